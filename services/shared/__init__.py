"""Plumbing every Boss service uses the same way: configuration, database and unit of work,
transactional outbox and event streams, gRPC server bootstrap, auth, errors and telemetry. What the
device worker needs as well (time, addresses, bearer metadata, reconnection, error details,
logging) lives in boss_common/, which these modules build on."""
