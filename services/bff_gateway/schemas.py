"""JSON shapes of the gateway's REST API (pydantic models; OpenAPI is generated from them).

Field names are the seed's (SPEC CB-6, CB-10, CB-14) and equal the proto field names, so an error
from context_budget names the same field the caller sent.

Validation rules beyond the JSON Schema types (see research/toolchain.md §6 for why):

- Number fields take JSON numbers only: pydantic's lax mode would turn `true` into 1 and `"37"` into
  37; both are rejected here. Non-finite values (`NaN`, `Infinity`, which Python's JSON parser
  accepts) are rejected too. Integers may be written `5.0` (JSON Schema counts that as an integer).
- Bounds are `Field(ge=..., le=...)` defaults, so OpenAPI shows `minimum` / `maximum`. Token counts
  and versions stop at 2**53 - 1 (exact in JavaScript and in the OpenAPI document).
- Instants are RFC 3339 strings with a `Z` or `±hh:mm` offset; they are converted to UTC. Numbers
  (Unix times) and offset-less strings are rejected.
- Text must be valid UTF-8 without NUL characters (PostgreSQL text cannot hold NUL).
- Unknown fields are rejected, so a misspelt optional field is an error, not silently dropped.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, StrictBool

INT32_MAX = 2**31 - 1
# Largest integer a JSON number keeps exactly in JavaScript (and in OpenAPI, whose bounds FastAPI
# writes as doubles); the int64/uint64 proto fields take at most this from JSON.
JSON_SAFE_INTEGER_MAX = 2**53 - 1
ID_MAX_LENGTH = 200
REASON_MAX_LENGTH = 2000
FOLDER_MAX_LENGTH = 4096

ContextBudgetLevelName = Literal["safe", "watch", "urgent", "critical"]
SourceKindName = Literal["codex_app_server", "codex_sdk", "worker_estimator"]
CompactionLimitSourceName = Literal["configured", "model_default", "assumed"]
MasterActionName = Literal[
    "refresh_stage_summary",
    "avoid_large_context_append",
    "prepare_handoff",
    "finish_current_subtask",
    "precreate_relay_thread",
    "run_pre_compaction_wrap_up",
    "freeze_context_growth",
]
AlertTypeName = Literal[
    "context_watch", "context_urgent", "context_critical", "compaction_risk", "handoff_missing"
]
AlertStatusName = Literal["opened", "acked", "resolved"]
ChecklistStatusName = Literal["done", "missing", "pending"]

CHECKLIST_LABELS: dict[str, str] = {
    "files_touched": "Files touched by the current change",
    "patches": "Patches done and not done",
    "last_key_command": "The last key command and its result",
    "last_test_run": "The last test conclusion",
    "open_questions": "Open questions",
    "next_actions": "Suggested next actions for the next thread",
    "evidence_links": "Links to required evidence",
}
"""The CB-18 wrap-up checklist items in the spec's order: key (the scheduler's item name, also the
conversations projection's key) -> the label shown to a person. Same labels as the projection's
(services/conversations/domain/model.py CHECKLIST_ITEMS)."""

_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")


def _json_number(value: Any) -> Any:
    """Lets JSON numbers through (None too, for optional fields); rejects booleans, strings and
    non-finite floats, which pydantic's lax mode would otherwise coerce or accept."""
    if value is None:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a JSON number")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _rfc3339_text(value: Any) -> Any:
    """Lets RFC 3339 strings with an offset through (None too); rejects everything else."""
    if value is None:
        return value
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise ValueError("must be an RFC 3339 timestamp with offset, e.g. 2026-03-25T15:56:00+08:00")
    return value


def _to_utc(value: datetime | None) -> datetime | None:
    """The same instant in UTC. Raises ValueError when UTC falls outside years 1-9999."""
    if value is None:
        return value
    try:
        return value.astimezone(UTC)
    except OverflowError as error:
        raise ValueError("instant out of range (years 1-9999 in UTC)") from error


def _clean_text(value: str | None) -> str | None:
    """Rejects text that cannot be stored as UTF-8 or holds NUL characters."""
    if value is None:
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ValueError("must be valid UTF-8 text") from error
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Number = Annotated[float, BeforeValidator(_json_number)]
OptionalInteger = Annotated[int | None, BeforeValidator(_json_number)]
Integer = Annotated[int, BeforeValidator(_json_number)]
Instant = Annotated[AwareDatetime, BeforeValidator(_rfc3339_text), AfterValidator(_to_utc)]
OptionalInstant = Annotated[AwareDatetime | None, BeforeValidator(_rfc3339_text), AfterValidator(_to_utc)]
Text = Annotated[str, AfterValidator(_clean_text)]
OptionalText = Annotated[str | None, AfterValidator(_clean_text)]


class ThreadContextReport(BaseModel):
    """Body of `POST /api/v1/workers/{worker_id}/thread-context`: one reading of one Codex
    thread's context budget (seed §5.2, SPEC CB-6/CB-10, plus the raw figures of SPEC D-1)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "node_id": "mac-01",
                    "worker_id": "worker-mac-01",
                    "thread_id": "thread-abc",
                    "project_id": "proj-001",
                    "task_id": "task-017",
                    "source_kind": "worker_estimator",
                    "context_budget_remaining_pct": 37,
                    "context_budget_level": "urgent",
                    "compaction_expected_at": "2026-03-25T16:08:30+08:00",
                    "must_finish_before_compaction": True,
                    "estimated_remaining_turns": 5,
                    "estimated_remaining_large_messages": 2,
                    "last_compaction_at": "2026-03-25T15:12:10+08:00",
                    "compaction_count": 1,
                    "captured_at": "2026-03-25T15:56:00+08:00",
                }
            ]
        },
    )

    node_id: Text = Field(min_length=1, max_length=ID_MAX_LENGTH, description="The reporting machine.")
    worker_id: Text = Field(
        min_length=1, max_length=ID_MAX_LENGTH, description="The reporting worker; must equal the path's."
    )
    thread_id: Text = Field(min_length=1, max_length=ID_MAX_LENGTH, description="The Codex thread's id.")
    project_id: OptionalText = Field(
        default=None,
        max_length=ID_MAX_LENGTH,
        description="Optional until the thread is placed in a project.",
    )
    task_id: OptionalText = Field(
        default=None, max_length=ID_MAX_LENGTH, description="The task the thread runs."
    )
    source_kind: SourceKindName = Field(description="Where the figures come from (SPEC D-4).")
    context_budget_remaining_pct: Number = Field(
        ge=0, le=100, description="Percent 0-100 of the usable room left before Codex compacts (SPEC D-1)."
    )
    context_budget_level: ContextBudgetLevelName | None = Field(
        default=None, description="The worker's own level: recorded, never trusted (the server classifies)."
    )
    compaction_expected_at: OptionalInstant = Field(
        default=None, description="When the worker expects Codex to compact (RFC 3339; SPEC D-2)."
    )
    must_finish_before_compaction: StrictBool = Field(
        default=False, description="The thread holds something to make durable before it compacts (CB-8)."
    )
    estimated_remaining_turns: OptionalInteger = Field(
        default=None, ge=0, le=INT32_MAX, description="Turns left at the observed growth; null when unknown."
    )
    estimated_remaining_large_messages: OptionalInteger = Field(
        default=None, ge=0, le=INT32_MAX, description="Large (8,000-token) messages that still fit."
    )
    last_compaction_at: OptionalInstant = Field(
        default=None, description="When Codex last compacted (RFC 3339)."
    )
    compaction_count: Integer = Field(default=0, ge=0, le=INT32_MAX, description="Compactions seen so far.")
    captured_at: Instant = Field(description="When the reading was taken (RFC 3339 with offset).")
    snapshot_id: OptionalText = Field(
        default=None,
        max_length=ID_MAX_LENGTH,
        description="Unique id of this reading; derived by the server when absent.",
    )
    snapshot_version: Integer = Field(
        default=0, ge=0, le=JSON_SAFE_INTEGER_MAX, description="Worker-side version, increasing per thread."
    )
    last_total_tokens: Integer = Field(
        default=0,
        ge=0,
        le=JSON_SAFE_INTEGER_MAX,
        description="T: the last model response's total tokens; 0 when unknown.",
    )
    model_context_window: Integer = Field(
        default=0,
        ge=0,
        le=JSON_SAFE_INTEGER_MAX,
        description="W: Codex's model_context_window in tokens; 0 when unknown.",
    )
    auto_compact_token_limit: Integer = Field(
        default=0,
        ge=0,
        le=JSON_SAFE_INTEGER_MAX,
        description="L: the auto-compact token limit; 0 when unknown.",
    )
    codex_context_left_pct: OptionalInteger = Field(
        default=None, ge=0, le=100, description="Codex's own displayed '% context left' (0-100)."
    )
    must_finish_reason: OptionalText = Field(
        default=None, max_length=REASON_MAX_LENGTH, description="Why must_finish_before_compaction is set."
    )
    codex_folder: OptionalText = Field(
        default=None, max_length=FOLDER_MAX_LENGTH, description="The Codex working folder of the thread."
    )
    compaction_limit_source: CompactionLimitSourceName | None = Field(
        default=None, description="Where auto_compact_token_limit came from; null when not said."
    )
    awaiting_reading_after_compaction: StrictBool = Field(
        default=False,
        description=(
            "Codex compacted after the thread's last reading: 'compacted, waiting for the first reading' "
            "(last_total_tokens 0, codex_context_left_pct null, the percent 100)."
        ),
    )


class ThreadContextReportAck(BaseModel):
    """Answer to a report (seed §5.2 response, SPEC CB-10), plus whether it changed anything."""

    accepted: bool = Field(description="True when the snapshot was valid.")
    thread_id: str
    context_budget_level: ContextBudgetLevelName | None = Field(
        description="The server's level for the thread's current state."
    )
    next_required_report_in_seconds: int = Field(
        description="Report again within this many seconds (CB-9: 30 safe, 15 watch, 5 urgent or critical)."
    )
    master_actions: list[MasterActionName] = Field(
        description="What the master agent asks of the thread now."
    )
    duplicate: bool = Field(description="This snapshot was already stored: nothing changed.")
    superseded: bool = Field(
        description="The thread already had a newer reading: kept in history, current state unchanged."
    )


class ThreadContextAlertView(BaseModel):
    """One open (or acknowledged) alert of a thread (CB-6 `thread_context_alerts`)."""

    alert_id: str
    alert_type: AlertTypeName | None
    alert_status: AlertStatusName | None
    opened_at: datetime | None = Field(description="UTC.")
    reason: str


class ChecklistItemView(BaseModel):
    """One line of the pre-compaction wrap-up checklist (SPEC CB-18). The same shape everywhere a
    checklist is answered: `wrap_up_checklist` of `GET /api/v1/threads/{id}/context-budget` (from the
    scheduler) and of `GET /api/v1/threads/{id}/context-summary` (from the conversations
    projection), and `checklist` of a handoff package."""

    key: str = Field(
        description=(
            "Stable item key: files_touched, patches, last_key_command, last_test_run, "
            "open_questions, next_actions, evidence_links."
        )
    )
    label: str = Field(description="The item in words, for a person.")
    status: ChecklistStatusName = Field(
        description=(
            "done: the handoff package holds it; missing: the worker looked for it and did not find "
            "it (the package was made without it); pending: not gathered yet."
        )
    )
    detail: str = Field(description="What was found, or why it is missing, in words; may be empty.")


class ThreadContextBudgetView(BaseModel):
    """Body of `GET /api/v1/threads/{thread_id}/context-budget` (SPEC CB-14). Instants are UTC
    (RFC 3339 with `Z`); figures that were never reported are null."""

    thread_id: str
    project_id: str | None
    node_id: str
    context_budget_remaining_pct: float = Field(description="Percent 0-100 (SPEC D-1).")
    context_budget_level: ContextBudgetLevelName | None = Field(description="The server's level.")
    compaction_expected_at: datetime | None
    last_compaction_at: datetime | None
    compaction_count: int
    must_finish_before_compaction: bool
    must_finish_reason: str | None
    estimated_remaining_turns: int | None
    estimated_remaining_large_messages: int | None
    codex_context_left_pct: int | None
    last_total_tokens: int | None = Field(description="Tokens; null when unknown.")
    model_context_window: int | None = Field(description="Tokens; null when unknown.")
    auto_compact_token_limit: int | None = Field(description="Tokens; null when unknown.")
    compaction_limit_source: CompactionLimitSourceName | None = Field(
        default=None,
        description=(
            "Where auto_compact_token_limit came from: configured (Codex's config.toml), model_default "
            "(Codex's default for the model) or assumed (what decides it could not be seen); null "
            "when not reported."
        ),
    )
    awaiting_reading_after_compaction: bool = Field(
        default=False,
        description=(
            "Codex compacted the thread after its last reading: 'compacted, waiting for the first "
            "reading' (last_total_tokens and codex_context_left_pct are null, the percent is 100)."
        ),
    )
    source_kind: SourceKindName | None
    captured_at: datetime | None
    updated_at: datetime | None = Field(description="When the server committed the latest reading.")
    next_required_report_in_seconds: int
    master_actions: list[MasterActionName]
    open_alerts: list[ThreadContextAlertView]
    wrap_up_checklist: list[ChecklistItemView] = Field(
        description=(
            "The current pre-compaction wrap-up checklist (CB-18) from the scheduler's handoff "
            "package, in the spec's order; empty while the thread has no package."
        )
    )
    handoff_package: dict[str, Any] | None = Field(
        description="The thread's handoff package and its status; filled by the scheduler, null when none."
    )


class HealthStatus(BaseModel):
    """Body of `/healthz` and `/readyz`."""

    status: Literal["ok", "ready"]
    checks: dict[str, str] = Field(
        default_factory=dict, description="Per dependency: its gRPC health status."
    )
