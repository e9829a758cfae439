"""UTC time helpers and protobuf Timestamp conversions (always timezone-aware UTC)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from google.protobuf.timestamp_pb2 import Timestamp


def utc_now() -> datetime:
    """The current instant, timezone-aware UTC."""
    return datetime.now(UTC)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_timestamp(value: datetime | None) -> Timestamp | None:
    """A protobuf Timestamp for an aware datetime (None stays None). Raises ValueError if naive."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime: pass a timezone-aware datetime")
    # The same fields as `Timestamp.FromDatetime` (whole seconds since the epoch, rounded down, and
    # the microseconds as nanos) from one subtraction: FromDatetime builds a UTC time tuple, a few
    # times the cost, and every streamed event carries a timestamp.
    since_epoch = value - _EPOCH
    return Timestamp(
        seconds=since_epoch.days * 86_400 + since_epoch.seconds, nanos=since_epoch.microseconds * 1_000
    )


def from_timestamp(stamp: Timestamp) -> datetime:
    """An aware UTC datetime from a protobuf Timestamp, to the microsecond (nanoseconds truncated, as
    `Timestamp.ToDatetime` does). The epoch plus a timedelta: the same instant as
    `stamp.ToDatetime(tzinfo=UTC)` at about half its cost (it runs for every streamed event)."""
    return _EPOCH + timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)


def isoformat_utc(value: datetime | None) -> str | None:
    """RFC 3339 text with a `Z` suffix, or None."""
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
