"""The tailer as a PySpark data source: ``spark.readStream.format("deltatail").load(path)``.

Usage::

    from deltatail.sinks.spark import register
    register(spark)
    stream = spark.readStream.format("deltatail").option("startingVersion", 0).load("/data/events")
    batch = (spark.read.format("deltatail")
             .option("startingVersion", 3).option("endingVersion", 7).load("/data/events"))

Rows are those of :class:`tailer.read.feed.ChangeFeed`: the table's logical
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
``splitCommits``         which commits a micro-batch may end inside (Delta tables): ``auto``
                         (default) splits commits with deletion vectors and no cdc files;
                         ``always`` also commits with cdc files (their update images may
                         then land in different micro-batches); ``never`` keeps both whole,
                         as Delta does (:func:`sinks.spark.admission.whole_unit`)
``netChanges``           ``true``: cancel copy-on-write noise per commit (:mod:`tailer.read.net_changes`)
``keyColumns``           ``a,b``: key for ``netChanges`` update pairing (needs ``netChanges``)
``failOnDataLoss``       ``true`` (default): a version the log no longer holds is an error;
                         ``false``: skip forward to the earliest version the log can still
                         build a snapshot of, with a warning (as Delta does)
``onDataLoss``           ``fail`` (default), ``skip`` (``failOnDataLoss=false``) or
                         ``resnapshot``: the table's rows at its latest version are read as
                         initial-snapshot rows (snapshot offsets), and the stream goes on
                         after them (Debezium's ``when_needed``); Delta tables only. Each
                         loss is logged and counted (``planner.data_losses``)
``externalRoots``        ``s3://src/t,/mnt/clone``: roots outside the table whose files its
                         log may name (shallow clones); read with the table's ``storage.*``
                         options. Other paths outside the table are refused (:mod:`state.paths`)
======================== ==================================================================

Offsets are JSON objects ``{"tableId", "version", "index", "snapshot"}``:
``(version, index)`` is the next *file task* to read, ``index`` counting the
tasks of that version in plan order (:meth:`state.changes.PreparedCommit.tasks`;
for an initial snapshot, live files sorted by path). A version read to its end
is written as ``(version + 1, 0)``. Offsets never move backward. The driver
keeps one incremental :class:`~state.snapshot.Snapshot` and the planned
:class:`~state.planning.VersionPlan` objects not yet committed; each
``latestOffset`` lists the log only after the newest planned version
(:class:`tailer.log.follower.LogFollower`), so planning costs in proportion to
the new commits. A restarted query (same ``checkpointLocation``) rebuilds the
snapshot at ``offset.version - 1`` with :meth:`tailer.log.delta_log.DeltaLog.snapshot` and
goes on incrementally from there, so it resumes exactly where it stopped.

Admission (``maxFilesPerTrigger``/``maxBytesPerTrigger``): a micro-batch takes
*units* in order while some budget remains; its first unit is always taken, so
a batch may overshoot (soft limits, as Delta's). A unit is one file task, or a
whole commit where ``splitCommits`` keeps it whole (by default: commits with cdc
files) and for every commit under ``netChanges``. Plain commits, commits with
deletion vectors (unless ``splitCommits=never``) and initial snapshots may thus
end a micro-batch between two of their files; the other commits never do. When
Spark asks for everything (``ReadAllAvailable``) the options are ignored. With
both options set, the engine's limit is the file limit and the byte limit
applies too. ``Trigger.AvailableNow`` records the latest version when the
query starts and never reads past it.

Partitions: one Spark partition per file task, carrying only the task and the
version's :class:`~state.planning.ReadContext`; executors read it with
:func:`tailer.read.tasks.read_task` through the table's storage (a local path
must be readable there; an object store is reached with the ``storage.*``
options, e.g. ``.option("storage.aws_region", "eu-west-1")``, which travel in
the query plan, never in offsets, or with the executors' own environment:
``AWS_*``, ``AZURE_*``, ``GOOGLE_*``, instance credentials) and hand Arrow
batches to Spark.
Nothing is collected to the driver. Under ``netChanges`` a commit without cdc
files needs all its rows together, so it is *one* partition, and the executor
applies :func:`tailer.read.net_changes.net_changes` to it.

Schema. The stream's schema is fixed when the DataFrame is defined (each
start and restart of a query defines it again): the table schema at the latest
version then (at ``endingVersion`` for a batch read). Rows of older versions
whose schema lacks some of its columns (additive changes) get nulls there;
columns whose type the stream's widens (Delta type widening) are cast up.
A version whose rows do not fit the stream's schema (a column added after the
query started, a narrower type) or that drops or renames a column the stream
has stops the query with a :class:`~state.errors.SchemaChangeError` naming
that version, after every earlier row was delivered; its message says how to
go on (:func:`sinks.spark.schema.check_fits`; ``docs/spark.md``).

Lance datasets. A path written ``lance://PATH``, the option ``format`` (``lance``
or ``delta``), or, without either, a ``_versions/`` directory holding manifests
makes the source read a Lance dataset (:mod:`sinks.spark.lance`): the rows of
:class:`tailer.lance.feed.LanceFeed`, the same offsets (``index`` counts the
version's *row tasks*, one fragment's rows each), options and guarantees.
``maxFilesPerTrigger`` counts row tasks, and a version with updates is admitted
whole; ``netChanges``, ``keyColumns`` and ``maxBytesPerTrigger`` are refused.
Lance versions start at 1 (``startingVersion=0`` reads from 1). The driver plans
with :mod:`state.lance.planning`; executors read each row task with pylance.

Iceberg tables. A path written ``iceberg://LOCATION``, the option ``format``
(``iceberg``), or an Iceberg layout makes the source read an Iceberg table
(:mod:`sinks.spark.iceberg`): the rows of :class:`tailer.iceberg.feed.IcebergFeed`
(with ``_snapshot_id``), one snapshot admitted whole and read as one partition
(``index`` is always 0; ``maxFilesPerTrigger`` counts the snapshot's data files);
``maxBytesPerTrigger`` and ``onDataLoss`` other than ``fail`` are refused.

The table id (``metaData.id``) is recorded in every offset; a table deleted
and recreated at the same path makes the query fail with a
:class:`~state.errors.StateError`. A running query notices it when a commit
carries a new ``metaData`` or when the log is shorter than its position; a
restarted query always does (it rebuilds its snapshot from the log).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from deltatail.sinks.spark.admission import Budget, admit
from deltatail.sinks.spark.formats import Planner, spark_format
from deltatail.sinks.spark.iceberg import IcebergPartition, read_iceberg_partition
from deltatail.sinks.spark.lance import LancePartition, read_lance_partition
from deltatail.sinks.spark.offsets import Offset, plan_key
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.partitions import make_partitions, read_partition
from deltatail.sinks.spark.schema import arrow_target, spark_schema
from deltatail.state.errors import ConfigError
from deltatail.tailer.storage import Storage

SHORT_NAME = "deltatail"


def check_key_columns(options: SourceOptions, schema: StructType) -> None:
    """Refuse ``keyColumns`` that are not columns of the read's schema.

    Raises:
        ConfigError: naming the missing columns.
    """
    missing = [k for k in options.key_columns if k not in schema.fieldNames()]
    if missing:
        raise ConfigError(f"keyColumns not in the table's schema: {', '.join(missing)}", table=options.path)


class DeltaTailStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader; Spark drives it on the driver and pickles it (without its state) to executors.

    Args:
        options: the parsed options.
        schema: the query's schema (what :meth:`DeltaTailDataSource.schema` returned, or the user's).
        storage: where the table is, for the driver's planning (by default from the path and ``storage.*`` options).

    Raises:
        ConfigError: if ``endingVersion`` is given (batch reads only) or a key column is not in ``schema``.
    """

    def __init__(self, options: SourceOptions, schema: StructType, storage: Storage | None = None) -> None:
        if options.ending_version is not None:
            raise ConfigError("endingVersion applies to batch reads (spark.read), not to streams")
        check_key_columns(options, schema)
        self.options = options
        self.schema = schema
        self._storage = storage
        self._planner: Planner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "schema": self.schema, "_planner": None, "_storage": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def planner(self) -> Planner:
        """The driver state, created on first use by the table's format (:mod:`sinks.spark.formats`)."""
        if self._planner is None:
            fmt = spark_format(self.options)
            self._planner = fmt.planner(self.options, arrow_target(self.schema), self._storage)
        return self._planner

    def initialOffset(self) -> dict[str, Any]:
        """The offset of a new query (its start options). Raises what :meth:`StreamPlanner.start_offset` raises."""
        return self.planner.start_offset().to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        """The read limit of the options (``maxFilesPerTrigger``, default 1000, or ``maxBytesPerTrigger``)."""
        return self.options.read_limit()

    def prepareForTriggerAvailableNow(self) -> None:
        """Record the latest version: this query run never reads past it."""
        self.planner.target = self.planner.latest_version()

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
            StateError: if an offset is not a deltatail offset or belongs to a recreated table, or an
                Iceberg table's ``main`` no longer holds the snapshot ``end`` names (a rollback).
        """
        first, last = Offset.from_json(start), Offset.from_json(end)
        if last.position <= first.position:
            return []
        self.planner.check_end(last)  # a batch replayed after a restart reads what it read before, or fails
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
        """The rows of one partition (on an executor); raises what :func:`read_any` raises."""
        return read_any(partition, self.schema, self.options)

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
            SchemaChangeError: if a version's rows do not fit the read's schema (:func:`check_fits`).
            VersionNotFoundError, VersionGapError: as :meth:`ChangeFeed.plans`.
        """
        return spark_format(self.options).batch_partitions(self.options, arrow_target(self.schema), self.ending_version)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The rows of one partition (on an executor); raises what :func:`read_any` raises."""
        return read_any(partition, self.schema, self.options)


def read_any(partition: InputPartition, schema: StructType, options: SourceOptions) -> Iterator[pa.RecordBatch]:
    """The rows of a Delta or Lance partition in the layout of ``schema`` (runs on an executor).

    Raises:
        DeltaTailError: what :func:`~sinks.spark.partitions.read_partition` (Delta) or
            :func:`~sinks.spark.lance.read_lance_partition` (Lance) or
            :func:`~sinks.spark.iceberg.read_iceberg_partition` (Iceberg) raises.
    """
    if isinstance(partition, LancePartition):
        return read_lance_partition(partition, arrow_target(schema), options)
    if isinstance(partition, IcebergPartition):
        return read_iceberg_partition(partition, arrow_target(schema), options)
    return read_partition(partition, arrow_target(schema), options.key_columns, options.storage())


class DeltaTailDataSource(DataSource):
    """The ``deltatail`` data source (register it with :func:`register`)."""

    #: The version :meth:`schema` read the schema at (pins a batch read's default end).
    schema_version: int | None = None
    #: The table's format as :meth:`schema` found it (so the readers need not look again).
    table_format: str | None = None

    @classmethod
    def name(cls) -> str:
        """The short name: ``deltatail``."""
        return SHORT_NAME

    def source_options(self) -> SourceOptions:
        """The parsed options, with the table's format known (looked up once, in :meth:`schema`).

        Raises:
            ConfigError: if the options are invalid, or Delta-only options are given for a Lance dataset.
        """
        options = SourceOptions.parse(self.options)
        if options.table_format is None and self.table_format is not None:
            options = replace(options, table_format=self.table_format)
        return options.resolved()

    def schema(self) -> StructType:
        """The table's logical schema (latest version, or ``endingVersion``) plus the three change columns.

        Raises:
            ConfigError: if the options are invalid.
            TableNotFoundError: if the path holds no Delta table (or no Lance dataset).
            VersionNotFoundError: if ``endingVersion`` is after the latest version.
        """
        options = self.source_options()
        self.table_format = options.table_format
        arrow, self.schema_version = spark_format(options).schema(options, options.ending_version)
        return spark_schema(arrow)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """A :class:`DeltaTailStreamReader`; raises what it raises."""
        return DeltaTailStreamReader(self.source_options(), schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        """A :class:`DeltaTailBatchReader`; raises what it raises."""
        options = self.source_options()
        end = options.ending_version if options.ending_version is not None else self.schema_version
        return DeltaTailBatchReader(options, schema, end)


def register(spark: SparkSession) -> None:
    """Register the ``deltatail`` format with ``spark`` (``spark.readStream.format("deltatail")``)."""
    spark.dataSource.register(DeltaTailDataSource)
