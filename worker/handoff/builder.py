"""Build the CB-18 handoff package from real local facts: pure functions over what the worker read.

Inputs (:class:`SessionFacts`): the thread's last activity from its Codex session file (last agent
message, last shell command with its output, last test run with its outcome, via
:class:`~worker.codex_sessions.tracker.ThreadBudgetTracker`), the git state of its working folder
(:func:`~worker.codex_sessions.git_state.read_git_state`), the rollout file path, and the artefact
files that exist in the folder.

Each checklist item is `done` with what was found, or `missing` with why; nothing is invented:

- files_touched: `git status` of the working folder; missing without git state or changed files.
- patches: done = `git diff --stat HEAD` and the changed files; not done = "TODO" / "not done" /
  "remaining" lines of the last agent message; missing when neither is found.
- last_key_command: the session's last shell command and its output; missing without one.
- last_test_run: the session's last test-looking command and its outcome; missing without one.
- open_questions: lines of the last agent message ending in "?" or under a "question" heading.
- next_actions: bullet lines under a "next" / "todo" heading of the last agent message.
- evidence_links: the rollout file, and artefacts (logs, reports, images) among the changed files.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from worker.codex_sessions.git_state import GitState
from worker.codex_sessions.tracker import LastActivity

OUTPUT_TAIL_CHARS = 2_000
"""A command's output is kept as its last this-many characters."""

ARTEFACT_SUFFIXES = frozenset(
    {".log", ".txt", ".json", ".xml", ".html", ".csv", ".png", ".jpg", ".svg", ".bin"}
)
"""Changed files with these suffixes are listed as evidence (test reports, logs, captures)."""

_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(?P<text>.+?)\s*$")
_HEADING = re.compile(r"^\s*(?:#+\s*)?(?:\*\*)?(?P<title>[^*#:]{1,60}?)(?:\*\*)?\s*:?\s*(?:\*\*)?\s*$")
_NOT_DONE = re.compile(
    r"\b(?:TODO|not (?:yet )?done|remaining|still (?:needs?|to do)|not yet)\b", re.IGNORECASE
)


@dataclass(frozen=True)
class SessionFacts:
    """What the worker knows about one thread when asked to prepare its handoff.

    Attributes:
        thread_id: the Codex thread id.
        folder: the thread's working folder (session cwd), None when unknown.
        rollout_path: the thread's session file, None when unknown.
        activity: the last activity from the session file, None when the thread was not read.
        git: the git state of `folder`, None when it could not be read.
        artefacts: artefact files found in the folder (paths), see :func:`find_artefacts`.
    """

    thread_id: str
    folder: str | None
    rollout_path: Path | None
    activity: LastActivity | None
    git: GitState | None
    artefacts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChecklistResult:
    """One CB-18 checklist item: status `done` or `missing`, and what was found or why not."""

    item: str
    status: str
    detail: str


@dataclass(frozen=True)
class CommandFact:
    """A shell command with its exit code and output tail."""

    command: str
    exit_code: int | None
    output_tail: str
    ran_at: datetime | None


@dataclass(frozen=True)
class TestFact:
    """A test run: outcome passed | failed | running | unknown, and its summary line."""

    command: str
    outcome: str
    summary: str
    ran_at: datetime | None


@dataclass(frozen=True)
class BuiltPackage:
    """The package content to upload (CB-6 fields, CB-18 extras and checklist)."""

    summary_text: str
    open_questions: tuple[str, ...]
    critical_files: tuple[str, ...]
    critical_commands: tuple[CommandFact, ...]
    critical_tests: tuple[TestFact, ...]
    critical_artifacts: tuple[str, ...]
    patches_done: tuple[str, ...]
    patches_not_done: tuple[str, ...]
    suggested_next_actions: tuple[str, ...]
    checklist: tuple[ChecklistResult, ...] = field(default_factory=tuple)

    @property
    def missing_items(self) -> tuple[str, ...]:
        """Checklist items marked missing."""
        return tuple(entry.item for entry in self.checklist if entry.status == "missing")


def _sections(message: str) -> list[tuple[str, list[str]]]:
    """(heading, lines) pairs of a message; lines before any heading have the heading ""."""
    sections: list[tuple[str, list[str]]] = [("", [])]
    for line in message.splitlines():
        if not line.strip():
            continue
        heading = _HEADING.match(line)
        if (
            heading
            and not _BULLET.match(line)
            and (line.rstrip().endswith(":") or line.lstrip().startswith("#"))
        ):
            sections.append((heading.group("title").strip().lower(), []))
            continue
        sections[-1][1].append(line)
    return sections


def _bullet_text(line: str) -> str:
    match = _BULLET.match(line)
    return match.group("text") if match else line.strip()


def open_questions_of(message: str | None) -> tuple[str, ...]:
    """Questions in the last agent message: lines under a heading naming questions, and any line
    that ends with a question mark."""
    if not message:
        return ()
    found: list[str] = []
    for heading, lines in _sections(message):
        for line in lines:
            text = _bullet_text(line)
            if ("question" in heading or text.endswith("?")) and text not in found:
                found.append(text)
    return tuple(found)


def next_actions_of(message: str | None) -> tuple[str, ...]:
    """Bullet lines under a heading that names next steps ("Next steps:", "## Next", "TODO:")."""
    if not message:
        return ()
    actions: list[str] = []
    for heading, lines in _sections(message):
        if "next" in heading or "todo" in heading or "follow" in heading:
            actions.extend(_bullet_text(line) for line in lines if _BULLET.match(line))
    return tuple(actions)


def patches_not_done_of(message: str | None) -> tuple[str, ...]:
    """Lines of the last agent message that say something is not done yet (TODO, remaining...)."""
    if not message:
        return ()
    return tuple(_bullet_text(line) for line in message.splitlines() if _NOT_DONE.search(line))


def find_artefacts(folder: Path | None, git: GitState | None) -> tuple[str, ...]:
    """Changed files of the folder whose suffix marks an artefact (ARTEFACT_SUFFIXES), as absolute paths."""
    if folder is None or git is None:
        return ()
    return tuple(
        str(folder / changed.path)
        for changed in git.changed_files
        if Path(changed.path).suffix in ARTEFACT_SUFFIXES
    )


def build_package(facts: SessionFacts) -> BuiltPackage:
    """The CB-18 package for `facts` (see the module table for every item's source)."""
    activity = facts.activity
    message = activity.last_agent_message if activity else None
    checklist: list[ChecklistResult] = []

    files: tuple[str, ...] = ()
    patches_done: tuple[str, ...] = ()
    if facts.git is None:
        checklist.append(
            ChecklistResult(
                "files_touched", "missing", f"no git state for {facts.folder or 'unknown folder'}"
            )
        )
    else:
        files = tuple(changed.path for changed in facts.git.changed_files)
        if files:
            checklist.append(
                ChecklistResult("files_touched", "done", f"{len(files)} changed file(s) in {facts.folder}")
            )
        else:
            checklist.append(
                ChecklistResult("files_touched", "missing", f"no uncommitted changes in {facts.folder}")
            )
        stat = facts.git.diff_stat
        patches_done = tuple(
            f"{changed.status.strip() or '?'} {changed.path}" for changed in facts.git.changed_files
        )
        if stat.files_changed:
            patches_done = (
                f"{stat.files_changed} file(s) changed, +{stat.insertions} -{stat.deletions} against "
                f"{(facts.git.head_commit or 'HEAD')[:12]}",
                *patches_done,
            )
    not_done = patches_not_done_of(message)
    if patches_done or not_done:
        checklist.append(
            ChecklistResult("patches", "done", f"{len(patches_done)} done, {len(not_done)} not done")
        )
    else:
        checklist.append(
            ChecklistResult("patches", "missing", "no working-tree changes and no unfinished work named")
        )

    commands: tuple[CommandFact, ...] = ()
    shell = activity.last_shell_command if activity else None
    if shell is not None and shell.command:
        commands = (
            CommandFact(
                shell.command,
                shell.exit_code,
                (shell.output or "")[-OUTPUT_TAIL_CHARS:],
                shell.finished_at or shell.called_at,
            ),
        )
        result = "still running" if shell.output is None else f"exit code {shell.exit_code}"
        checklist.append(ChecklistResult("last_key_command", "done", f"{shell.command[:80]} ({result})"))
    else:
        checklist.append(
            ChecklistResult("last_key_command", "missing", "no shell command in the session file")
        )

    tests: tuple[TestFact, ...] = ()
    test = activity.last_test_run if activity else None
    if test is not None:
        tests = (
            TestFact(
                test.run.command or "",
                test.outcome,
                test.summary or "",
                test.run.finished_at or test.run.called_at,
            ),
        )
        checklist.append(
            ChecklistResult("last_test_run", "done", f"{test.outcome}: {test.summary or test.run.command}")
        )
    else:
        checklist.append(ChecklistResult("last_test_run", "missing", "no test command in the session file"))

    questions = open_questions_of(message)
    actions = next_actions_of(message)
    no_message = "no assistant message in the session file" if not message else ""
    checklist.append(
        _found("open_questions", questions, no_message or "the last assistant message asks nothing")
    )
    checklist.append(
        _found("next_actions", actions, no_message or "the last assistant message names no next steps")
    )

    evidence = tuple(([str(facts.rollout_path)] if facts.rollout_path else []) + list(facts.artefacts))
    checklist.append(_found("evidence_links", evidence, "no session file or artefact found"))

    return BuiltPackage(
        summary_text=summary_of(facts, files, tests, message),
        open_questions=questions,
        critical_files=files,
        critical_commands=commands,
        critical_tests=tests,
        critical_artifacts=evidence,
        patches_done=patches_done,
        patches_not_done=not_done,
        suggested_next_actions=actions,
        checklist=tuple(checklist),
    )


def _found(item: str, values: Sequence[str], why_missing: str) -> ChecklistResult:
    if values:
        return ChecklistResult(item, "done", f"{len(values)} found")
    return ChecklistResult(item, "missing", why_missing)


def summary_of(
    facts: SessionFacts, files: Sequence[str], tests: Sequence[TestFact], message: str | None
) -> str:
    """One paragraph for the next thread: where, what changed, the last test, the last message's gist."""
    parts = [f"Thread {facts.thread_id} in {facts.folder or 'an unknown folder'}"]
    if facts.git is not None:
        branch = facts.git.branch or "detached HEAD"
        parts[0] += f" on {branch} at {(facts.git.head_commit or 'no commit')[:12]}"
    parts[0] += "."
    if files:
        more = "..." if len(files) > 5 else ""
        parts.append(f"Uncommitted changes in {len(files)} file(s): {', '.join(files[:5])}{more}.")
    if tests:
        parts.append(f"Last test run {tests[0].outcome}: {tests[0].summary or tests[0].command}.")
    if message:
        first_line = next((line.strip() for line in message.splitlines() if line.strip()), "")
        parts.append(f"Last assistant message: {first_line[:300]}")
    return " ".join(parts)
