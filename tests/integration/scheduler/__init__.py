"""Integration tests of the scheduler service on SQLite and PostgreSQL."""
