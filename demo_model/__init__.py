"""Boss's built-in demo model: an offline stand-in for the OpenAI Responses API that real Codex talks to.

It is **not a real model**. Every reply says so ("Demo model (not a real model): you said: …"), and
so does the provider name in the Codex home it writes ("Boss demo model (not a real model)"). It
exists so that `make run` and the test suite can drive the real Codex CLI with no network and no
account: threads created this way are real Codex threads whose session files are exactly what
Codex writes, their context grows turn by turn into real compactions, and each failure Boss must
report can be produced on demand.

What it serves (Codex 0.169, ``real-codex.md`` §2-3): ``POST /v1/responses`` streaming Server-Sent
Events (``response.created``, ``response.output_item.added``, ``response.output_text.delta``,
``response.output_item.done``, ``response.completed`` with ``usage``); 426 to the WebSocket attempt
``GET /v1/responses``; a summary for compaction requests (local: the last input item is a user
message starting "You are performing a CONTEXT CHECKPOINT COMPACTION"; remote v2: it is a
``compaction_trigger``).

Replies: :func:`demo_model.responses.reply_text` of the person's latest message, e.g.
``Demo model (not a real model): you said: fix the flaky test``.

Usage: ``input_tokens = base_tokens + turn_tokens x (user messages since the last compaction
summary)``, ``output_tokens`` constant (defaults 12,000 / 2,000 / 100: a 32,000-token window goes
through watch, urgent and critical and compacts before turn 10; :mod:`demo_model.usage`).

Markers: written anywhere in the person's latest message, they switch the answer to that turn
(every request of the turn, until the next message):

- ``[[demo:http500]]``: HTTP 500 with an OpenAI-style error body (Codex: the turn fails; the demo
  home allows no retries);
- ``[[demo:http400]]``: HTTP 400 with an error body (the turn fails with the body as its message);
- ``[[demo:http429]]``: HTTP 429, rate limited (the turn fails);
- ``[[demo:response_failed]]``: ``response.created``, then ``response.failed`` (the turn fails,
  "stream disconnected before completion");
- ``[[demo:stall]]``: ``response.created``, then nothing, until the client goes away (Codex waits,
  up to its own idle timeout when one is set);
- ``[[demo:slow=SECONDS]]``: waits SECONDS (at most 3,600) before answering normally;
- ``[[demo:no_reply]]``: a completed response with no output item (the turn ends without an agent
  message);
- ``[[demo:shell=CMD]]``: one ``exec_command`` tool call running CMD (everything up to the first
  ``]]``); after Codex sends its output back, the reply
  ``Demo model (not a real model): ran `CMD` (exit code N); you said: …``.

An unknown marker, or a value that does not parse, is ignored. With several failure markers the
first wins.

Entry points:

- ``python -m demo_model serve --host 127.0.0.1 --port 8123 [--base-tokens N --turn-tokens N]``;
- ``python -m demo_model write-home --codex-home DIR --base-url http://127.0.0.1:8123/v1``;
- :class:`DemoModelServer` in-process on a free port (``with DemoModelServer() as server:``);
- :func:`write_codex_home` and :func:`demo_model_environment` for the Codex home and environment.

Server side only: the device worker never imports this package.
"""

from demo_model.codex_home import demo_model_environment, write_codex_home
from demo_model.responses import REPLY_PREFIX, reply_text, tool_reply_text
from demo_model.server import DemoModelServer
from demo_model.usage import UsageModel

__all__ = [
    "REPLY_PREFIX",
    "DemoModelServer",
    "UsageModel",
    "demo_model_environment",
    "reply_text",
    "tool_reply_text",
    "write_codex_home",
]
