"""Command line of the context_budget service.

    python -m services.context_budget serve     # migrates first when BOSS_MIGRATE_ON_START is true
    python -m services.context_budget migrate   # applies the Alembic migrations and exits

Settings come from the environment (services/shared/config.py): BOSS_CONTEXT_BUDGET_DATABASE_URL or
BOSS_DATABASE_URL (default: SQLite under BOSS_DATA_DIR), BOSS_CONTEXT_BUDGET_LISTEN, BOSS_AUTH_SECRET.
BOSS_CONTEXT_BUDGET_INGEST_IN_FLIGHT (optional, an integer >= 1) overrides how many ingest
transactions run at once (server.build_service, default 1; more only on PostgreSQL).
BOSS_CONVERSATIONS_ADDRESS: where the conversations service is (its thread moves and device
revocations are followed).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os

from services.context_budget import SERVICE_NAME
from services.context_budget.server import build_service, migrate
from services.shared.config import ServiceSettings, service_address
from services.shared.logging_setup import configure_logging
from services.shared.retention import RetentionSettings
from services.shared.telemetry import configure_telemetry, instrument_engine

log = logging.getLogger("services.context_budget")


async def _serve() -> None:
    configure_telemetry(SERVICE_NAME)
    in_flight = os.environ.get("BOSS_CONTEXT_BUDGET_INGEST_IN_FLIGHT")
    service = build_service(
        ServiceSettings.from_environment(SERVICE_NAME),
        batch_max_in_flight=int(in_flight) if in_flight else 1,
        conversations_address=service_address("conversations"),
        retention=RetentionSettings.from_environment(),
    )
    instrument_engine(service.database.writer)
    await service.run()


async def _migrate() -> None:
    settings = ServiceSettings.from_environment(SERVICE_NAME)
    await migrate(settings.database_url, SERVICE_NAME)
    log.info("context_budget migrations applied")


def main(argv: list[str] | None = None) -> None:
    """Parses the command (`serve` or `migrate`) and runs it."""
    parser = argparse.ArgumentParser(
        prog="python -m services.context_budget", description="context_budget service"
    )
    parser.add_argument("command", choices=["serve", "migrate"])
    arguments = parser.parse_args(argv)
    configure_logging()
    asyncio.run(_serve() if arguments.command == "serve" else _migrate())


if __name__ == "__main__":
    main()
