"""Command line of the conversations service: `serve` (default) or `migrate`.

python -m services.conversations serve     # gRPC on BOSS_CONVERSATIONS_LISTEN (127.0.0.1:50053)
python -m services.conversations migrate   # apply migrations to BOSS_CONVERSATIONS_DATABASE_URL
"""

from __future__ import annotations

import argparse
import asyncio

from services.conversations.server import migrate, serve
from services.shared import config
from services.shared.logging_setup import configure_logging


def main() -> None:
    """Parses the command and runs it."""
    parser = argparse.ArgumentParser(prog="python -m services.conversations", description=__doc__)
    parser.add_argument("command", nargs="?", choices=["serve", "migrate"], default="serve")
    arguments = parser.parse_args()
    configure_logging()
    if arguments.command == "migrate":
        asyncio.run(migrate(config.database_url("conversations")))
    else:
        asyncio.run(serve())


if __name__ == "__main__":
    main()
