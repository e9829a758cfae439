"""When a followed stream reconnects (boss_common/reconnection.py)."""

from __future__ import annotations

import logging

import pytest

from boss_common.reconnection import HEALTHY_STREAM_SECONDS, Reconnection


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def failed_attempts(reconnection: Reconnection, clock: Clock, count: int) -> list[float]:
    delays = []
    for _ in range(count):
        reconnection.attempt_started()
        clock.now += 0.01
        delays.append(reconnection.next_delay())
    return delays


def test_failing_attempts_back_off_from_a_fifth_of_a_second_to_ten_seconds() -> None:
    clock = Clock()
    reconnection = Reconnection(clock)
    delays = failed_attempts(reconnection, clock, 9)
    bases = [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 10.0, 10.0, 10.0]
    for delay, base in zip(delays, bases, strict=True):
        assert base * 0.5 <= delay <= base * 1.5  # jittered by +-50 %
    assert not reconnection.was_healthy


@pytest.mark.parametrize("healthy", ["delivered", "stayed_open"])
def test_after_a_healthy_attempt_the_next_reconnect_is_prompt(healthy: str) -> None:
    clock = Clock()
    reconnection = Reconnection(clock)
    failed_attempts(reconnection, clock, 6)  # the upstream was down for a while
    reconnection.attempt_started()
    if healthy == "delivered":
        clock.now += 1
        reconnection.delivered()
    else:  # an idle stream the server recycled
        clock.now += HEALTHY_STREAM_SECONDS
    delay = reconnection.next_delay()
    assert reconnection.was_healthy
    assert 0.1 <= delay <= 0.3
    assert 0.1 <= failed_attempts(reconnection, clock, 1)[0] <= 0.3  # and backing off starts over


def test_ended_logs_a_healthy_end_as_information_and_a_failure_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    reconnection = Reconnection(clock)
    log = logging.getLogger("test.reconnection")
    with caplog.at_level(logging.INFO, logger="test.reconnection"):
        reconnection.attempt_started()
        reconnection.delivered()
        prompt = reconnection.ended(log, "demo stream", "recycled")
        reconnection.attempt_started()
        clock.now += 0.01
        reconnection.ended(log, "demo stream", "UNAVAILABLE")
    assert 0.1 <= prompt <= 0.3
    logged = [(record.levelno, record.getMessage()) for record in caplog.records]
    assert len(logged) == 2
    assert logged[0] == (logging.INFO, "demo stream ended (recycled); reconnecting")
    assert logged[1][0] == logging.WARNING
    assert logged[1][1].startswith("demo stream unavailable (UNAVAILABLE); retrying in ")
