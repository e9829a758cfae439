"""gRPC server bootstrap shared by every service: grpc.aio, health, reflection, keepalive,
graceful shutdown on SIGTERM/SIGINT, and the mapping of Boss errors to rich status.

Shutdown order (gRPC's own graceful-shutdown example): health goes NOT_SERVING first so probes and
load balancers stop sending work, then `server.stop(grace)` lets in-flight RPCs finish for up to
GRACE_SECONDS, then background tasks are cancelled and the database closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from services.shared.auth import TokenAuthority
from services.shared.config import ServerTls
from services.shared.errors import BossError, grpc_status_of
from services.shared.grpc_requests import UndecodableRequestInterceptor
from services.shared.metrics import MetricsEndpoint, OpenStreamsInterceptor, metrics_listen_address
from services.shared.runtime import tune_garbage_collection

log = logging.getLogger(__name__)

GRACE_SECONDS = 10.0
MAX_MESSAGE_BYTES = 4 * 1024 * 1024

# Keepalive and connection management, from gRPC's keepalive guide. Connections are recycled every
# 5 minutes (plus 30 s grace) so that clients spread over new replicas behind a Kubernetes Service.
# No SO_REUSEPORT (gRPC sets it by default): a second process started on an address in use would
# start silently and take a share of the connections, with the callers' bearer tokens; without it
# the second bind fails (CannotListen).
SERVER_OPTIONS: tuple[tuple[str, Any], ...] = (
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_connection_age_ms", 300_000),
    ("grpc.max_connection_age_grace_ms", 30_000),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
)

F = TypeVar("F", bound=Callable[..., Awaitable[Any]])


class CannotListen(RuntimeError):
    """A server could not bind its address; the message says which and why (`bind_problem`)."""


def bind_problem(listen: str) -> str:
    """Why `listen` ("host:port", "[v6]:port") cannot be bound, in plain words, found by binding a
    probe socket the way gRPC does: "port in use" when another process listens there."""
    host, _, port = listen.rpartition(":")
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host.removeprefix("[").removesuffix("]") or None,
            port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except socket.gaierror as error:
        return f"its host cannot be resolved ({error.strerror})"
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            return "port in use: another process listens there (another instance of this service?)"
        return error.strerror or str(error)
    return "gRPC refused it (GRPC_VERBOSITY=debug says why)"


def translate_errors(method: F) -> F:
    """Decorates a unary servicer method: a BossError aborts the call with its rich status
    (code, message, google.rpc details); any other exception is logged with its traceback and
    answered INTERNAL "internal error", so a caller never sees a statement, its parameters or a
    traceback."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await method(self, request, context)
        except BossError as error:
            await context.abort_with_status(grpc_status_of(error))
        except grpc.aio.AbortError:
            raise
        except Exception:
            log.exception("%s failed", method.__qualname__)
            await context.abort(grpc.StatusCode.INTERNAL, "internal error")

    return wrapper  # type: ignore[return-value]


READINESS_INTERVAL_SECONDS = 5.0


async def watch_readiness(
    health: health_aio.HealthServicer,
    check: Callable[[], Awaitable[None]],
    service_names: Iterable[str],
    interval: float = READINESS_INTERVAL_SECONDS,
) -> None:
    """Keeps the business services' health in step with `check` until cancelled.

    While `check` raises, every name in `service_names` reports NOT_SERVING, so readiness probes and
    load balancers stop sending work; the whole server ("") stays SERVING, so liveness probes do not
    restart a process that is only waiting for its database. Transitions are logged once.
    """
    names = list(service_names)
    ready = True
    while True:
        try:
            async with asyncio.timeout(interval):
                await check()
            healthy = True
        except asyncio.CancelledError:
            raise
        except Exception as error:
            healthy = False
            if ready:
                log.warning("not ready: %s", error)
        if healthy != ready:
            status = (
                health_pb2.HealthCheckResponse.SERVING
                if healthy
                else health_pb2.HealthCheckResponse.NOT_SERVING
            )
            for name in names:
                await health.set(name, status)
            if healthy:
                log.info("ready again")
            ready = healthy
        await asyncio.sleep(interval)


@dataclass
class ServiceHost:
    """Everything one service process runs: its servicers, its background tasks and its cleanup.

    Attributes:
        name: short service name, e.g. "context_budget".
        listen: host:port to bind.
        register: adds the service's servicers to the server.
        service_names: fully qualified gRPC service names (for health and reflection).
        background: coroutine factories started after the server (notifier, consumers...).
        on_start: awaited before the server takes its first call (e.g. loading the revoked devices,
            so no call of a revoked device is served after a restart).
        on_draining: called (synchronously) as soon as shutdown begins, before the server stops
            taking calls and waits for the open ones: e.g. `EventLog.end_followers`, so event
            streams end at once instead of holding the shutdown for its whole grace period.
        on_stop: awaited after the server stopped (close databases, flush).
        readiness_check: raises when the service cannot do its work (e.g. its database is
            unreachable); polled every READINESS_INTERVAL_SECONDS by `run()`, see `watch_readiness`.
        authority: verifies the token of a call whose request cannot be decoded before it is
            refused as bad input (services/shared/grpc_requests.py); None: refused as bad input.
        tls: the certificate to serve TLS with (ServiceSettings.tls: BOSS_TLS_CERT_FILE and
            BOSS_TLS_KEY_FILE); None listens in plaintext.
    """

    name: str
    listen: str
    register: Callable[[grpc.aio.Server], None]
    service_names: Iterable[str]
    background: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_start: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_draining: list[Callable[[], None]] = field(default_factory=list)
    on_stop: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    readiness_check: Callable[[], Awaitable[None]] | None = None
    authority: TokenAuthority | None = None
    tls: ServerTls | None = None

    async def start(self) -> tuple[grpc.aio.Server, health_aio.HealthServicer, int]:
        """Runs `on_start`, builds and starts the server; returns it, its health servicer and the
        bound port. Raises CannotListen when the address cannot be bound (e.g. in use)."""
        for prepare in self.on_start:
            await prepare()
        server = grpc.aio.server(
            options=SERVER_OPTIONS,
            interceptors=[UndecodableRequestInterceptor(self.authority), OpenStreamsInterceptor()],
        )
        self.register(server)
        health = health_aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        names = list(self.service_names)
        reflection.enable_server_reflection(
            (*names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
            server,
        )
        try:
            if self.tls is None:
                port = server.add_insecure_port(self.listen)
            else:
                credentials = grpc.ssl_server_credentials(
                    [(self.tls.private_key, self.tls.certificate_chain)]
                )
                port = server.add_secure_port(self.listen, credentials)
        except RuntimeError as error:
            raise CannotListen(
                f"{self.name} cannot listen on {self.listen}: {bind_problem(self.listen)}"
            ) from error
        await server.start()
        for service_name in ("", *names):
            await health.set(service_name, health_pb2.HealthCheckResponse.SERVING)
        log.info("%s serving on %s (%s)", self.name, self.listen, "TLS" if self.tls else "plaintext")
        return server, health, port

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serves until SIGTERM/SIGINT (or `stop` is set), then shuts down gracefully. Tunes the
        process's garbage collector once the server has started (services/shared/runtime.py).
        Serves Prometheus metrics on BOSS_<NAME>_METRICS_LISTEN when set (services/shared/metrics.py).
        Exits the process (SystemExit with CannotListen's message) when the address cannot be bound."""
        stop = stop or asyncio.Event()
        listen = metrics_listen_address(self.name)
        endpoint = MetricsEndpoint(listen) if listen else None
        if endpoint is not None:
            endpoint.start()
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal_number, stop.set)
        try:
            server, health, _port = await self.start()
        except CannotListen as error:
            if endpoint is not None:
                await endpoint.stop()
            raise SystemExit(str(error)) from None
        tune_garbage_collection()
        tasks = [asyncio.ensure_future(factory()) for factory in self.background]
        if self.readiness_check is not None:
            tasks.append(
                asyncio.ensure_future(watch_readiness(health, self.readiness_check, self.service_names))
            )
        try:
            waiters = [asyncio.create_task(stop.wait()), *tasks]
            done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for finished in done:
                if finished is not waiters[0] and finished.exception() is not None:
                    log.error("%s background task failed", self.name, exc_info=finished.exception())
        finally:
            log.info("%s shutting down", self.name)
            await health.enter_graceful_shutdown()
            for draining in self.on_draining:
                draining()
            await server.stop(GRACE_SECONDS)
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            for cleanup in self.on_stop:
                await cleanup()
            if endpoint is not None:
                await endpoint.stop()
            log.info("%s stopped", self.name)
