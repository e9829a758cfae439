"""Alembic environment of the conversations context (online mode; see services/shared/migrations.py)."""

from services.conversations.adapters.tables import metadata
from services.shared.migrations import run_alembic_environment

run_alembic_environment(metadata)
