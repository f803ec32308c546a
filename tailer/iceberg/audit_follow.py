"""Following an Iceberg table's audit events: ``deltatail audit ICEBERG_TABLE --follow --state-dir DIR``.

:class:`IcebergAuditFollower` is the Iceberg twin of :class:`~tailer.follow.audit.AuditFollower`: a
:class:`~tailer.follow.loop.FollowLoop` whose output is one audit event per new snapshot of the
``main`` branch (:meth:`~tailer.iceberg.audit.IcebergAuditFeed.event`), each evaluated by the alert
rules and written to every output with the alerts it raised.

Each look reads the newest metadata file's name (the catalog's pointer, the version hint, or one
listing of ``metadata/``) and parses it only when it changed (as :class:`~tailer.iceberg.follow.IcebergTailer`).

The state directory is an auditor's (``KIND`` holds ``audit``) and keeps the cursor alone
(``cursor.json``): ``cursor`` is the next version to audit, ``snapshot_version`` and
``previous_timestamp_ms`` the version and timestamp of the snapshot audited up to, which name it
(a sequence number is never reused in a table). Checkpoints flush every output, then save the
cursor: every ``checkpoint_commits`` snapshots or ``checkpoint_seconds`` seconds, when caught up,
on stop and before an error stops it. A restart resumes after the saved snapshot; outputs that
read back what they hold (the JSON-lines and Parquet audit logs, the alert log) skip the events
they already hold: exactly once.

Errors that stop it (after checkpointing what was audited), never a silent skip:

- the snapshot audited up to is no longer on ``main`` (a rollback or branch reset): ``StateError``;
- snapshots after it were expired before they were audited: ``VersionGapError``;
- the table's uuid changed (dropped and re-created), or the state directory is another table's or
  a tailer's: ``StateError``;
- the newest metadata file does not parse (``InvalidLogError``), or a manifest list ``counted``
  needs is missing (``MissingFileError``), once that has lasted :data:`~tailer.iceberg.look.TORN_SECONDS`
  (a file a local writer is still writing is complete then: :mod:`tailer.iceberg.look`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from deltatail.state.cursor import Position
from deltatail.state.errors import DeltaTailError, StateError, VersionGapError
from deltatail.state.iceberg.ancestry import Ancestry, Lost, find_base, versions_after
from deltatail.state.iceberg.model import SnapshotInfo
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.log import AuditOutput
from deltatail.tailer.follow.audit import AuditFollowConfig, AuditOutputs, AuditProgress, mark_audit_state
from deltatail.tailer.follow.loop import FollowLoop
from deltatail.tailer.follow.state_store import SavedState
from deltatail.tailer.iceberg.audit import IcebergAuditFeed
from deltatail.tailer.iceberg.feed import IcebergFeed
from deltatail.tailer.iceberg.follow import iceberg_table_id
from deltatail.tailer.iceberg.look import TORN_SECONDS, MetadataLook, Seen
from deltatail.tailer.log.watch import Watcher
from deltatail.tailer.runtime.faults import crash_point
from deltatail.tailer.runtime.status import status

log = logging.getLogger("deltatail.audit")

__all__ = ["TORN_SECONDS", "IcebergAuditFollower"]

#: What the auditor tells a user to do when ``main`` no longer holds the snapshot audited up to.
RESET_HINT = (
    "the events already written stay as they are; to audit the branch as it is now, start a new --state-dir "
    "(with --starting-version at the first version to audit)"
)
#: What the auditor tells a user to do when the snapshots after its position were expired.
EXPIRED_HINT = (
    "they were expired before they were audited; to go on, start a new --state-dir with --starting-version "
    "at a version the table still holds (the audit log keeps what it holds)"
)


class IcebergAuditFollower(FollowLoop[AuditOutputs]):
    """Follows one Iceberg table's audit events into outputs. Not reusable: construct one per run.

    Args:
        config: the settings (``counted`` counts each snapshot's change rows; ``track_table_rows``
            needs nothing more: the summaries carry the table's row count).
        outputs: where events go (not yet opened; closed by :meth:`run`).
        feed: the table's feed (metadata, and the rows ``counted`` counts).
        notifier: evaluates alert rules and delivers the alerts (closed by :meth:`run`), if any.
        watcher: makes the watcher of ``metadata/`` (the directory, whether to watch).
        clock: monotonic seconds.
        sleep: the waits for a file being written.
    """

    config: AuditFollowConfig
    progress: AuditProgress

    def __init__(
        self,
        config: AuditFollowConfig,
        outputs: Sequence[AuditOutput],
        *,
        feed: IcebergFeed,
        notifier: AlertNotifier | None = None,
        watcher: Callable[[str, bool], Watcher] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            config, AuditOutputs(outputs), feed.table, store=None, watcher=watcher, clock=clock, status_file=False
        )
        self.feed = feed
        self.table = feed.table
        self.audit = IcebergAuditFeed(feed)
        self.outputs = self.sink
        self.notifier = notifier
        self.progress = AuditProgress()
        self._base: SnapshotInfo | None = None  # the snapshot audited up to
        self._base_version = -1
        self._metadata = MetadataLook(feed, lambda: self._clock(), sleep)
        self._since = 0
        self._last_checkpoint = clock()

    def run(self) -> AuditProgress:
        """Audit until caught up (``until_caught_up``), stopped, or an error.

        Raises:
            StateError: the state directory is locked, damaged, a tailer's or another table's; the
                table was dropped and re-created; or the snapshot audited up to left ``main``.
            VersionGapError: snapshots after the one audited up to were expired.
            VersionNotFoundError: a new state directory's start is at a time after the newest snapshot.
            TableNotFoundError: there is no Iceberg table.
            InvalidLogError: metadata does not parse, or a summary count is not a number.
            SinkError: an output cannot be opened or written; the cursor stays at the last checkpoint.
            MissingFileError: with ``counted``, a file the change rows need is gone.
        """
        try:
            super().run()
        finally:
            if self.notifier is not None:
                self.notifier.close()
        return self.progress

    def _look(self) -> Seen:
        """The newest metadata (:meth:`MetadataLook.look <tailer.iceberg.look.MetadataLook.look>`)."""
        return self._metadata.look()

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        self._open = True  # the outputs are closed on the way out, whatever fails from here
        saved = self.store.load()
        mark_audit_state(self.config.state_dir, saved)
        _, state, ancestry = self._look()
        self._table_id = iceberg_table_id(state.table_uuid)
        if saved is None:
            self._start_new(ancestry)
        else:
            if saved.table_id != self._table_id:
                raise StateError(
                    f"this state directory belongs to {saved.table_id}, but {self.table} is now {self._table_id} "
                    "(a different table, or it was dropped and re-created); use a new --state-dir to start over",
                    table=self.table,
                    file=self.config.state_dir,
                )
            self._cursor = saved.cursor
            if saved.previous_timestamp_ms is not None:
                self._base = self._find_base(saved.snapshot_version, saved.previous_timestamp_ms, ancestry)
                self._base_version = saved.snapshot_version
            log.info("resuming the audit of %s at version %d", self.table, saved.cursor.version)
        self.outputs.open(self._table_id, self._cursor)

    def _start_new(self, ancestry: Ancestry) -> None:
        """Put the cursor at the first version to audit, and the snapshot before it as the one audited up to.

        That version is ``starting_version`` (one after the newest: only new snapshots), the first
        snapshot at or after ``starting_timestamp_ms``, or the oldest snapshot ``main`` holds.
        """
        c = self.config
        versions = ancestry.versions
        if c.starting_version is not None and c.starting_version > ancestry.latest:
            first = len(versions)
        else:
            first, _ = self.feed.range_indexes(
                ancestry, c.starting_version, None, starting_timestamp_ms=c.starting_timestamp_ms
            )
        if first > 0:
            self._base, self._base_version = ancestry.snapshots[first - 1], versions[first - 1]
        start = versions[first] if first < len(versions) else max(c.starting_version or 0, ancestry.latest + 1)
        self._cursor = Position.change(start, 0)
        log.info("auditing %s from version %d", self.table, start)

    def _find_base(self, version: int, timestamp_ms: int, ancestry: Ancestry) -> SnapshotInfo:
        """The snapshot audited up to (its version and timestamp name it), which must still be on ``main``.

        Raises:
            VersionGapError: if it and the snapshots after it were expired.
            StateError: if it is no longer on ``main``.
        """
        found = find_base(ancestry, version, timestamp_ms)
        if isinstance(found, SnapshotInfo):
            return found
        if found is Lost.EXPIRED:
            raise VersionGapError(
                f"version {version}, audited up to, and the snapshots after it are gone: " + EXPIRED_HINT,
                table=self.table,
                version=version,
                file=self.config.state_dir,
            )
        raise StateError(
            f"the snapshot of version {version} (committed at {timestamp_ms} ms), audited up to, is no longer on "
            f"the main branch: it was rolled back or the branch was reset; {RESET_HINT}",
            table=self.table,
            version=version,
            file=self.config.state_dir,
        )

    # -- loop ----------------------------------------------------------------------------------

    @property
    def _watch_dir(self) -> str:
        return self.feed.iceberg.metadata_dir

    @property
    def _remote(self) -> bool:
        return self.feed.storage.remote

    def _deliver_initial_snapshot(self) -> None:
        """Never called: an auditor starts at a version, never inside a snapshot."""

    def _new_versions(self, limit: int | None = None) -> list[int]:
        """The versions on ``main`` after the one audited up to (at most ``limit``).

        Raises:
            StateError: if the snapshot audited up to left ``main``, or the table was re-created.
            VersionGapError: if snapshots after it were expired.
        """
        _, state, ancestry = self._look()
        if iceberg_table_id(state.table_uuid) != self._table_id:
            raise StateError(
                f"the table's uuid is now {state.table_uuid}, not the one audited ({self._table_id}): it was dropped "
                "and re-created; use a new --state-dir and audit log to audit the new table",
                table=self.table,
                file=self.config.state_dir,
            )
        base = None if self._base is None else self._find_base(self._base_version, self._base.timestamp_ms, ancestry)
        found = list(versions_after(ancestry, base, self._cursor.version))
        return found if limit is None else found[:limit]

    def _deliver_versions(self, versions: list[int]) -> None:
        """Audit ``versions`` in order, checkpointing when due; on an error, checkpoint what was audited first."""
        try:
            for version in versions:
                if self._stop.is_set():
                    break
                self._audit(version)
                if self._checkpoint_due():
                    self._checkpoint()
        except DeltaTailError:
            self._checkpoint()
            raise

    def _audit(self, version: int) -> None:
        """Build, evaluate and write the event of ``version`` (in the last look's metadata)."""
        where, state, ancestry = self._metadata.last()
        index = ancestry.index_of_version(version)
        event = self._metadata.patiently(
            lambda: self.audit.event(state, ancestry, index, where, counted=self.config.counted)
        )
        alerts = self.notifier.notify(event).alerts if self.notifier is not None else ()
        self.outputs.write(event, alerts)
        self._unflushed = True
        crash_point("after_write")
        self._base, self._base_version = ancestry.snapshots[index], version
        self._cursor = Position.change(version + 1, 0)
        self._since += 1
        self.progress.versions += 1
        self.progress.alerts += len(alerts)

    # -- checkpoints ---------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        by_time = self._clock() - self._last_checkpoint >= self.config.checkpoint_seconds
        return self._since >= self.config.checkpoint_commits or (by_time and self._since > 0)

    def _checkpoint(self) -> None:
        """Flush every output, then save the cursor (with the snapshot audited up to)."""
        if not self._open:
            return
        self.outputs.flush()
        crash_point("after_flush")
        self._unflushed = False
        base = self._base
        self.store.save(
            SavedState(
                self.table,
                self._table_id,
                self._cursor,
                self._base_version,
                "",
                None if base is None else base.timestamp_ms,
            )
        )
        crash_point("after_save")
        self._since = 0
        self._last_checkpoint = self._clock()

    def _seconds_until_due(self) -> float | None:
        if not self._since:
            return None
        return max(self._last_checkpoint + self.config.checkpoint_seconds - self._clock(), 0.0)

    def _head(self) -> tuple[int, float | None]:
        if self._base is None:
            return -1, None
        return self._base_version, self._base.timestamp_ms / 1000

    def _report_following(self) -> None:
        version, _ = self._head()
        if not self._status_lines.due(version):
            return
        status(
            "following",
            f"auditing: at version {version}, {self.progress.versions} versions audited, "
            f"{self.progress.alerts} alerts raised",
            version=version,
            versions_done=self.progress.versions,
            alerts=self.progress.alerts,
        )
