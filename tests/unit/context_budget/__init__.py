"""Unit tests of the context budget domain (pure: no database, no gRPC)."""
