"""Integration tests of the context_budget service: real gRPC server in-process, SQLite and PostgreSQL."""
