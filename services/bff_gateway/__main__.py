"""Command line of the gateway.

    python -m services.bff_gateway serve [--listen HOST:PORT]
    python -m services.bff_gateway token --worker WORKER --node NODE [--owner OWNER] [--days N]
    python -m services.bff_gateway token --client OWNER [--days N]
    python -m services.bff_gateway token --service NAME [--days N]
    python -m services.bff_gateway pairing-code [--owner OWNER]

`serve` reads its settings from the environment (settings.py). `token` prints one token signed with
the configured secret (BOSS_AUTH_SECRET, else $BOSS_DATA_DIR/auth-secret, created if missing), for
a worker bound to WORKER on NODE acting for OWNER (default BOSS_DEFAULT_OWNER_ID, else "local"), for
the app or console of OWNER, or for a Boss service: tokens for automation, which cannot be revoked
one by one. `pairing-code` asks the conversations service (BOSS_CONVERSATIONS_ADDRESS) for a
one-time code that enrolls one device for OWNER (`python -m worker enroll CODE` on the device):
its credential can be listed and revoked by the owner.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta

import grpc

from boss_common.channels import open_channel
from services.shared.auth import TokenAuthority, bearer_metadata
from services.shared.config import auth_secret, default_owner_id, service_address
from services.shared.time import from_timestamp, isoformat_utc


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
    token.add_argument(
        "--owner", metavar="OWNER", help="whose threads the worker reports (default: the default owner)"
    )
    token.add_argument("--days", type=float, default=30.0, help="validity in days (default 30)")
    pairing = commands.add_parser("pairing-code", help="print a one-time code that enrolls one device")
    pairing.add_argument(
        "--owner", metavar="OWNER", help="whose device it enrolls (default: the default owner)"
    )
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
        return authority.issue_worker(
            arguments.worker,
            arguments.node,
            lifetime=lifetime,
            owner_id=arguments.owner or default_owner_id(),
        )
    if arguments.owner:
        raise ValueError("--owner goes with --worker (a client token's owner is --client)")
    if arguments.client:
        return authority.issue_client(arguments.client, lifetime=lifetime)
    return authority.issue_service(arguments.service, lifetime=lifetime)


async def request_pairing_code(owner_id: str) -> tuple[str, datetime]:
    """A one-time pairing code for `owner_id` from the conversations service, asked with a service
    token of this installation. Raises grpc.aio.AioRpcError."""
    from boss.conversations.v1 import conversations_pb2, conversations_pb2_grpc

    token = TokenAuthority(auth_secret()).issue_service("bff_gateway")
    async with open_channel(service_address("conversations")) as channel:
        response = await conversations_pb2_grpc.ConversationsServiceStub(channel).CreatePairingCode(
            conversations_pb2.CreatePairingCodeRequest(owner_id=owner_id),
            metadata=bearer_metadata(token),
            timeout=10,
        )
    return response.pairing_code, from_timestamp(response.expires_at)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs one command; returns the process exit status."""
    arguments = _parser().parse_args(argv)
    if arguments.command == "pairing-code":
        try:
            code, expires_at = asyncio.run(request_pairing_code(arguments.owner or default_owner_id()))
        except grpc.aio.AioRpcError as error:
            sys.stderr.write(
                f"error: the conversations service answered {error.code().name}: {error.details()}\n"
            )
            return 1
        sys.stdout.write(f"{code}\n")
        sys.stderr.write(
            f"valid until {isoformat_utc(expires_at)}, once: on the device, boss-worker enroll {code} "
            f"(in a clone of Boss: python -m worker enroll {code})\n"
        )
        return 0
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
