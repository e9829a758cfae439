"""The console's chat draws what people and threads wrote as text, never as markup: a message or a
failure's detail holding HTML, markdown or bidi controls becomes text nodes holding exactly those
characters (run under Node with the minimal DOM of test_console_chat.py, whose stand-in builds no
element from a string, so markup assigned as HTML would leave the bubble empty).

Skipped, with the reason, when `node` is not installed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.unit.bff_gateway.test_console_chat import (
    MESSAGES_URL,
    PROJECT,
    SCRIPTS,
    message,
    run_console,
    task,
)

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")

HOSTILE = [
    '<img src=x onerror="window.owned=1">',
    "**bold** [link](javascript:alert(1)) <script>window.owned=1</script>",
    "invoice \u202egpj.exe\u202c &amp; &lt;b&gt;",
]


def test_messages_and_failure_details_are_drawn_as_the_text_they_hold(tmp_path: Path) -> None:
    history = [
        message(1, "user", HOSTILE[0], "t-1"),
        message(2, "thread", HOSTILE[1], "t-1"),
        message(3, "user", HOSTILE[2], "t-2"),
    ]
    routes = {
        f"{MESSAGES_URL}0": {"messages": history, "nextPageToken": ""},
        "/api/v1/tasks/t-1": {"task": task("t-1", "completed", resultMessageId="m-2")},
        "/api/v1/tasks/t-2": {
            "task": task("t-2", "queued", requestMessageId="m-3", statusDetail="<b>device</b> offline"),
        },
    }
    drawn = run_console(
        tmp_path,
        f"""(async () => {{
          Object.assign(routes, {json.dumps(routes)});
          state.token = "token";
          const chat = chatFor({json.dumps(PROJECT)});
          await syncChat(chat);
          clearTimeout(chat.pollTimer);
          const strings = (node) => node.childNodes.filter((c) => typeof c === "string");
          return {{
            bubbles: chat.list.childNodes.map((item) => {{
              const bubble = byClass(item, "bubble")[0];
              return {{ children: bubble.childNodes.length, strings: strings(bubble) }};
            }}),
            details: byClass(chat.list, "detail").map((node) => node.textContent),
            owned: typeof owned !== "undefined",
          }};
        }})()""",
        SCRIPTS,
    )

    assert drawn["bubbles"] == [{"children": 1, "strings": [text]} for text in HOSTILE]
    assert drawn["details"] == ["<b>device</b> offline"]
    assert drawn["owned"] is False
