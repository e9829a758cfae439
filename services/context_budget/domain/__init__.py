"""Pure domain of the context budget: values, threshold policy, validation, alerts and the ingest
plan. No I/O here: everything is tested with plain values."""
