"""Alembic environment of the scheduler: its tables on one MetaData, in its own schema."""

import services.scheduler.tasks.tables  # noqa: F401  (registers the task tables on the metadata)
from services.scheduler.adapters.tables import metadata
from services.shared.migrations import run_alembic_environment

run_alembic_environment(metadata)
