"""Validation of worker snapshots: every violation is collected and named by its field path.

Rules (SPEC CB-6, D-1, D-2):

- thread_id, node_id, worker_id: required; project_id, task_id, snapshot_id optional; all at most
  200 characters without control or bidirectional formatting characters; thread_id also of the
  thread-id alphabet (services/shared/identifiers.py: no `/`, ASCII letters, digits and
  `- _ . : @ +`), so every listed thread can be opened.
- source_kind: a known value (not UNSPECIFIED, not an unknown wire number).
- context_budget_remaining_pct: finite, 0-100 (percent).
- context_budget_level (the worker's own level): unset or a known value; compaction_limit_source
  likewise.
- captured_at: required, not before 2000-01-01 and at most 5 minutes ahead of the server clock.
- compaction_expected_at: when set, between 2000-01-01 and 2100-01-01.
- last_compaction_at: when set, not before 2000-01-01 and at most 5 minutes ahead of the server clock.
- compaction_count, estimated_remaining_turns, estimated_remaining_large_messages, last_total_tokens,
  model_context_window, auto_compact_token_limit: >= 0; codex_context_left_pct: 0-100 when set.
- snapshot_version: at most 2**63 - 1 (stored as a signed 64-bit integer).
- must_finish_reason (<= 2,000 characters) and codex_folder (<= 4,096): no control characters
  (tab and newline are allowed in the reason).

Timestamps are checked as integers before any datetime is built, so absurd wire values (year 10,000,
negative nanos) are reported, never raised.
"""

from __future__ import annotations

import hashlib
import math
import re
import uuid
from datetime import UTC, datetime, timedelta

from services.context_budget.domain.model import (
    CompactionLimitSource,
    ContextBudgetLevel,
    RawTimestamp,
    Snapshot,
    SnapshotInput,
    SourceKind,
)
from services.shared.errors import FieldViolation, InvalidArgument
from services.shared.identifiers import folder_problem, id_problem, thread_id_problem

MAX_REASON_LENGTH = 2_000
MAX_SNAPSHOT_VERSION = 2**63 - 1
MAX_SNAPSHOTS_PER_MESSAGE = 1_000
FUTURE_TOLERANCE = timedelta(minutes=5)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_EXPECTED = datetime(2100, 1, 1, tzinfo=UTC)
_MICROS = 1_000_000
_EARLIEST_US = int((EARLIEST - EPOCH).total_seconds()) * _MICROS
_LATEST_EXPECTED_US = int((LATEST_EXPECTED - EPOCH).total_seconds()) * _MICROS
_FUTURE_TOLERANCE_US = int(FUTURE_TOLERANCE.total_seconds()) * _MICROS

# Wire numbers of the protobuf enums (context_budget.proto) -> domain values.
SOURCE_KINDS: dict[int, SourceKind] = {
    1: SourceKind.CODEX_APP_SERVER,
    2: SourceKind.CODEX_SDK,
    3: SourceKind.WORKER_ESTIMATOR,
}
LIMIT_SOURCES: dict[int, CompactionLimitSource] = {
    1: CompactionLimitSource.CONFIGURED,
    2: CompactionLimitSource.MODEL_DEFAULT,
    3: CompactionLimitSource.ASSUMED,
}
LEVELS: dict[int, ContextBudgetLevel] = {
    1: ContextBudgetLevel.SAFE,
    2: ContextBudgetLevel.WATCH,
    3: ContextBudgetLevel.URGENT,
    4: ContextBudgetLevel.CRITICAL,
}

# Derived snapshot ids: uuid5 in this namespace over (worker_id, thread_id, snapshot_version,
# captured_at in microseconds), so a reading re-sent without an id is recognised as a duplicate.
SNAPSHOT_ID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://boss.dev/context-budget/snapshot")
_NAMESPACE_BYTES = SNAPSHOT_ID_NAMESPACE.bytes

_CONTROL_EXCEPT_TAB_NEWLINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def check_identifier(value: str, field: str, violations: list[FieldViolation], *, required: bool) -> None:
    """Appends a violation when an id is missing (if required), longer than 200 characters or
    holds control or bidirectional formatting characters (`id_problem`)."""
    if (value or required) and (problem := id_problem(value)) is not None:
        violations.append(FieldViolation(field, problem))


def _check_text(
    value: str, field: str, limit: int, pattern: re.Pattern[str], violations: list[FieldViolation]
) -> None:
    if len(value) > limit:
        violations.append(FieldViolation(field, f"must be at most {limit} characters"))
    elif value and pattern.search(value):
        violations.append(FieldViolation(field, "must not contain control characters"))


def _micros(
    raw: RawTimestamp, field: str, low_us: int, high_us: int, high_text: str, violations: list[FieldViolation]
) -> int | None:
    """The instant of a raw timestamp in microseconds since the epoch, or None (with a violation)
    when its nanos are invalid or it lies outside [low_us, high_us]."""
    seconds, nanos = raw
    if not 0 <= nanos < 1_000_000_000:
        violations.append(FieldViolation(field, "nanos must be within 0..999,999,999"))
        return None
    micros = seconds * _MICROS + nanos // 1_000
    if micros < low_us:
        violations.append(FieldViolation(field, "must not be before 2000-01-01T00:00:00Z"))
        return None
    if micros > high_us:
        violations.append(FieldViolation(field, f"must not be later than {high_text}"))
        return None
    return micros


def _instant(micros: int) -> datetime:
    return EPOCH + timedelta(microseconds=micros)


def _check_non_negative(value: int | None, field: str, violations: list[FieldViolation]) -> None:
    if value is not None and value < 0:
        violations.append(FieldViolation(field, "must be >= 0"))


def derive_snapshot_id(worker_id: str, thread_id: str, snapshot_version: int, captured_at_us: int) -> str:
    """The stable id of a reading sent without snapshot_id: uuid5 (RFC 4122 §4.3, SHA-1) in
    SNAPSHOT_ID_NAMESPACE over "worker_id\nthread_id\nsnapshot_version\ncaptured_at", captured_at in
    microseconds since the epoch. Equal to `str(uuid.uuid5(SNAPSHOT_ID_NAMESPACE, name))`, computed
    without building UUID objects (half the time on the ingest path)."""
    name = f"{worker_id}\n{thread_id}\n{snapshot_version}\n{captured_at_us}"
    digest = bytearray(hashlib.sha1(_NAMESPACE_BYTES + name.encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def validate_snapshot(raw: SnapshotInput, *, now: datetime, prefix: str) -> Snapshot:
    """Validates one snapshot against the server clock `now` (aware UTC).

    Args:
        raw: the snapshot as sent.
        now: the server's current instant.
        prefix: the snapshot's field path, e.g. "snapshot" (unary) or "snapshots[3]" (stream).

    Returns:
        The validated snapshot, with a derived snapshot_id when the worker sent none.

    Raises:
        InvalidArgument: with every violation found, each named like `snapshots[3].captured_at`.
    """
    violations: list[FieldViolation] = []
    check_identifier(raw.thread_id, "thread_id", violations, required=True)
    if not violations and (thread_problem := thread_id_problem(raw.thread_id)) is not None:
        violations.append(FieldViolation("thread_id", thread_problem))
    check_identifier(raw.node_id, "node_id", violations, required=True)
    check_identifier(raw.worker_id, "worker_id", violations, required=True)
    check_identifier(raw.project_id, "project_id", violations, required=False)
    check_identifier(raw.task_id, "task_id", violations, required=False)
    check_identifier(raw.snapshot_id, "snapshot_id", violations, required=False)

    source_kind = SOURCE_KINDS.get(raw.source_kind)
    if source_kind is None:
        violations.append(
            FieldViolation(
                "source_kind",
                "must be codex_app_server, codex_sdk or worker_estimator"
                + (" (unspecified)" if raw.source_kind == 0 else f" (unknown value {raw.source_kind})"),
            )
        )
    pct = raw.context_budget_remaining_pct
    if not math.isfinite(pct) or not 0.0 <= pct <= 100.0:
        violations.append(
            FieldViolation("context_budget_remaining_pct", "must be a finite percentage in 0..100")
        )
    reported_level: ContextBudgetLevel | None = None
    if raw.context_budget_level != 0:
        reported_level = LEVELS.get(raw.context_budget_level)
        if reported_level is None:
            violations.append(
                FieldViolation(
                    "context_budget_level",
                    f"unknown value {raw.context_budget_level}: must be unset, safe, watch, urgent, critical",
                )
            )

    limit_source: CompactionLimitSource | None = None
    if raw.compaction_limit_source != 0:
        limit_source = LIMIT_SOURCES.get(raw.compaction_limit_source)
        if limit_source is None:
            violations.append(
                FieldViolation(
                    "compaction_limit_source",
                    f"unknown value {raw.compaction_limit_source}: must be unset, configured, "
                    "model_default or assumed",
                )
            )

    now_us = (now - EPOCH) // timedelta(microseconds=1)
    latest_us = now_us + _FUTURE_TOLERANCE_US
    captured_us: int | None = None
    if raw.captured_at is None:
        violations.append(FieldViolation("captured_at", "is required"))
    else:
        captured_us = _micros(
            raw.captured_at,
            "captured_at",
            _EARLIEST_US,
            latest_us,
            "5 minutes after the server's clock",
            violations,
        )
    expected_us = None
    if raw.compaction_expected_at is not None:
        expected_us = _micros(
            raw.compaction_expected_at,
            "compaction_expected_at",
            _EARLIEST_US,
            _LATEST_EXPECTED_US,
            "2100-01-01T00:00:00Z",
            violations,
        )
    last_compaction_us = None
    if raw.last_compaction_at is not None:
        last_compaction_us = _micros(
            raw.last_compaction_at,
            "last_compaction_at",
            _EARLIEST_US,
            latest_us,
            "5 minutes after the server's clock",
            violations,
        )

    _check_non_negative(raw.compaction_count, "compaction_count", violations)
    _check_non_negative(raw.estimated_remaining_turns, "estimated_remaining_turns", violations)
    _check_non_negative(
        raw.estimated_remaining_large_messages, "estimated_remaining_large_messages", violations
    )
    _check_non_negative(raw.last_total_tokens, "last_total_tokens", violations)
    _check_non_negative(raw.model_context_window, "model_context_window", violations)
    _check_non_negative(raw.auto_compact_token_limit, "auto_compact_token_limit", violations)
    if raw.codex_context_left_pct is not None and not 0 <= raw.codex_context_left_pct <= 100:
        violations.append(FieldViolation("codex_context_left_pct", "must be within 0..100"))
    if not 0 <= raw.snapshot_version <= MAX_SNAPSHOT_VERSION:
        violations.append(FieldViolation("snapshot_version", "must be within 0..2^63-1"))
    _check_text(
        raw.must_finish_reason,
        "must_finish_reason",
        MAX_REASON_LENGTH,
        _CONTROL_EXCEPT_TAB_NEWLINE,
        violations,
    )
    if (problem := folder_problem(raw.codex_folder)) is not None:
        violations.append(FieldViolation("codex_folder", problem))

    if violations:
        raise InvalidArgument([FieldViolation(f"{prefix}.{v.field}", v.description) for v in violations])
    assert source_kind is not None and captured_us is not None
    snapshot_id = raw.snapshot_id or derive_snapshot_id(
        raw.worker_id, raw.thread_id, raw.snapshot_version, captured_us
    )
    return Snapshot(
        snapshot_id=snapshot_id,
        project_id=raw.project_id,
        task_id=raw.task_id,
        thread_id=raw.thread_id,
        node_id=raw.node_id,
        worker_id=raw.worker_id,
        source_kind=source_kind,
        context_budget_remaining_pct=float(pct),
        reported_level=reported_level,
        compaction_expected_at=None if expected_us is None else _instant(expected_us),
        must_finish_before_compaction=raw.must_finish_before_compaction,
        estimated_remaining_turns=raw.estimated_remaining_turns,
        estimated_remaining_large_messages=raw.estimated_remaining_large_messages,
        last_compaction_at=None if last_compaction_us is None else _instant(last_compaction_us),
        compaction_count=raw.compaction_count,
        snapshot_version=raw.snapshot_version,
        captured_at=_instant(captured_us),
        last_total_tokens=raw.last_total_tokens,
        model_context_window=raw.model_context_window,
        auto_compact_token_limit=raw.auto_compact_token_limit,
        codex_context_left_pct=raw.codex_context_left_pct,
        must_finish_reason=raw.must_finish_reason,
        codex_folder=raw.codex_folder,
        compaction_limit_source=limit_source,
        awaiting_reading_after_compaction=raw.awaiting_reading_after_compaction,
    )


def validate_batch_size(count: int, field: str = "snapshots") -> None:
    """A stream message carries 1 to 1,000 snapshots. Raises InvalidArgument naming `field`."""
    if count == 0:
        raise InvalidArgument([FieldViolation(field, "must contain at least one snapshot")])
    if count > MAX_SNAPSHOTS_PER_MESSAGE:
        raise InvalidArgument(
            [
                FieldViolation(
                    field, f"must contain at most {MAX_SNAPSHOTS_PER_MESSAGE} snapshots, got {count}"
                )
            ]
        )
