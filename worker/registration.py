"""Device import: a worker registers each Codex thread it sees with the conversations service, so the
thread gets its conversation (a single_device project) with its node, worker, Codex working folder,
Codex thread reference and title (ARCHITECTURE.md, "worker/ ... registers threads with conversations").

Use from the worker agent (synchronous code may call `note`; the registrar's `run` task does the
calls in the background, retrying while conversations is unreachable):

    registrar = ThreadRegistrar(conversations_address, token, worker_id=..., node_id=...)
    task = asyncio.create_task(registrar.run(stop))
    registrar.note(thread_id, codex_folder=state.folder or "", codex_thread_ref=thread_id)
    ...
    await registrar.close()

Registration is idempotent on the server (a known thread only gets its metadata refreshed), and the
registrar calls it once per thread per process. A thread that reports before it is registered is
imported by conversations anyway, so a late registration loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import grpc
from boss.conversations.v1 import conversations_pb2 as pb
from boss.conversations.v1 import conversations_pb2_grpc as pb_grpc

from boss_common.bearer import bearer_metadata
from boss_common.channels import open_channel

log = logging.getLogger(__name__)

RETRY_SECONDS = 5.0
RPC_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class ThreadToRegister:
    """What the worker knows about a thread when it first sees it.

    Attributes:
        thread_id: Codex's thread id (the session id in the rollout's `session_meta`).
        codex_folder: the session's working folder (its cwd) on this node.
        codex_thread_ref: what `codex exec resume` takes to resume the thread: its session id.
        title: the thread's title, "" when unknown.
    """

    thread_id: str
    codex_folder: str = ""
    codex_thread_ref: str = ""
    title: str = ""


class ThreadRegistrar:
    """Registers threads with boss.conversations.v1.ConversationsService.RegisterThread.

    Args:
        address: gRPC target of conversations (BOSS_CONVERSATIONS_ADDRESS, default 127.0.0.1:50053).
        token: this worker's token (bound to worker_id and node_id; scope threads:register).
        worker_id, node_id: must equal the token's.
        owner_id: whose threads these are; empty means the server's default owner ("local").
        channel: an existing channel to use instead of opening one (not closed by `close`).
    """

    def __init__(
        self,
        address: str,
        token: str,
        *,
        worker_id: str,
        node_id: str,
        owner_id: str = "",
        channel: grpc.aio.Channel | None = None,
    ) -> None:
        self._address = address
        self._metadata = bearer_metadata(token)
        self.worker_id = worker_id
        self.node_id = node_id
        self.owner_id = owner_id
        self._channel = channel
        self._owns_channel = channel is None
        self._pending: dict[str, ThreadToRegister] = {}
        self._wake = asyncio.Event()
        self._registered_folders: dict[str, str] = {}
        self.registered: dict[str, str] = {}
        """thread id -> the project it was placed in, for every thread registered by this process."""

    def note(
        self, thread_id: str, *, codex_folder: str = "", codex_thread_ref: str = "", title: str = ""
    ) -> None:
        """Queues a thread for registration unless it was registered already (cheap; no I/O).

        A thread first seen before its working folder was known (a session file read while Codex
        was still writing its first records) is registered again once the folder is known: without
        it the thread can take no task, and its title stays its id."""
        queued = self._pending.get(thread_id)
        known = self._registered_folders.get(thread_id) if thread_id in self.registered else None
        if queued is not None:
            if codex_folder and not queued.codex_folder:
                self._pending[thread_id] = ThreadToRegister(thread_id, codex_folder, codex_thread_ref, title)
            return
        if known is not None and (known or not codex_folder):
            return
        self._pending[thread_id] = ThreadToRegister(thread_id, codex_folder, codex_thread_ref, title)
        self._wake.set()

    async def register(self, thread: ThreadToRegister) -> str:
        """Registers one thread now; returns its project id. Raises grpc.aio.AioRpcError (e.g.
        PERMISSION_DENIED when the token belongs to another worker or node, UNAVAILABLE)."""
        response = await self._call(thread)
        self.registered[thread.thread_id] = response.project_id
        self._registered_folders[thread.thread_id] = thread.codex_folder
        if response.created:
            log.info("registered thread %s as project %s", thread.thread_id, response.project_id)
        return response.project_id

    async def _call(self, thread: ThreadToRegister) -> pb.RegisterThreadResponse:
        """The RegisterThread call for `thread`."""
        if self._channel is None:
            self._channel = open_channel(self._address, for_worker=True)
        stub = pb_grpc.ConversationsServiceStub(self._channel)
        response = await stub.RegisterThread(
            pb.RegisterThreadRequest(
                thread_id=thread.thread_id,
                node_id=self.node_id,
                worker_id=self.worker_id,
                codex_folder=thread.codex_folder,
                codex_thread_ref=thread.codex_thread_ref,
                title=thread.title,
                owner_id=self.owner_id,
            ),
            metadata=self._metadata,
            timeout=RPC_TIMEOUT_SECONDS,
        )
        return response

    async def flush(self) -> int:
        """Registers every queued thread; returns how many are still waiting (after failures)."""
        for thread_id, thread in list(self._pending.items()):
            try:
                await self.register(thread)
            except grpc.aio.AioRpcError as error:
                if error.code() in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNAUTHENTICATED,
                ):
                    log.error("thread %s cannot be registered: %s", thread_id, error.details())
                    self._pending.pop(thread_id, None)
                else:
                    log.warning("conversations unavailable (%s); will retry %s", error.code().name, thread_id)
                continue
            self._pending.pop(thread_id, None)
        return len(self._pending)

    async def run(self, stop: asyncio.Event) -> None:
        """Registers queued threads until `stop` is set, retrying failures every 5 s."""
        while not stop.is_set():
            self._wake.clear()
            waiting = await self.flush()
            timeout = RETRY_SECONDS if waiting else None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wait(stop)

    async def _wait(self, stop: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(self._wake.wait()), asyncio.ensure_future(stop.wait())]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def close(self) -> None:
        """Closes the channel if the registrar opened it."""
        if self._owns_channel and self._channel is not None:
            await self._channel.close()
            self._channel = None
