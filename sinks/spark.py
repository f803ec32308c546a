"""The tailer as a PySpark data source: ``spark.readStream.format("deltatail").load(path)``.

Usage::

    from sinks.spark import register
    register(spark)
    stream = spark.readStream.format("deltatail").option("startingVersion", 0).load("/data/events")
    batch = (spark.read.format("deltatail")
             .option("startingVersion", 3).option("endingVersion", 7).load("/data/events"))

Rows are those of :class:`tailer.changes.ChangeFeed`: the table's logical
columns plus ``_change_type`` (string), ``_commit_version`` (long) and
``_commit_timestamp`` (timestamp). A batch read gives the same rows as
``ChangeFeed(path).read_table(a, b)`` (``deltatail changes``).

Options (names as Delta's change data feed source; case-insensitive):

======================== ==================================================================
``startingVersion``      first version to read (inclusive), or ``latest`` (streams: only
                         commits after the latest version at the query's first start)
``startingTimestamp``    start at the first commit at or after this time: ISO-8601
                         (``2024-01-02``, ``2024-01-02T03:04:05Z``; no zone means UTC) or
                         epoch milliseconds; a time after the newest commit starts a stream
                         after it
``endingVersion``        batch reads only: last version (inclusive); default the version
                         the DataFrame was defined at
``initialSnapshot``      ``true``: emit the live rows at the starting version (default: the
                         latest) as ``insert`` rows first, then the changes after it.
                         Default for streams: ``true`` when neither starting option is
                         given (as Delta does); for batch reads ``false``
``maxFilesPerTrigger``   soft limit of file tasks per micro-batch; default 1000 (Delta's)
                         unless ``maxBytesPerTrigger`` alone is given
``maxBytesPerTrigger``   soft limit of file bytes per micro-batch (``1048576``, ``64m``, ``1g``)
``netChanges``           ``true``: cancel copy-on-write noise per commit (:mod:`tailer.netchanges`)
``keyColumns``           ``a,b``: key for ``netChanges`` update pairing (needs ``netChanges``)
``failOnDataLoss``       ``true`` (default): a version the log no longer holds is an error;
                         ``false``: skip forward to the earliest version the log can still
                         build a snapshot of, with a warning (as Delta does)
======================== ==================================================================

Offsets are JSON objects ``{"tableId", "version", "index", "snapshot"}``:
``(version, index)`` is the next *file task* to read, ``index`` counting the
tasks of that version in plan order (:meth:`state.changes.PreparedCommit.tasks`;
for an initial snapshot, live files sorted by path). A version read to its end
is written as ``(version + 1, 0)``. Offsets never move backward. The driver
keeps one incremental :class:`~state.snapshot.Snapshot` and the planned
:class:`~tailer.changes.VersionPlan` objects not yet committed; each
``latestOffset`` lists the log only after the newest planned version
(:meth:`tailer.log.DeltaLog.new_commits`), so planning costs in proportion to
the new commits. A restarted query (same ``checkpointLocation``) rebuilds the
snapshot at ``offset.version - 1`` with :meth:`tailer.log.DeltaLog.snapshot` and
goes on incrementally from there, so it resumes exactly where it stopped.

Admission (``maxFilesPerTrigger``/``maxBytesPerTrigger``): a micro-batch takes
*units* in order while some budget remains; its first unit is always taken, so
a batch may overshoot (soft limits, as Delta's). A unit is one file task, or a
whole commit for commits with cdc files or deletion vectors and for every
commit under ``netChanges``. Plain commits and initial snapshots may thus end a
micro-batch between two of their files; the other commits never do. When
Spark asks for everything (``ReadAllAvailable``) the options are ignored. With
both options set, the engine's limit is the file limit and the byte limit
applies too. ``Trigger.AvailableNow`` records the latest version when the
query starts and never reads past it.

Partitions: one Spark partition per file task, carrying only the task and the
version's :class:`~tailer.changes.ReadContext`; executors read it with
:func:`tailer.changes.read_task` through :class:`~tailer.storage.LocalStorage`
(the table path must be readable there) and hand Arrow batches to Spark.
Nothing is collected to the driver. Under ``netChanges`` a commit without cdc
files needs all its rows together, so it is *one* partition, and the executor
applies :func:`tailer.netchanges.net_changes` to it.

Schema. The stream's schema is fixed when the DataFrame is defined (each
start and restart of a query defines it again): the table schema at the latest
version then (at ``endingVersion`` for a batch read). Rows of older versions
whose schema lacks some of its columns (additive changes) get nulls there.
A version whose schema is not contained in the stream's (a column added after
the query started, or a non-additive change) stops the query with a
:class:`~state.errors.SchemaChangeError` naming that version, after every
earlier row was delivered; restarting the query picks up an additive change.
A non-additive change cannot be streamed across.

The table id (``metaData.id``) is recorded in every offset; a table deleted
and recreated at the same path makes the query fail with a
:class:`~state.errors.StateError`. A running query notices it when a commit
carries a new ``metaData`` or when the log is shorter than its position; a
restarted query always does (it rebuilds its snapshot from the log).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from state.changes import FileTask
from state.errors import (
    ConfigError,
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    StateError,
    VersionGapError,
    VersionNotFoundError,
)
from state.snapshot import Snapshot
from tailer.changes import ChangeFeed, ChangeOptions, ReadContext, VersionPlan, change_schema, read_task
from tailer.log import DeltaLog
from tailer.netchanges import net_changes
from tailer.storage import LocalStorage

log = logging.getLogger("deltatail")

SHORT_NAME = "deltatail"
#: Delta's default ``maxFilesPerTrigger``.
DEFAULT_MAX_FILES = 1000
BATCH_SIZE = 65536
#: How often an idle stream lists the log to detect gaps and truncation (seconds).
CHECK_SECONDS = 5.0

T = TypeVar("T")

#: ``(version, rank)``: rank 0 for an initial snapshot taken at ``version``, 1 for commit ``version``.
Key = tuple[int, int]


# ---------------------------------------------------------------- options --


def _bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("true", "false"):
        return value == "true"
    raise ConfigError(f"option {name}={raw!r} is not true or false")


def _count(name: str, raw: str, minimum: int) -> int:
    text = raw.strip()
    if not text.isdigit() or int(text) < minimum:
        raise ConfigError(f"option {name}={raw!r} is not an integer >= {minimum}")
    return int(text)


_BYTES = re.compile(r"^(\d+)\s*([kmgt]?)(?:i?b)?$", re.IGNORECASE)


def parse_bytes(name: str, raw: str) -> int:
    """A positive byte count: digits with an optional binary unit (``k``, ``m``, ``g``, ``t``, optionally + ``b``).

    Raises:
        ConfigError: if ``raw`` is not such a count.
    """
    m = _BYTES.match(raw.strip())
    if m is None or int(m.group(1)) <= 0:
        raise ConfigError(f"option {name}={raw!r} is not a positive byte size such as 1048576, 64m or 1g")
    return int(m.group(1)) << (10 * " kmgt".index(m.group(2).lower() or " "))


def parse_timestamp_ms(raw: str) -> int:
    """Epoch milliseconds of ``startingTimestamp``: digits (epoch ms) or ISO-8601 (no zone: UTC).

    Raises:
        ConfigError: if ``raw`` is neither.
    """
    text = raw.strip()
    if text.isdigit():
        return int(text)
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError as e:
        raise ConfigError(f"option startingTimestamp={raw!r} is not an ISO-8601 date or timestamp") from e
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return (moment - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """The parsed options of one ``load``; see the module docstring for their meaning."""

    path: str
    starting_version: int | None = None
    starting_latest: bool = False
    starting_timestamp_ms: int | None = None
    ending_version: int | None = None
    initial_snapshot: bool | None = None
    max_files: int | None = None
    max_bytes: int | None = None
    net_changes: bool = False
    key_columns: tuple[str, ...] = ()
    fail_on_data_loss: bool = True

    @staticmethod
    def parse(options: Mapping[str, str]) -> SourceOptions:
        """Parse Spark's (case-insensitive) option map; unknown options are ignored, as Spark sources do.

        Raises:
            ConfigError: if the path is missing, a value is malformed, both starting options are
                given, or ``keyColumns`` is given without ``netChanges``.
        """
        opts = {k.lower(): v for k, v in options.items()}
        path = opts.get("path")
        if not path:
            raise ConfigError('no table path: use .load("/path/to/table")')
        start = opts.get("startingversion")
        latest = start is not None and start.strip().lower() == "latest"
        keys = tuple(k.strip() for k in opts.get("keycolumns", "").split(",") if k.strip())
        parsed = SourceOptions(
            path=path,
            starting_version=None if start is None or latest else _count("startingVersion", start, 0),
            starting_latest=latest,
            starting_timestamp_ms=_maybe(opts, "startingtimestamp", parse_timestamp_ms),
            ending_version=_maybe(opts, "endingversion", lambda v: _count("endingVersion", v, 0)),
            initial_snapshot=_maybe(opts, "initialsnapshot", lambda v: _bool("initialSnapshot", v)),
            max_files=_maybe(opts, "maxfilespertrigger", lambda v: _count("maxFilesPerTrigger", v, 1)),
            max_bytes=_maybe(opts, "maxbytespertrigger", lambda v: parse_bytes("maxBytesPerTrigger", v)),
            net_changes=_bool("netChanges", opts.get("netchanges", "false")),
            key_columns=keys,
            fail_on_data_loss=_bool("failOnDataLoss", opts.get("failondataloss", "true")),
        )
        if start is not None and parsed.starting_timestamp_ms is not None:
            raise ConfigError("give startingVersion or startingTimestamp, not both")
        if keys and not parsed.net_changes:
            raise ConfigError("keyColumns only applies with netChanges=true")
        return parsed

    @property
    def has_start(self) -> bool:
        """Whether ``startingVersion`` or ``startingTimestamp`` was given."""
        return self.starting_latest or self.starting_version is not None or self.starting_timestamp_ms is not None

    def change_options(self) -> ChangeOptions:
        """The :class:`~tailer.changes.ChangeOptions` these options ask for."""
        return ChangeOptions(net_changes=self.net_changes, key_columns=self.key_columns)

    def read_limit(self) -> ReadLimit:
        """The default read limit: the file limit (Delta's 1000 unless only a byte limit is set), else bytes."""
        if self.max_files is not None or self.max_bytes is None:
            return ReadMaxFiles(self.max_files or DEFAULT_MAX_FILES)
        return ReadMaxBytes(self.max_bytes)


def _maybe(opts: Mapping[str, str], name: str, parse: Callable[[str], T]) -> T | None:
    raw = opts.get(name)
    return None if raw is None else parse(raw)


# ---------------------------------------------------------------- schema --


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow change schema (:func:`tailer.changes.change_schema`)."""
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def arrow_target(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``read`` for a Spark schema (timestamps in UTC)."""
    return to_arrow_schema(schema, timezone="UTC")


def fits(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether values of ``old`` can be read as ``new``: equal, or ``new`` only adds struct fields (any depth)."""
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        names = {new.field(i).name: new.field(i).type for i in range(new.num_fields)}
        olds = (old.field(i) for i in range(old.num_fields))
        return all(f.name in names and fits(f.type, names[f.name]) for f in olds)
    if pa.types.is_list(old) and pa.types.is_list(new):
        return fits(old.value_type, new.value_type)
    if pa.types.is_map(old) and pa.types.is_map(new):
        return fits(old.key_type, new.key_type) and fits(old.item_type, new.item_type)
    return bool(old == new)


def schema_problem(plan_schema: pa.Schema, stream: pa.Schema) -> str | None:
    """``None`` if rows of ``plan_schema`` fit the stream's schema, else which column does not."""
    for f in plan_schema:
        index = stream.get_field_index(f.name)
        if index < 0:
            return f"column {f.name!r} is not in the query's schema"
        if not fits(f.type, stream.field(index).type):
            return f"column {f.name!r} has type {f.type}, the query's schema has {stream.field(index).type}"
    return None


def check_fits(plan: VersionPlan, stream: pa.Schema) -> None:
    """Refuse a version whose schema does not fit the query's fixed schema.

    Raises:
        SchemaChangeError: naming the version and the column.
    """
    problem = schema_problem(change_schema(plan.context.schema()), stream)
    if problem is not None:
        raise SchemaChangeError(
            f"the table schema at this version does not fit the query's schema: {problem}; the schema is "
            "fixed when the query starts: restart it to pick up an additive change (a non-additive change "
            "cannot be streamed across)",
            table=plan.context.table_root,
            version=plan.context.version,
        )


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` in exactly ``target``'s layout: columns cast by name, missing ones (older versions) null."""
    columns = []
    for f in target:
        index = batch.schema.get_field_index(f.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, f.type))
            continue
        column = batch.column(index)
        columns.append(column if column.type == f.type else column.cast(f.type))
    return pa.RecordBatch.from_arrays(columns, schema=target)


# ---------------------------------------------------------------- offsets --


@dataclass(frozen=True, slots=True)
class Offset:
    """A stream offset: the next file task to read (see the module docstring)."""

    table_id: str
    version: int
    index: int
    snapshot: bool = False

    @property
    def key(self) -> Key:
        """The ``(version, rank)`` of the plan this offset points into."""
        return (self.version, 0 if self.snapshot else 1)

    @property
    def position(self) -> tuple[int, int, int]:
        """A total order of offsets: ``(version, rank, index)``."""
        return (*self.key, self.index)

    def to_json(self) -> dict[str, Any]:
        """The JSON object Spark stores in its offset log."""
        return {"tableId": self.table_id, "version": self.version, "index": self.index, "snapshot": self.snapshot}

    @staticmethod
    def from_json(raw: Any) -> Offset:
        """Parse :meth:`to_json` output.

        Raises:
            StateError: if ``raw`` is not such an object.
        """
        try:
            table_id, version, index, snap = raw["tableId"], raw["version"], raw["index"], raw["snapshot"]
        except (KeyError, TypeError) as e:
            raise StateError(f"invalid deltatail offset {raw!r}: missing {e}") from e
        ints = type(version) is int and type(index) is int and version >= 0 and index >= 0
        if not (isinstance(table_id, str) and ints and isinstance(snap, bool)):
            raise StateError(f"invalid deltatail offset {raw!r}")
        return Offset(table_id, version, index, snap)


def plan_key(plan: VersionPlan) -> Key:
    """The ``(version, rank)`` of a plan."""
    return (plan.context.version, 0 if plan.snapshot else 1)


def after(plan: VersionPlan, table_id: str) -> Offset:
    """The offset just after every task of ``plan``."""
    return Offset(table_id, plan.context.version + 1, 0, False)


# ---------------------------------------------------------------- partitions --


@dataclass(frozen=True)
class ChangePartition(InputPartition):
    """One Spark partition: file tasks of one version and its read context (picklable, small).

    ``net`` is set for a whole commit under ``netChanges`` (its rows are netted together).
    """

    context: ReadContext
    tasks: tuple[FileTask, ...]
    net: bool = False


def uses_net(plan: VersionPlan, options: SourceOptions) -> bool:
    """Whether ``netChanges`` applies to a plan (commits without cdc files, as :class:`ChangeFeed`)."""
    return options.net_changes and plan.commit is not None and not plan.commit.cdcs


def make_partitions(plan: VersionPlan, first: int, last: int, options: SourceOptions) -> list[ChangePartition]:
    """Partitions for tasks ``first..last-1`` of a plan: one per task, or one for a netted commit."""
    tasks = plan.tasks[first:last]
    if not tasks:
        return []
    if uses_net(plan, options):
        return [ChangePartition(plan.context, tasks, net=True)]
    return [ChangePartition(plan.context, (t,)) for t in tasks]


def read_partition(
    partition: InputPartition, target: pa.Schema, key_columns: tuple[str, ...], batch_size: int = BATCH_SIZE
) -> Iterator[pa.RecordBatch]:
    """The rows of one partition in ``target``'s layout (runs on an executor).

    Anything but a :class:`ChangePartition` (Spark's placeholder for an empty
    read) yields nothing.

    Raises:
        MissingFileError: if a data, cdc or DV file is missing.
        DeletionVectorError: if a DV does not decode.
    """
    if not isinstance(partition, ChangePartition):
        return
    storage, ctx = LocalStorage(), partition.context
    batches: Iterator[pa.RecordBatch] = (b for t in partition.tasks for b in read_task(storage, ctx, t, batch_size))
    if partition.net:
        rows = pa.Table.from_batches(list(batches), schema=change_schema(ctx.schema()))
        batches = iter(net_changes(rows, key_columns).to_batches(batch_size))
    for batch in batches:
        if batch.num_rows:
            yield conform(batch, target)


def check_key_columns(options: SourceOptions, schema: StructType) -> None:
    """Refuse ``keyColumns`` that are not columns of the read's schema.

    Raises:
        ConfigError: naming the missing columns.
    """
    missing = [k for k in options.key_columns if k not in schema.fieldNames()]
    if missing:
        raise ConfigError(f"keyColumns not in the table's schema: {', '.join(missing)}", table=options.path)


# ---------------------------------------------------------------- driver state --


class StreamPlanner:
    """The driver's planning state of one query: an incremental snapshot and the plans not yet committed.

    Plans are cached in order of their keys; the newest is always that of the
    snapshot's version. Any planning error is sticky (the snapshot may be half
    moved on): it is raised again whenever planning reaches that version.
    ``jump`` is ``(position, offset)``: the state serves any start offset from
    ``position`` to ``offset`` (the start it was built for, and everything a
    data-loss skip jumped over).
    """

    def __init__(self, options: SourceOptions, stream_schema: pa.Schema) -> None:
        self.options = options
        self.stream_schema = stream_schema
        self.feed = ChangeFeed(options.path, options=options.change_options())
        self.log: DeltaLog = self.feed.log
        self.table_id: str | None = None
        self.target: int | None = None
        self.rebuilds = 0
        self._snap: Snapshot | None = None
        self.jump: tuple[tuple[int, int, int], Offset] | None = None
        self._previous_ms: int | None = None
        self._plans: dict[Key, VersionPlan] = {}
        self._pending: deque[int] = deque()
        self._failure: DeltaTailError | None = None
        self.check_seconds = CHECK_SECONDS
        self._last_check = -math.inf

    # -- starting ------------------------------------------------------------------------------

    def start_offset(self) -> Offset:
        """The offset a new query starts at, with the state for it built.

        Raises:
            VersionNotFoundError: if ``startingVersion`` is after the latest version, or (with
                ``failOnDataLoss``) older than the log still holds.
            TableNotFoundError: if the path holds no Delta table.
        """
        o, latest = self.options, self.log.latest_version()
        snapshot_first = o.initial_snapshot if o.initial_snapshot is not None else not o.has_start
        if o.starting_latest:
            version = latest if snapshot_first else latest + 1
        elif o.starting_timestamp_ms is not None:
            version = self._version_at(o.starting_timestamp_ms, latest)
        elif o.starting_version is not None:
            if o.starting_version > latest:
                raise VersionNotFoundError(
                    f"startingVersion {o.starting_version} is after the latest version {latest}", table=self.log.table
                )
            version = o.starting_version
        else:
            version = latest if snapshot_first else 0
        start = Offset("", version, 0, snapshot_first and version <= latest)
        self._rebuild(start)
        if self.table_id is None:
            self.table_id = self._first_table_id()
        return Offset(self.table_id, start.version, 0, start.snapshot)

    def _version_at(self, timestamp_ms: int, latest: int) -> int:
        try:
            return self.feed.version_at_or_after(timestamp_ms)
        except VersionNotFoundError:
            return latest + 1

    def _first_table_id(self) -> str:
        try:
            metadata = self.log.read_commit(0).metadata
        except MissingFileError:
            metadata = self.log.snapshot().metadata
        if metadata is None:
            raise InvalidLogError("commit 0 holds no metaData action", table=self.log.table, version=0)
        return metadata.id

    # -- (re)building --------------------------------------------------------------------------

    def _covers(self, start: Offset) -> bool:
        if self._snap is None:
            return False
        if start.key in self._plans:
            return True
        if self.jump is not None and self.jump[0] <= start.position <= self.jump[1].position:
            return True
        return not start.snapshot and start.version == self._snap.version + 1

    def ensure(self, start: Offset) -> None:
        """Make the state serve ``start``: reuse it, or rebuild it from the log (a restart).

        Raises:
            StateError: if the offset belongs to another table (deleted and recreated).
        """
        if start.table_id and self.table_id and start.table_id != self.table_id:
            raise self._recreated(start.table_id, self.table_id)
        if not self._covers(start):
            self._rebuild(start)

    def _rebuild(self, start: Offset) -> None:
        log.info("%s: building the stream's state for offset %s", self.log.table, start.to_json())
        self.rebuilds += 1
        self._plans.clear()
        self._pending.clear()
        self._failure = None
        self.table_id = start.table_id or None
        base = start.version if start.snapshot else start.version - 1
        snap = self._load(base)
        self._set_snapshot(snap)
        tid = self.table_id or ""
        if snap.version == base:
            self.jump = (start.position, start)
        else:  # data loss skipped ahead
            to = Offset(tid, snap.version, 0, True) if start.snapshot else Offset(tid, snap.version + 1, 0)
            self.jump = (start.position, to)
        if start.snapshot and snap.version >= 0:
            plan = self.feed.plan_snapshot(snap, self._previous_ms or 0)
            self._plans[plan_key(plan)] = plan

    def _set_snapshot(self, snap: Snapshot) -> None:
        self._snap = snap
        self._check_table(snap)
        if snap.version < 0:
            self._previous_ms = None
            return
        self._previous_ms = self.feed.snapshot_time(snap)

    def _load(self, version: int) -> Snapshot:
        if version < 0:
            return Snapshot.empty(self.log.table)
        try:
            return self.log.snapshot(version)
        except (VersionNotFoundError, VersionGapError) as e:
            self._check_not_truncated(version)
            return self._data_loss(e, version)

    def _data_loss(self, error: VersionNotFoundError | VersionGapError, position: int) -> Snapshot:
        """Fail (``failOnDataLoss``), or skip to the earliest snapshot the log still holds, with a warning."""
        if self.options.fail_on_data_loss:
            hint = "the log no longer holds the versions the stream needs; set failOnDataLoss=false to skip them"
            raise type(error)(
                f"{error.message}; {hint}", table=error.table, version=error.version, file=error.file
            ) from error
        earliest = self.log.earliest_version()
        if earliest <= position:
            raise error
        log.warning(
            "%s: versions after %d up to %d are gone from the log (failOnDataLoss=false): their changes are "
            "skipped; the stream goes on with version %d",
            self.log.table,
            position,
            earliest,
            earliest + 1,
        )
        return self.log.snapshot(earliest)

    def _check_table(self, snap: Snapshot) -> None:
        if snap.metadata is None:
            return
        if self.table_id is None:
            self.table_id = snap.metadata.id
        elif snap.metadata.id != self.table_id:
            raise self._recreated(self.table_id, snap.metadata.id)

    def _recreated(self, expected: str, found: str) -> StateError:
        return StateError(
            f"the stream's offsets belong to table id {expected}, but the table now has id {found}: it was "
            "deleted and recreated; start a new query (a new checkpointLocation) to read the new table",
            table=self.log.table,
        )

    # -- planning ------------------------------------------------------------------------------

    def plans_from(self, start: Offset, stop: Key | None = None) -> Iterator[VersionPlan]:
        """Plans from ``start``'s on, in order, planning new commits lazily; none at or after ``stop``.

        Raises:
            SchemaChangeError: when planning reaches a version whose schema does not fit the stream's.
            VersionGapError, VersionNotFoundError: when the log no longer holds a needed version
                (``failOnDataLoss``).
            StateError: if the table was deleted and recreated.
            InvalidLogError, UnsupportedFeatureError: as :meth:`ChangeFeed.plan_commit`.
        """
        self.ensure(start)
        for key, plan in list(self._plans.items()):
            if key < start.key:
                continue
            if stop is not None and key >= stop:
                return
            yield plan
        while True:
            assert self._snap is not None
            if stop is not None and (self._snap.version + 1, 1) >= stop:
                return
            planned = self._plan_next()
            if planned is None:
                return
            yield planned

    def _plan_next(self) -> VersionPlan | None:
        if self._failure is not None:
            raise self._failure
        assert self._snap is not None
        if self.target is not None and self._snap.version >= self.target:
            return None
        try:
            if not self._pending:
                self._pending.extend(self._list_after(self._snap.version))
            if not self._pending:
                return None
            return self._plan_commit(self._pending.popleft())
        except DeltaTailError as e:
            self._failure = e
            raise

    def _list_after(self, version: int) -> list[int]:
        """New commits after ``version`` (a stat per commit); the log is listed at most every ``check_seconds``.

        Listing tells "nothing new" from a gap (log cleaned up past us) and a truncated log
        (table recreated); Spark polls an idle source every few milliseconds.
        """
        now = time.monotonic()
        check = now - self._last_check >= self.check_seconds
        try:
            versions = self.log.new_commits(version, check_gaps=check)
        except VersionGapError as e:
            snap = self._data_loss(e, version)
            self._set_snapshot(snap)
            self.jump = ((version + 1, 1, 0), Offset(self.table_id or "", snap.version + 1, 0))
            return self.log.new_commits(snap.version)
        if not versions and check:
            self._last_check = now
            if version >= 0 and not self.log.storage.exists(self.log.commit_path(version)):
                self._check_not_truncated(version)  # our newest commit is gone: cleaned up (harmless) or recreated
        return versions

    def _check_not_truncated(self, version: int) -> None:
        latest = self.log.latest_version()
        if latest < version:
            raise StateError(
                f"the stream has read up to version {version}, but the table's latest version is {latest}: "
                "the table was deleted and recreated, or its log truncated; start a new query",
                table=self.log.table,
            )

    def _plan_commit(self, version: int) -> VersionPlan:
        assert self._snap is not None
        mtime = self.log.storage.stat(self.log.commit_path(version)).modification_time
        commit = self.log.read_commit(version)
        self._snap, plan = self.feed.plan_commit(self._snap, commit, mtime, self._previous_ms)
        self._previous_ms = plan.context.timestamp_ms
        if commit.metadata is not None:
            self._check_table(self._snap)
        check_fits(plan, self.stream_schema)
        self._plans[plan_key(plan)] = plan
        return plan

    def forget_before(self, end: Offset) -> None:
        """Drop the cached plans wholly before ``end`` (Spark committed them; it never asks for them again)."""
        for key in [k for k in self._plans if k < end.key]:
            del self._plans[key]
        if self.jump is not None and end.position >= self.jump[1].position:
            self.jump = None

    @property
    def cached(self) -> int:
        """How many plans are cached."""
        return len(self._plans)


# ---------------------------------------------------------------- admission --


@dataclass
class Budget:
    """What a micro-batch may still take; ``None`` is unlimited. A unit is taken while both are positive."""

    files: int | None = None
    bytes: int | None = None
    taken: bool = field(default=False)

    @staticmethod
    def of(limit: ReadLimit, options: SourceOptions) -> Budget:
        """The budget for Spark's ``limit`` (``ReadAllAvailable`` ignores the options).

        Raises:
            ConfigError: for a read limit other than all-available, max files or max bytes.
        """
        if isinstance(limit, ReadAllAvailable):
            return Budget()
        if isinstance(limit, ReadMaxFiles):
            return Budget(limit.max_files, options.max_bytes)
        if isinstance(limit, ReadMaxBytes):
            return Budget(options.max_files, limit.max_bytes)
        raise ConfigError(f"the deltatail source does not support the read limit {limit!r}")

    def admits(self) -> bool:
        """Whether the next unit may be taken (always the first one)."""
        if not self.taken:
            return True
        return (self.files is None or self.files > 0) and (self.bytes is None or self.bytes > 0)

    def take(self, tasks: Sequence[FileTask]) -> None:
        """Charge a unit of tasks."""
        self.taken = True
        if self.files is not None:
            self.files -= len(tasks)
        if self.bytes is not None:
            self.bytes -= sum(t.size or 0 for t in tasks)


def whole_unit(plan: VersionPlan, options: SourceOptions) -> bool:
    """Whether a plan is admitted whole: commits with cdc files or deletion vectors, or any under ``netChanges``."""
    if plan.snapshot:
        return False
    if options.net_changes:
        return True
    return any(t.is_cdc or t.selection.within is not None or t.selection.minus is not None for t in plan.tasks)


def admit(plans: Iterable[VersionPlan], start: Offset, budget: Budget, options: SourceOptions) -> Offset:
    """The end offset of a micro-batch from ``start``; a planning error ends the batch before its version.

    Raises:
        DeltaTailError: what planning raises, when it is raised at ``start`` itself.
    """
    end = start
    try:
        for plan in plans:
            first = start.index if plan_key(plan) == start.key else 0
            tasks = plan.tasks[first:]
            if whole_unit(plan, options) and tasks:
                if not budget.admits():
                    return end
                budget.take(tasks)
            else:
                for i, task in enumerate(tasks, first):
                    if not budget.admits():
                        return Offset(start.table_id, plan.context.version, i, plan.snapshot)
                    budget.take((task,))
            end = after(plan, start.table_id)
    except DeltaTailError:
        if end == start:
            raise
        log.info("ending the micro-batch at %s, before a version that cannot be read", end)
    return end


# ---------------------------------------------------------------- readers --


class DeltaTailStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader; Spark drives it on the driver and pickles it (without its state) to executors.

    Args:
        options: the parsed options.
        schema: the query's schema (what :meth:`DeltaTailDataSource.schema` returned, or the user's).

    Raises:
        ConfigError: if ``endingVersion`` is given (batch reads only) or a key column is not in ``schema``.
    """

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        if options.ending_version is not None:
            raise ConfigError("endingVersion applies to batch reads (spark.read), not to streams")
        check_key_columns(options, schema)
        self.options = options
        self.schema = schema
        self._planner: StreamPlanner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "schema": self.schema, "_planner": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def planner(self) -> StreamPlanner:
        """The driver state, created on first use."""
        if self._planner is None:
            self._planner = StreamPlanner(self.options, arrow_target(self.schema))
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        """The offset of a new query (its start options). Raises what :meth:`StreamPlanner.start_offset` raises."""
        return self.planner.start_offset().to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        """The read limit of the options (``maxFilesPerTrigger``, default 1000, or ``maxBytesPerTrigger``)."""
        return self.options.read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the latest version: this query run never reads past it."""
        self.planner.target = self.planner.log.latest_version()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        """The end of the next micro-batch from ``start`` under ``limit``; ``start`` itself when nothing is new.

        Raises:
            StateError: if ``start`` is not a deltatail offset or belongs to a recreated table.
            ConfigError: for an unsupported read limit.
            DeltaTailError: a planning error at ``start`` (see :meth:`StreamPlanner.plans_from`).
        """
        first = Offset.from_json(start)
        end = admit(self.planner.plans_from(first), first, Budget.of(limit, self.options), self.options)
        jump = self.planner.jump
        if jump is not None and jump[0] <= first.position and end.position < jump[1].position:
            end = jump[1]  # the versions in between are gone (failOnDataLoss=false): move past them
        return start if end == first else end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """One partition per file task between the offsets (per commit under ``netChanges``).

        Raises:
            StateError: if an offset is not a deltatail offset or belongs to a recreated table.
        """
        first, last = Offset.from_json(start), Offset.from_json(end)
        if last.position <= first.position:
            return []
        stop = (last.version, last.key[1] + (1 if last.index else 0))
        out: list[InputPartition] = []
        for plan in self.planner.plans_from(first, stop):
            key = plan_key(plan)
            if key >= stop:
                break
            lo = first.index if key == first.key else 0
            hi = last.index if key == last.key else len(plan.tasks)
            out += make_partitions(plan, lo, hi, self.options)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one partition (on an executor); raises what :func:`read_partition` raises."""
        return read_partition(partition, arrow_target(self.schema), self.options.key_columns)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark processed everything before ``end``: drop those cached plans."""
        if self._planner is not None:
            self._planner.forget_before(Offset.from_json(end))

    def stop(self) -> None:
        """Drop the driver state."""
        self._planner = None


class DeltaTailBatchReader(DataSourceReader):
    """The batch reader: the rows of ``ChangeFeed(path).read_table(startingVersion, endingVersion)``.

    Args:
        options: the parsed options.
        schema: the read's schema.
        ending_version: the last version to read (``endingVersion``, else the version the schema is of).

    Raises:
        ConfigError: if ``startingVersion`` is ``latest`` (streams only) or a key column is not in ``schema``.
    """

    def __init__(self, options: SourceOptions, schema: StructType, ending_version: int | None) -> None:
        if options.starting_latest:
            raise ConfigError("startingVersion=latest applies to streams; give a version number")
        check_key_columns(options, schema)
        self.options = options
        self.schema = schema
        self.ending_version = ending_version

    def partitions(self) -> list[InputPartition]:
        """Plan the range (on the driver) into partitions.

        Raises:
            SchemaChangeError: if a version's schema does not fit the read's, or changes non-additively.
            VersionNotFoundError, VersionGapError: as :meth:`ChangeFeed.plans`.
        """
        o = self.options
        feed = ChangeFeed(o.path, options=o.change_options())
        target = arrow_target(self.schema)
        plans = feed.plans(
            o.starting_version,
            self.ending_version,
            starting_timestamp_ms=o.starting_timestamp_ms,
            initial_snapshot=bool(o.initial_snapshot),
        )
        out: list[InputPartition] = []
        for plan in plans:
            check_fits(plan, target)
            out += make_partitions(plan, 0, len(plan.tasks), o)
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one partition (on an executor); raises what :func:`read_partition` raises."""
        return read_partition(partition, arrow_target(self.schema), self.options.key_columns)


class DeltaTailDataSource(DataSource):
    """The ``deltatail`` data source (register it with :func:`register`)."""

    #: The version :meth:`schema` read the schema at (pins a batch read's default end).
    schema_version: int | None = None

    @classmethod
    def name(cls) -> str:
        """The short name: ``deltatail``."""
        return SHORT_NAME

    def schema(self) -> StructType:
        """The table's logical schema (latest version, or ``endingVersion``) plus the three change columns.

        Raises:
            ConfigError: if the options are invalid.
            TableNotFoundError: if the path holds no Delta table.
            VersionNotFoundError: if ``endingVersion`` is after the latest version.
        """
        options = SourceOptions.parse(self.options)
        snap = DeltaLog(options.path).snapshot(options.ending_version)
        self.schema_version = snap.version
        return spark_schema(change_schema(snap.schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A :class:`DeltaTailStreamReader`; raises what it raises."""
        return DeltaTailStreamReader(SourceOptions.parse(self.options), schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        """A :class:`DeltaTailBatchReader`; raises what it raises."""
        options = SourceOptions.parse(self.options)
        end = options.ending_version if options.ending_version is not None else self.schema_version
        return DeltaTailBatchReader(options, schema, end)


def register(spark: SparkSession) -> None:
    """Register the ``deltatail`` format with ``spark`` (``spark.readStream.format("deltatail")``)."""
    spark.dataSource.register(DeltaTailDataSource)
