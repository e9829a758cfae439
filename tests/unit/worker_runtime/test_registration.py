"""The thread registrar's bookkeeping (the RegisterThread call itself faked): once per thread, and
once more when a thread first seen without its working folder later shows it."""

from __future__ import annotations

from boss.conversations.v1 import conversations_pb2 as pb

from worker.registration import ThreadRegistrar, ThreadToRegister


class RecordingRegistrar(ThreadRegistrar):
    """A registrar whose RegisterThread calls are recorded and answered, with no server."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1:1", "token", worker_id="w", node_id="n")
        self.calls: list[ThreadToRegister] = []

    async def _call(self, thread: ThreadToRegister) -> pb.RegisterThreadResponse:
        self.calls.append(thread)
        return pb.RegisterThreadResponse(project_id=f"proj-{thread.thread_id}", created=len(self.calls) == 1)


async def test_a_thread_is_registered_once_however_often_it_is_seen() -> None:
    registrar = RecordingRegistrar()
    registrar.note("t1", codex_folder="/home/dev/north", codex_thread_ref="t1")
    registrar.note("t1", codex_folder="/home/dev/north", codex_thread_ref="t1")
    assert await registrar.flush() == 0
    registrar.note("t1", codex_folder="/home/dev/north", codex_thread_ref="t1")
    assert await registrar.flush() == 0
    assert [call.codex_folder for call in registrar.calls] == ["/home/dev/north"]


async def test_a_thread_first_seen_without_its_folder_is_registered_again_once_it_is_known() -> None:
    registrar = RecordingRegistrar()
    registrar.note("t1", codex_thread_ref="t1")  # the session file read before its folder was written
    await registrar.flush()
    registrar.note("t1", codex_thread_ref="t1")  # still unknown: nothing new to say
    await registrar.flush()
    registrar.note("t1", codex_folder="/home/dev/south", codex_thread_ref="t1")
    await registrar.flush()
    registrar.note("t1", codex_folder="/home/dev/south", codex_thread_ref="t1")
    await registrar.flush()
    assert [call.codex_folder for call in registrar.calls] == ["", "/home/dev/south"]


async def test_a_folder_learned_before_the_first_call_replaces_the_queued_registration() -> None:
    registrar = RecordingRegistrar()
    registrar.note("t1", codex_thread_ref="t1")
    registrar.note("t1", codex_folder="/home/dev/south", codex_thread_ref="t1")
    await registrar.flush()
    assert [call.codex_folder for call in registrar.calls] == ["/home/dev/south"]
