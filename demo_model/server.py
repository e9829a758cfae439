"""Running the demo model: in-process on a free port (tests, the local stack) or as a foreground server.

:class:`DemoModelServer` runs uvicorn on its own thread with its own event loop, so it serves while
the caller's thread (sync or async) blocks on a Codex subprocess. Use it as a context manager::

    with DemoModelServer() as server:
        write_codex_home(home, base_url=server.base_url)
        ...  # run codex with CODEX_HOME=home

``async with DemoModelServer() as server:`` works too (start and stop run off the event loop).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from types import TracebackType

import uvicorn

from demo_model.app import RecordedRequest, create_app
from demo_model.usage import UsageModel

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 10.0
"""How long :meth:`DemoModelServer.start` waits for uvicorn to accept connections (seconds)."""

STOP_GRACE_S = 1
"""On stop, open streams (a stall) are given this long before uvicorn cancels them (seconds)."""


class _UpgradeRefusalFilter(logging.Filter):
    """Drops uvicorn's warnings about the WebSocket upgrade it cannot do: the demo model refuses
    those upgrades on purpose (426), so that Codex's built-in provider falls back to HTTPS at once."""

    _PREFIXES = ("Unsupported upgrade request", "No supported WebSocket library detected")

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self._PREFIXES)


def _quiet_upgrade_refusals() -> None:
    uvicorn_logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(existing, _UpgradeRefusalFilter) for existing in uvicorn_logger.filters):
        uvicorn_logger.addFilter(_UpgradeRefusalFilter())


class DemoModelServer:
    """The demo model served on ``host:port`` from a background thread.

    Args:
        host: interface to listen on.
        port: TCP port; 0 picks a free one (read :attr:`port` / :attr:`base_url` after start).
        usage_model: the token usage rule.

    Attributes:
        requests: every request answered so far, oldest first (a snapshot copy per read).
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, usage_model: UsageModel | None = None):
        self._host = host
        self._requested_port = port
        self._port: int | None = None
        self._usage_model = usage_model or UsageModel()
        self._records: list[RecordedRequest] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The TCP port served on. Raises RuntimeError before :meth:`start`."""
        if self._port is None:
            raise RuntimeError("the demo model server is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """The provider ``base_url`` for Codex: ``http://HOST:PORT/v1``. Raises RuntimeError before start."""
        return f"http://{self._host}:{self.port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """The requests answered so far, oldest first."""
        with self._lock:
            return list(self._records)

    def requests_of(self, thread_id: str) -> list[RecordedRequest]:
        """The requests answered for one Codex thread (its session id), oldest first."""
        return [record for record in self.requests if record.thread_id == thread_id]

    def start(self) -> str:
        """Binds the port, starts serving and returns :attr:`base_url`.

        Raises:
            OSError: the port cannot be bound.
            RuntimeError: already started, or uvicorn did not come up within :data:`START_TIMEOUT_S`.
        """
        if self._server is not None:
            raise RuntimeError("the demo model server is already started")
        _quiet_upgrade_refusals()
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self._host, self._requested_port))
        self._port = listener.getsockname()[1]
        config = uvicorn.Config(
            create_app(self._usage_model, self._record),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=STOP_GRACE_S,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [listener]}, name="demo-model", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                listener.close()
                raise RuntimeError(f"the demo model server did not start on {self._host}:{self._port}")
            time.sleep(0.01)
        logger.info("demo model serving at %s", self.base_url)
        return self.base_url

    def stop(self) -> None:
        """Stops serving (open streams get :data:`STOP_GRACE_S`) and waits for the thread. Idempotent."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout=STOP_GRACE_S + 5.0)

    def _record(self, record: RecordedRequest) -> None:
        with self._lock:
            self._records.append(record)

    def __enter__(self) -> DemoModelServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> DemoModelServer:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)


def serve(host: str, port: int, usage_model: UsageModel) -> None:
    """Serves the demo model in the foreground until SIGINT/SIGTERM (uvicorn's own logging); open
    requests (a slow or stalled answer) get STOP_GRACE_S seconds when it stops."""
    _quiet_upgrade_refusals()
    uvicorn.run(
        create_app(usage_model),
        host=host,
        port=port,
        log_level="info",
        lifespan="off",
        timeout_graceful_shutdown=STOP_GRACE_S,
    )
