"""Handoff package transitions and checklist normalisation (CB-6, CB-18)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from services.scheduler.domain.handoff import (
    CHECKLIST_ITEMS,
    ChecklistEntry,
    can_transition,
    check_transition,
    is_expired,
    normalise_checklist,
)
from services.scheduler.domain.model import PackageStatus as S
from services.shared.errors import FailedPrecondition


def test_legal_and_illegal_transitions() -> None:
    assert can_transition(S.DRAFT, S.READY) and can_transition(S.READY, S.CONSUMED)
    assert can_transition(S.READY, S.READY) and can_transition(S.DRAFT, S.EXPIRED)
    for current, target in [
        (S.READY, S.DRAFT),
        (S.CONSUMED, S.CONSUMED),
        (S.EXPIRED, S.READY),
        (S.DRAFT, S.CONSUMED),
    ]:
        assert not can_transition(current, target)
    with pytest.raises(FailedPrecondition, match="pk1 is consumed; it cannot become consumed") as caught:
        check_transition("pk1", S.CONSUMED, S.CONSUMED)
    assert caught.value.reason == "ILLEGAL_PACKAGE_TRANSITION"


def test_checklist_keeps_order_and_marks_unreported_items_missing() -> None:
    result = normalise_checklist(
        [ChecklistEntry("last_test_run", "done", "3 passed"), ChecklistEntry("bogus", "done")]
    )
    assert [entry.item for entry in result] == list(CHECKLIST_ITEMS)
    assert result[3] == ChecklistEntry("last_test_run", "done", "3 passed")
    assert result[0] == ChecklistEntry("files_touched", "missing", "not reported by the worker")


def test_expiry_only_for_open_packages() -> None:
    now = datetime(2025, 5, 1, tzinfo=UTC)
    assert is_expired(S.READY, now - timedelta(seconds=1), now)
    assert not is_expired(S.DRAFT, now + timedelta(seconds=1), now)
    assert not is_expired(S.CONSUMED, now - timedelta(days=1), now)
