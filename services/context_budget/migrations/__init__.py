"""Alembic migrations of the context_budget service.

Applied by `python -m services.context_budget migrate`, or at start when BOSS_MIGRATE_ON_START is true.
"""
