"""Git state of a working folder, on real temporary repositories."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from worker.codex_sessions.git_state import (
    ChangedFile,
    DiffStat,
    parse_diff_stat,
    parse_porcelain_status,
    read_git_state,
)

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.invalid",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.invalid",
}


def git(folder: Path, *arguments: str) -> str:
    completed = subprocess.run(
        ["git", "-C", str(folder), "-c", "commit.gpgsign=false", *arguments],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **IDENTITY},
    )
    return completed.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    git(folder, "init", "--quiet", "--initial-branch=main")
    (folder / "app.py").write_text("print('hi')\n")
    (folder / "old_name.py").write_text("x = 1\n")
    git(folder, "add", "--all")
    git(folder, "commit", "--quiet", "-m", "start")
    return folder


@needs_git
def test_clean_repository(repo: Path) -> None:
    state = read_git_state(repo)
    assert state is not None
    assert state.branch == "main"
    assert state.head_commit == git(repo, "rev-parse", "HEAD").strip()
    assert state.changed_files == ()
    assert state.has_uncommitted_changes is False
    assert state.diff_stat == DiffStat(0, 0, 0)


@needs_git
def test_uncommitted_changes_are_listed(repo: Path) -> None:
    (repo / "app.py").write_text("print('hi')\nprint('bye')\n")
    (repo / "new file.py").write_text("y = 2\n")
    git(repo, "mv", "old_name.py", "new_name.py")
    state = read_git_state(repo)
    assert state is not None
    assert state.has_uncommitted_changes is True
    assert set(state.changed_files) == {
        ChangedFile("app.py", " M"),
        ChangedFile("new file.py", "??"),
        ChangedFile("new_name.py", "R ", "old_name.py"),
    }
    assert state.diff_stat == DiffStat(files_changed=2, insertions=1, deletions=0)


@needs_git
def test_repository_without_commits(tmp_path: Path) -> None:
    git(tmp_path, "init", "--quiet", "--initial-branch=trunk")
    (tmp_path / "a.txt").write_text("a\n")
    state = read_git_state(tmp_path)
    assert state is not None
    assert (state.branch, state.head_commit) == ("trunk", None)
    assert state.changed_files == (ChangedFile("a.txt", "??"),)


@needs_git
def test_detached_head_has_no_branch(repo: Path) -> None:
    git(repo, "checkout", "--quiet", "--detach")
    state = read_git_state(repo)
    assert state is not None
    assert state.branch is None
    assert state.head_commit is not None


@needs_git
def test_not_a_repository_or_missing_folder_gives_none(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    assert read_git_state(plain) is None
    assert read_git_state(tmp_path / "missing") is None


def test_missing_git_gives_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    assert read_git_state(tmp_path) is None


def test_parse_porcelain_status() -> None:
    output = "## feature/x...origin/feature/x [ahead 2]\0 M a.py\0R  new.py\0old.py\0?? notes.md\0"
    branch, changed = parse_porcelain_status(output)
    assert branch == "feature/x"
    assert changed == (
        ChangedFile("a.py", " M"),
        ChangedFile("new.py", "R ", "old.py"),
        ChangedFile("notes.md", "??"),
    )
    assert changed[2].untracked
    assert parse_porcelain_status("## HEAD (no branch)\0") == (None, ())
    assert parse_porcelain_status("## No commits yet on main\0") == ("main", ())


def test_parse_diff_stat() -> None:
    text = " a.py | 3 ++-\n b.py | 4 ----\n 2 files changed, 2 insertions(+), 5 deletions(-)\n"
    assert parse_diff_stat(text) == DiffStat(2, 2, 5)
    assert parse_diff_stat(" 1 file changed, 1 deletion(-)\n") == DiffStat(1, 0, 1)
    assert parse_diff_stat("") == DiffStat(0, 0, 0)
