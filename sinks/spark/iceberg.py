"""The Spark source on an Iceberg table: planning on the driver (:class:`~tailer.iceberg.feed.IcebergFeed`).

The same offsets and options as on a Delta table (:mod:`sinks.spark.source`), with Iceberg's units:

- a planned unit is one snapshot of the ``main`` branch (:class:`~state.iceberg.planning.IcebergPlan`),
  its version the snapshot's (:mod:`state.iceberg.ancestry`: the sequence number, or the ordinal on
  a format v1 table). A snapshot's rows are netted and paired across the whole snapshot, so a
  snapshot is admitted whole: an offset's ``index`` is always 0, ``maxFilesPerTrigger`` counts the
  snapshot's row tasks (data files read) and a micro-batch holds at least one snapshot;
- the driver keeps the newest planned snapshot and reads the newest metadata file's name (the
  version hint or the catalog's pointer) on every poll, parsing the metadata only when it changed;
  a planned snapshot that is no longer an ancestor of ``main`` (a rollback or branch reset), or a
  table uuid other than the offsets' (dropped and re-created), stops the query with a ``StateError``;
- executors get an :class:`IcebergPartition` (the whole plan: snapshot and row tasks) and read it
  with the feed's rows (:meth:`~tailer.iceberg.feed.IcebergFeed.plan_table`): one partition per
  snapshot.

Offsets carry versions and the id of the snapshot they read on from (``baseSnapshotId``,
:mod:`sinks.spark.offsets`): a query restarted after ``main`` was rolled back or reset while it was
stopped finds that snapshot no longer where ``main`` has the offset's version, and stops with a
``StateError`` naming the snapshot (never reading on from another snapshot, which would skip or
repeat rows). Offsets written without the id (by an older deltatail) are not checked.

Rows carry ``_change_type``, ``_commit_version``, ``_commit_timestamp`` and ``_snapshot_id``. A
snapshot needing expired snapshots is a ``VersionGapError`` (``failOnDataLoss=false`` is refused:
Iceberg snapshots are never skipped).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from deltatail.sinks.spark.offsets import Offset, plan_key
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.plan_cache import PlanCache
from deltatail.sinks.spark.schema import arrow_target, check_schema_fits, conform, spark_schema
from deltatail.state.errors import ConfigError, StateError, VersionNotFoundError
from deltatail.state.iceberg.ancestry import Ancestry
from deltatail.state.iceberg.model import SnapshotInfo, TableState
from deltatail.state.iceberg.planning import IcebergPlan
from deltatail.tailer.formats.iceberg import ICEBERG, open_feed
from deltatail.tailer.iceberg.feed import IcebergFeed
from deltatail.tailer.iceberg.follow import iceberg_table_id
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import TableRef

#: What the stream's errors tell a user to do about a re-created table or a reset branch.
RESTART_HINT = "start a new query (a new checkpointLocation) to read the table as it is now"
#: How many rows an executor hands Spark in one Arrow batch.
BATCH_ROWS = 65536


@dataclass(frozen=True)
class IcebergPartition(InputPartition):
    """One Spark partition of an Iceberg stream: the plan of one snapshot (picklable).

    Attributes:
        plan: the snapshot's plan (its snapshot, version and row tasks).
    """

    plan: IcebergPlan


def iceberg_partitions(plan: IcebergPlan, first: int, last: int) -> list[IcebergPartition]:
    """The partition of a whole plan (``first..last`` covering its tasks), none for an empty part."""
    if first >= last or not plan.tasks:
        return []
    return [IcebergPartition(plan)]


def iceberg_feed(options: SourceOptions, storage: Storage | None = None) -> IcebergFeed:
    """The :class:`IcebergFeed` of the source's table (a metadata file, a table directory or ``catalog:NAME/...``)."""
    ref = TableRef(
        options.path,
        dict(options.storage_options),
        storage or options.storage(),
        options.external_roots,
        ICEBERG,
    )
    return open_feed(ref, options.change_options())


def _check_options(options: SourceOptions) -> None:
    if not options.fail_on_data_loss:
        raise ConfigError(
            "failOnDataLoss=false (onDataLoss=skip) does not apply to Iceberg tables: a snapshot whose parent was "
            "expired cannot be read exactly, and is never skipped",
            table=options.path,
        )


def snapshot_at(ancestry: Ancestry, version: int, table: str) -> tuple[int, SnapshotInfo]:
    """The index and snapshot of ``main`` with exactly ``version``.

    Raises:
        VersionNotFoundError: if no snapshot of ``main`` has that version.
    """
    index = ancestry.index_of_version(version)
    if index >= len(ancestry.versions) or ancestry.versions[index] != version:
        raise VersionNotFoundError(
            f"no snapshot of the main branch has version {version} (the newest is {ancestry.latest})",
            table=table,
            version=version,
        )
    return index, ancestry.snapshots[index]


def _base_of(ancestry: Ancestry, version: int, snapshot: bool) -> int | None:
    """The id of the snapshot of ``main`` an offset at ``version`` reads on from (``None``: none before it).

    That is the snapshot of ``version`` itself for an initial snapshot's offset, else the last one before it.
    """
    index = ancestry.index_of_version(version + 1 if snapshot else version)
    return ancestry.snapshots[index - 1].snapshot_id if index else None


def plan_schema(feed: IcebergFeed, plan: IcebergPlan) -> pa.Schema:
    """The change rows' Arrow schema of a plan as Spark will see it."""
    return arrow_target(spark_schema(feed.change_schema(plan.snapshot)))


def iceberg_source_schema(options: SourceOptions, version: int | None) -> tuple[pa.Schema, int]:
    """The change schema (Arrow) of an Iceberg source at ``version`` (default: the newest), and that version.

    A table with no snapshot yet has version 0 and its current schema.

    Raises:
        TableNotFoundError: if there is no Iceberg table at the path.
        VersionNotFoundError: if no snapshot of ``main`` has ``version``.
    """
    _check_options(options)
    feed = iceberg_feed(options)
    _, ancestry, _ = feed.current()
    if version is None:
        if not ancestry.versions:
            return feed.change_schema(None), 0
        version = ancestry.latest
    _, snap = snapshot_at(ancestry, version, feed.table)
    return feed.change_schema(snap), version


def batch_partitions(options: SourceOptions, target: pa.Schema, end: int | None) -> list[InputPartition]:
    """One partition per snapshot of the range, each snapshot's schema checked against ``target``.

    Raises:
        SchemaChangeError: if a snapshot's schema does not fit ``target``.
        VersionNotFoundError, VersionGapError: as :meth:`IcebergFeed.plans`.
    """
    _check_options(options)
    feed = iceberg_feed(options)
    out: list[InputPartition] = []
    plans = feed.plans(
        options.starting_version,
        end,
        starting_timestamp_ms=options.starting_timestamp_ms,
        initial_snapshot=bool(options.initial_snapshot),
    )
    for plan in plans:
        check_schema_fits(plan_schema(feed, plan), target, table=feed.table, version=plan.version)
        out += iceberg_partitions(plan, 0, len(plan.tasks))
    return out


#: How many table feeds (one per table, storage options and key columns) an executor process keeps.
FEEDS_KEPT = 4

_feeds: OrderedDict[tuple[str, tuple[tuple[str, str], ...], tuple[str, ...]], IcebergFeed] = OrderedDict()
_feeds_lock = threading.Lock()


def _feed(options: SourceOptions) -> IcebergFeed:
    """The executor process's feed of a table (kept: its parsed metadata and schemas stay warm)."""
    key = (options.path, tuple(sorted(options.storage_options.items())), options.key_columns)
    with _feeds_lock:
        found = _feeds.get(key)
        if found is not None:
            _feeds.move_to_end(key)
            return found
    found = iceberg_feed(options)
    with _feeds_lock:
        _feeds[key] = found
        while len(_feeds) > FEEDS_KEPT:
            _feeds.popitem(last=False)
    return found


def read_iceberg_partition(
    partition: IcebergPartition, target: pa.Schema, options: SourceOptions
) -> Iterator[pa.RecordBatch]:
    """The rows of one Iceberg partition in ``target``'s layout (runs on an executor).

    Raises:
        MissingFileError, DataFileError, UnsupportedFeatureError: as :meth:`IcebergFeed.plan_table`.
        TableNotFoundError: if the table's metadata is gone.
    """
    feed = _feed(options)
    feed.iceberg.state()  # the newest metadata: the one the plan's schema is taken from (it holds every schema)
    rows = feed.plan_table(partition.plan)
    for batch in rows.to_batches(BATCH_ROWS):
        if batch.num_rows:
            yield conform(batch, target)


class IcebergStreamPlanner(PlanCache[IcebergPlan]):
    """The driver's planning state of one query on an Iceberg table (see the module docstring).

    The same interface as :class:`sinks.spark.planner.StreamPlanner`; the head is the newest planned
    snapshot. Planning raises ``SchemaChangeError`` when a snapshot's schema does not fit the
    stream's, ``VersionGapError`` when a needed snapshot was expired, ``StateError`` when the table
    was re-created or the head left ``main``, and what :meth:`IcebergFeed.plan` raises.

    Args:
        options: the source's options.
        stream_schema: the query's fixed schema (Arrow).
        storage: where the table is (by default the storage its path and ``storage.*`` options name).

    Raises:
        ConfigError: for ``failOnDataLoss=false``.
    """

    def __init__(self, options: SourceOptions, stream_schema: pa.Schema, storage: Storage | None = None) -> None:
        _check_options(options)
        super().__init__(options, stream_schema)
        self.feed = iceberg_feed(options, storage)
        self.table = self.feed.table
        self._seen: tuple[str, TableState, Ancestry] | None = None
        self._table_id: str | None = None
        self._head: SnapshotInfo | None = None
        self._head_version = 0
        self._built = False

    @property
    def table_id(self) -> str:
        """The table's id (:func:`~tailer.iceberg.follow.iceberg_table_id` of its uuid)."""
        if self._table_id is None:
            self._table_id = iceberg_table_id(self._look()[1].table_uuid)
        return self._table_id

    @property
    def head_version(self) -> int:
        """The newest planned version (0 before the first)."""
        return self._head_version

    @property
    def built(self) -> bool:
        """Whether the state was built (:meth:`build`)."""
        return self._built

    def _owner(self) -> str | None:
        return self.table_id

    def _recreated(self, expected: str, found: str) -> StateError:
        return StateError(
            f"the stream's offsets belong to {expected}, not to {found} (the table was dropped and re-created); "
            + RESTART_HINT,
            table=self.table,
        )

    def _look(self) -> tuple[str, TableState, Ancestry]:
        """The newest metadata: its location (one request), parsed only when it changed."""
        where = self.feed.iceberg.metadata_location()
        if self._seen is None or self._seen[0] != where:
            state, ancestry, _ = self.feed.current(where)
            self._seen = (where, state, ancestry)
        return self._seen

    def latest_version(self) -> int:
        """The newest version of ``main`` now."""
        return self._look()[2].latest

    # -- starting ------------------------------------------------------------------------------

    def start_offset(self) -> Offset:
        """The offset a new query starts at, with the state for it built.

        Raises:
            VersionNotFoundError: if ``startingVersion`` is after the newest version.
            TableNotFoundError: if the path holds no Iceberg table.
        """
        o, ancestry = self.options, self._look()[2]
        latest = ancestry.latest
        snapshot_first = o.initial_snapshot if o.initial_snapshot is not None else not o.has_start
        if o.starting_latest:
            version = latest if snapshot_first else latest + 1
        elif o.starting_timestamp_ms is not None:
            ts = o.starting_timestamp_ms
            version = next(
                (v for s, v in zip(ancestry.snapshots, ancestry.versions, strict=True) if s.timestamp_ms >= ts),
                latest + 1,
            )
        elif o.starting_version is not None:
            if o.starting_version > latest:
                raise VersionNotFoundError(
                    f"startingVersion {o.starting_version} is after the latest version {latest}", table=self.table
                )
            version = ancestry.versions[ancestry.index_of_version(o.starting_version)]
        else:
            version = latest if snapshot_first else (ancestry.versions[0] if ancestry.versions else 1)
        if not ancestry.versions:
            version, snapshot_first = 1, False
        snapshot = snapshot_first and version <= latest
        start = Offset(self.table_id, version, 0, snapshot, _base_of(ancestry, version, snapshot))
        self.build(start)
        return start

    # -- (re)building --------------------------------------------------------------------------

    def _rebuild(self, start: Offset) -> None:
        self._built = False
        _, state, ancestry = self._look()
        self._check_base(start, ancestry)
        if start.snapshot:
            index, snap = snapshot_at(ancestry, start.version, self.table)
            plan = self.feed.plan_initial(state, ancestry, index)
            check_schema_fits(plan_schema(self.feed, plan), self.stream_schema, table=self.table, version=plan.version)
            self._plans[plan_key(plan)] = plan
            self._head, self._head_version = snap, start.version
        else:
            index = ancestry.index_of_version(start.version)
            self._head = ancestry.snapshots[index - 1] if index else None
            self._head_version = ancestry.versions[index - 1] if index else start.version - 1
        self.jump = (start.position, start)
        self._built = True

    def check_end(self, end: Offset) -> None:
        """Check that ``main`` still holds the snapshot a micro-batch ending at ``end`` read up to.

        Raises:
            StateError: if ``main`` holds another snapshot there, or none (rolled back or reset).
        """
        self._check_base(end, self._look()[2])

    def _check_base(self, start: Offset, ancestry: Ancestry) -> None:
        """Check that ``main`` still holds the snapshot ``start`` reads on from (when the offset names it).

        Where ``main`` holds no snapshot before the offset's version because older ones were expired, the
        plan of that version says so (``VersionGapError``).

        Raises:
            StateError: if ``main`` holds another snapshot there, or none (rolled back or reset).
        """
        found = _base_of(ancestry, start.version, start.snapshot)
        if start.base_snapshot is None or start.base_snapshot == found:
            return
        if found is None and not ancestry.complete:
            return
        now = "no snapshot" if found is None else f"snapshot {found}"
        raise StateError(
            f"the stream's offset reads on from snapshot {start.base_snapshot} (version {start.base_version}), but "
            f"the main branch now has {now} there: it was rolled back or reset after that snapshot was read, and "
            "reading on would skip or repeat rows; " + RESTART_HINT + " (startingVersion to choose where it starts)",
            table=self.table,
            version=start.base_version,
        )

    # -- planning ------------------------------------------------------------------------------

    def _plan_new(self) -> IcebergPlan | None:
        where, state, ancestry = self._look()
        found = iceberg_table_id(state.table_uuid)
        if found != self.table_id:
            raise self._recreated(self.table_id, found)
        index = self._next_index(ancestry)
        if index >= len(ancestry.versions):
            return None
        plan = self.feed.plan(state, ancestry, index, where)
        check_schema_fits(plan_schema(self.feed, plan), self.stream_schema, table=self.table, version=plan.version)
        self._head, self._head_version = plan.snapshot, plan.version
        return plan

    def _next_index(self, ancestry: Ancestry) -> int:
        """The index on ``main`` of the snapshot after the head.

        Raises:
            StateError: if the head snapshot is no longer an ancestor of ``main``.
        """
        if self._head is None:
            return ancestry.index_of_version(self._head_version + 1)
        index = ancestry.index_of_id(self._head.snapshot_id)
        if index is None:
            raise StateError(
                f"snapshot {self._head.snapshot_id} (version {self._head_version}), which the stream has read, is no "
                f"longer on the main branch (a rollback or branch reset); {RESTART_HINT}",
                table=self.table,
                version=self._head_version,
            )
        return index + 1
