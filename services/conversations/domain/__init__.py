"""Pure rules of the conversations context: no I/O, tested with plain values."""
