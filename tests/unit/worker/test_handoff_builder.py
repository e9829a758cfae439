"""The CB-18 package built from local facts: what is found is done, what is not is missing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from worker.codex_sessions.git_state import ChangedFile, DiffStat, GitState
from worker.codex_sessions.tracker import LastActivity, RecordedTestRun, ToolRun
from worker.handoff.builder import SessionFacts, build_package, next_actions_of, open_questions_of

AT = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
MESSAGE = """Parser fixed; the tokenizer still needs a TODO for unicode.

Open questions:
- Should empty input raise?

Next steps:
1. Add a unicode test
2. Update the changelog
Is the CLI flag still needed?"""


def test_everything_found_is_done() -> None:
    run = ToolRun("c1", "exec_command", "pytest -q", "{}", AT, "1 failed, 2 passed in 0.3s", 1, AT)
    activity = LastActivity(
        last_agent_message=MESSAGE,
        last_agent_message_at=AT,
        last_tool_call=run,
        last_shell_command=run,
        last_test_run=RecordedTestRun(run, "failed", "1 failed, 2 passed in 0.3s"),
    )
    git = GitState(
        Path("/repo"),
        "main",
        "abcdef1234567890",
        (ChangedFile("src/parser.py", " M"), ChangedFile("reports/run.log", "??")),
        True,
        DiffStat(1, 4, 2),
    )
    facts = SessionFacts(
        "t1", "/repo", Path("/codex/rollout-x.jsonl"), activity, git, ("/repo/reports/run.log",)
    )
    package = build_package(facts)
    assert package.missing_items == ()
    assert package.critical_files == ("src/parser.py", "reports/run.log")
    assert package.patches_done[0] == "1 file(s) changed, +4 -2 against abcdef123456"
    assert package.patches_not_done == ("Parser fixed; the tokenizer still needs a TODO for unicode.",)
    assert package.critical_tests[0].outcome == "failed"
    assert package.critical_commands[0].exit_code == 1
    assert package.open_questions == ("Should empty input raise?", "Is the CLI flag still needed?")
    assert package.suggested_next_actions == ("Add a unicode test", "Update the changelog")
    assert package.critical_artifacts == ("/codex/rollout-x.jsonl", "/repo/reports/run.log")
    assert package.summary_text.startswith("Thread t1 in /repo on main at abcdef123456.")


def test_nothing_known_is_marked_missing_not_invented() -> None:
    package = build_package(SessionFacts("t2", None, None, None, None))
    assert package.missing_items == (
        "files_touched",
        "patches",
        "last_key_command",
        "last_test_run",
        "open_questions",
        "next_actions",
        "evidence_links",
    )
    details = {entry.item: entry.detail for entry in package.checklist}
    assert details["files_touched"] == "no git state for unknown folder"
    assert details["open_questions"] == "no assistant message in the session file"
    assert package.critical_files == () and package.critical_tests == () and package.open_questions == ()


def test_message_parsing_edges() -> None:
    assert open_questions_of(None) == () and next_actions_of("") == ()
    assert next_actions_of("## Next\n- ship it\nplain text") == ("ship it",)
