"""The demo model's [[demo:...]] markers: which failure, wait or tool call a message asks for."""

from __future__ import annotations

import pytest

from demo_model.markers import MAX_SLOW_SECONDS, Directives, Failure, parse_directives


def test_a_plain_message_asks_for_nothing() -> None:
    assert parse_directives("please fix the flaky test") == Directives()


@pytest.mark.parametrize(
    ("text", "failure"),
    [
        ("[[demo:http500]]", Failure.HTTP500),
        ("try this [[demo:http400]] now", Failure.HTTP400),
        ("[[demo:http429]]", Failure.HTTP429),
        ("[[demo:http401]]", Failure.HTTP401),
        ("[[demo:response_failed]]", Failure.RESPONSE_FAILED),
        ("[[demo:stall]]", Failure.STALL),
        ("[[demo:no_reply]]", Failure.NO_REPLY),
    ],
)
def test_each_failure_marker_is_read(text: str, failure: Failure) -> None:
    assert parse_directives(text).failure is failure


def test_the_first_failure_marker_wins() -> None:
    assert parse_directives("[[demo:stall]] then [[demo:http500]]").failure is Failure.STALL


def test_slow_reads_seconds_with_a_fraction() -> None:
    assert parse_directives("[[demo:slow=2.5]] hello") == Directives(slow_seconds=2.5)


def test_slow_is_capped_at_an_hour() -> None:
    assert parse_directives("[[demo:slow=99999]]").slow_seconds == MAX_SLOW_SECONDS


@pytest.mark.parametrize("value", ["soon", "-3", "nan", "inf", ""])
def test_a_slow_value_that_is_not_a_duration_is_ignored(value: str) -> None:
    assert parse_directives(f"[[demo:slow={value}]]").slow_seconds == 0.0


def test_shell_takes_everything_up_to_the_closing_brackets() -> None:
    directives = parse_directives("run [[demo:shell=echo a=b; ls -la | wc -l]] please")
    assert directives.shell_command == "echo a=b; ls -la | wc -l"
    assert directives.failure is None


def test_an_empty_shell_command_is_ignored() -> None:
    assert parse_directives("[[demo:shell=  ]]").shell_command is None


def test_unknown_or_misspelt_markers_are_ignored() -> None:
    assert parse_directives("[[demo:explode]] [[demo:HTTP500]] [[demo:stall=1]] [demo:stall]") == Directives()


def test_markers_combine() -> None:
    directives = parse_directives("[[demo:slow=1]] [[demo:shell=pwd]] [[demo:no_reply]]")
    assert directives == Directives(failure=Failure.NO_REPLY, slow_seconds=1.0, shell_command="pwd")
