"""Which processes a look of the descendant watch reads: the known descendants and the new pids."""

from __future__ import annotations

from worker.local_agent.descendant_watch import pids_to_read


def test_the_pids_handed_out_since_the_previous_look_and_the_known_descendants_are_read() -> None:
    listed = [1, 57, 900, 1000, 1001, 1004, 1010, 1011]

    assert pids_to_read(listed, known={57}, previous_last=1000, last=1010) == {57, 1001, 1004, 1010}


def test_a_pid_handed_out_after_the_current_last_is_left_for_the_next_look() -> None:
    assert pids_to_read([1005, 1020], known=set(), previous_last=1000, last=1010) == {1005}


def test_after_a_wrap_around_the_new_pids_are_those_above_the_previous_last_or_up_to_the_last() -> None:
    listed = [300, 301, 305, 400, 31990, 32001, 32700]

    read = pids_to_read(listed, known={400}, previous_last=32000, last=305)

    assert read == {300, 301, 305, 400, 32001, 32700}


def test_known_descendants_that_are_gone_are_not_read() -> None:
    assert pids_to_read([10, 11], known={7, 11}, previous_last=20, last=20) == {11}


def test_nothing_new_and_nothing_known_reads_nothing() -> None:
    assert pids_to_read([10, 11, 12], known=frozenset(), previous_last=40, last=40) == set()
