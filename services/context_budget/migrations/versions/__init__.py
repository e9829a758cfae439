"""Revisions of the context_budget schema, oldest first."""
