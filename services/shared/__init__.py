"""Plumbing every Boss service uses the same way: configuration, database and unit of work,
transactional outbox and event streams, gRPC server bootstrap, auth, errors and telemetry."""
