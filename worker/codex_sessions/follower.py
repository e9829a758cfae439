"""Follow Codex rollout files as Codex appends to them: the I/O edge of the session reader.

:class:`RolloutFollower` keeps, per file, a byte offset, any incomplete last line and a
:class:`~worker.codex_sessions.tracker.ThreadBudgetTracker`. Each :meth:`RolloutFollower.poll` stats
every followed file first and reads only files that grew, so polling every second stays cheap with
hundreds of files. Codex flushes after every line (codex-rs/rollout/src/recorder.rs:1741-1760), but a
poll can still land mid-line: a last line without its newline is kept until it is completed.

Where rollouts are found:

- ``$CODEX_HOME/sessions/**/rollout-*.jsonl`` (followed as they grow) and
  ``$CODEX_HOME/archived_sessions/**`` (archived threads; codex-rs/rollout/src/lib.rs:21-22);
- ``rollout-*.jsonl.zst``: Codex >= 0.137 zstd-compresses rollouts idle for 7 days
  (``codex-rs/rollout/src/compression.rs``, research/codex-context.md §3.5). A compressed file does
  not grow: it is read once, whole (streamed through the decompressor, so memory stays bounded),
  and read again only if it is replaced. When both ``X.jsonl`` and ``X.jsonl.zst`` exist the plain
  file is followed, as Codex itself prefers it.

Codex's configuration (``config.toml``, ``models_cache.json``) is re-read when it changes and handed
to every thread's tracker before its new lines are fed (:mod:`worker.codex_sessions.codex_config`).
"""

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from time import monotonic

import zstandard

from worker.codex_sessions.codex_config import CodexConfigurationReader, LimitSource
from worker.codex_sessions.rollout import RolloutParseError, parse_rollout_line, thread_id_from_rollout_name
from worker.codex_sessions.tracker import (
    LastActivity,
    ThreadBudgetReading,
    ThreadBudgetTracker,
    TrackerSettings,
)

logger = logging.getLogger(__name__)

SESSIONS_SUBDIR = "sessions"
"""Rollouts live under ``$CODEX_HOME/sessions/YYYY/MM/DD/`` (codex-rs/rollout/src/lib.rs:21-22)."""

ARCHIVED_SESSIONS_SUBDIR = "archived_sessions"
"""Archived rollouts live under ``$CODEX_HOME/archived_sessions/`` (codex-rs/rollout/src/lib.rs:21-22)."""

ROLLOUT_PREFIX = "rollout-"
ROLLOUT_SUFFIX = ".jsonl"
COMPRESSED_SUFFIX = ".jsonl.zst"

MAX_BYTES_PER_POLL = 8 * 1024 * 1024
"""At most this many bytes are read from one file per poll; the rest follows on the next polls."""

MALFORMED_WARNINGS_PER_FILE = 5
"""Malformed lines logged at WARNING per file; further ones are logged at DEBUG."""

ZSTD_READ_CHUNK_BYTES = 1024 * 1024
"""Decompressed bytes taken from a ``.jsonl.zst`` stream at a time."""


@dataclass(frozen=True)
class FileUpdate:
    """What one poll learned from one rollout file.

    Attributes:
        path: the rollout file.
        codex_thread_id: the thread's uuid (from ``session_meta``, else the file name).
        readings: new real readings, in file order (possibly empty).
        new_compactions: compactions recorded by the lines read in this poll.
        last_activity: the thread's last agent message, tool call, command and test run so far.
        restarted: the file shrank or was replaced, so it was re-read from the start with a fresh
            tracker (reading sequences start again at 1).
    """

    path: Path
    codex_thread_id: str | None
    readings: tuple[ThreadBudgetReading, ...]
    new_compactions: int
    last_activity: LastActivity
    restarted: bool


@dataclass
class _FileState:
    """Mutable per-file follow state (private to the follower)."""

    tracker: ThreadBudgetTracker
    inode: int
    offset: int = 0
    pending: bytes = b""
    lines_read: int = 0
    malformed_lines: int = 0
    limit_said: tuple[LimitSource, str] | None = None


def _scan_sessions(codex_home: Path) -> list[Path]:
    """Rollout files under ``codex_home/sessions`` and ``codex_home/archived_sessions``, sorted by path.

    ``X.jsonl.zst`` is left out when ``X.jsonl`` exists too (the plain file is the one Codex reads).
    """
    found: list[Path] = []
    for subdirectory in (SESSIONS_SUBDIR, ARCHIVED_SESSIONS_SUBDIR):
        for directory, _subdirectories, files in os.walk(codex_home / subdirectory):
            names = set(files)
            for name in files:
                if not name.startswith(ROLLOUT_PREFIX):
                    continue
                if name.endswith(ROLLOUT_SUFFIX) or (
                    name.endswith(COMPRESSED_SUFFIX) and name.removesuffix(".zst") not in names
                ):
                    found.append(Path(directory, name))
    return sorted(found)


def is_compressed(path: Path) -> bool:
    """True for a zstd-compressed rollout (``rollout-*.jsonl.zst``)."""
    return path.name.endswith(COMPRESSED_SUFFIX)


def discover_rollout_files(codex_home: Path) -> list[Path]:
    """Every rollout under ``codex_home`` (plain or compressed, live or archived), sorted by path.

    Missing ``sessions`` / ``archived_sessions`` folders give an empty list.
    """
    return _scan_sessions(codex_home)


class RolloutFollower:
    """Follows every rollout file of one ``$CODEX_HOME`` and reports new readings per file."""

    def __init__(
        self,
        codex_home: Path,
        settings: TrackerSettings | None = None,
        rediscover_interval_s: float = 10.0,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        """Prepare to follow ``codex_home``; nothing is read until :meth:`poll`.

        Args:
            codex_home: the Codex home folder (``~/.codex`` or ``$CODEX_HOME``).
            settings: tracker settings applied to every thread.
            rediscover_interval_s: seconds between scans for new files (0 scans on every poll).
            clock: monotonic seconds, injectable for tests.
        """
        self._codex_home = codex_home
        self._configuration = CodexConfigurationReader(codex_home)
        self._settings = settings
        self._rediscover_interval_s = rediscover_interval_s
        self._clock = clock
        self._next_discovery_at: float | None = None
        self._files: dict[Path, _FileState] = {}

    @property
    def followed_files(self) -> list[Path]:
        """The files currently followed, sorted."""
        return sorted(self._files)

    def tracker(self, path: Path) -> ThreadBudgetTracker | None:
        """The tracker of a followed file, None when the file is not followed."""
        state = self._files.get(path)
        return state.tracker if state else None

    def discover(self) -> list[Path]:
        """Scan for rollout files now; start following new ones. Returns the newly followed files."""
        added = [path for path in _scan_sessions(self._codex_home) if path not in self._files]
        for path in added:
            self.follow(path)
        return added

    def follow(self, path: Path) -> None:
        """Start following one rollout file from its beginning (no-op if already followed or gone)."""
        if path in self._files:
            return
        try:
            inode = path.stat().st_ino
        except FileNotFoundError:
            return
        self._files[path] = self._fresh_state(path, inode)

    def poll(self) -> list[FileUpdate]:
        """Read what was appended to every followed file since the last poll.

        Rediscovers files when the interval has passed. Files that did not grow are only stat'ed.
        Returns one :class:`FileUpdate` per file that had new complete lines or was restarted.
        """
        now = self._clock()
        if self._next_discovery_at is None or now >= self._next_discovery_at:
            self.discover()
            self._next_discovery_at = now + self._rediscover_interval_s
        configuration = self._configuration.current()
        for state in self._files.values():
            state.tracker.use_configuration(configuration)
        updates = []
        for path in list(self._files):
            update = self._poll_file(path)
            if update is not None:
                updates.append(update)
        return updates

    def _fresh_state(self, path: Path, inode: int) -> _FileState:
        """Follow state for reading ``path`` from the start."""
        tracker = ThreadBudgetTracker(
            thread_id_from_rollout_name(path.name), self._settings, self._configuration.current()
        )
        return _FileState(tracker=tracker, inode=inode)

    def _poll_file(self, path: Path) -> FileUpdate | None:
        """Stat one file and, when it grew, shrank or was replaced, read its new complete lines."""
        state = self._files[path]
        try:
            status = path.stat()
        except FileNotFoundError:
            logger.info("rollout file %s disappeared; no longer following it", path)
            del self._files[path]
            return None
        restarted = False
        if status.st_ino != state.inode or status.st_size < state.offset:
            logger.info("rollout file %s was truncated or replaced; reading it again from the start", path)
            state = self._fresh_state(path, status.st_ino)
            self._files[path] = state
            restarted = True
        if status.st_size == state.offset and not restarted:
            return None
        try:
            if is_compressed(path):
                return self._read_compressed(path, state, status.st_size, restarted)
            lines = self._read_complete_lines(path, state, status.st_size)
        except OSError as error:
            logger.warning("cannot read rollout file %s: %s", path, error)
            return None
        if not lines and not restarted:
            return None
        compactions_before = state.tracker.compaction_count
        readings = tuple(self._feed_lines(path, state, lines))
        return FileUpdate(
            path=path,
            codex_thread_id=state.tracker.codex_thread_id,
            readings=readings,
            new_compactions=state.tracker.compaction_count - compactions_before,
            last_activity=state.tracker.last_activity,
            restarted=restarted,
        )

    def _read_compressed(self, path: Path, state: _FileState, size: int, restarted: bool) -> FileUpdate:
        """Read a whole ``.jsonl.zst`` rollout once, streaming it through the zstd decompressor.

        Raises:
            OSError: the file cannot be read or is not valid zstd data (the file is then tried again
                on the next poll only if it changed).
        """
        compactions_before = state.tracker.compaction_count
        readings: list[ThreadBudgetReading] = []
        pending = b""
        try:
            with path.open("rb") as handle, zstandard.ZstdDecompressor().stream_reader(handle) as stream:
                while chunk := stream.read(ZSTD_READ_CHUNK_BYTES):
                    *complete, pending = (pending + chunk).split(b"\n")
                    readings.extend(self._feed_lines(path, state, complete))
        except zstandard.ZstdError as error:
            state.offset = size
            raise OSError(f"not valid zstd data: {error}") from error
        readings.extend(self._feed_lines(path, state, [pending]))
        state.offset = size
        return FileUpdate(
            path=path,
            codex_thread_id=state.tracker.codex_thread_id,
            readings=tuple(readings),
            new_compactions=state.tracker.compaction_count - compactions_before,
            last_activity=state.tracker.last_activity,
            restarted=restarted,
        )

    @staticmethod
    def _read_complete_lines(path: Path, state: _FileState, size: int) -> list[bytes]:
        """Read from ``state.offset`` (at most :data:`MAX_BYTES_PER_POLL`) and split complete lines.

        Advances ``state.offset``; an unterminated last line stays in ``state.pending``.
        """
        with path.open("rb") as handle:
            handle.seek(state.offset)
            data = handle.read(min(size - state.offset, MAX_BYTES_PER_POLL))
        state.offset += len(data)
        *complete, state.pending = (state.pending + data).split(b"\n")
        return complete

    def _feed_lines(
        self, path: Path, state: _FileState, lines: Iterable[bytes]
    ) -> Iterable[ThreadBudgetReading]:
        """Parse and feed complete lines in order, skipping blank and malformed ones."""
        for raw in lines:
            state.lines_read += 1
            text = raw.rstrip(b"\r")
            if not text.strip():
                continue
            try:
                record = parse_rollout_line(text.decode("utf-8"))
            except (UnicodeDecodeError, RolloutParseError) as error:
                self._report_malformed(path, state, error)
                continue
            reading = state.tracker.feed(record)
            if reading is not None:
                self._say_limit(path, state, reading)
                yield reading

    @staticmethod
    def _say_limit(path: Path, state: _FileState, reading: ThreadBudgetReading) -> None:
        """Log where a thread's L comes from when that changes (a warning when it is assumed)."""
        said = (reading.compaction_limit_source, reading.compaction_limit_reason)
        if said == state.limit_said:
            return
        state.limit_said = said
        level = logging.WARNING if reading.compaction_limit_source is LimitSource.ASSUMED else logging.INFO
        logger.log(
            level,
            "%s: Codex compacts at %d tokens (%s: %s)",
            path.name,
            reading.auto_compact_token_limit,
            reading.compaction_limit_source.value,
            reading.compaction_limit_reason,
        )

    @staticmethod
    def _report_malformed(path: Path, state: _FileState, error: Exception) -> None:
        """Log a skipped line: the first few per file at WARNING, the rest at DEBUG."""
        state.malformed_lines += 1
        if state.malformed_lines <= MALFORMED_WARNINGS_PER_FILE:
            logger.warning("skipping malformed line %d of %s: %s", state.lines_read, path, error)
            if state.malformed_lines == MALFORMED_WARNINGS_PER_FILE:
                logger.warning("further malformed lines of %s are logged at DEBUG level", path)
        else:
            logger.debug("skipping malformed line %d of %s: %s", state.lines_read, path, error)
