"""`python -m services.scheduler serve|migrate`: run the scheduler, or apply its migrations."""

from __future__ import annotations

import argparse
import asyncio

from services.scheduler.server import migrate, serve
from services.shared import config
from services.shared.logging_setup import configure_logging


def main(argv: list[str] | None = None) -> None:
    """Parses the command line and runs `serve` (default) or `migrate`."""
    parser = argparse.ArgumentParser(prog="python -m services.scheduler", description=__doc__)
    parser.add_argument("command", nargs="?", default="serve", choices=["serve", "migrate"])
    arguments = parser.parse_args(argv)
    configure_logging()
    if arguments.command == "migrate":
        asyncio.run(migrate(config.database_url("scheduler")))
    else:
        asyncio.run(serve())


if __name__ == "__main__":
    main()
