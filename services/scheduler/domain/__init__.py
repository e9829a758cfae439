"""Pure scheduling rules: no I/O, tested with plain values."""
