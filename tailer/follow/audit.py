"""Following a table's audit events as commits land: ``deltatail audit TABLE --follow --state-dir DIR``.

:class:`AuditFollower` is a :class:`~tailer.follow.loop.FollowLoop` whose output is audit
events: the twin of :class:`~tailer.follow.tailer.Tailer`, on the same life cycle and with the
same parts, built the same way (:mod:`tailer.follow.log_parts`):

- a :class:`~tailer.log.follower.LogFollower` finds the next commits by name, tells
  "nothing new" from a gap, and refuses a deleted and recreated table; it builds each
  commit's :class:`~state.audit.AuditEvent` (its ``audit`` builder) and moves the snapshot
  on (:meth:`~tailer.log.follower.LogFollower.step`: nothing is planned or read but the log,
  unless ``counted``, where the commit is planned and its change rows counted);
- a :class:`~tailer.follow.state_store.StateStore` holds the lock, the cursor (the next
  version to audit) and a saved snapshot, taken by a
  :class:`~tailer.follow.checkpointer.Checkpointer`: flush every output, save the snapshot
  when due, then the cursor; every ``checkpoint_commits`` versions or ``checkpoint_seconds``
  seconds, when caught up, and on stop;
- a :class:`~tailer.log.watch.LogWatcher` wakes it when ``_delta_log`` changes (polling on an
  object store).

Each event goes to the :class:`~tailer.audit.alerts.AlertNotifier` (rules evaluated; alerts
logged to stderr and queued to the webhooks, which never hold the follower up) and then to
every :class:`~tailer.audit.log.AuditOutput` with the alerts it raised.

Delivery across a crash or a stop: a restart resumes at the saved cursor, so events after
it are produced again. Outputs that read back what they hold (the JSON-lines and Parquet
audit logs, the alert log) skip those: exactly once. Standard output, the stderr alert lines
and the webhooks see them again: at least once, the repeats bounded by the checkpoint
interval.

The state directory is marked as an auditor's (``KIND`` holds ``audit``): a ``deltatail run``
tailer's state directory is refused, and a state directory of another table too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from deltatail.state.alerts import Alert, Evaluation
from deltatail.state.audit import AuditEvent
from deltatail.state.cursor import Position
from deltatail.state.errors import DeltaTailError, InvalidLogError, StateError
from deltatail.state.feed import FollowStatus
from deltatail.state.retention import retention
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.feed import AuditTracker, table_row_count
from deltatail.tailer.audit.log import AuditOutput
from deltatail.tailer.follow.checkpointer import Checkpointer
from deltatail.tailer.follow.config import FollowConfig
from deltatail.tailer.follow.log_parts import checkpointer, log_follower
from deltatail.tailer.follow.loop import FollowLoop
from deltatail.tailer.follow.state_store import SavedState
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import Hints, LogFollower
from deltatail.tailer.log.starts import snapshot_time, table_id, version_at_or_after
from deltatail.tailer.log.watch import Watcher
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.runtime.faults import crash_point
from deltatail.tailer.runtime.files import atomic_write
from deltatail.tailer.runtime.status import Progress, status
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import table_storage

log = logging.getLogger("deltatail.audit")

#: The file of a state directory that says which command owns it.
KIND_FILE = "KIND"
KIND = "audit"

#: What the auditor tells a user to do when the log no longer holds its position.
AUDIT_HINTS = Hints(
    gap="to go on, start a new --state-dir with --starting-version at a version the log still holds "
    "(the audit log keeps what it holds)",
    recreated="use a new --state-dir and audit log to audit the new table",
)


@dataclass
class AuditFollowConfig(FollowConfig):
    """Settings of one auditor (see ``deltatail audit --help``): those every follow loop has, and these.

    ``starting_version`` ``None`` starts at the oldest version the log can audit (0, or the
    one after the oldest checkpoint when older commits are gone); the start settings count only
    on a new state directory.
    """

    #: Row figures counted from each commit's change rows (reads data files).
    counted: bool = False
    #: Carry the table's live row count (rules on the share of the table deleted need it).
    track_table_rows: bool = False
    #: Roots outside the table whose files its log may name (:mod:`state.paths`); none by default.
    external_roots: tuple[str, ...] = ()


@dataclass
class AuditProgress(Progress):
    """What a run did: versions audited (``versions``) and alerts raised."""

    alerts: int = 0


class AuditLoop(Protocol):
    """What ``deltatail audit --follow`` runs: :class:`AuditFollower`, or a format's own (an Iceberg table's)."""

    def run(self) -> AuditProgress:
        """Audit until caught up (``until_caught_up``), stopped, or an error."""
        ...

    def stop(self) -> None:
        """Ask it to finish the version in hand, checkpoint and return (thread- and signal-safe)."""
        ...


def mark_audit_state(state_dir: str, saved: SavedState | None) -> None:
    """Refuse a tailer's state directory (one with a cursor but no ``KIND`` of ``audit``); mark a new one.

    Raises:
        StateError: if the state directory holds a ``deltatail run`` tailer's cursor.
    """
    kind_file = Path(state_dir) / KIND_FILE
    kind = kind_file.read_text().strip() if kind_file.is_file() else None
    if saved is not None and kind != KIND:
        raise StateError(
            "this state directory belongs to a `deltatail run` tailer, not to an auditor; "
            "give `deltatail audit --follow` its own --state-dir",
            file=state_dir,
        )
    if saved is None:
        atomic_write(kind_file, KIND.encode())


class AuditOutputs:
    """Every output as one: what the loop delivers to and the checkpointer flushes."""

    def __init__(self, outputs: Sequence[AuditOutput]) -> None:
        self.outputs = tuple(outputs)

    def open(self, table_id: str, cursor: Position) -> None:
        """Open every output for ``table_id`` (each says which versions it already holds, up to ``cursor``)."""
        for out in self.outputs:
            held = out.open(table_id)
            if held is not None and held >= cursor.version:  # a stop between its flush and the cursor
                log.info("%s already holds events up to version %d; they are not written again", out.path, held)

    def write(self, event: AuditEvent, alerts: Sequence[Alert]) -> None:
        """Write ``event`` and its alerts to every output (each skips what it already holds)."""
        for out in self.outputs:
            out.write(event, alerts)

    def flush(self) -> None:
        """Make what every output was given durable."""
        for out in self.outputs:
            out.flush()

    def heartbeat(self, status: FollowStatus) -> None:
        """Audit outputs have no heartbeat: a quiet table writes no event."""

    def close(self) -> None:
        """Close every output."""
        for out in self.outputs:
            out.close()


class AuditFollower(FollowLoop[AuditOutputs]):
    """Follows one table's audit events into outputs. Not reusable: construct one per run.

    A :class:`~tailer.follow.loop.FollowLoop` whose output is audit events: the same life cycle,
    watcher, idle backoff and checkpoints as the tailer. It keeps no ``status.json`` (the state
    directory is an auditor's; its status lines say what it audited).

    Args:
        config: the settings.
        outputs: where events go (not yet opened; closed by :meth:`run`).
        notifier: evaluates alert rules and delivers the alerts (closed by :meth:`run`), if any.
        storage: the table's storage; by default :func:`~tailer.table.table_storage` with
            ``config.storage_options``.
        watcher: makes the watcher of ``_delta_log`` (the log directory, whether to watch).
        clock: monotonic seconds.
    """

    config: AuditFollowConfig
    progress: AuditProgress

    def __init__(
        self,
        config: AuditFollowConfig,
        outputs: Sequence[AuditOutput],
        notifier: AlertNotifier | None = None,
        *,
        storage: Storage | None = None,
        watcher: Callable[[str, bool], Watcher] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if storage is None:
            storage = table_storage(config.table, config.storage_options)
        self.log = DeltaLog(config.table, storage)
        super().__init__(
            config, AuditOutputs(outputs), self.log.table, store=None, watcher=watcher, clock=clock, status_file=False
        )
        self.outputs = self.sink
        self.notifier = notifier
        self.progress = AuditProgress()
        self._follower: LogFollower | None = None
        self._checkpoints: Checkpointer | None = None
        self._changes: ChangeFeed | None = None
        self._snap: Snapshot | None = None
        self._prev_ts: int | None = None

    def run(self) -> AuditProgress:
        """Audit until caught up (``until_caught_up``), stopped, or an error.

        Raises:
            StateError: the state directory is locked, damaged, a tailer's, or of another table;
                or the table was deleted and recreated.
            VersionGapError: a commit is missing, or the log was cleaned up past the cursor.
            VersionNotFoundError: a new state directory's start is after the latest version.
            InvalidLogError: a commit is malformed.
            UnsupportedFeatureError: a commit needs an unsupported reader feature.
            SinkError: an output cannot be opened or written; the cursor stays at the last checkpoint.
            MissingFileError: with ``counted``, a data file the change rows need is gone.
        """
        try:
            super().run()
        finally:
            if self.notifier is not None:
                self.notifier.close()
        return self.progress

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        self._open = True  # the outputs are closed on the way out, whatever fails from here
        c = self.config
        saved = self.store.load()
        mark_audit_state(c.state_dir, saved)
        if saved is not None:
            snap, prev, cursor, owner = self._resume_saved(saved)
        else:
            snap, prev, cursor, owner = self._start_new()
        self._table_id, self._snap, self._prev_ts, self._cursor = owner, snap, prev, cursor
        self._follower = self._new_follower(snap, prev, owner, self._tracker(snap))
        if c.counted:
            options = ChangeOptions(
                allow_non_additive=True, read_ahead=0, reader_processes=0, external_roots=c.external_roots
            )
            self._changes = ChangeFeed(self.log.table, self.log.storage, options)
        self._checkpoints = checkpointer(
            self.store, self.outputs, self.config, table=self.log.table, table_id=owner, clock=self._clock
        )
        if saved is not None:
            self._checkpoints.saved_snapshot = (saved.snapshot_version, saved.snapshot_file)
        self.outputs.open(owner, cursor)

    def _resume_saved(self, saved: SavedState) -> tuple[Snapshot, int | None, Position, str]:
        """The snapshot just before the saved cursor, the commit time before it, the cursor and the table id."""
        snap = self.store.load_snapshot(saved)
        current = table_id(self.log)
        if snap.metadata is None or saved.table_id != current:
            raise StateError(
                f"this state directory belongs to table id {saved.table_id}, but {self.log.table} now has id "
                f"{current} (a different table, or the table was deleted and recreated); "
                "use a new --state-dir to start over",
                table=self.log.table,
                file=self.config.state_dir,
            )
        replay = self._new_follower(snap, saved.previous_timestamp_ms, saved.table_id, None)
        for v in range(snap.version + 1, saved.cursor.version):  # applied before the last stop: no events
            try:
                snap, _ = snap.apply(replay.read_commit(v))
            except DeltaTailError as e:
                raise e.at(table=self.log.table, file=self.log.commit_path(v)) from None
        log.info("resuming the audit of %s at version %d", self.log.table, saved.cursor.version)
        return snap, saved.previous_timestamp_ms, saved.cursor, saved.table_id

    def _start_new(self) -> tuple[Snapshot, int | None, Position, str]:
        """The snapshot before the first version, its commit time, the cursor and the table id."""
        start = self._first_version()
        snap = self.log.snapshot(start - 1) if start > 0 else Snapshot.empty(self.log.table)
        prev = snapshot_time(self.log, snap) if start > 0 else None
        owner = table_id(self.log, snap)
        log.info("auditing %s from version %d", self.log.table, start)
        return snap, prev, Position.change(start, 0), owner

    def _tracker(self, snap: Snapshot) -> AuditTracker:
        c = self.config
        rows = None
        if c.track_table_rows:
            rows = 0 if snap.version < 0 else table_row_count(snap, self.log.storage, c.external_roots)
        return AuditTracker(self.log.table, self.log.storage, table_rows=rows, external_roots=c.external_roots)

    def _first_version(self) -> int:
        """The first version of a new state directory (``latest + 1``: only the commits after now)."""
        c = self.config
        if c.starting_timestamp_ms is not None:
            return version_at_or_after(self.log, c.starting_timestamp_ms)
        if c.starting_version is not None:
            return c.starting_version
        earliest = self.log.earliest_version()
        if earliest == 0 and self.log.storage.exists(self.log.commit_path(0)):
            return 0
        return earliest + 1  # older commits are gone: the checkpoint is where auditing can start after

    def _new_follower(
        self, head: Snapshot, previous_ms: int | None, table_id: str, tracker: AuditTracker | None
    ) -> LogFollower:
        return log_follower(
            self.log,
            head,
            self.config,
            previous_ms=previous_ms,
            table_id=table_id,
            hints=AUDIT_HINTS,
            clock=self._clock,
            audit=None if tracker is None else tracker.build,
            allow_non_additive=True,
        )

    # -- loop ----------------------------------------------------------------------------------

    @property
    def _watch_dir(self) -> str:
        return self.log.log_dir

    @property
    def _remote(self) -> bool:
        return self.log.storage.remote

    def _deliver_initial_snapshot(self) -> None:
        """Never called: an auditor starts at a version, never inside a snapshot."""

    def _new_versions(self, limit: int | None = None) -> list[int]:
        return self._following().discover(check_gaps=self.config.until_caught_up, limit=limit)

    def _deliver_versions(self, versions: list[int]) -> None:
        """Audit ``versions`` in order, checkpointing when due; on an error, checkpoint what was audited first."""
        checkpoints = self._checkpointing()
        try:
            for version in versions:
                if self._stop.is_set():
                    break
                self._audit(self._following(), version)
                checkpoints.delivered_version()
                if checkpoints.is_due():
                    self._checkpoint()
        except DeltaTailError:
            self._checkpoint()  # keep what was audited: a restart resumes or refuses from here
            raise

    def _audit(self, follower: LogFollower, version: int) -> None:
        """Build, evaluate and write the event of ``version`` (the follower's next)."""
        if self._changes is not None:
            followed = follower.plan(version)
            event = followed.audit
            counts: dict[str, int] = {}
            for batch in self._changes.plan_batches(followed.plan):
                for value in batch.rows.column("_change_type").value_counts().to_pylist():
                    counts[value["values"]] = counts.get(value["values"], 0) + int(value["counts"])
            event = None if event is None else event.with_counted(counts)
            snap, timestamp_ms = followed.snapshot, followed.plan.context.timestamp_ms
        else:
            stepped = follower.step(version)
            event, snap, timestamp_ms = stepped.audit, stepped.snapshot, stepped.timestamp_ms
        if event is None:
            raise RuntimeError("the follower has no audit builder")  # a program error: _start gives it one
        readable = _readable_seconds(snap, timestamp_ms, time.time())
        result = self.notifier.notify(event, readable) if self.notifier is not None else Evaluation()
        self.outputs.write(event, result.alerts)
        self._unflushed = True
        crash_point("after_write")
        self._snap, self._prev_ts, self._cursor = snap, timestamp_ms, Position.change(version + 1, 0)
        self.progress.versions += 1
        self.progress.alerts += len(result.alerts)

    def _following(self) -> LogFollower:
        if self._follower is None:
            raise RuntimeError("the auditor has not started")  # a program error: run() starts it
        return self._follower

    def _checkpointing(self) -> Checkpointer:
        if self._checkpoints is None:
            raise RuntimeError("the auditor has not started")  # a program error: run() starts it
        return self._checkpoints

    def _checkpoint(self) -> None:
        if self._snap is None or self._checkpoints is None:
            return
        self._unflushed = False
        self._checkpoints.take(self._snap, self._cursor, self._prev_ts)

    def _checkpoint_due(self) -> bool:
        return self._checkpoints is not None and self._checkpoints.is_due()

    def _seconds_until_due(self) -> float | None:
        return None if self._checkpoints is None else self._checkpoints.seconds_until_due()

    def _head(self) -> tuple[int, float | None]:
        version = -1 if self._snap is None else self._snap.version
        return version, None if self._prev_ts is None else self._prev_ts / 1000

    def _report_following(self) -> None:
        snap = self._snap
        if snap is None or not self._status_lines.due(snap.version):
            return
        status(
            "following",
            f"auditing: at version {snap.version}, {self.progress.versions} versions audited, "
            f"{self.progress.alerts} alerts raised",
            version=snap.version,
            versions_done=self.progress.versions,
            alerts=self.progress.alerts,
        )


def _readable_seconds(snap: Snapshot, commit_ms: int, now: float) -> float | None:
    """How long a commit of ``snap``'s table made at ``commit_ms`` stays readable at ``now`` (:mod:`state.retention`).

    ``None`` when the table's retention properties are not intervals (the rule is then undecided).
    """
    if snap.metadata is None:
        return None
    try:
        return retention(snap.metadata.configuration).readable_seconds(commit_ms, round(now * 1000))
    except InvalidLogError:
        return None
