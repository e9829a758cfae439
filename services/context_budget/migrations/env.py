"""Alembic environment of the context_budget service: its tables live in its own schema or file."""

from services.context_budget.adapters.tables import metadata
from services.shared.migrations import run_alembic_environment

run_alembic_environment(metadata)
