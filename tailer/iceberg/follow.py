"""Following an Iceberg table into a sink: ``deltatail run`` on an Iceberg table.

The same life cycle and guarantees as the Delta and Lance tailers (:class:`~tailer.follow.plan_loop.PlanLoop`).
The state directory keeps the cursor alone (``cursor.json``): its ``snapshot_version`` is the version
delivered up to and its ``previous_timestamp_ms`` that snapshot's timestamp (a sequence number is never
reused in a table, so the two name the snapshot; after a rollback the old one is no longer on ``main``).
The table id is ``iceberg-<table-uuid>``: a table dropped and re-created at the same place has another
uuid, so its old state directory is refused.

Each look reads the newest metadata with the fewest requests (the catalog's pointer, or
``metadata/version-hint.text``, or one listing of ``metadata/``), and nothing more when it is the
file the last look read. New snapshots are those of the ``main`` branch after the one delivered up to.
A metadata file or manifest list a writer has not finished is waited for (:mod:`tailer.iceberg.look`).

Errors that stop it (after checkpointing what was delivered):

- the snapshot delivered up to is no longer on ``main`` (a branch reset or rollback): ``StateError``;
- snapshots after it were expired before they were read: ``VersionGapError`` with a recovery hint;
- the table id differs (dropped and re-created, or another table's state directory): ``StateError``;
- an unsupported feature or a non-additive schema change;
- a newest metadata file that has not parsed, or a manifest list missing, for
  :data:`~tailer.iceberg.look.TORN_SECONDS`: ``InvalidLogError`` / ``MissingFileError``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

from deltatail.state.cursor import Position
from deltatail.state.errors import SchemaChangeError, StateError, UnsupportedFeatureError, VersionGapError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.state.iceberg.ancestry import EXPIRED_HINT, Ancestry, Lost, find_base, versions_after
from deltatail.state.iceberg.model import SnapshotInfo
from deltatail.state.iceberg.planning import IcebergPlan
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.loop import table_name
from deltatail.tailer.follow.plan_loop import PlanLoop
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.iceberg.feed import IcebergFeed
from deltatail.tailer.iceberg.look import MetadataLook, Seen
from deltatail.tailer.log.watch import Watcher
from deltatail.tailer.sink import Sink

log = logging.getLogger("deltatail")


def iceberg_table_id(table_uuid: str) -> str:
    """The id an Iceberg table goes by in state directories, sinks and Spark offsets: ``iceberg-<table-uuid>``."""
    return f"iceberg-{table_uuid}"


class IcebergTailer(PlanLoop[IcebergPlan]):
    """Follows one Iceberg table into one sink. Not reusable: construct one per run.

    Args:
        config: the settings (``options.allow_non_additive``, ``batch_size``, ``filter``,
            ``key_columns`` and ``external_roots`` apply; the reader settings do not).
        sink: where rows go (not yet opened).
        feed: plans and reads rows.
        store: the state directory; by default ``StateStore(config.state_dir)``.
        watcher: makes the watcher of ``metadata/`` (the directory, whether to watch).
        clock: monotonic seconds; wall_clock: epoch seconds; sleep: the waits for a file being written.
        stats: the figures the tailer keeps up to date (a new one by default).
        status_file: whether it keeps ``status.json`` in its state directory (not for ``deltatail serve``).
    """

    def __init__(
        self,
        config: TailerConfig,
        sink: Sink,
        *,
        feed: IcebergFeed,
        store: StateStore | None = None,
        watcher: Callable[[str, bool], Watcher] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stats: TableStats | None = None,
        status_file: bool = True,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            config,
            sink,
            feed.table,
            store=store,
            watcher=watcher,
            clock=clock,
            wall_clock=wall_clock,
            stats=stats,
            status_file=status_file,
        )
        self.feed = feed
        self.table = feed.table
        self._base: SnapshotInfo | None = None  # the snapshot delivered up to
        self._base_version = -1
        self._metadata = MetadataLook(feed, lambda: self._clock(), sleep)

    @property
    def table_id(self) -> str:
        """The table's id (:func:`iceberg_table_id`)."""
        if not self._table_id:
            self._table_id = iceberg_table_id(self._look()[1].table_uuid)
        return self._table_id

    def _look(self) -> Seen:
        return self._metadata.look()

    def _last(self) -> Seen:
        """The last look's metadata (the versions being delivered were found in it)."""
        return self._metadata.last()

    # -- start ---------------------------------------------------------------------------------

    def _start(self) -> None:
        saved = self.store.load()
        ancestry = self._look()[2]
        if saved is not None:
            if saved.table_id != self.table_id:
                raise StateError(
                    f"this state directory belongs to {saved.table_id}, not {self.table_id} (the table was dropped "
                    "and re-created, or it is another table's); use a new --state-dir",
                    table=self.table,
                    file=self.config.state_dir,
                )
            self._cursor = saved.cursor
            if saved.previous_timestamp_ms is not None:
                self._base = self._find_base(saved.snapshot_version, saved.previous_timestamp_ms, ancestry)
                self._base_version = saved.snapshot_version
            self._resume = saved.cursor
            self._rows_end = saved.rows_end
            log.info("resuming %s at %s", self.table, saved.cursor)
        else:
            self._start_new(ancestry)
        self.stats.delivered_version = self._base_version
        self.stats.newest_version = max(self.stats.newest_version, ancestry.latest)
        if self._base is not None:
            self.stats.delivered_commit_ms = self._base.timestamp_ms
        self._open_sink(TableInfo(self.table, self.table_id, table_name(self.table)))
        if saved is None and self._cursor.snapshot:
            self._checkpoint()  # fix the snapshot's version now, so a restart resumes the same snapshot

    def _start_new(self, ancestry: Ancestry) -> None:
        c = self.config
        first, _ = self.feed.range_indexes(
            ancestry,
            c.starting_version if c.starting_version is None or c.starting_version <= ancestry.latest else None,
            None,
            starting_timestamp_ms=c.starting_timestamp_ms,
            initial_snapshot=c.initial_snapshot,
        )
        if c.starting_version is not None and c.starting_version > ancestry.latest:
            first = len(ancestry.versions)  # only what comes after the newest version now
        if c.initial_snapshot and first < len(ancestry.versions):
            self._cursor = Position.in_snapshot(ancestry.versions[first], 0)
            return
        start = ancestry.versions[first] if first < len(ancestry.versions) else max(c.starting_version or 0, 0)
        if first < len(ancestry.versions) and first > 0:
            self._base, self._base_version = ancestry.snapshots[first - 1], ancestry.versions[first - 1]
        self._cursor = Position.change(start, 0)

    def _find_base(self, version: int, timestamp_ms: int, ancestry: Ancestry) -> SnapshotInfo:
        """The snapshot the state delivered up to (its version and timestamp), which must still be on ``main``.

        Raises:
            VersionGapError: if it and the snapshots after it were expired.
            StateError: if it is no longer on ``main``.
        """
        found = find_base(ancestry, version, timestamp_ms)
        if isinstance(found, SnapshotInfo):
            return found
        if found is Lost.EXPIRED:
            raise VersionGapError(
                f"version {version}, delivered up to, and the snapshots after it were expired before they were "
                "read; " + EXPIRED_HINT,
                table=self.table,
                version=version,
            )
        raise StateError(
            f"the snapshot of version {version}, delivered up to, is no longer on the main branch (a branch "
            "reset or rollback): the rows delivered after the new head's common ancestor no longer hold; "
            "use a new --state-dir (with --initial-snapshot) to follow the branch as it is",
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

    def _new_versions(self, limit: int | None = None) -> list[int]:
        """The versions on ``main`` after the one delivered up to (at most ``limit``).

        Raises:
            StateError: if the snapshot delivered up to left ``main``, or the table was re-created.
            VersionGapError: if snapshots after it were expired.
        """
        _, state, ancestry = self._look()
        if iceberg_table_id(state.table_uuid) != self.table_id:
            raise StateError(
                f"the table's uuid is now {state.table_uuid}, not the one followed ({self.table_id}): it was dropped "
                "and re-created; use a new --state-dir to follow it",
                table=self.table,
                file=self.config.state_dir,
            )
        base = None if self._base is None else self._find_base(self._base_version, self._base.timestamp_ms, ancestry)
        found = list(versions_after(ancestry, base, self._cursor.version))
        if limit is not None:
            found = found[:limit]
        if found:
            self.stats.found(ancestry.latest, ancestry.snapshots[-1].timestamp_ms)
        return found

    def _deliver_initial_snapshot(self) -> None:
        _, state, ancestry = self._last()
        index = ancestry.index_of_version(self._cursor.version)
        plan = self._metadata.patiently(lambda: self.feed.plan_initial(state, ancestry, index))
        if not self._deliver(plan):
            return
        self._base, self._base_version = plan.snapshot, plan.version
        self._cursor = Position.change(plan.version + 1, 0)
        self._checkpoint()

    def _deliver_version(self, version: int, remaining: int) -> bool:
        where, state, ancestry = self._last()
        index = ancestry.index_of_version(version)
        try:
            plan = self._metadata.patiently(lambda: self.feed.plan(state, ancestry, index, where))
        except (UnsupportedFeatureError, SchemaChangeError) as e:
            log.error("stopping before version %s; everything before it is delivered and checkpointed", e.version)
            self._checkpoint()
            raise
        if not self._deliver(plan):
            return False
        self._base, self._base_version = plan.snapshot, version
        self._cursor = Position.change(version + 1, 0)
        self._since += 1
        self._delivered(version, plan.timestamp_ms, remaining)
        return True

    def _plan_batches(self, plan: IcebergPlan) -> Iterator[ChangeBatch]:
        return self.feed.plan_batches(plan)

    def _commit_of(self, plan: IcebergPlan) -> tuple[int, str | None, int, dict[str, str]] | None:
        if plan.initial:
            return None
        return plan.version, plan.operation, plan.timestamp_ms, dict(plan.snapshot.summary)

    def _saved_base(self) -> tuple[int, int | None]:
        return self._base_version, None if self._base is None else self._base.timestamp_ms

    def _head(self) -> tuple[int, float | None]:
        if self._base is None:
            return -1, None
        return self._base_version, self._base.timestamp_ms / 1000
