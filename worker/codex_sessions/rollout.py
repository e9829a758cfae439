"""Typed records for one line of a Codex rollout file (``$CODEX_HOME/sessions/**/rollout-*.jsonl``).

Pure parsing, no I/O. Each line is ``{"timestamp": "<UTC ISO-8601>", "type": ..., "payload": {...}}``
(``RolloutLine`` in codex-rs/protocol/src/protocol.rs:2996-3001; ``RolloutItem`` at :2845-2853; see
``research/codex-context.md`` §3), since 0.15x with an ``ordinal`` and, on ``response_item`` lines, a
``metadata`` object. The format is observed, not a versioned contract, so anything this module does
not know becomes an :class:`UnknownRecord` instead of an error; only lines that cannot be what Codex
writes (not JSON, no timestamp, a known record with ill-typed fields) raise :class:`RolloutParseError`.

Both vocabularies are read (``research/real-codex.md`` §4):

- Codex 0.104-0.153: ``event_msg`` ``user_message``, ``agent_message``, ``context_compacted``;
- Codex 0.169: ``event_msg`` ``item_completed`` whose ``item.type`` is ``UserMessage``,
  ``AgentMessage``, ``CommandExecution`` or ``ContextCompaction`` (other item types are unknown), the
  top-level ``token_usage_record`` and ``world_state`` lines, and the assistant message carrying
  ``metadata.compaction_output = true`` (the summary a local compaction request returned).

``token_count``, ``compacted``, ``turn_context``, ``session_meta``, ``task_started`` /
``task_complete`` and the tool calls are common to both.
"""

import json
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

_THREAD_ID_IN_NAME = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl(?:\.zst)?$", re.IGNORECASE
)
_SHELL_WRAPPERS = frozenset({"bash", "sh", "zsh", "/bin/bash", "/bin/sh", "/bin/zsh", "/usr/bin/bash"})
_SHELL_FLAGS = frozenset({"-c", "-lc", "-l", "-ic"})
_EXIT_CODE_PATTERNS = (
    re.compile(r"^Exit code: (-?\d+)\s*$", re.MULTILINE),
    re.compile(r"^Process exited with code (-?\d+)\s*$", re.MULTILINE),
)


class RolloutParseError(ValueError):
    """A rollout line that is not valid Codex output; the message names the problem."""


@dataclass(frozen=True)
class TokenUsage:
    """One ``TokenUsage`` object (codex-rs/protocol/src/protocol.rs:2114-2240), all counts in tokens.

    ``total_tokens == input_tokens + output_tokens`` for model responses; cached input is part of input
    and reasoning is part of output. Newer fields (e.g. ``cache_write_input_tokens``) are ignored.
    """

    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    reasoning_output_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class GitInfo:
    """``session_meta.git``: the repository Codex saw when the session started (all optional)."""

    commit_hash: str | None
    branch: str | None
    repository_url: str | None


@dataclass(frozen=True)
class SessionMetaRecord:
    """``session_meta``: written once at the top of a rollout (protocol.rs:2786-2843). Has no model."""

    timestamp: datetime
    thread_id: str
    cwd: str | None
    cli_version: str | None
    originator: str | None
    model_provider: str | None
    forked_from_id: str | None
    git: GitInfo | None


@dataclass(frozen=True)
class TurnContextRecord:
    """``turn_context``: the model and folder of a turn; also written after a mid-turn compaction."""

    timestamp: datetime
    turn_id: str | None
    cwd: str | None
    model: str | None


@dataclass(frozen=True)
class TokenCountRecord:
    """``event_msg`` ``token_count``: usage after a model response (or a re-emit, or an estimate).

    ``info: null`` (before the first response) gives a record whose three usage fields are None.
    ``model_context_window`` is W in tokens (already 95 % of the full window).
    """

    timestamp: datetime
    last_token_usage: TokenUsage | None
    total_token_usage: TokenUsage | None
    model_context_window: int | None

    @property
    def has_info(self) -> bool:
        """True when the line carried ``info`` with a ``last_token_usage``."""
        return self.last_token_usage is not None


@dataclass(frozen=True)
class CompactedRecord:
    """``compacted``: Codex replaced the history with a summary (empty message for remote compaction).

    ``compaction_response_id`` (0.169) is the response id of the compaction request; None before.
    """

    timestamp: datetime
    message: str
    replacement_history_items: int
    compaction_response_id: str | None = None


@dataclass(frozen=True)
class ContextCompactionItemRecord:
    """``event_msg`` ``item_completed`` with a ``ContextCompaction`` item (0.169): a compaction ended."""

    timestamp: datetime
    item_id: str | None


@dataclass(frozen=True)
class CompactionSummaryRecord:
    """The assistant message a local compaction request returned (``metadata.compaction_output``).

    It is written just before that request's own ``token_usage_record`` and ``token_count``, so it
    tells that the next token_count is the compaction request's usage, not a turn's (0.169).
    """

    timestamp: datetime


@dataclass(frozen=True)
class ResponseUsageRecord:
    """``token_usage_record`` (0.15x+): one model response's usage and the thread's running total.

    Attributes:
        response_id: the model response's id (``compacted.compaction_response_id`` names one).
        usage: that response's usage (tokens).
        thread_token_usage: every request of the thread so far, compaction requests included
            (what ``codex exec --json`` reports as ``turn.completed.usage``); None when absent.
    """

    timestamp: datetime
    response_id: str | None
    usage: TokenUsage
    thread_token_usage: TokenUsage | None


@dataclass(frozen=True)
class WorldStateRecord:
    """``world_state`` (0.169): the state Codex gives the model; ``model`` is the thread's model slug."""

    timestamp: datetime
    model: str | None


@dataclass(frozen=True)
class CommandExecutionRecord:
    """``event_msg`` ``item_completed`` with a ``CommandExecution`` item (0.169): a command Codex ran.

    Attributes:
        call_id: the item's id, the ``call_id`` of the tool call that ran it (none for a command the
            user ran directly).
        argv: the command line as run (e.g. ``["/bin/bash", "-lc", "pytest -q"]``).
        status: e.g. ``completed``, ``failed``.
        exit_code: the command's exit code, None when Codex gives none.
        output: the command's own output (``aggregated_output``).
    """

    timestamp: datetime
    call_id: str | None
    argv: tuple[str, ...]
    status: str | None
    exit_code: int | None
    output: str

    @property
    def command(self) -> str:
        """The command as one shell string (the script itself for ``bash -lc <script>``)."""
        return _command_from_argv(self.argv)


@dataclass(frozen=True)
class ContextCompactedRecord:
    """``event_msg`` ``context_compacted``: the legacy event emitted for the same compaction."""

    timestamp: datetime


@dataclass(frozen=True)
class TaskStartedRecord:
    """``event_msg`` ``task_started`` (a user turn began); carries W in tokens when known."""

    timestamp: datetime
    turn_id: str | None
    model_context_window: int | None


@dataclass(frozen=True)
class TaskCompleteRecord:
    """``event_msg`` ``task_complete`` (a user turn ended)."""

    timestamp: datetime
    turn_id: str | None
    last_agent_message: str | None


@dataclass(frozen=True)
class UserMessageRecord:
    """The text the user sent: ``event_msg`` ``user_message``, or a ``UserMessage`` item (0.169)."""

    timestamp: datetime
    message: str


@dataclass(frozen=True)
class AgentMessageRecord:
    """Text the agent showed: ``event_msg`` ``agent_message``, or an ``AgentMessage`` item (0.169)."""

    timestamp: datetime
    text: str


@dataclass(frozen=True)
class FunctionCallRecord:
    """``response_item`` ``function_call``: a tool call; ``arguments`` is the raw JSON string."""

    timestamp: datetime
    name: str
    arguments: str
    call_id: str

    @property
    def command(self) -> str | None:
        """The shell command this call runs, None for non-shell tools (:func:`command_from_arguments`)."""
        return command_from_arguments(self.arguments)


@dataclass(frozen=True)
class FunctionCallOutputRecord:
    """``response_item`` ``function_call_output``: the result text of the call with ``call_id``."""

    timestamp: datetime
    call_id: str
    output: str

    @property
    def exit_code(self) -> int | None:
        """Exit code reported in the output text, when there is one (see :func:`exit_code_from_output`)."""
        return exit_code_from_output(self.output)


@dataclass(frozen=True)
class CustomToolCallRecord:
    """``response_item`` ``custom_tool_call`` (e.g. ``apply_patch``); ``input`` is the raw tool input."""

    timestamp: datetime
    name: str
    input: str
    call_id: str
    status: str | None


@dataclass(frozen=True)
class CustomToolCallOutputRecord:
    """``response_item`` ``custom_tool_call_output``: the result text of a custom tool call."""

    timestamp: datetime
    call_id: str
    output: str

    @property
    def exit_code(self) -> int | None:
        """Exit code reported in the output text, when there is one."""
        return exit_code_from_output(self.output)


@dataclass(frozen=True)
class LocalShellCallRecord:
    """``response_item`` ``local_shell_call``: an ``exec`` action; its output is a function_call_output."""

    timestamp: datetime
    call_id: str | None
    argv: tuple[str, ...]
    status: str | None
    working_directory: str | None

    @property
    def command(self) -> str:
        """The command as one shell string (the script itself for ``bash -lc <script>``)."""
        return _command_from_argv(self.argv)


@dataclass(frozen=True)
class UnknownRecord:
    """Any line this module does not model (other record or payload types, newer Codex additions)."""

    timestamp: datetime
    record_type: str
    payload_type: str | None


RolloutRecord = (
    SessionMetaRecord
    | TurnContextRecord
    | TokenCountRecord
    | CompactedRecord
    | ContextCompactedRecord
    | ContextCompactionItemRecord
    | CompactionSummaryRecord
    | ResponseUsageRecord
    | WorldStateRecord
    | CommandExecutionRecord
    | TaskStartedRecord
    | TaskCompleteRecord
    | UserMessageRecord
    | AgentMessageRecord
    | FunctionCallRecord
    | FunctionCallOutputRecord
    | CustomToolCallRecord
    | CustomToolCallOutputRecord
    | LocalShellCallRecord
    | UnknownRecord
)
"""Every record :func:`parse_rollout_line` can return."""


def parse_rollout_line(line: str) -> RolloutRecord:
    """Parse one rollout JSONL line (without or with its trailing newline) into a typed record.

    Raises:
        RolloutParseError: the line is not a JSON object, has no valid ``timestamp`` or ``type``, or
            a known record has a missing or ill-typed required field.
    """
    try:
        document = json.loads(line)
    except json.JSONDecodeError as error:
        raise RolloutParseError(f"not valid JSON: {error.msg} at column {error.colno}") from error
    if not isinstance(document, dict):
        raise RolloutParseError(f"expected a JSON object, got {type(document).__name__}")
    timestamp = parse_timestamp(document.get("timestamp"))
    record_type = document.get("type")
    if not isinstance(record_type, str):
        raise RolloutParseError("missing or non-string 'type'")
    payload = document.get("payload")
    if record_type == "response_item" and _is_compaction_output(payload, document.get("metadata")):
        return CompactionSummaryRecord(timestamp)
    parser = _TOP_LEVEL_PARSERS.get(record_type)
    if parser is None:
        payload_type = payload.get("type") if isinstance(payload, dict) else None
        return UnknownRecord(timestamp, record_type, payload_type if isinstance(payload_type, str) else None)
    if not isinstance(payload, dict):
        if record_type in _LENIENT_TYPES:
            return UnknownRecord(timestamp, record_type, None)
        raise RolloutParseError(f"'{record_type}' line has no payload object")
    return parser(timestamp, payload)


def parse_timestamp(value: object) -> datetime:
    """Parse a rollout ``timestamp`` (e.g. ``"2026-02-23T11:41:32.239Z"``) into an aware UTC datetime.

    A timestamp without an offset is taken as UTC (Codex always writes UTC with ``Z``).

    Raises:
        RolloutParseError: the value is missing, not a string, or not ISO-8601.
    """
    if not isinstance(value, str):
        raise RolloutParseError("missing or non-string 'timestamp'")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as error:
        raise RolloutParseError(f"invalid timestamp {value!r}") from error
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC)


def thread_id_from_rollout_name(file_name: str) -> str | None:
    """The thread uuid at the end of a rollout file name (``rollout-<local time>-<uuid>.jsonl``).

    Naming from ``precompute_log_file_info`` in codex-rs/rollout/src/recorder.rs:1320-1349. Returns
    the lower-case uuid, or None when the name does not end with one.
    """
    match = _THREAD_ID_IN_NAME.search(file_name)
    return match.group(1).lower() if match else None


def command_from_arguments(arguments: str) -> str | None:
    """The shell command in a function call's JSON ``arguments``, or None for non-shell tools.

    Recognised shapes: ``{"cmd": "pytest -q"}`` (``exec_command``), ``{"command": "pytest -q"}``
    (``shell_command``) and ``{"command": ["bash", "-lc", "pytest -q"]}`` (``shell``). A
    ``bash -lc <script>`` wrapper is reduced to its script.
    """
    try:
        decoded = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    if not isinstance(decoded, dict):
        return None
    for key in ("cmd", "command"):
        value = decoded.get(key)
        if isinstance(value, str) and value.strip():
            return value
        if isinstance(value, list) and value and all(isinstance(part, str) for part in value):
            return _command_from_argv(tuple(value))
    return None


def exit_code_from_output(output: str) -> int | None:
    """The exit code a tool output reports, or None when it reports none.

    Recognised shapes: the JSON ``{"output": ..., "metadata": {"exit_code": N}}`` of the older
    ``shell`` tool, and the text headers ``Exit code: N`` (shell tools) and
    ``Process exited with code N`` (``exec_command``).
    """
    stripped = output.lstrip()
    if stripped.startswith("{"):
        try:
            decoded = json.loads(stripped)
        except json.JSONDecodeError:
            decoded = None
        if isinstance(decoded, dict):
            metadata = decoded.get("metadata")
            if isinstance(metadata, dict) and _is_int(metadata.get("exit_code")):
                return int(metadata["exit_code"])
    for pattern in _EXIT_CODE_PATTERNS:
        match = pattern.search(output)
        if match:
            return int(match.group(1))
    return None


def _command_from_argv(argv: tuple[str, ...]) -> str:
    """Join an argv into one command string, unwrapping ``bash -lc <script>``."""
    if len(argv) == 3 and argv[0] in _SHELL_WRAPPERS and argv[1] in _SHELL_FLAGS:
        return argv[2]
    return shlex.join(argv)


def _is_int(value: object) -> bool:
    """True for JSON integers (bools excluded)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_str(payload: dict[str, Any], key: str) -> str | None:
    """``payload[key]`` when it is a string, else None."""
    value = payload.get(key)
    return value if isinstance(value, str) else None


def _required_str(payload: dict[str, Any], key: str, context: str) -> str:
    """``payload[key]`` as a string.

    Raises:
        RolloutParseError: the field is missing or not a string.
    """
    value = payload.get(key)
    if not isinstance(value, str):
        raise RolloutParseError(f"{context}: missing or non-string '{key}'")
    return value


def _optional_int(payload: dict[str, Any], key: str, context: str) -> int | None:
    """``payload[key]`` as an int, None when absent or null.

    Raises:
        RolloutParseError: the field is present but not an integer.
    """
    value = payload.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise RolloutParseError(f"{context}: '{key}' is not an integer")
    return int(value)


def _text_of(value: object) -> str:
    """Tool output as text: a string, a list of content items (their ``text``), or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = [item.get("text") for item in value if isinstance(item, dict)]
        return "\n".join(part for part in parts if isinstance(part, str))
    if isinstance(value, dict):
        content = value.get("content")
        if isinstance(content, str):
            return content
        return _text_of(content) if isinstance(content, list) else ""
    return ""


def _parse_token_usage(value: object, context: str) -> TokenUsage:
    """Parse a ``TokenUsage`` object; components default to 0, ``total_tokens`` is required.

    Raises:
        RolloutParseError: not an object, ``total_tokens`` missing, or a component is not an integer.
    """
    if not isinstance(value, dict):
        raise RolloutParseError(f"{context}: expected a token usage object")
    total = _optional_int(value, "total_tokens", context)
    if total is None:
        raise RolloutParseError(f"{context}: missing 'total_tokens'")
    return TokenUsage(
        input_tokens=_optional_int(value, "input_tokens", context) or 0,
        cached_input_tokens=_optional_int(value, "cached_input_tokens", context) or 0,
        output_tokens=_optional_int(value, "output_tokens", context) or 0,
        reasoning_output_tokens=_optional_int(value, "reasoning_output_tokens", context) or 0,
        total_tokens=total,
    )


def _is_compaction_output(payload: object, metadata: object) -> bool:
    """True for the assistant message a compaction request returned (``metadata.compaction_output``)."""
    return (
        isinstance(payload, dict)
        and payload.get("type") == "message"
        and isinstance(metadata, dict)
        and metadata.get("compaction_output") is True
    )


def _parse_session_meta(timestamp: datetime, payload: dict[str, Any]) -> SessionMetaRecord:
    """Parse a ``session_meta`` payload; ``id`` is required."""
    git = payload.get("git")
    git_info = (
        GitInfo(
            commit_hash=_optional_str(git, "commit_hash"),
            branch=_optional_str(git, "branch"),
            repository_url=_optional_str(git, "repository_url"),
        )
        if isinstance(git, dict)
        else None
    )
    return SessionMetaRecord(
        timestamp=timestamp,
        thread_id=_required_str(payload, "id", "session_meta"),
        cwd=_optional_str(payload, "cwd"),
        cli_version=_optional_str(payload, "cli_version"),
        originator=_optional_str(payload, "originator"),
        model_provider=_optional_str(payload, "model_provider"),
        forked_from_id=_optional_str(payload, "forked_from_id"),
        git=git_info,
    )


def _parse_turn_context(timestamp: datetime, payload: dict[str, Any]) -> TurnContextRecord:
    """Parse a ``turn_context`` payload (all fields optional here)."""
    return TurnContextRecord(
        timestamp=timestamp,
        turn_id=_optional_str(payload, "turn_id"),
        cwd=_optional_str(payload, "cwd"),
        model=_optional_str(payload, "model"),
    )


def _parse_compacted(timestamp: datetime, payload: dict[str, Any]) -> CompactedRecord:
    """Parse a ``compacted`` payload; windowed (newer) payloads without a message are accepted."""
    history = payload.get("replacement_history")
    return CompactedRecord(
        timestamp=timestamp,
        message=_optional_str(payload, "message") or "",
        replacement_history_items=len(history) if isinstance(history, list) else 0,
        compaction_response_id=_optional_str(payload, "compaction_response_id"),
    )


def _parse_token_usage_record(timestamp: datetime, payload: dict[str, Any]) -> RolloutRecord:
    """Parse a ``token_usage_record`` payload; one without ``usage`` becomes an :class:`UnknownRecord`."""
    usage = payload.get("usage")
    if usage is None:
        return UnknownRecord(timestamp, "token_usage_record", None)
    thread_usage = payload.get("thread_token_usage")
    return ResponseUsageRecord(
        timestamp=timestamp,
        response_id=_optional_str(payload, "response_id"),
        usage=_parse_token_usage(usage, "token_usage_record usage"),
        thread_token_usage=(
            None
            if thread_usage is None
            else _parse_token_usage(thread_usage, "token_usage_record thread_token_usage")
        ),
    )


def _parse_world_state(timestamp: datetime, payload: dict[str, Any]) -> WorldStateRecord:
    """Parse a ``world_state`` payload: only its ``state.model`` is kept."""
    state = payload.get("state")
    return WorldStateRecord(timestamp, _optional_str(state, "model") if isinstance(state, dict) else None)


def _content_text(content: object) -> str:
    """The text parts of an item's ``content`` list (``{"type": "text" | "Text", "text": ...}``) joined."""
    if not isinstance(content, list):
        return ""
    parts = [part.get("text") for part in content if isinstance(part, dict)]
    return "".join(part for part in parts if isinstance(part, str))


def _parse_item_completed(timestamp: datetime, payload: dict[str, Any]) -> RolloutRecord:
    """Parse an ``item_completed`` event (0.169) by its item's ``type``; others are unknown."""
    item = payload.get("item")
    item_type = item.get("type") if isinstance(item, dict) else None
    if not isinstance(item, dict) or not isinstance(item_type, str):
        return UnknownRecord(timestamp, "event_msg", "item_completed")
    if item_type == "UserMessage":
        return UserMessageRecord(timestamp, _content_text(item.get("content")))
    if item_type == "AgentMessage":
        return AgentMessageRecord(timestamp, _content_text(item.get("content")))
    if item_type == "ContextCompaction":
        return ContextCompactionItemRecord(timestamp, _optional_str(item, "id"))
    if item_type == "CommandExecution":
        argv = item.get("command")
        if isinstance(argv, str):
            argv = [argv]
        if not isinstance(argv, list) or not all(isinstance(part, str) for part in argv):
            raise RolloutParseError("item_completed CommandExecution: 'command' is not a list of strings")
        return CommandExecutionRecord(
            timestamp=timestamp,
            call_id=_optional_str(item, "id"),
            argv=tuple(argv),
            status=_optional_str(item, "status"),
            exit_code=_optional_int(item, "exit_code", "item_completed CommandExecution"),
            output=_optional_str(item, "aggregated_output") or "",
        )
    return UnknownRecord(timestamp, "event_msg", f"item_completed:{item_type}")


def _parse_token_count(timestamp: datetime, payload: dict[str, Any]) -> TokenCountRecord:
    """Parse a ``token_count`` event; ``info: null`` gives a record without usage."""
    info = payload.get("info")
    if info is None:
        return TokenCountRecord(timestamp, None, None, None)
    if not isinstance(info, dict):
        raise RolloutParseError("token_count: 'info' is neither an object nor null")
    total = info.get("total_token_usage")
    return TokenCountRecord(
        timestamp=timestamp,
        last_token_usage=_parse_token_usage(info.get("last_token_usage"), "token_count last_token_usage"),
        total_token_usage=(
            None if total is None else _parse_token_usage(total, "token_count total_token_usage")
        ),
        model_context_window=_optional_int(info, "model_context_window", "token_count"),
    )


def _parse_event_msg(timestamp: datetime, payload: dict[str, Any]) -> RolloutRecord:
    """Parse an ``event_msg`` payload by its own ``type``."""
    event_type = payload.get("type")
    if event_type == "token_count":
        return _parse_token_count(timestamp, payload)
    if event_type == "context_compacted":
        return ContextCompactedRecord(timestamp)
    if event_type == "task_started":
        return TaskStartedRecord(
            timestamp=timestamp,
            turn_id=_optional_str(payload, "turn_id"),
            model_context_window=_optional_int(payload, "model_context_window", "task_started"),
        )
    if event_type == "task_complete":
        return TaskCompleteRecord(
            timestamp=timestamp,
            turn_id=_optional_str(payload, "turn_id"),
            last_agent_message=_optional_str(payload, "last_agent_message"),
        )
    if event_type == "user_message":
        return UserMessageRecord(timestamp, _optional_str(payload, "message") or "")
    if event_type == "agent_message":
        return AgentMessageRecord(timestamp, _optional_str(payload, "message") or "")
    if event_type == "item_completed":
        return _parse_item_completed(timestamp, payload)
    return UnknownRecord(timestamp, "event_msg", event_type if isinstance(event_type, str) else None)


def _parse_local_shell_call(timestamp: datetime, payload: dict[str, Any]) -> RolloutRecord:
    """Parse a ``local_shell_call``; an action other than ``exec`` becomes an :class:`UnknownRecord`."""
    action = payload.get("action")
    if not isinstance(action, dict) or action.get("type") != "exec":
        return UnknownRecord(timestamp, "response_item", "local_shell_call")
    argv = action.get("command")
    if not isinstance(argv, list) or not all(isinstance(part, str) for part in argv):
        raise RolloutParseError("local_shell_call: 'action.command' is not a list of strings")
    return LocalShellCallRecord(
        timestamp=timestamp,
        call_id=_optional_str(payload, "call_id") or _optional_str(payload, "id"),
        argv=tuple(argv),
        status=_optional_str(payload, "status"),
        working_directory=_optional_str(action, "working_directory"),
    )


def _parse_response_item(timestamp: datetime, payload: dict[str, Any]) -> RolloutRecord:
    """Parse a ``response_item`` payload by its ``type``; tool calls and outputs are modelled."""
    item_type = payload.get("type")
    if item_type == "function_call":
        arguments = payload.get("arguments")
        return FunctionCallRecord(
            timestamp=timestamp,
            name=_required_str(payload, "name", "function_call"),
            arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            call_id=_required_str(payload, "call_id", "function_call"),
        )
    if item_type == "function_call_output":
        return FunctionCallOutputRecord(
            timestamp=timestamp,
            call_id=_required_str(payload, "call_id", "function_call_output"),
            output=_text_of(payload.get("output")),
        )
    if item_type == "custom_tool_call":
        return CustomToolCallRecord(
            timestamp=timestamp,
            name=_required_str(payload, "name", "custom_tool_call"),
            input=_optional_str(payload, "input") or "",
            call_id=_required_str(payload, "call_id", "custom_tool_call"),
            status=_optional_str(payload, "status"),
        )
    if item_type == "custom_tool_call_output":
        return CustomToolCallOutputRecord(
            timestamp=timestamp,
            call_id=_required_str(payload, "call_id", "custom_tool_call_output"),
            output=_text_of(payload.get("output")),
        )
    if item_type == "local_shell_call":
        return _parse_local_shell_call(timestamp, payload)
    return UnknownRecord(timestamp, "response_item", item_type if isinstance(item_type, str) else None)


_LENIENT_TYPES = frozenset({"token_usage_record", "world_state"})
"""Newer record types read for extra facts only: a shape this module does not expect is unknown, not
an error."""

_TOP_LEVEL_PARSERS: dict[str, Callable[[datetime, dict[str, Any]], RolloutRecord]] = {
    "session_meta": _parse_session_meta,
    "turn_context": _parse_turn_context,
    "compacted": _parse_compacted,
    "event_msg": _parse_event_msg,
    "response_item": _parse_response_item,
    "token_usage_record": _parse_token_usage_record,
    "world_state": _parse_world_state,
}
