"""The tailer's run loop: follow a live table and deliver each change row once.

Life cycle of :meth:`Tailer.run`:

1. Lock the state directory; load the saved cursor and snapshot, or start new
   (``starting_version`` / ``starting_timestamp_ms`` / ``initial_snapshot``).
   A state directory of another table (another table id) is refused.
2. Open the sink; if it reports the position it holds, rows before it are skipped.
3. Loop: list the log after the snapshot's version (``start_after``: never
   the whole directory), plan and deliver each new commit in order, and save
   a checkpoint every ``checkpoint_commits`` commits or ``checkpoint_seconds``
   seconds. Between looks, wait for a change in ``_delta_log`` (see :mod:`tailer.watch`) or the poll interval.
4. A checkpoint is: sink flushed → cursor (and, every
   ``snapshot_commits`` commits, the snapshot) saved. After a crash the tailer
   repeats at most the rows after the last saved cursor; with a sink that
   reports its position, nothing.
5. SIGINT/SIGTERM: finish the batch in hand, checkpoint, return.

Errors that stop it: a version gap or a log cleaned up past the cursor
(``VersionGapError``), a table deleted and recreated (``StateError``), an
unsupported reader feature or a non-additive schema change mid-stream
(``UnsupportedFeatureError``/``SchemaChangeError``) — in the last two cases
after delivering and checkpointing everything before that version.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import FrameType

import pyarrow as pa
import pyarrow.compute as pc

from sinks.base import ChangeBatch, CommitEvent, FollowStatus, Sink, TableInfo
from state.commit import Commit
from state.cursor import Position
from state.errors import (
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    SinkUnavailableError,
    StateError,
    UnsupportedFeatureError,
    VersionGapError,
)
from state.snapshot import Snapshot
from tailer.changes import ChangeFeed, ChangeOptions, VersionPlan
from tailer.faults import crash_point
from tailer.log import DeltaLog
from tailer.state_store import SavedState, StateStore
from tailer.storage import FileInfo
from tailer.watch import LogWatcher

log = logging.getLogger("deltatail")


def status(event: str, message: str, *, level: int = logging.INFO, **fields: object) -> None:
    """Log a status line; ``event`` and ``fields`` ride along for structured (JSON) logs."""
    log.log(level, "%s", message, extra={"event": event, "fields": fields})


#: The GIL switch interval a following tailer process uses (Python's default is 5 ms): work handed to
#: the run loop by another thread reaches it sooner. Set by :func:`tune_for_latency`.
SWITCH_INTERVAL = 0.0005


def tune_for_latency() -> None:
    """Shorten the interpreter's thread switch interval for this process (the ``deltatail run`` command does).

    Where a commit is noticed by another thread (watchdog's observer, on platforms
    without inotify) or a sink works on its own thread (kafka-python's sender), a
    hand-over to the run loop with the default 5 ms interval often waits for a
    slice to end. On Linux the run loop waits on inotify itself.
    """
    sys.setswitchinterval(SWITCH_INTERVAL)


#: Seconds between repeated "following" status lines when nothing changes.
STATUS_SECONDS = 30.0
#: Seconds between listings of the log that look for a gap when no next commit exists.
GAP_CHECK_SECONDS = 10.0


def _count_change_types(column: pa.Array, counts: dict[str, int]) -> None:
    """Add each change type's number of rows in ``column`` to ``counts``."""
    if len(column) > 64:  # one kernel call instead of a Python object per row
        pairs = [(item["values"], item["counts"]) for item in pc.value_counts(column).to_pylist()]
    else:
        pairs = [(kind, 1) for kind in column.to_pylist()]
    for kind, n in pairs:
        counts[kind] = counts.get(kind, 0) + n


@dataclass
class TailerConfig:
    """Settings of one tailer (see ``deltatail run --help`` for each)."""

    table: str
    state_dir: str
    starting_version: int | None = None
    starting_timestamp_ms: int | None = None
    initial_snapshot: bool = False
    poll_interval: float = 1.0
    watch: bool = True
    checkpoint_commits: int = 50
    checkpoint_seconds: float = 5.0
    snapshot_commits: int = 1000
    until_caught_up: bool = False
    parse_retries: int = 5
    parse_retry_delay: float = 0.05
    options: ChangeOptions = field(default_factory=ChangeOptions)


@dataclass
class Progress:
    """Counters for logs and the status line."""

    versions: int = 0
    rows: int = 0
    started: float = field(default_factory=time.monotonic)


class Tailer:
    """Follows one table into one sink. Not reusable: construct one per run."""

    def __init__(self, config: TailerConfig, sink: Sink) -> None:
        self.config = config
        self.sink = sink
        self.feed = ChangeFeed(config.table, options=config.options)
        self.log: DeltaLog = self.feed.log
        self.store = StateStore(config.state_dir)
        self.progress = Progress()
        self._stop = threading.Event()
        self._snap: Snapshot | None = None
        self._cursor = Position.change(0, 0)
        self._resume: Position | None = None
        self._prev_ts: int | None = None
        self._saved_snapshot: tuple[int, str] | None = None
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()
        self._table_id = ""
        self._status_version = -2
        self._unflushed = False
        self._last_commit_id: tuple[int, int] | None = None
        self._watcher: LogWatcher | None = None
        self._last_gap_check = -GAP_CHECK_SECONDS
        self._status_time = 0.0

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, checkpoint and return (thread- and signal-safe)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.wake()

    def install_signal_handlers(self) -> None:
        """Make SIGINT and SIGTERM call :meth:`stop`."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        saved = self.store.load()
        if saved is not None:
            self._resume_saved(saved)
        else:
            self._start_new()
        held = self.sink.open(TableInfo(self.log.table, self._table_id, _table_name(self.log.table)))
        if held is not None and held > self._cursor:
            log.info("sink already holds rows up to %s; skipping them", held)
            self._resume = held
        if saved is None and self._cursor.snapshot:
            self._checkpoint()  # fix the snapshot's version now, so a restart resumes the same snapshot

    def _resume_saved(self, saved: SavedState) -> None:
        snap = self.store.load_snapshot(saved)
        if snap.metadata is None or snap.metadata.id != saved.table_id:
            raise StateError("saved snapshot does not match the saved table id", file=self.config.state_dir)
        self._check_same_table(saved)
        self._table_id = saved.table_id
        self._saved_snapshot = (saved.snapshot_version, saved.snapshot_file)
        self._prev_ts = saved.previous_timestamp_ms
        cursor = saved.cursor
        # Bring the snapshot to just before the cursor's version (commits already delivered).
        target = cursor.version if cursor.snapshot else cursor.version - 1
        for v in range(snap.version + 1, target + 1):
            snap, _ = snap.apply(self._read_commit(v))
        self._snap = snap
        self._cursor = cursor
        self._resume = cursor
        log.info("resuming %s at %s (saved snapshot version %d)", self.log.table, cursor, saved.snapshot_version)

    def _check_same_table(self, saved: SavedState) -> None:
        try:
            metadata = self.log.read_commit(0).metadata
        except MissingFileError:
            metadata = None
        if metadata is None:
            metadata = self.log.snapshot().metadata
        assert metadata is not None
        if metadata.id != saved.table_id:
            raise StateError(
                f"this state directory belongs to table id {saved.table_id}, but {self.log.table} now has id "
                f"{metadata.id} (a different table, or the table was deleted and recreated); "
                "use a new --state-dir to start over",
                table=self.log.table,
                file=self.config.state_dir,
            )

    def _start_new(self) -> None:
        c = self.config
        start = c.starting_version
        if c.starting_timestamp_ms is not None:
            start = self.feed.version_at_or_after(c.starting_timestamp_ms)
        if c.initial_snapshot:
            version = self.log.latest_version() if start is None else start
            snap = self.log.snapshot(version)
            self._cursor = Position.in_snapshot(version, 0)
        else:
            first = 0 if start is None else start
            snap = self.log.snapshot(first - 1) if first > 0 else Snapshot.empty(self.log.table)
            self._cursor = Position.change(first, 0)
        self._snap = snap
        self._table_id = self._first_metadata_id(snap)

    def _first_metadata_id(self, snap: Snapshot) -> str:
        """The table id: from the snapshot, or from commit 0 when starting before version 0."""
        metadata = snap.metadata if snap.metadata is not None else self._read_commit(0).metadata
        if metadata is None:
            raise InvalidLogError("commit 0 holds no metaData action", table=self.log.table, version=0)
        return metadata.id

    # -- loop ----------------------------------------------------------------------------------

    def run(self) -> Progress:
        """Run until caught up (``until_caught_up``), stopped, or an error.

        Raises:
            StateError: the state directory is locked, damaged, or belongs to another table.
            VersionGapError: a commit is missing, or the log was cleaned up past the cursor.
            UnsupportedFeatureError: a commit needs an unsupported reader feature (cursor saved before it).
            SchemaChangeError: a non-additive schema change (cursor saved before it).
            SinkError: the sink failed; the cursor stays at the last successful checkpoint.
        """
        with self.store:
            self._start()
            watcher = LogWatcher(self.log.log_dir, watch=self.config.watch)
            self._watcher = watcher
            try:
                self._loop(watcher)
            finally:
                watcher.close()
                self.sink.close()
        return self.progress

    def _loop(self, watcher: LogWatcher) -> None:
        assert self._snap is not None
        if self._cursor.snapshot:
            self._deliver_initial_snapshot()
        while not self._stop.is_set():
            try:
                versions = self._new_versions()
            except DeltaTailError:
                self._checkpoint()  # keep what was delivered: a restart then refuses or resumes from here
                raise
            self._deliver_versions(versions)
            if self._stop.is_set():
                break
            if not versions:
                if self.config.until_caught_up:
                    break
                self._flush_idle()
                self._report_following()
                # Issue 19: the sink may send a heartbeat (it decides whether one is due).
                behind = 0.0 if self._prev_ts is None else max(time.time() - self._prev_ts / 1000, 0.0)
                self.sink.heartbeat(FollowStatus(self._table_id, self._snap.version, self._snap.version, behind))
                watcher.wait(self._idle_timeout())
        self._checkpoint()

    def _new_versions(self) -> list[int]:
        assert self._snap is not None
        self._check_not_recreated()
        versions = self.log.new_commits(self._snap.version, check_gaps=False)
        if versions:
            return versions
        now = time.monotonic()
        if self.config.until_caught_up or now - self._last_gap_check >= GAP_CHECK_SECONDS:
            # Nothing new by name: list the log to tell "nothing new" from a gap (never before exiting).
            self._last_gap_check = now
            try:
                versions = self.log.new_commits(self._snap.version, check_gaps=True)
            except VersionGapError as e:
                raise VersionGapError(
                    f"{e.message}; to recover, start over with a new --state-dir and --initial-snapshot "
                    "(the table's current state, then its changes), or --starting-version at a version "
                    "the log still holds",
                    table=e.table,
                    version=e.version,
                    file=e.file,
                ) from e
        return versions

    def _check_not_recreated(self) -> None:
        """Make sure the tailer's last commit is still the one it read (a deleted and recreated table).

        The commit file's size and modification time, recorded when it was read,
        must be unchanged; a missing file is fine only if the log still goes on
        past it (cleaned up by log retention).
        """
        assert self._snap is not None
        v = self._snap.version
        if v < 0:
            return
        try:
            info = self.log.storage.stat(self.log.commit_path(v))
        except MissingFileError:
            info = None
        if info is not None:
            if self._last_commit_id is None or self._last_commit_id == (info.size, info.modification_time):
                self._last_commit_id = (info.size, info.modification_time)
                return
            reason = f"commit {v} was rewritten since the tailer read it"
        else:
            try:
                latest = self.log.latest_version()
            except DeltaTailError:
                latest = -1
            if latest >= v:
                return
            reason = f"the table's log now ends at version {latest}, before the tailer's version {v}"
        raise StateError(
            f"{reason}: the table was deleted and recreated, or its log truncated; "
            "use a new --state-dir to follow the new table",
            table=self.log.table,
            version=v,
        )

    def _read_commit(self, version: int) -> Commit:
        """Read a commit, retrying briefly: a writer may still be writing it (non-atomic stores)."""
        for attempt in range(self.config.parse_retries + 1):
            try:
                return self.log.read_commit(version)
            except InvalidLogError:
                if attempt == self.config.parse_retries:
                    raise
                time.sleep(self.config.parse_retry_delay * (2**attempt))
            except MissingFileError as e:
                raise VersionGapError(
                    f"commit {version} is missing: the log was cleaned up past the tailer's position; "
                    "restart with a new --state-dir and --initial-snapshot to resume from the table's latest state",
                    table=self.log.table,
                    version=version,
                    file=e.file,
                ) from e
        raise AssertionError("unreachable")

    def _deliver_versions(self, versions: list[int]) -> None:
        """Deliver new versions in order, planning and reading ahead of delivery within reach of a snapshot save.

        Planning a commit moves the snapshot's file tables on (:meth:`Snapshot.apply`),
        so while versions are planned ahead the snapshot in hand is exact only for
        the newest planned one. A checkpoint saves the snapshot once it is
        ``snapshot_commits`` versions past the saved one (or when none is saved
        yet); so versions are planned ahead in stretches that end at that version
        (or, once it is passed, at the next checkpoint by commit count), where a
        checkpoint is taken with the now exact snapshot before the next stretch
        starts. A checkpoint inside a stretch (one due by time) saves the cursor
        against the snapshot saved before, never a snapshot handed on.
        """
        i = 0
        while i < len(versions) and not self._stop.is_set():
            saved = self._saved_snapshot
            due = None if saved is None else saved[0] + self.config.snapshot_commits
            if due is None or due <= versions[i]:
                # Any checkpoint would save the snapshot: plan ahead only up to the next one by commit count.
                due = versions[i] + max(self.config.checkpoint_commits - self._since_checkpoint, 1) - 1
            j = i + 1
            while j < len(versions) and versions[j] <= due:
                j += 1
            stretch = versions[i:j]
            if not self._deliver_stretch(stretch, last=versions[-1]):
                return
            if stretch[-1] >= due and self._since_checkpoint:
                self._checkpoint()  # the snapshot is due and exact here
            i = j

    def _deliver_stretch(self, versions: list[int], last: int) -> bool:
        """Plan ``versions`` ahead of their delivery and deliver them; ``False`` if stopped inside one."""
        planned: dict[int, tuple[Snapshot, FileInfo]] = {}
        try:
            with contextlib.closing(self.feed.read_plans(self._plan_versions(versions, planned))) as reading:
                for plan, task_batches in reading:
                    version = plan.context.version
                    if self._stop.is_set():
                        return False
                    if not self._deliver_version(plan, *planned.pop(version), task_batches, remaining=last - version):
                        return False
                    self._maybe_checkpoint()
        except (UnsupportedFeatureError, SchemaChangeError) as e:
            log.error("stopping before version %s; everything before it is delivered and checkpointed", e.version)
            self._checkpoint()
            raise
        return True

    def _plan_versions(
        self, versions: list[int], planned: dict[int, tuple[Snapshot, FileInfo]]
    ) -> Iterator[VersionPlan]:
        """Plan ``versions`` in order from the snapshot in hand; each one's snapshot and commit go to ``planned``."""
        assert self._snap is not None
        snap, previous_ms = self._snap, self._prev_ts
        for version in versions:
            commit = self._read_commit(version)
            info = self.log.storage.stat(self.log.commit_path(version))
            snap, plan = self.feed.plan_commit(snap, commit, info.modification_time, previous_ms)
            previous_ms = plan.context.timestamp_ms
            planned[version] = (snap, info)
            yield plan

    def _deliver_version(
        self,
        plan: VersionPlan,
        snap: Snapshot,
        info: FileInfo,
        task_batches: Iterable[Iterable[pa.RecordBatch]] | None,
        remaining: int,
    ) -> bool:
        """Deliver one planned version; ``False`` if stopped inside it (the cursor points at its next row)."""
        version = plan.context.version
        self._snap = snap
        self._last_commit_id = (info.size, info.modification_time)
        if not self._deliver(plan, task_batches):
            return False
        self._prev_ts = plan.context.timestamp_ms
        self._cursor = Position.change(version + 1, 0)
        self._since_checkpoint += 1
        self.progress.versions += 1
        if remaining > 0 and self.progress.versions % 100 == 0:
            rate = self.progress.rows / max(time.monotonic() - self.progress.started, 1e-9)
            status(
                "catching_up",
                f"catching up: version {version}, {remaining} versions remaining, "
                f"{self.progress.versions} versions and {self.progress.rows} rows done, {rate:,.0f} rows/s",
                version=version,
                versions_remaining=remaining,
                versions_done=self.progress.versions,
                rows_done=self.progress.rows,
                rows_per_second=round(rate),
            )
        return True

    def _deliver_initial_snapshot(self) -> None:
        assert self._snap is not None
        snap = self._snap
        ts = self.feed.snapshot_time(snap)
        with contextlib.closing(self.feed.read_plans(iter([self.feed.plan_snapshot(snap, ts)]))) as reading:
            for plan, task_batches in reading:  # one plan: its files read ahead (by the reader processes if small)
                if not self._deliver(plan, task_batches):
                    return
        self._prev_ts = ts
        self._cursor = Position.change(snap.version + 1, 0)
        self._checkpoint()

    def _deliver(self, plan: VersionPlan, task_batches: Iterable[Iterable[pa.RecordBatch]] | None = None) -> bool:
        """Write a version's rows (skipping delivered ones); returns ``False`` if stopped inside it."""
        counts: dict[str, int] = {}
        if plan.commit is not None:  # Issue 19: the commit's Delta operation, for Debezium's source.operation
            info = plan.commit.commit_info
            self.sink.commit_started(plan.context.version, None if info is None else info.operation)
        for batch in self.feed.plan_batches(plan, task_batches):
            batch = self._skip_delivered(batch)
            if len(batch):
                self.sink.write(batch)
                self._unflushed = True
                crash_point("after_write")
                self.progress.rows += len(batch)
                _count_change_types(batch.rows.column("_change_type"), counts)
            self._cursor = batch.end
            if self._stop.is_set():
                return False
        if plan.commit is not None:
            info = plan.commit.commit_info
            self.sink.commit_event(
                CommitEvent(
                    version=plan.context.version,
                    timestamp_ms=plan.context.timestamp_ms,
                    operation=None if info is None else info.operation,
                    operation_metrics={} if info is None else info.operation_metrics,
                    row_counts=counts,
                )
            )
        return True

    def _skip_delivered(self, batch: ChangeBatch) -> ChangeBatch:
        if self._resume is None:
            return batch
        if batch.end <= self._resume:
            return batch.slice_from(batch.end)
        out = batch.slice_from(self._resume)
        self._resume = None
        return out

    # -- checkpoints ---------------------------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        c = self.config
        due = time.monotonic() - self._last_checkpoint >= c.checkpoint_seconds
        if self._since_checkpoint >= c.checkpoint_commits or (due and self._since_checkpoint):
            self._checkpoint()

    def _idle_timeout(self) -> float:
        """How long to wait for news: the poll interval, but no later than the next checkpoint that is due."""
        timeout = self.config.poll_interval
        if self._since_checkpoint:
            due_in = self._last_checkpoint + self.config.checkpoint_seconds - time.monotonic()
            timeout = min(timeout, max(due_in, 0.0))
        return timeout

    def _flush_idle(self) -> None:
        """Caught up: make delivered rows durable now (latency); save the cursor only when a checkpoint is due.

        Saving the cursor costs a few fsyncs and renames, so following a table one
        commit at a time does it on the checkpoint interval, not per commit; a crash
        in between repeats at most those commits' rows, and none with a sink that
        reports what it holds.
        """
        if self._unflushed:
            self.sink.flush()
            self._unflushed = False
        self._maybe_checkpoint()

    def _checkpoint(self) -> None:
        """Sink flushed, then cursor saved (with a fresh snapshot when due).

        The snapshot in hand is consistent with the cursor only at a version
        boundary (cursor at the first row of the next version, or inside the
        initial snapshot of the snapshot's own version). Inside a commit, the cursor
        is saved with the last saved snapshot and resuming replays the commits
        after it without delivering them.
        """
        if self._snap is None:
            return
        self.sink.flush()
        self._unflushed = False
        crash_point("after_flush")
        snap, cursor = self._snap, self._cursor
        at_boundary = (not cursor.snapshot and cursor == Position.change(snap.version + 1, 0)) or (
            cursor.snapshot and cursor.version == snap.version
        )
        saved = self._saved_snapshot
        due = saved is None or snap.version - saved[0] >= self.config.snapshot_commits
        if at_boundary and due and snap.protocol is not None and not snap.handed_on:
            # (A snapshot handed on belongs to a version planned ahead of delivery: the next save will do.)
            if self._prev_ts is not None:
                snap.expire_tombstones(self._prev_ts)
            saved = (snap.version, self.store.save_snapshot(snap))
            crash_point("after_snapshot")
            self._saved_snapshot = saved
        if saved is None or (not at_boundary and saved[0] >= cursor.version):
            return  # nothing consistent to resume from yet; a restart redoes this from the start
        self.store.save(SavedState(self.log.table, self._table_id, cursor, saved[0], saved[1], self._prev_ts))
        crash_point("after_save")
        self._since_checkpoint = 0
        self._last_checkpoint = time.monotonic()

    def _report_following(self) -> None:
        """A status line when following: on a new version, else at most every ``STATUS_SECONDS``."""
        assert self._snap is not None
        now = time.monotonic()
        if self._snap.version == self._status_version and now - self._status_time < STATUS_SECONDS:
            return
        self._status_version, self._status_time = self._snap.version, now
        behind = 0.0 if self._prev_ts is None else max(time.time() - self._prev_ts / 1000, 0.0)
        status(
            "following",
            f"following: at version {self._snap.version}, 0 versions behind, newest commit {behind:.1f}s ago",
            version=self._snap.version,
            versions_behind=0,
            seconds_behind=round(behind, 3),
        )


class TailerService:
    """Runs tailers one after another while the sink is unavailable: the cursor is held, nothing is lost.

    A :class:`~state.errors.SinkUnavailableError` (broker down, delivery not
    acknowledged in time) ends a tailer run with its cursor at the last
    checkpoint whose flush succeeded. The service waits (exponential backoff,
    capped at ``max_backoff`` seconds), reports it in the status line, and starts
    a new tailer from the saved state, which resends everything after the cursor:
    the sink acknowledges nothing its destination did not accept. Other errors
    end the service at once.
    """

    def __init__(
        self,
        config: TailerConfig,
        make_sink: Callable[[], Sink],
        *,
        retries: int | None = None,
        max_backoff: float = 60.0,
    ) -> None:
        self.config = config
        self.make_sink = make_sink
        self.retries = retries
        self.max_backoff = max_backoff
        self._stopping = threading.Event()
        self._current: Tailer | None = None

    def stop(self) -> None:
        """Stop the running tailer (after its batch in hand) or the wait before the next one."""
        self._stopping.set()
        if self._current is not None:
            self._current.stop()

    def install_signal_handlers(self) -> None:
        """Make SIGINT and SIGTERM call :meth:`stop`."""

        def handler(signum: int, frame: FrameType | None) -> None:
            self.stop()

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def run(self) -> Progress:
        """Run tailers until one finishes, is stopped, or fails with something other than an unavailable sink.

        Raises:
            SinkUnavailableError: when ``retries`` runs in a row have failed on an unavailable sink.
            DeltaTailError: whatever else stops a tailer (see :meth:`Tailer.run`).
        """
        total = Progress()
        failures = 0
        while not self._stopping.is_set():
            tailer = Tailer(self.config, self.make_sink())
            self._current = tailer
            try:
                done = tailer.run()
                total.versions += done.versions
                total.rows += done.rows
                return total
            except SinkUnavailableError as e:
                total.versions += tailer.progress.versions
                total.rows += tailer.progress.rows
                failures = 1 if tailer.progress.versions else failures + 1
                if self.retries is not None and failures > self.retries:
                    raise
                delay = min(self.max_backoff, 0.5 * 2 ** (failures - 1))
                status(
                    "sink_unavailable",
                    f"sink unavailable: {e.message}; holding the cursor at the last checkpoint, "
                    f"retrying in {delay:.1f}s (attempt {failures})",
                    level=logging.WARNING,
                    retry_in_seconds=delay,
                    attempt=failures,
                )
                self._stopping.wait(delay)
            finally:
                self._current = None
        return total


def _table_name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] or path
