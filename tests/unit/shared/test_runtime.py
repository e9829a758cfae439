"""The services' garbage-collection tuning (services/shared/runtime.py)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from services.shared.runtime import (
    OLDER_GENERATION_THRESHOLD,
    YOUNG_GENERATION_THRESHOLD,
    tune_garbage_collection,
)


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_tuning_freezes_what_exists_and_raises_the_thresholds() -> None:
    survivor = [object()]
    tune_garbage_collection()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (
        YOUNG_GENERATION_THRESHOLD,
        OLDER_GENERATION_THRESHOLD,
        OLDER_GENERATION_THRESHOLD,
    )
    assert YOUNG_GENERATION_THRESHOLD > 700  # CPython's default, which the tuning exists to raise
    assert not any(survivor is tracked for tracked in gc.get_objects())  # frozen: not scanned


@pytest.mark.usefixtures("restored_collector")
def test_cycles_created_after_tuning_are_still_collected() -> None:
    tune_garbage_collection()

    class Node:
        partner: object

    first, second = Node(), Node()
    first.partner, second.partner = second, first
    reference = weakref.ref(first)
    del first, second
    assert reference() is not None  # a cycle: reference counting alone does not free it
    gc.collect()
    assert reference() is None
