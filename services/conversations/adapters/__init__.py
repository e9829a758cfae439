"""Storage adapters of the conversations context (SQLAlchemy Core on SQLite and PostgreSQL)."""
