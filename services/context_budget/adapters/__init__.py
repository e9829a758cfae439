"""Adapters of the context budget service: SQLAlchemy tables and repository, protobuf mapping."""
