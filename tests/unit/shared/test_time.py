"""Protobuf Timestamp conversions (boss_common/time.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from boss_common.time import from_timestamp, isoformat_utc, to_timestamp


@pytest.mark.parametrize(
    ("seconds", "nanos"),
    [(0, 0), (1_746_100_800, 123_456_789), (1_746_100_800, 999_999_999), (-86_400, 500_000_001)],
)
def test_from_timestamp_is_the_instant_the_protobuf_library_gives(seconds: int, nanos: int) -> None:
    stamp = Timestamp(seconds=seconds, nanos=nanos)
    converted = from_timestamp(stamp)
    assert converted == stamp.ToDatetime(tzinfo=UTC)
    assert converted.tzinfo is UTC
    assert converted.microsecond == nanos // 1000


@pytest.mark.parametrize(
    "value",
    [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(2026, 11, 30, 11, 44, 5, 123_456, tzinfo=UTC),
        datetime(2026, 3, 25, 9, 56, 0, 250_000, tzinfo=timezone(timedelta(hours=2))),
        datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC),
    ],
)
def test_to_timestamp_gives_the_fields_the_protobuf_library_gives(value: datetime) -> None:
    expected = Timestamp()
    expected.FromDatetime(value.astimezone(UTC))
    converted = to_timestamp(value)
    assert converted is not None
    assert (converted.seconds, converted.nanos) == (expected.seconds, expected.nanos)


def test_round_trip_keeps_the_instant_in_utc() -> None:
    local = datetime(2026, 3, 25, 9, 56, 0, 250_000, tzinfo=timezone(timedelta(hours=2)))
    back = from_timestamp(to_timestamp(local))
    assert back == local and back.tzinfo is UTC
    assert isoformat_utc(back) == "2026-03-25T07:56:00.250000Z"


def test_to_timestamp_refuses_a_naive_datetime() -> None:
    with pytest.raises(ValueError, match="naive"):
        to_timestamp(datetime(2026, 3, 25, 7, 56))
