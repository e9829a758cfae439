"""Git state of a Codex thread's working folder: the I/O edge behind CB-8's "uncommitted patch".

:func:`read_git_state` runs ``git status --porcelain=v1`` and ``git diff --stat`` in the folder
(subprocess, with a timeout) and returns a :class:`GitState`: branch, HEAD commit, the changed files
with their porcelain status codes, and whether anything is uncommitted. The parsing helpers are pure.
Git runs with ``GIT_OPTIONAL_LOCKS=0`` so reading never contends with Codex for ``index.lock``.
"""

import logging
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
"""Seconds one git command may take before the state is given up as unknown."""

_UNBORN_BRANCH = re.compile(r"^(?:No commits yet on|Initial commit on) (?P<branch>\S+)$")
_STAT_SUMMARY = re.compile(
    r"(?P<files>\d+) files? changed(?:, (?P<insertions>\d+) insertions?\(\+\))?"
    r"(?:, (?P<deletions>\d+) deletions?\(-\))?"
)
_GIT_ENV = {"GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C", "GIT_TERMINAL_PROMPT": "0"}


@dataclass(frozen=True)
class ChangedFile:
    """One entry of ``git status --porcelain=v1``.

    Attributes:
        path: path relative to the repository root (the new path of a rename or copy).
        status: the two-character ``XY`` code, e.g. ``" M"`` (modified, unstaged), ``"A "`` (added),
            ``"R "`` (renamed), ``"??"`` (untracked).
        original_path: the old path of a rename or copy, else None.
    """

    path: str
    status: str
    original_path: str | None = None

    @property
    def untracked(self) -> bool:
        """True for a file git does not track yet (``??``)."""
        return self.status == "??"


@dataclass(frozen=True)
class DiffStat:
    """Summary of ``git diff --stat HEAD`` (tracked changes, staged and unstaged, against HEAD)."""

    files_changed: int
    insertions: int
    deletions: int


@dataclass(frozen=True)
class GitState:
    """Git facts of one working folder at one moment.

    Attributes:
        folder: the folder that was read.
        branch: the checked-out branch, None when HEAD is detached.
        head_commit: the HEAD commit hash, None before the first commit.
        changed_files: every changed, staged or untracked file.
        has_uncommitted_changes: True when ``changed_files`` is not empty (an uncommitted patch, CB-8).
        diff_stat: line counts of tracked changes against HEAD (zeros when there is no HEAD).
    """

    folder: Path
    branch: str | None
    head_commit: str | None
    changed_files: tuple[ChangedFile, ...]
    has_uncommitted_changes: bool
    diff_stat: DiffStat


def parse_porcelain_status(output: str) -> tuple[str | None, tuple[ChangedFile, ...]]:
    """Parse ``git status --porcelain=v1 -z --branch`` output into (branch, changed files).

    The branch is None when HEAD is detached. With ``-z`` a rename or copy is ``XY new NUL old``.
    """
    tokens = output.split("\0")
    branch: str | None = None
    changed: list[ChangedFile] = []
    index = 0
    while index < len(tokens):
        entry = tokens[index]
        index += 1
        if not entry:
            continue
        if entry.startswith("## "):
            branch = _branch_from_header(entry[3:])
            continue
        status, path = entry[:2], entry[3:]
        original = None
        if "R" in status or "C" in status:
            original = tokens[index] if index < len(tokens) else None
            index += 1
        changed.append(ChangedFile(path=path, status=status, original_path=original))
    return branch, tuple(changed)


def parse_diff_stat(output: str) -> DiffStat:
    """Parse the summary line of ``git diff --stat`` (e.g. ``2 files changed, 1 insertion(+)``)."""
    match = _STAT_SUMMARY.search(output)
    if match is None:
        return DiffStat(0, 0, 0)
    return DiffStat(
        files_changed=int(match.group("files")),
        insertions=int(match.group("insertions") or 0),
        deletions=int(match.group("deletions") or 0),
    )


def read_git_state(folder: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> GitState | None:
    """Read the git state of ``folder``.

    Returns:
        The state, or None when the folder does not exist, is not inside a git work tree, git is not
        installed, or a git command failed or exceeded ``timeout_s`` seconds.
    """
    if not folder.is_dir():
        return None
    status = _run_git(folder, ["status", "--porcelain=v1", "-z", "--branch"], timeout_s)
    if status is None:
        return None
    branch, changed = parse_porcelain_status(status)
    head = _run_git(folder, ["rev-parse", "--verify", "--quiet", "HEAD"], timeout_s)
    head_commit = (head.strip() or None) if head is not None else None
    diff_stat = DiffStat(0, 0, 0)
    if head_commit is not None:
        stat_output = _run_git(folder, ["diff", "--stat", "HEAD"], timeout_s)
        diff_stat = parse_diff_stat(stat_output or "")
    return GitState(
        folder=folder,
        branch=branch,
        head_commit=head_commit,
        changed_files=changed,
        has_uncommitted_changes=bool(changed),
        diff_stat=diff_stat,
    )


def _branch_from_header(header: str) -> str | None:
    """Branch name from a porcelain ``## ...`` header; None for a detached HEAD."""
    unborn = _UNBORN_BRANCH.match(header)
    if unborn:
        return unborn.group("branch")
    if header.startswith("HEAD (no branch)"):
        return None
    return header.split("...", 1)[0].split(" ", 1)[0]


def _run_git(folder: Path, arguments: list[str], timeout_s: float) -> str | None:
    """Run ``git -C folder <arguments>``; stdout on exit code 0, else None (logged at DEBUG/WARNING)."""
    command = ["git", "-C", str(folder), *arguments]
    try:
        completed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            check=False,
            env={**os.environ, **_GIT_ENV},
        )
    except FileNotFoundError:
        logger.debug("git is not installed; no git state for %s", folder)
        return None
    except subprocess.TimeoutExpired:
        logger.warning("git %s in %s took longer than %.1f s", arguments[0], folder, timeout_s)
        return None
    if completed.returncode != 0:
        logger.debug("git %s in %s failed: %s", arguments[0], folder, completed.stderr.strip())
        return None
    return completed.stdout
