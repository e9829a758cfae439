"""Storage and upstream adapters of the scheduler (SQLAlchemy Core, gRPC clients)."""
