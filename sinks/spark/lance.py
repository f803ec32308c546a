"""The Spark source on a Lance dataset: planning on the driver (:class:`~tailer.lance.feed.LanceFeed`), rows by pylance.

The same offsets and options as on a Delta table (:mod:`sinks.spark.source`), with Lance's units:

- a *task* is a :class:`~state.lance.planning.RowTask` (rows of one fragment, read at one version):
  an offset ``(version, index)`` names the next row task of that version in plan order
  (:func:`~state.lance.planning.plan_version`'s order, the same on every planning), and
  ``maxFilesPerTrigger`` counts row tasks. Versions with updates are admitted whole, so an
  update's preimage and postimage rows stay in one micro-batch; appends, deletes and initial
  snapshots may end a micro-batch between two fragments;
- the driver keeps the manifest of the newest planned version and the plans not yet committed;
  a new version is found by the name of its manifest (one request), and ``_versions/`` is listed
  at most every ``check_seconds`` while idle, to tell "nothing new" from versions cleaned up past
  the stream (``failOnDataLoss``) and from a dataset recreated shorter than the stream's position;
- a restarted query rebuilds from the manifest of ``offset.version - 1`` (or of the snapshot's
  version), which Lance keeps until ``cleanup_old_versions`` removes it;
- executors get a :class:`LancePartition` (the dataset's root, the version's number, timestamp and
  operation, and the row tasks: fragment, version to read at, offsets) and read it with
  :class:`~tailer.lance.rows.LanceRows` (pylance); the storage options travel in the reader's
  options, as for Delta.

The stream's schema is the dataset's at the query's start (pylance's Arrow schema at the latest
version, or ``endingVersion``); a version whose schema does not fit it stops the query with a
:class:`~state.errors.SchemaChangeError`, as a non-additive change does (``LanceFeed`` refuses those).

The table id in offsets is :func:`~tailer.lance.follow.lance_table_id` (Lance manifests carry no
table id): a dataset deleted and recreated at the same path is noticed when it is shorter than the
stream's position, not when it has grown past it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from deltatail.sinks.spark.offsets import Offset, plan_key
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.plan_cache import PlanCache
from deltatail.sinks.spark.schema import arrow_target, check_schema_fits, conform, spark_schema
from deltatail.state.errors import StateError, VersionGapError, VersionNotFoundError
from deltatail.state.lance.manifest import Manifest
from deltatail.state.lance.planning import LancePlan, RowTask, plan_snapshot
from deltatail.tailer.lance.dataset import CLEANED_UP_HINT
from deltatail.tailer.lance.feed import LanceFeed, LanceOptions
from deltatail.tailer.lance.follow import lance_table_id
from deltatail.tailer.lance.rows import LanceRows, change_schema_of
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import table_storage

log = logging.getLogger("deltatail")

#: What the stream's errors tell a user to do about a recreated dataset.
RECREATED_HINT = "start a new query (a new checkpointLocation) to read the new dataset"
#: How many row readers (one per dataset and storage options) an executor process keeps.
READERS_KEPT = 4


@dataclass(frozen=True)
class LancePartition(InputPartition):
    """One Spark partition of a Lance stream: row tasks of one planned version (picklable, small).

    Attributes:
        root: the dataset's root (a path or URI).
        version: the version planned (for a snapshot: the version it is taken at).
        timestamp_us: that version's manifest timestamp (``_commit_timestamp``).
        operation: the version's operation.
        snapshot: whether the rows are an initial snapshot's.
        tasks: the row tasks to read, in order.
    """

    root: str
    version: int
    timestamp_us: int
    operation: str | None
    snapshot: bool
    tasks: tuple[RowTask, ...]

    def plan(self) -> LancePlan:
        """The plan of just these tasks (what :meth:`LanceRows.batches` reads)."""
        return LancePlan(self.version, self.timestamp_us, self.operation, self.tasks, self.snapshot)


def lance_partitions(plan: LancePlan, first: int, last: int, root: str) -> list[LancePartition]:
    """Partitions for row tasks ``first..last-1`` of a plan: one per task."""
    return [
        LancePartition(root, plan.version, plan.timestamp_us, plan.operation, plan.snapshot, (t,))
        for t in plan.tasks[first:last]
    ]


def version_schema(rows: LanceRows, version: int) -> pa.Schema:
    """The change rows' Arrow schema at ``version`` as Spark will see it (large types made plain).

    Raises:
        DataFileError: if pylance cannot open the version.
    """
    return arrow_target(spark_schema(change_schema_of(rows.dataset(version).schema)))


def lance_source_schema(options: SourceOptions, version: int | None) -> tuple[pa.Schema, int]:
    """The change schema (Arrow) of a Lance source at ``version`` (default: the latest), and that version.

    Raises:
        TableNotFoundError: if there is no Lance dataset at the path.
        VersionNotFoundError: if ``version`` is not there.
        DataFileError: if pylance cannot open it.
    """
    feed = lance_feed(options)
    at = feed.dataset.latest_version() if version is None else version
    feed.dataset.manifest(at)  # a missing version is a VersionNotFoundError naming it
    return change_schema_of(feed.rows.dataset(at).schema), at


def lance_feed(options: SourceOptions, storage: Storage | None = None) -> LanceFeed:
    """The :class:`LanceFeed` of the source's dataset (Delta-only options were refused by ``resolved``)."""
    return LanceFeed(
        options.path,
        storage or options.storage(),
        LanceOptions(external_roots=options.external_roots),
        storage_options=options.storage_options or None,
    )


_readers: OrderedDict[tuple[str, tuple[tuple[str, str], ...]], LanceRows] = OrderedDict()
_readers_lock = threading.Lock()


def _reader(root: str, options: SourceOptions) -> LanceRows:
    """The executor process's row reader for a dataset (kept: opened versions and pylance's caches stay warm)."""
    key = (root, tuple(sorted(options.storage_options.items())))
    with _readers_lock:
        found = _readers.get(key)
        if found is not None:
            _readers.move_to_end(key)
            return found
    rows = LanceRows(
        root, table_storage(root, options.storage_options or None), storage_options=options.storage_options
    )
    with _readers_lock:
        _readers[key] = rows
        while len(_readers) > READERS_KEPT:
            _readers.popitem(last=False)
    return rows


def read_lance_partition(
    partition: LancePartition, target: pa.Schema, options: SourceOptions
) -> Iterator[pa.RecordBatch]:
    """The rows of one Lance partition in ``target``'s layout (runs on an executor).

    Raises:
        MissingFileError: if a data file is missing.
        DataFileError: if pylance cannot open the version or read a fragment (and other errors of
            :meth:`LanceRows.batches`).
    """
    for batch in _reader(partition.root, options).batches(partition.plan()):
        if batch.num_rows:
            yield conform(batch, target)


class LanceStreamPlanner(PlanCache[LancePlan]):
    """The driver's planning state of one query on a Lance dataset (see the module docstring).

    The same interface as :class:`sinks.spark.planner.StreamPlanner`, the plans cached as
    :class:`~sinks.spark.plan_cache.PlanCache` says; the head is the newest planned version's
    manifest.

    Planning a new version raises ``SchemaChangeError`` when its schema does not fit the stream's
    or changes non-additively, ``VersionGapError``/``VersionNotFoundError`` when the dataset no
    longer holds a needed version (``failOnDataLoss``), ``StateError`` when the dataset was
    recreated, ``InvalidLogError`` when a manifest does not decode, ``MissingFileError`` when a
    deletion file is missing.

    Args:
        options: the source's options.
        stream_schema: the query's fixed schema (Arrow).
        storage: where the dataset is (by default the storage its path and ``storage.*`` options name).
    """

    def __init__(self, options: SourceOptions, stream_schema: pa.Schema, storage: Storage | None = None) -> None:
        super().__init__(options, stream_schema)
        self.feed = lance_feed(options, storage)
        self.dataset = self.feed.dataset
        self.table = self.feed.table
        self.table_id: str = lance_table_id(self.table)
        self._head: Manifest | None = None
        self._built = False

    @property
    def head_version(self) -> int:
        """The newest planned version (0 before the first)."""
        return 0 if self._head is None else self._head.version

    @property
    def built(self) -> bool:
        """Whether the state was built (:meth:`build`)."""
        return self._built

    def _owner(self) -> str | None:
        return self.table_id

    def _recreated(self, expected: str, found: str) -> StateError:
        return StateError(
            f"the stream's offsets belong to {expected}, not to {found}; {RECREATED_HINT}", table=self.table
        )

    def latest_version(self) -> int:
        """The dataset's newest version now (one listing).

        Raises:
            TableNotFoundError: if the dataset is gone.
        """
        return self.dataset.latest_version()

    # -- starting ------------------------------------------------------------------------------

    def start_offset(self) -> Offset:
        """The offset a new query starts at, with the state for it built.

        Raises:
            VersionNotFoundError: if ``startingVersion`` is after the latest version, or (with
                ``failOnDataLoss``) the version before the start is no longer held.
            TableNotFoundError: if the path holds no Lance dataset.
        """
        o, latest = self.options, self.dataset.latest_version()
        snapshot_first = o.initial_snapshot if o.initial_snapshot is not None else not o.has_start
        if o.starting_latest:
            version = latest if snapshot_first else latest + 1
        elif o.starting_timestamp_ms is not None:
            try:
                version = self.dataset.timestamp_version(o.starting_timestamp_ms * 1000)
            except VersionNotFoundError:
                version = latest + 1
        elif o.starting_version is not None:
            if o.starting_version > latest:
                raise VersionNotFoundError(
                    f"startingVersion {o.starting_version} is after the latest version {latest}", table=self.table
                )
            version = o.starting_version
        else:
            version = latest if snapshot_first else 1
        if version == 0:  # Lance's version 0 is the empty dataset before version 1
            version, snapshot_first = 1, False
        start = Offset(self.table_id, version, 0, snapshot_first and version <= latest)
        self.build(start)
        return start

    # -- (re)building --------------------------------------------------------------------------

    def _rebuild(self, start: Offset) -> None:
        self._built = False
        base = start.base_version
        head = self._load(base)
        if head is None or head.version == base:
            self.jump = (start.position, start)
        else:  # data loss skipped ahead
            to = (
                Offset(self.table_id, head.version, 0, True)
                if start.snapshot
                else Offset(self.table_id, head.version + 1, 0)
            )
            self.jump = (start.position, to)
        self._head = head
        self._built = True
        if start.snapshot and head is not None:
            plan = plan_snapshot(head, table=self.table)
            check_schema_fits(
                version_schema(self.feed.rows, head.version), self.stream_schema, table=self.table, version=head.version
            )
            self._plans[plan_key(plan)] = plan

    def _load(self, version: int) -> Manifest | None:
        if version < 1:
            return None
        try:
            return self.dataset.manifest(version)
        except VersionNotFoundError as e:
            latest = self.dataset.latest_version()
            if latest < version:
                raise self._truncated(version, latest) from e
            return self._data_loss(e, version)

    def _truncated(self, version: int, latest: int) -> StateError:
        return StateError(
            f"the stream has read up to version {version}, but the dataset's latest version is {latest}: "
            f"it was deleted and recreated; {RECREATED_HINT}",
            table=self.table,
        )

    def _data_loss(self, error: VersionNotFoundError | VersionGapError, position: int) -> Manifest:
        """Fail (``failOnDataLoss``), or skip to the oldest version the dataset still holds, with a warning."""
        if self.options.fail_on_data_loss:
            hint = "the dataset no longer holds the versions the stream needs; set failOnDataLoss=false to skip them"
            raise type(error)(
                f"{error.message}; {hint}", table=error.table or self.table, version=error.version, file=error.file
            ) from error
        oldest = self.dataset.oldest_version()
        if oldest <= position:
            raise error
        log.warning(
            "%s: versions after %d up to %d are gone from the dataset (failOnDataLoss=false): their changes are "
            "skipped; the stream goes on with version %d",
            self.table,
            position,
            oldest,
            oldest + 1,
        )
        return self.dataset.manifest(oldest)

    # -- planning ------------------------------------------------------------------------------

    def _plan_new(self) -> LancePlan | None:
        version = self._next()
        if version is None:
            return None
        plan = self.feed.plan(self._head, version)
        after = self.dataset.manifest(version)
        check_schema_fits(
            version_schema(self.feed.rows, version), self.stream_schema, table=self.table, version=version
        )
        self._head = after
        return plan

    def _next(self) -> int | None:
        """The version after the head if it is there (one request); lists ``_versions/`` once per ``check_seconds``.

        Raises:
            VersionGapError: (``failOnDataLoss``) if the next version is gone while newer ones exist.
            StateError: if the dataset's newest version is older than the head (recreated).
        """
        version = self.head_version + 1
        if self.dataset.exists(version):
            return version
        now = time.monotonic()
        if now - self._last_check < self.check_seconds:
            return None
        self._last_check = now
        latest = self.dataset.latest_version()
        if latest < self.head_version:
            raise self._truncated(self.head_version, latest)
        if latest < version or self.dataset.exists(version):
            return version if latest >= version else None
        gap = VersionGapError(
            f"version {version} is gone but the dataset has newer versions (up to {latest}); {CLEANED_UP_HINT}",
            table=self.table,
            version=version,
            file=self.dataset.manifest_path(version),
        )
        head = self._data_loss(gap, self.head_version)
        self._head = head
        self.jump = ((version, 1, 0), Offset(self.table_id, head.version + 1, 0))
        return head.version + 1 if self.dataset.exists(head.version + 1) else None
