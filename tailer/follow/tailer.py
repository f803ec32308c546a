"""The tailer's run loop: follow a live table and deliver each change row once.

Life cycle of :meth:`Tailer.run`:

1. Lock the state directory; load the saved cursor and snapshot, or start new
   (``starting_version`` / ``starting_timestamp_ms`` / ``initial_snapshot``).
   A state directory of another table (another table id) is refused.
2. Open the sink; if it reports the position it holds, rows before it are skipped.
3. Loop: find the commits after the snapshot's version (by name, see
   :class:`~tailer.log.follower.LogFollower`), plan and deliver each in order
   (for a sink that :attr:`~tailer.sink.Sink.wants_audit_events`, the
   follower builds each commit's audit event before planning it, and it
   reaches the sink in :class:`~state.feed.CommitEvent`),
   and checkpoint (:mod:`tailer.follow.checkpointer`) every
   ``checkpoint_commits`` commits or ``checkpoint_seconds`` seconds. Between
   looks, wait for a change in ``_delta_log`` (see :mod:`tailer.log.watch`) or
   the poll interval.
4. SIGINT/SIGTERM (or :meth:`Tailer.stop`): finish the batch in hand, checkpoint, return.

Errors that stop it: a version gap or a log cleaned up past the cursor
(``VersionGapError``) and a file vacuumed (``MissingFileError``), unless
``on_data_loss`` says to resnapshot or skip (:meth:`Tailer._data_lost`), a table
deleted and recreated (``StateError``), an
unsupported reader feature or, unless ``options.allow_non_additive`` (``run``'s default,
``on_schema_change = evolve``), a non-additive schema change mid-stream
(``UnsupportedFeatureError``/``SchemaChangeError``) — in the last two cases
after delivering and checkpointing everything before that version.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from deltatail.state.cursor import Position
from deltatail.state.errors import (
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    StateError,
    UnsupportedFeatureError,
    VersionGapError,
)
from deltatail.state.feed import CommitEvent, TableInfo
from deltatail.state.planning import VersionPlan, plan_snapshot
from deltatail.state.retention import retention
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.follow.change_loop import ChangeLoop
from deltatail.tailer.follow.checkpointer import Checkpointer
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.log_parts import checkpointer, log_follower
from deltatail.tailer.follow.loop import table_name
from deltatail.tailer.follow.state_store import SavedState, StateStore
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import PREFETCH_COMMITS, AuditBuilder, Hints, LogFollower
from deltatail.tailer.log.starts import snapshot_time, table_id, version_at_or_after
from deltatail.tailer.log.watch import Watcher
from deltatail.tailer.read.feed import ChangeFeed
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage import FileInfo
from deltatail.tailer.table import table_storage

if TYPE_CHECKING:  # audit events are built only for a sink that wants them (_audit_builder)
    from deltatail.state.audit import AuditEvent

__all__ = ["TAILER_HINTS", "Tailer", "TailerConfig", "table_name"]

log = logging.getLogger("deltatail")

#: What the tailer tells a user to do when the log no longer holds its position.
TAILER_HINTS = Hints(
    gap="to recover, start over with a new --state-dir and --initial-snapshot (the table's current state, "
    "then its changes), or --starting-version at a version the log still holds",
    recreated="use a new --state-dir to follow the new table",
)


class Tailer(ChangeLoop):
    """Follows one table into one sink. Not reusable: construct one per run.

    Args:
        config: the settings.
        sink: where rows go (not yet opened).
        feed: plans and reads rows; by default a :class:`~tailer.read.feed.ChangeFeed` of
            ``config.table`` (on its storage, :func:`~tailer.table.table_storage`) with ``config.options``.
        store: the state directory; by default ``StateStore(config.state_dir)``.
        watcher: makes the watcher of ``_delta_log`` (the log directory, whether to watch);
            by default :class:`~tailer.log.watch.LogWatcher`.
        clock: monotonic seconds (checkpoint intervals, status lines).
        wall_clock: epoch seconds (how far behind the newest commit the tailer is).
        stats: where the tailer's figures go (metrics, status); a new one by default.
        status_file: whether the tailer keeps ``status.json`` in its state directory (``deltatail serve``
            writes its tables' itself).
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
        status_file: bool = True,
    ) -> None:
        if feed is None:
            feed = ChangeFeed(config.table, table_storage(config.table, config.storage_options), config.options)
        feed.pair_updates(sink.update_pair_key)
        super().__init__(
            config,
            sink,
            feed.log.table,
            store=store,
            watcher=watcher,
            clock=clock,
            wall_clock=wall_clock,
            stats=stats,
            status_file=status_file,
        )
        self.feed = feed
        self.log: DeltaLog = self.feed.log
        self._snap: Snapshot | None = None
        self._follower: LogFollower | None = None
        self._checkpoints: Checkpointer | None = None
        self._prev_ts: int | None = None
        self._retention_of: object = None  # the metadata stats.retention was read from
        self._lost_at_start: VersionGapError | None = None  # the log no longer reaches the saved cursor

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        saved = self.store.load()
        if saved is not None:
            self._resume_saved(saved)
        else:
            self._start_new()
        self.stats.table_id = self._table_id
        if self._snap is not None:
            self._note_retention(self._snap)
        self.stats.delivered_version = self._cursor.base_version
        self.stats.newest_version = max(self.stats.newest_version, self.stats.delivered_version)
        self.feed.check_filter()  # fail fast on a column the table does not have
        self._open_sink(TableInfo(self.log.table, self._table_id, table_name(self.log.table)))
        if saved is not None:
            self.feed.adopt_row_order(self._resume or self._cursor, saved.row_order, saved.earlier_order)
        if saved is None and (self._cursor.snapshot or self._cursor.version > 0):
            # Fix the start now: a restart resumes the same snapshot, or a cursor inside the first commit
            # (saved with a snapshot before it, see Checkpointer.take) has a snapshot to resume from.
            self._checkpoint()
        if self._lost_at_start is not None:
            self._data_lost(self._lost_at_start)

    def _new_follower(self, head: Snapshot, previous_ms: int | None, table_id: str | None) -> LogFollower:
        options = self.config.options
        follower = log_follower(
            self.log,
            head,
            self.config,
            previous_ms=previous_ms,
            table_id=table_id,
            hints=TAILER_HINTS,
            clock=self._clock,
            audit=self._audit_builder(),
            allow_non_additive=options.allow_non_additive,
            require_cdf=options.require_cdf,
            external_roots=options.external_roots,
        )
        # On a store, the check that the table was not recreated overlaps the data's reads and is awaited
        # before any row is delivered (_deliver_version): a followed commit costs two round trips, not three.
        follower.defer_checks = True
        return follower

    def _audit_builder(self) -> AuditBuilder | None:
        """Builds each commit's audit event for a sink that wants them; ``None`` (nothing built) otherwise."""
        if not self.sink.wants_audit_events:
            return None
        from deltatail.tailer.audit.feed import AuditTracker  # the audit model loads only for a sink that wants it

        return AuditTracker(self.log.table, self.log.storage, external_roots=self.config.options.external_roots).build

    def _checkpointer(self) -> Checkpointer:
        return checkpointer(
            self.store,
            self.sink,
            self.config,
            table=self.log.table,
            table_id=self._table_id,
            clock=self._clock,
            earlier_order=self.feed.earlier_order,
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
        try:
            snap = self._replay(follower, snap, self._resume_version(saved))
        except VersionGapError as e:
            if self.config.on_data_loss == "fail":
                raise
            self._lost_at_start = e  # dealt with once the sink is open (see _data_lost)
        follower.reset(snap, saved.previous_timestamp_ms)
        self._follower = follower
        self._snap = snap
        self._prev_ts = saved.previous_timestamp_ms
        self._cursor = cursor
        self._resume = cursor
        self._rows_end = saved.rows_end
        self._checkpoints = self._checkpointer()
        self._checkpoints.saved_snapshot = (saved.snapshot_version, saved.snapshot_file)
        log.info("resuming %s at %s (saved snapshot version %d)", self.log.table, cursor, saved.snapshot_version)

    def _resume_version(self, saved: SavedState) -> int:
        """The version whose state a resumed tailer rebuilds before delivering from the saved cursor."""
        return saved.cursor.base_version

    def _replay(self, follower: LogFollower, snap: Snapshot, target: int) -> Snapshot:
        """``snap`` brought on to version ``target`` by the commits after it (already delivered ones).

        Where the log was cleaned up after ``snap`` but still reaches ``target`` from a checkpoint,
        the snapshot at ``target`` is built from the log instead: nothing was lost.

        Raises:
            VersionGapError: if the log no longer reaches ``target``.
            DeltaTailError: a commit that cannot be read, naming it.
        """
        for v in range(snap.version + 1, target + 1):
            try:
                snap, _ = snap.apply(follower.read_commit(v))
            except VersionGapError:
                if self.log.earliest_version() > target:
                    raise
                return self.log.snapshot(target)
            except DeltaTailError as e:
                raise e.at(table=self.log.table, file=self.log.commit_path(v)) from None
        return snap

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

    unit = "commit"

    @property
    def _watch_dir(self) -> str:
        return self.log.log_dir

    @property
    def _remote(self) -> bool:
        return self.log.storage.remote

    def _new_versions(self, limit: int | None = None) -> list[int]:
        try:
            return self._look(limit)
        except VersionGapError as e:
            self._data_lost(e)
            return self._look(limit)

    def _look(self, limit: int | None) -> list[int]:
        # Nothing new by name: the log is listed to tell "nothing new" from a gap (always before exiting).
        follower = self._following()
        versions = follower.discover(check_gaps=self.config.until_caught_up, limit=limit)
        if versions:
            newest = versions[-1] if limit is None or len(versions) < limit else self.log.latest_version()
            self.stats.found(newest, follower.discovered_ms(versions[0]))
        return versions

    def _commit_time_ms(self, version: int) -> int | None:
        return None if self._follower is None else self._follower.discovered_ms(version)

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
        try:
            self._deliver_in_stretches(versions)
        except (VersionGapError, MissingFileError) as e:
            self._data_lost(e)

    def _deliver_in_stretches(self, versions: list[int]) -> None:
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
        self._following().confirm_not_recreated()
        self._snap = snap
        self._note_retention(snap)
        if not self._deliver(plan, task_batches, audit):
            return False
        self._prev_ts = plan.context.timestamp_ms
        self._cursor = Position.change(version + 1, 0)
        if self._checkpoints is not None:
            self._checkpoints.delivered_version()
        self._delivered(version, plan.context.timestamp_ms, remaining)
        return True

    def _deliver_initial_snapshot(self) -> None:
        try:
            self._deliver_snapshot_rows()
        except MissingFileError as e:  # vacuumed since the snapshot was taken (a resumed one)
            self._data_lost(e)

    def _deliver_snapshot_rows(self) -> None:
        snap = self._snap
        if snap is None:
            raise RuntimeError("the tailer has not started")
        ts = snapshot_time(self.log, snap)
        with contextlib.closing(
            self.feed.read_plans(iter([plan_snapshot(snap, ts, self.config.options.external_roots)]))
        ) as reading:
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
        if not self._write_batches(self.feed.plan_batches(plan, task_batches), counts):
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
                    schema=None if plan.commit.metadata is None else plan.context.schema(),
                )
            )
        return True

    def _note_retention(self, snap: Snapshot) -> None:
        """Keep the table's retention periods (:mod:`state.retention`) in the figures when its metadata changes.

        A retention property that is not an interval is logged (once per metadata) and leaves the
        retention unknown: it only feeds a warning, and following goes on.
        """
        metadata = snap.metadata
        if metadata is None or metadata is self._retention_of:
            return
        self._retention_of = metadata
        try:
            self.stats.retention = retention(metadata.configuration, self.log.table)
        except InvalidLogError as e:
            self.stats.retention = None
            log.warning("%s; how long undelivered versions stay readable is unknown", e)

    # -- data loss -----------------------------------------------------------------------------

    def _data_lost(self, e: VersionGapError | MissingFileError) -> None:
        """What the tailer still needed is gone (the log cleaned up past the cursor, a file vacuumed).

        ``on_data_loss``:

        - ``fail`` (the default): ``e`` is raised (the table stops; nothing is skipped).
        - ``resnapshot`` (Debezium's ``snapshot.mode=when_needed``): the table's rows at its latest
          version are delivered as a snapshot (labelled as ``--initial-snapshot`` rows are), and
          the tailer follows on from there.
        - ``skip`` (Delta's ``failOnDataLoss=false``): the tailer jumps to the oldest state it can
          still read: after a missing file, the next version; after a log cleaned up, the oldest
          version the log can still build.

        Either way the loss is logged (a warning naming the versions passed over and the error)
        and counted (:meth:`TableStats.data_lost`). A gap in the log that is not a cleanup (the
        log still holds versions before the missing one) is never passed over.

        A snapshot being delivered whose files were vacuumed since it was taken (a resumed one)
        is itself a loss: ``resnapshot`` takes a newer one, ``skip`` passes over the rest of it.

        Raises:
            VersionGapError, MissingFileError: ``e``, with ``fail``, or a gap that is not a cleanup,
                or a ``resnapshot`` with no newer version to snapshot.
        """
        mode = self.config.on_data_loss
        cursor = self._cursor
        if mode == "fail":
            raise e
        if isinstance(e, VersionGapError) and self.log.earliest_version() <= cursor.base_version:
            raise e  # a hole in the log, not a cleanup: never passed over
        if mode == "resnapshot":
            head = self.log.latest_version()
            if head < cursor.version or (head == cursor.version and (cursor.index > 0 or cursor.snapshot)):
                raise e  # the snapshot's rows cannot follow rows of its own version already delivered
        else:  # skip: after a missing file the next version; after a cleanup the oldest the log builds
            head = cursor.version if isinstance(e, MissingFileError) else self.log.earliest_version()
        self._report_loss(e, cursor.version, head)  # before the rows: a crash inside them still said it
        if mode == "resnapshot":
            self._jump(self.log.snapshot(head), Position.in_snapshot(head, 0))
            self._deliver_initial_snapshot()
        else:
            self._jump(self.log.snapshot(head), Position.change(head + 1, 0))

    def _report_loss(self, e: DeltaTailError, first: int, last: int) -> None:
        """Log and count the versions ``first`` to ``last`` passed over (see :meth:`_data_lost`)."""
        mode = self.config.on_data_loss
        what = f"versions {first} to {last}" if last > first else f"version {first}"
        self.stats.data_lost(last - first + 1, f"{what} passed over ({mode}): {e}")
        log.warning(
            "%s: data lost: %s (on_data_loss = %s); its changes were not delivered (%s)",
            self.stats.name,
            what,
            mode,
            e,
            extra={"event": "data_loss", "fields": {"table": self.stats.name, "from_version": first,
                                                   "to_version": last, "mode": mode}},
        )  # fmt: skip

    def _jump(self, snap: Snapshot, cursor: Position) -> None:
        """Go on from ``snap`` at ``cursor``, checkpointed at once with ``snap`` saved (the old one is unreachable)."""
        self._snap = snap
        self._prev_ts = snapshot_time(self.log, snap)
        self._following().reset(snap, self._prev_ts)
        self._cursor = cursor
        self._note_retention(snap)
        if self._checkpoints is not None:
            self._checkpoints.saved_snapshot = None  # save this one: a restart must not replay from the old
        self._checkpoint()

    # -- checkpoints ---------------------------------------------------------------------------

    def _maybe_checkpoint(self) -> None:
        if self._checkpoint_due():
            self._checkpoint()

    def _checkpoint_due(self) -> bool:
        return self._checkpoints is not None and self._checkpoints.is_due()

    def _seconds_until_due(self) -> float | None:
        return None if self._checkpoints is None else self._checkpoints.seconds_until_due()

    def _checkpoint(self) -> None:
        """Take a checkpoint (see :mod:`tailer.follow.checkpointer`) at the cursor in hand."""
        if self._snap is None or self._checkpoints is None:
            return
        self._unflushed = False
        self._checkpoints.take(self._snap, self._cursor, self._prev_ts, self._rows_end)
        self.stats.last_checkpoint = self._wall_clock()

    def _head(self) -> tuple[int, float | None]:
        version = -1 if self._snap is None else self._snap.version
        return version, None if self._prev_ts is None else self._prev_ts / 1000
