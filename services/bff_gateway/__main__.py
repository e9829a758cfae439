"""Command line of the gateway.

    python -m services.bff_gateway serve [--listen HOST:PORT]
    python -m services.bff_gateway token --worker WORKER --node NODE [--days N]
    python -m services.bff_gateway token --client OWNER [--days N]
    python -m services.bff_gateway token --service NAME [--days N]

`serve` reads its settings from the environment (settings.py). `token` prints one token signed with
the configured secret (BOSS_AUTH_SECRET, else $BOSS_DATA_DIR/auth-secret, created if missing), for
a worker bound to WORKER on NODE, for the app or console of OWNER, or for a Boss service.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from datetime import timedelta

from services.shared.auth import TokenAuthority
from services.shared.config import auth_secret


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m services.bff_gateway", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP gateway")
    serve.add_argument("--listen", help="host:port to bind (default: BOSS_GATEWAY_LISTEN or 127.0.0.1:8080)")
    token = commands.add_parser("token", help="print a signed bearer token")
    kind = token.add_mutually_exclusive_group(required=True)
    kind.add_argument("--worker", metavar="WORKER", help="a worker token bound to WORKER (needs --node)")
    kind.add_argument("--client", metavar="OWNER", help="a client (app, console) token for OWNER")
    kind.add_argument("--service", metavar="NAME", help="a token for the Boss service NAME")
    token.add_argument("--node", metavar="NODE", help="the node the worker token is bound to")
    token.add_argument("--days", type=float, default=30.0, help="validity in days (default 30)")
    return parser


def issue_token(arguments: argparse.Namespace, authority: TokenAuthority) -> str:
    """The token the `token` command asked for. Raises ValueError when --worker lacks --node or
    --days is not positive."""
    if arguments.days <= 0:
        raise ValueError("--days must be positive")
    lifetime = timedelta(days=arguments.days)
    if arguments.worker:
        if not arguments.node:
            raise ValueError("--worker needs --node")
        return authority.issue_worker(arguments.worker, arguments.node, lifetime=lifetime)
    if arguments.client:
        return authority.issue_client(arguments.client, lifetime=lifetime)
    return authority.issue_service(arguments.service, lifetime=lifetime)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the process exit status."""
    arguments = _parser().parse_args(argv)
    if arguments.command == "token":
        try:
            token = issue_token(arguments, TokenAuthority(auth_secret()))
        except ValueError as error:
            sys.stderr.write(f"error: {error}\n")
            return 2
        sys.stdout.write(token + "\n")
        return 0

    from services.bff_gateway.server import serve
    from services.bff_gateway.settings import GatewaySettings
    from services.shared.logging_setup import configure_logging
    from services.shared.telemetry import configure_telemetry

    configure_logging()
    configure_telemetry("gateway")
    settings = GatewaySettings.from_environment()
    if arguments.listen:
        settings = dataclasses.replace(settings, listen=arguments.listen)
    asyncio.run(serve(settings))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
