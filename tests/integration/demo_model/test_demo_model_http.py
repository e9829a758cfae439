"""The demo model over real HTTP: the SSE stream, the errors, the WebSocket refusal, the stall and the
command line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from demo_model import DemoModelServer, UsageModel, reply_text
from tests.conftest import REPOSITORY_ROOT


def _body(text: str) -> dict[str, Any]:
    return {
        "model": "gpt-5.5",
        "stream": True,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
    }


def _sse_events(raw: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in raw.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.fixture
def server() -> Iterator[DemoModelServer]:
    with DemoModelServer(usage_model=UsageModel(base_tokens=500, turn_tokens=50, output_tokens=5)) as running:
        yield running


def test_a_reply_streams_as_server_sent_events(server: DemoModelServer) -> None:
    response = httpx.post(
        f"{server.base_url}/responses", json=_body("hello there"), headers={"thread-id": "t-1"}, timeout=10
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _sse_events(response.text)
    names = [name for name, _ in events]
    assert names[:2] == ["response.created", "response.output_item.added"]
    assert names[-2:] == ["response.output_item.done", "response.completed"]
    assert all(name == data["type"] for name, data in events)
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    assert text == reply_text("hello there")
    assert events[-1][1]["response"]["usage"]["total_tokens"] == 555
    (record,) = server.requests
    assert (record.thread_id, record.user_text, record.user_turns, record.total_tokens) == (
        "t-1",
        "hello there",
        1,
        555,
    )


def test_an_http_failure_marker_answers_with_that_status(server: DemoModelServer) -> None:
    response = httpx.post(f"{server.base_url}/responses", json=_body("[[demo:http429]]"), timeout=10)
    assert response.status_code == 429
    assert response.json()["error"]["type"] == "rate_limit_exceeded"


def test_a_body_that_is_not_a_json_object_is_400(server: DemoModelServer) -> None:
    response = httpx.post(f"{server.base_url}/responses", content=b"[1, 2", timeout=10)
    assert response.status_code == 400
    assert server.requests == []


def test_a_websocket_upgrade_is_refused_with_426(server: DemoModelServer) -> None:
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        "openai-beta": "responses_websockets=2026-02-06",
    }
    response = httpx.get(f"{server.base_url}/responses", headers=headers, timeout=10)
    assert response.status_code == 426


def test_a_stall_holds_the_stream_open_after_created(server: DemoModelServer) -> None:
    url, timeout = f"{server.base_url}/responses", httpx.Timeout(10, read=1.0)
    with (
        httpx.stream("POST", url, json=_body("[[demo:stall]]"), timeout=timeout) as response,
        pytest.raises(httpx.ReadTimeout),
    ):
        received = ""
        for chunk in response.iter_text():
            received += chunk
    assert [name for name, _ in _sse_events(received)] == ["response.created"]


def test_health_names_the_demo_model(server: DemoModelServer) -> None:
    assert httpx.get(f"http://127.0.0.1:{server.port}/healthz", timeout=10).json() == {
        "status": "ok",
        "model": "boss-demo-model",
    }


def test_two_servers_get_different_ports_and_a_stopped_one_stops_answering() -> None:
    with DemoModelServer() as first, DemoModelServer() as second:
        assert first.port != second.port
        url = first.base_url
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/responses", json=_body("x"), timeout=2)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_command_line_serves_with_the_given_usage() -> None:
    port = _free_port()
    command = [sys.executable, "-m", "demo_model", "serve", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--base-tokens", "700", "--turn-tokens", "10"],
        cwd=REPOSITORY_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        response = None
        for _ in range(200):
            try:
                response = httpx.post(f"http://127.0.0.1:{port}/v1/responses", json=_body("hi"), timeout=2)
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        assert response is not None, "the demo model did not come up"
        assert _sse_events(response.text)[-1][1]["response"]["usage"]["input_tokens"] == 710
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_command_line_writes_a_codex_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    command = [sys.executable, "-m", "demo_model", "write-home", "--codex-home", str(home)]
    done = subprocess.run(
        [*command, "--base-url", "http://h:1/v1"],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "BOSS_DEMO_MODEL_API_KEY" in done.stdout
    assert 'base_url = "http://h:1/v1"' in (home / "config.toml").read_text()
    refused = subprocess.run(
        [*command, "--base-url", "x", "--context-window", "0"],
        cwd=REPOSITORY_ROOT,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "context_window must be positive" in refused.stderr
