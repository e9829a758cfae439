"""The scheduler repository's PostgreSQL bulk forms agree with its row mapping (no database needed)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import orjson
import pytest

from services.scheduler.adapters.repository import (
    _state_row,
    _state_values,
    utc_state,
)
from services.scheduler.adapters.tables import scheduled_threads
from services.scheduler.domain.model import ThreadState
from tests.unit.scheduler.factories import NOW, full_state


def test_state_values_are_the_state_row_in_column_order_with_times_as_utc_text() -> None:
    state = full_state()
    row = _state_row(state, NOW)
    assert list(row) == list(scheduled_threads.c.keys())
    assert _state_values(state, NOW) == list(row.values())
    # What the upsert receives: datetimes as RFC 3339 text in UTC, as PostgreSQL reads them back.
    encoded = json.loads(orjson.dumps(_state_values(state, NOW)))
    expected = [value.isoformat() if isinstance(value, datetime) else value for value in row.values()]
    assert encoded == expected
    assert encoded[16] == state.captured_at.isoformat() and encoded[16].endswith("+00:00")
    empty = _state_values(ThreadState(thread_id="t2"), NOW)
    assert empty[:8] == ["t2", "", "", "", "", "", None, 100.0]


def test_utc_state_converts_other_offsets_and_keeps_utc_states_as_they_are() -> None:
    state = full_state()
    assert utc_state(state) is state
    plus_two = timezone(timedelta(hours=2))
    shifted = utc_state(ThreadState(thread_id="t", captured_at=NOW.astimezone(plus_two)))
    assert shifted.captured_at == NOW and shifted.captured_at.tzinfo is UTC


def test_utc_state_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        utc_state(ThreadState(thread_id="t", captured_at=datetime(2025, 5, 1, 12, 0)))
