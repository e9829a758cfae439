"""The web console's times (services/bff_gateway/console/times.js and the thread page of app.js),
run under Node with a minimal stand-in for the DOM: a handoff reason's instant is shown as the rest
of the console shows times (the browser's local date and time), with the exact ISO value in the
`<time>` element's title, never as raw ISO text.

Skipped, with the reason, when `node` is not installed. The real browser is exercised by
tests/e2e/test_console_browser.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from services.bff_gateway.routers.conversations import CONSOLE_DIR

NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (`apt-get install -y nodejs`)")

# Loads the console's scripts into one context (as index.html does) with just enough of a DOM for
# app.js to start and render, then runs the JavaScript given as argv[3] and prints its result.
HARNESS = r"""
const fs = require("fs");
const path = require("path");
const vm = require("vm");

class FakeNode {
  constructor(tag) {
    this.tagName = tag; this.attributes = {}; this.childNodes = []; this.dataset = {};
  }
  setAttribute(key, value) { this.attributes[key] = value; }
  append(...nodes) { this.childNodes.push(...nodes); }
  replaceChildren(...nodes) { this.childNodes = nodes; }
  addEventListener() {}
  querySelector() { return new FakeNode("stub"); }
  cloneNode() { return new FakeNode("fragment"); }
  get content() { return new FakeNode("template"); }
  get textContent() {
    return this.childNodes.map((c) => (typeof c === "string" ? c : c.textContent)).join("");
  }
  set textContent(value) { this.childNodes = [String(value)]; }
}

function byId(node, id) {
  if (typeof node === "string") return null;
  if (node.attributes.id === id) return node;
  for (const child of node.childNodes) {
    const found = byId(child, id);
    if (found) return found;
  }
  return null;
}

function shape(node) {
  if (typeof node === "string") return node;
  return { tag: node.tagName, attributes: node.attributes, children: node.childNodes.map(shape) };
}

const elements = {};
const context = {
  console, URLSearchParams, setTimeout, clearTimeout, FakeNode, byId, shape,
  Node: FakeNode,
  CSS: { escape: (value) => value },
  document: {
    createElement: (tag) => new FakeNode(tag),
    createElementNS: (_ns, tag) => new FakeNode(tag),
    getElementById: (id) => (elements[id] = elements[id] || new FakeNode(id)),
    querySelector: () => null,
    querySelectorAll: () => [],
  },
  location: { search: "", pathname: "/console/", hash: "" },
  history: { replaceState() {} },
  localStorage: { getItem: () => "", setItem() {}, removeItem() {} },
  window: { addEventListener() {} },
  fetch: async () => ({ ok: true, json: async () => context.answer }),
};
vm.createContext(context);
for (const file of ["times.js", "chat.js", "chat_view.js", "app.js"]) {
  vm.runInContext(fs.readFileSync(path.join(process.argv[2], file), "utf8"), context, { filename: file });
}
vm.runInContext(`(async () => (${process.argv[3]}))()`, context).then(
  (result) => console.log(JSON.stringify(result)),
  (error) => { console.error(error); process.exit(1); },
);
"""


def run_console(tmp_path: Path, expression: str) -> Any:
    """The JSON value of `expression`, evaluated in the console's scripts under Node in UTC."""
    harness = tmp_path / "harness.js"
    harness.write_text(HARNESS)
    assert NODE is not None
    completed = subprocess.run(
        [NODE, str(harness), str(CONSOLE_DIR), expression],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "TZ": "UTC", "LC_ALL": "en_US.UTF-8"},
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout)


def test_time_parts_replace_each_instant_and_keep_the_rest(tmp_path: Path) -> None:
    result = run_console(
        tmp_path,
        """{
          near: timeParts("compaction expected at 2026-03-25T08:08:30+00:00"),
          two: timeParts("from 2026-03-25T08:08:30.123456+00:00 to 2026-03-25T09:00:00Z."),
          invalid: timeParts("at 2026-13-45T08:08:30Z"),
          plain: timeParts("context budget critical (18.0 % left)"),
          empty: timeParts(""),
          local: when("2026-03-25T08:08:30+00:00"),
          expected: new Date("2026-03-25T08:08:30+00:00").toLocaleString(),
          none: when(""),
        }""",
    )

    assert "8:08:30" in result["local"] and "T" not in result["local"]
    assert result["local"] == result["expected"]
    assert result["near"] == [
        "compaction expected at ",
        {"iso": "2026-03-25T08:08:30+00:00", "text": result["local"]},
    ]
    assert [part if isinstance(part, str) else part["iso"] for part in result["two"]] == [
        "from ",
        "2026-03-25T08:08:30.123456+00:00",
        " to ",
        "2026-03-25T09:00:00Z",
        ".",
    ]
    assert result["invalid"] == ["at 2026-13-45T08:08:30Z"]
    assert result["plain"] == ["context budget critical (18.0 % left)"]
    assert (result["empty"], result["none"]) == ([], "—")


def test_thread_page_shows_the_handoff_reasons_time_locally_with_the_iso_on_hover(tmp_path: Path) -> None:
    iso = "2026-03-25T08:08:30+00:00"
    page = {
        "thread_id": "th-1",
        "title": "North line",
        "node_id": "node-a",
        "context": {
            "percent": 31,
            "level": "urgent",
            "reported": True,
            "compaction_expected_at": iso,
            "last_compaction_at": None,
            "must_finish_before_compaction": False,
            "updated_at": "2026-03-25T08:00:00Z",
        },
        "handoff_status": "required",
        "handoff_package_id": "hp-1",
        "handoff_reason": f"compaction expected at {iso}",
        "wrap_up_checklist": [],
        "project_ids": ["proj-1"],
    }
    result = run_console(
        tmp_path,
        f"""(async () => {{
          answer = {json.dumps(page)};
          const view = new FakeNode("main");
          await renderThread(view, "th-1");
          return {{
            handoff: shape(byId(view, "handoff")),
            text: byId(view, "handoff").textContent,
            budget: byId(view, "budget").textContent,
            local: when("{iso}"),
          }};
        }})()""",
    )

    assert result["handoff"]["attributes"] == {"id": "handoff", "data-status": "required"}
    assert result["handoff"]["children"] == [
        "required hp-1",
        " — ",
        "compaction expected at ",
        {"tag": "time", "attributes": {"datetime": iso, "title": iso}, "children": [result["local"]]},
    ]
    assert result["text"] == f"required hp-1 — compaction expected at {result['local']}"
    assert iso not in result["text"] and iso not in result["budget"]
