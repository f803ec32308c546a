"""The tailer's run loop: follow a live table and deliver each change row once.

Life cycle of :meth:`Tailer.run`:

1. Lock the state directory; load the saved cursor and snapshot, or start new
   (``starting_version`` / ``starting_timestamp_ms`` / ``initial_snapshot``).
   A state directory of another table (another table id) is refused.
2. Open the sink; if it reports the position it holds, rows before it are skipped.
3. Loop: find the commits after the snapshot's version (by name, see
   :class:`~tailer.log.follower.LogFollower`), plan and deliver each in order
   (for a sink that :attr:`~tailer.follow.sink.Sink.wants_audit_events`, the
   follower builds each commit's audit event before planning it, and it
   reaches the sink in :class:`~state.feed.CommitEvent`),
   and checkpoint (:mod:`tailer.follow.checkpointer`) every
   ``checkpoint_commits`` commits or ``checkpoint_seconds`` seconds. Between
   looks, wait for a change in ``_delta_log`` (see :mod:`tailer.log.watch`) or
   the poll interval.
4. SIGINT/SIGTERM (or :meth:`Tailer.stop`): finish the batch in hand, checkpoint, return.

Errors that stop it: a version gap or a log cleaned up past the cursor
(``VersionGapError``), a table deleted and recreated (``StateError``), an
unsupported reader feature or a non-additive schema change mid-stream
(``UnsupportedFeatureError``/``SchemaChangeError``) — in the last two cases
after delivering and checkpointing everything before that version.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from state.audit import AuditEvent
from state.cursor import Position
from state.errors import DeltaTailError, SchemaChangeError, StateError, UnsupportedFeatureError
from state.feed import ChangeBatch, CommitEvent, FollowStatus, TableInfo
from state.planning import VersionPlan, plan_snapshot
from state.snapshot import Snapshot
from tailer.audit.feed import AuditTracker
from tailer.follow.checkpointer import Checkpointer
from tailer.follow.faults import crash_point
from tailer.follow.sink import Sink
from tailer.follow.state_store import SavedState, StateStore
from tailer.follow.stats import TableState, TableStats
from tailer.follow.status import Progress, count_change_types, status
from tailer.log.delta_log import DeltaLog
from tailer.log.follower import GAP_CHECK_SECONDS, PREFETCH_COMMITS, AuditBuilder, Hints, LogFollower
from tailer.log.starts import snapshot_time, table_id, version_at_or_after
from tailer.log.watch import LogWatcher, Watcher
from tailer.read.feed import ChangeFeed, ChangeOptions
from tailer.storage import FileInfo, storage_for

log = logging.getLogger("deltatail")

#: Seconds between repeated "following" status lines when nothing changes.
STATUS_SECONDS = 30.0

#: What the tailer tells a user to do when the log no longer holds its position.
TAILER_HINTS = Hints(
    gap="to recover, start over with a new --state-dir and --initial-snapshot (the table's current state, "
    "then its changes), or --starting-version at a version the log still holds",
    recreated="use a new --state-dir to follow the new table",
)


@dataclass
class TailerConfig:
    """Settings of one tailer (see ``deltatail run --help`` for each)."""

    table: str
    state_dir: str
    starting_version: int | None = None
    starting_timestamp_ms: int | None = None
    initial_snapshot: bool = False
    poll_interval: float = 1.0
    max_poll_interval: float = 5.0
    watch: bool = True
    checkpoint_commits: int = 50
    checkpoint_seconds: float = 5.0
    snapshot_commits: int = 1000
    until_caught_up: bool = False
    parse_retries: int = 5
    parse_retry_delay: float = 0.05
    gap_check_seconds: float = GAP_CHECK_SECONDS
    options: ChangeOptions = field(default_factory=ChangeOptions)
    #: Options of the table's object store (credentials, endpoint); never shown, logged or saved.
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)


class Tailer:
    """Follows one table into one sink. Not reusable: construct one per run.

    Args:
        config: the settings.
        sink: where rows go (not yet opened).
        feed: plans and reads rows; by default a :class:`~tailer.read.feed.ChangeFeed` of
            ``config.table`` (on its storage, :func:`~tailer.storage.storage_for`) with ``config.options``.
        store: the state directory; by default ``StateStore(config.state_dir)``.
        watcher: makes the watcher of ``_delta_log`` (the log directory, whether to watch);
            by default :class:`~tailer.log.watch.LogWatcher`.
        clock: monotonic seconds (checkpoint intervals, status lines).
        wall_clock: epoch seconds (how far behind the newest commit the tailer is).
        stats: where the tailer's figures go (metrics, status); a new one by default.
    """

    def __init__(
        self,
        config: TailerConfig,
        sink: Sink,
        *,
        feed: ChangeFeed | None = None,
        store: StateStore | None = None,
        watcher: Callable[[str, bool], Watcher] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stats: TableStats | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        if feed is None:
            feed = ChangeFeed(config.table, storage_for(config.table, config.storage_options), config.options)
        self.feed = feed
        self.log: DeltaLog = self.feed.log
        self.store = store if store is not None else StateStore(config.state_dir)
        self._make_watcher = watcher if watcher is not None else _log_watcher
        self._clock = clock
        self._wall_clock = wall_clock
        self.progress = Progress()
        self._stop = threading.Event()
        self._snap: Snapshot | None = None
        self._follower: LogFollower | None = None
        self._checkpoints: Checkpointer | None = None
        self._cursor = Position.change(0, 0)
        self._resume: Position | None = None
        self._prev_ts: int | None = None
        self._table_id = ""
        self._status_version = -2
        self._status_time = 0.0
        self._unflushed = False
        self._watcher: Watcher | None = None
        self._idle_polls = 0
        self._open = False
        self.stats = stats if stats is not None else TableStats(self.log.table, table_name(self.log.table))

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, checkpoint and return (thread- and signal-safe)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.wake()

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        saved = self.store.load()
        if saved is not None:
            self._resume_saved(saved)
        else:
            self._start_new()
        self.stats.table_id = self._table_id
        self.stats.delivered_version = self._cursor.version - (0 if self._cursor.snapshot else 1)
        self.stats.newest_version = max(self.stats.newest_version, self.stats.delivered_version)
        self.feed.check_filter()  # fail fast on a column the table does not have
        held = self.sink.open(TableInfo(self.log.table, self._table_id, table_name(self.log.table)))
        if held is not None and held > self._cursor:
            log.info("sink already holds rows up to %s; skipping them", held)
            self._resume = held
        if saved is None and self._cursor.snapshot:
            self._checkpoint()  # fix the snapshot's version now, so a restart resumes the same snapshot

    def _new_follower(self, head: Snapshot, previous_ms: int | None, table_id: str | None) -> LogFollower:
        c = self.config
        return LogFollower(
            self.log,
            head,
            previous_ms=previous_ms,
            table_id=table_id,
            allow_non_additive=c.options.allow_non_additive,
            require_cdf=c.options.require_cdf,
            hints=TAILER_HINTS,
            gap_check_seconds=c.gap_check_seconds,
            parse_retries=c.parse_retries,
            retry_delay=c.parse_retry_delay,
            clock=self._clock,
            audit=self._audit_builder(),
        )

    def _audit_builder(self) -> AuditBuilder | None:
        """Builds each commit's audit event for a sink that wants them; ``None`` (nothing built) otherwise."""
        if not self.sink.wants_audit_events:
            return None
        return AuditTracker(self.log.table, self.log.storage).build

    def _checkpointer(self) -> Checkpointer:
        c = self.config
        return Checkpointer(
            self.store,
            self.sink,
            table=self.log.table,
            table_id=self._table_id,
            checkpoint_commits=c.checkpoint_commits,
            checkpoint_seconds=c.checkpoint_seconds,
            snapshot_commits=c.snapshot_commits,
            clock=self._clock,
        )

    def _resume_saved(self, saved: SavedState) -> None:
        snap = self.store.load_snapshot(saved)
        if snap.version >= 0 and (snap.metadata is None or snap.metadata.id != saved.table_id):
            raise StateError("saved snapshot does not match the saved table id", file=self.config.state_dir)
        current = table_id(self.log)
        if current != saved.table_id:
            raise StateError(
                f"this state directory belongs to table id {saved.table_id}, but {self.log.table} now has id "
                f"{current} (a different table, or the table was deleted and recreated); "
                "use a new --state-dir to start over",
                table=self.log.table,
                file=self.config.state_dir,
            )
        self._table_id = saved.table_id
        follower = self._new_follower(snap, saved.previous_timestamp_ms, saved.table_id)
        cursor = saved.cursor
        # Bring the snapshot to just before the cursor's version (commits already delivered).
        target = cursor.version if cursor.snapshot else cursor.version - 1
        for v in range(snap.version + 1, target + 1):
            try:
                snap, _ = snap.apply(follower.read_commit(v))
            except DeltaTailError as e:
                raise e.at(table=self.log.table, file=self.log.commit_path(v)) from None
        follower.reset(snap, saved.previous_timestamp_ms)
        self._follower = follower
        self._snap = snap
        self._prev_ts = saved.previous_timestamp_ms
        self._cursor = cursor
        self._resume = cursor
        self._checkpoints = self._checkpointer()
        self._checkpoints.saved_snapshot = (saved.snapshot_version, saved.snapshot_file)
        log.info("resuming %s at %s (saved snapshot version %d)", self.log.table, cursor, saved.snapshot_version)

    def _start_new(self) -> None:
        c = self.config
        start = c.starting_version
        if c.starting_timestamp_ms is not None:
            start = version_at_or_after(self.log, c.starting_timestamp_ms)
        if c.initial_snapshot:
            version = self.log.latest_version() if start is None else start
            snap = self.log.snapshot(version)
            self._cursor = Position.in_snapshot(version, 0)
        else:
            first = 0 if start is None else start
            snap = self.log.snapshot(first - 1) if first > 0 else Snapshot.empty(self.log.table)
            self._cursor = Position.change(first, 0)
        self._snap = snap
        self._table_id = table_id(self.log, snap)
        self._follower = self._new_follower(snap, None, self._table_id)
        self._checkpoints = self._checkpointer()

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
        self.open()
        # An object store cannot be watched: it is polled (listing from the last position).
        watcher = self._make_watcher(self.log.log_dir, self.config.watch and not self.log.storage.remote)
        self._watcher = watcher
        try:
            while not self._stop.is_set():
                delivered = self.step()
                if self._stop.is_set() or (not delivered and self.config.until_caught_up):
                    break
                if not delivered:
                    self.rest()
                    watcher.wait(self.idle_timeout())
            self._checkpoint()
        finally:
            watcher.close()
            self.close()
        return self.progress

    def open(self) -> None:
        """Lock the state directory, resume or start, open the sink, and deliver an initial snapshot if due.

        Raises:
            StateError, DeltaTailError: as :meth:`run`; the state directory is unlocked again then.
        """
        self.store.lock()
        try:
            self._start()
            self._open = True
            if self._cursor.snapshot:
                self._deliver_initial_snapshot()
        except BaseException as e:
            if isinstance(e, DeltaTailError):
                self.stats.errors[type(e).__name__] += 1
                self.stats.set_state(TableState.FAILED, str(e))
            if self._open:
                self.sink.close()
                self._open = False
            self.store.unlock()
            raise

    def step(self, max_versions: int | None = None) -> int:
        """Look at the log once and deliver what is new (at most ``max_versions`` versions); returns how many.

        Fewer than ``max_versions`` (or none) means caught up for now.

        Raises:
            DeltaTailError: as :meth:`run` (the cursor is saved first where that keeps what was delivered).
        """
        try:
            try:
                versions = self._new_versions(max_versions)
            except DeltaTailError:
                self._checkpoint()  # keep what was delivered: a restart then refuses or resumes from here
                raise
            self._deliver_versions(versions)
        except DeltaTailError as e:
            self.stats.errors[type(e).__name__] += 1
            self.stats.set_state(TableState.FAILED, str(e))
            raise
        self._idle_polls = 0 if versions else self._idle_polls + 1
        if versions and self.stats.state is not TableState.CATCHING_UP and self.stats.versions_behind:
            self.stats.set_state(TableState.CATCHING_UP)
        return len(versions)

    def rest(self) -> None:
        """Caught up: flush what was delivered, report, and let the sink send a heartbeat if one is due."""
        if self.stats.state is not TableState.FOLLOWING:
            self.stats.set_state(TableState.FOLLOWING)
        self._flush_idle()
        self._report_following()
        self.sink.heartbeat(self._follow_status())  # the sink decides whether one is due

    def close(self) -> None:
        """Close the sink and unlock the state directory (checkpoint first: :meth:`checkpoint`)."""
        if self._open:
            self._open = False
            try:
                self.sink.close()
            finally:
                self.store.unlock()
        if self.stats.state not in (TableState.FAILED, TableState.UNAVAILABLE):
            self.stats.set_state(TableState.STOPPED)

    def checkpoint(self) -> None:
        """Flush the sink and save the cursor now.

        Raises:
            SinkError: if the flush fails (the cursor is not saved).
        """
        self._checkpoint()

    def _new_versions(self, limit: int | None = None) -> list[int]:
        # Nothing new by name: the log is listed to tell "nothing new" from a gap (always before exiting).
        follower = self._following()
        versions = follower.discover(check_gaps=self.config.until_caught_up, limit=limit)
        if versions:
            newest = versions[-1] if limit is None or len(versions) < limit else self.log.latest_version()
            self.stats.newest_version = max(self.stats.newest_version, newest)
        return versions

    def _following(self) -> LogFollower:
        if self._follower is None:
            raise RuntimeError("the tailer has not started")  # a program error: run() starts it
        return self._follower

    def _deliver_versions(self, versions: list[int]) -> None:
        """Deliver new versions in order, planning and reading ahead of delivery within reach of a snapshot save.

        Planning a commit moves the snapshot's file tables on (:meth:`Snapshot.apply`),
        so while versions are planned ahead the snapshot in hand is exact only for
        the newest planned one. So versions are planned ahead in stretches that end
        where the checkpointer can next save the snapshot
        (:meth:`~tailer.follow.checkpointer.Checkpointer.snapshot_due_at`), and a
        checkpoint is taken there with the now exact snapshot before the next
        stretch starts. A checkpoint inside a stretch (one due by time) saves the
        cursor against the snapshot saved before, never a snapshot handed on.
        """
        checkpoints = self._checkpoints
        if checkpoints is None:
            raise RuntimeError("the tailer has not started")
        i = 0
        while i < len(versions) and not self._stop.is_set():
            due = checkpoints.snapshot_due_at(versions[i])
            j = i + 1
            while j < len(versions) and versions[j] <= due:
                j += 1
            stretch = versions[i:j]
            if not self._deliver_stretch(stretch, last=versions[-1]):
                return
            if stretch[-1] >= due and checkpoints.since:
                self._checkpoint()  # the snapshot is due and exact here
            i = j

    def _deliver_stretch(self, versions: list[int], last: int) -> bool:
        """Plan ``versions`` ahead of their delivery and deliver them; ``False`` if stopped inside one."""
        planned: dict[int, tuple[Snapshot, FileInfo, AuditEvent | None]] = {}
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
        self, versions: list[int], planned: dict[int, tuple[Snapshot, FileInfo, AuditEvent | None]]
    ) -> Iterator[VersionPlan]:
        """Plan ``versions`` in order from the follower's head; their snapshots, files and events go to ``planned``.

        Raises:
            DeltaTailError: what :meth:`LogFollower.plan` raises.
        """
        follower = self._following()
        for i, version in enumerate(versions):
            if i % (PREFETCH_COMMITS // 2) == 0:
                follower.prefetch(versions[i : i + PREFETCH_COMMITS])
            followed = follower.plan(version)
            planned[version] = (followed.snapshot, followed.file, followed.audit)
            yield self.feed.filtered(followed.plan)

    def _deliver_version(
        self,
        plan: VersionPlan,
        snap: Snapshot,
        info: FileInfo,
        audit: AuditEvent | None,
        task_batches: Iterable[Iterable[pa.RecordBatch]] | None,
        remaining: int,
    ) -> bool:
        """Deliver one planned version; ``False`` if stopped inside it (the cursor points at its next row)."""
        version = plan.context.version
        self._snap = snap
        if not self._deliver(plan, task_batches, audit):
            return False
        self._prev_ts = plan.context.timestamp_ms
        self._cursor = Position.change(version + 1, 0)
        if self._checkpoints is not None:
            self._checkpoints.delivered_version()
        self.progress.versions += 1
        self.stats.delivered_version = version
        self.stats.delivered_commit_ms = plan.context.timestamp_ms
        self.stats.newest_version = max(self.stats.newest_version, version)
        self.stats.commits += 1
        if remaining > 0 and self.progress.versions % 100 == 0:
            rate = self.progress.rows / max(self._clock() - self.progress.started, 1e-9)
            status(
                "catching_up",
                f"{self.stats.name}: catching up: version {version}, {remaining} versions remaining, "
                f"{self.progress.versions} versions and {self.progress.rows} rows done, {rate:,.0f} rows/s",
                table=self.stats.name,
                version=version,
                versions_remaining=remaining,
                versions_done=self.progress.versions,
                rows_done=self.progress.rows,
                rows_per_second=round(rate),
            )
        return True

    def _deliver_initial_snapshot(self) -> None:
        snap = self._snap
        if snap is None:
            raise RuntimeError("the tailer has not started")
        ts = snapshot_time(self.log, snap)
        with contextlib.closing(self.feed.read_plans(iter([plan_snapshot(snap, ts)]))) as reading:
            for plan, task_batches in reading:  # one plan: its files read ahead (by the reader processes if small)
                if not self._deliver(plan, task_batches):
                    return
        self._prev_ts = ts
        self._following().reset(snap, ts)
        self._cursor = Position.change(snap.version + 1, 0)
        self._checkpoint()

    def _deliver(
        self,
        plan: VersionPlan,
        task_batches: Iterable[Iterable[pa.RecordBatch]] | None = None,
        audit: AuditEvent | None = None,
    ) -> bool:
        """Write a version's rows (skipping delivered ones), then its commit event; ``False`` if stopped inside it."""
        counts: dict[str, int] = {}
        if plan.commit is not None:  # the commit's operation before its rows (Debezium's source.operation)
            info = plan.commit.commit_info
            self.sink.commit_started(plan.context.version, None if info is None else info.operation)
        for batch in self.feed.plan_batches(plan, task_batches):
            batch = self._skip_delivered(batch)
            if len(batch):
                self.sink.write(batch)
                self._unflushed = True
                crash_point("after_write")
                self.progress.rows += len(batch)
                self._account(batch, counts)
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
                    audit=audit,
                )
            )
        return True

    def _account(self, batch: ChangeBatch, counts: dict[str, int]) -> None:
        """Count a written batch's rows (and bytes, shared out by rows) by change type."""
        here: dict[str, int] = {}
        count_change_types(batch.rows.column("_change_type"), here)
        size = batch.rows.nbytes
        for kind, n in here.items():
            counts[kind] = counts.get(kind, 0) + n
            self.stats.rows[kind] += n
            self.stats.bytes[kind] += size * n // len(batch)

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
        if self._checkpoints is not None and self._checkpoints.is_due():
            self._checkpoint()

    def idle_timeout(self, poll: float | None = None) -> float:
        """How long to wait for news: ``poll`` (default the poll interval), but no later than a checkpoint due.

        On an object store (polled: nothing can be watched) the default interval doubles with
        every idle poll, up to ``max_poll_interval``, and is back to ``poll_interval`` once a
        commit is found.
        """
        c = self.config
        timeout = c.poll_interval if poll is None else poll
        if poll is None and self.log.storage.remote:
            backoff = c.poll_interval * 2 ** max(self._idle_polls - 1, 0)
            timeout = min(backoff, max(c.max_poll_interval, c.poll_interval))
        due_in = None if self._checkpoints is None else self._checkpoints.seconds_until_due()
        return timeout if due_in is None else min(timeout, due_in)

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
        """Take a checkpoint (see :mod:`tailer.follow.checkpointer`) at the cursor in hand."""
        if self._snap is None or self._checkpoints is None:
            return
        self._unflushed = False
        self._checkpoints.take(self._snap, self._cursor, self._prev_ts)
        self.stats.last_checkpoint = self._wall_clock()

    def _seconds_behind(self) -> float:
        """Seconds since the delivered version's commit timestamp (0 when unknown)."""
        return 0.0 if self._prev_ts is None else max(self._wall_clock() - self._prev_ts / 1000, 0.0)

    def _follow_status(self) -> FollowStatus:
        version = -1 if self._snap is None else self._snap.version
        return FollowStatus(self._table_id, version, version, self._seconds_behind())

    def _report_following(self) -> None:
        """A status line when following: on a new version, else at most every ``STATUS_SECONDS``."""
        snap = self._snap
        if snap is None:
            return
        now = self._clock()
        if snap.version == self._status_version and now - self._status_time < STATUS_SECONDS:
            return
        self._status_version, self._status_time = snap.version, now
        behind = self._seconds_behind()
        status(
            "following",
            f"{self.stats.name}: following: at version {snap.version}, 0 versions behind, "
            f"newest commit {behind:.1f}s ago",
            table=self.stats.name,
            version=snap.version,
            versions_behind=0,
            seconds_behind=round(behind, 3),
        )


def _log_watcher(log_dir: str, watch: bool) -> Watcher:
    return LogWatcher(log_dir, watch=watch)


def table_name(path: str) -> str:
    """The last part of a table's path or URI (``s3://bucket/sales/orders`` → ``orders``)."""
    return path.rstrip("/").rsplit("/", 1)[-1] or path
