"""What the Spark source needs of each table format: its schema, its stream planner, its batch partitions.

The source asks :func:`spark_format` for the entry of the table's format (a name of
:data:`tailer.formats.registry.FORMATS`), never branches on the format itself. A format the Spark
source reads has one entry in :data:`SPARK_FORMATS`; a format without one is refused with a
``ConfigError``.
"""

from __future__ import annotations

from typing import Protocol

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from deltatail.sinks.spark.iceberg import IcebergStreamPlanner, iceberg_source_schema
from deltatail.sinks.spark.iceberg import batch_partitions as iceberg_batch_partitions
from deltatail.sinks.spark.lance import LanceStreamPlanner, lance_feed, lance_source_schema, version_schema
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.partitions import make_partitions
from deltatail.sinks.spark.planner import StreamPlanner
from deltatail.sinks.spark.schema import check_fits, check_schema_fits
from deltatail.state.errors import ConfigError
from deltatail.state.feed import change_schema
from deltatail.tailer.formats.delta import DELTA
from deltatail.tailer.formats.iceberg import ICEBERG
from deltatail.tailer.formats.lance import LANCE
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.read.feed import ChangeFeed
from deltatail.tailer.storage import Storage

#: The driver's planning state of a stream, whatever the format.
Planner = StreamPlanner | LanceStreamPlanner | IcebergStreamPlanner


class SparkFormat(Protocol):
    """One table format as the Spark source reads it."""

    def schema(self, options: SourceOptions, version: int | None) -> tuple[pa.Schema, int]:
        """The change rows' Arrow schema at ``version`` (default: the latest), and that version.

        Raises:
            TableNotFoundError: if the path holds no table of the format.
            VersionNotFoundError: if ``version`` is not there.
        """
        ...

    def planner(self, options: SourceOptions, target: pa.Schema, storage: Storage | None) -> Planner:
        """The driver's planning state of a stream in ``target``'s layout."""
        ...

    def batch_partitions(self, options: SourceOptions, target: pa.Schema, end: int | None) -> list[InputPartition]:
        """The partitions of a batch read up to ``end``, each version's schema checked against ``target``.

        Raises:
            SchemaChangeError: if a version's schema does not fit ``target``.
        """
        ...


class DeltaSpark:
    """Delta tables: :class:`~tailer.read.feed.ChangeFeed` plans, :class:`~sinks.spark.planner.StreamPlanner`."""

    def schema(self, options: SourceOptions, version: int | None) -> tuple[pa.Schema, int]:
        """The snapshot's schema plus the change columns."""
        snap = DeltaLog(options.path, options.storage()).snapshot(version)
        return change_schema(snap.schema), snap.version

    def planner(self, options: SourceOptions, target: pa.Schema, storage: Storage | None) -> Planner:
        """A :class:`~sinks.spark.planner.StreamPlanner`."""
        return StreamPlanner(options, target, storage)

    def batch_partitions(self, options: SourceOptions, target: pa.Schema, end: int | None) -> list[InputPartition]:
        """One partition per file task of the range."""
        feed = ChangeFeed(options.path, options.storage(), options.change_options())
        plans = feed.plans(
            options.starting_version,
            end,
            starting_timestamp_ms=options.starting_timestamp_ms,
            initial_snapshot=bool(options.initial_snapshot),
        )
        out: list[InputPartition] = []
        for plan in plans:
            check_fits(plan, target)
            out += make_partitions(plan, 0, len(plan.tasks), options)
        return out


class LanceSpark:
    """Lance datasets: :mod:`sinks.spark.lance`."""

    def schema(self, options: SourceOptions, version: int | None) -> tuple[pa.Schema, int]:
        """:func:`~sinks.spark.lance.lance_source_schema`."""
        return lance_source_schema(options, version)

    def planner(self, options: SourceOptions, target: pa.Schema, storage: Storage | None) -> Planner:
        """A :class:`~sinks.spark.lance.LanceStreamPlanner`."""
        return LanceStreamPlanner(options, target, storage)

    def batch_partitions(self, options: SourceOptions, target: pa.Schema, end: int | None) -> list[InputPartition]:
        """One partition per row task of the range."""
        feed = lance_feed(options)
        plans = feed.plans(
            options.starting_version,
            end,
            starting_timestamp_ms=options.starting_timestamp_ms,
            initial_snapshot=bool(options.initial_snapshot),
        )
        out: list[InputPartition] = []
        for plan in plans:
            check_schema_fits(version_schema(feed.rows, plan.version), target, table=feed.table, version=plan.version)
            out += make_partitions(plan, 0, len(plan.tasks), options)
        return out


class IcebergSpark:
    """Iceberg tables: :mod:`sinks.spark.iceberg` (one planned unit and one partition per snapshot)."""

    def schema(self, options: SourceOptions, version: int | None) -> tuple[pa.Schema, int]:
        """:func:`~sinks.spark.iceberg.iceberg_source_schema`."""
        return iceberg_source_schema(options, version)

    def planner(self, options: SourceOptions, target: pa.Schema, storage: Storage | None) -> Planner:
        """An :class:`~sinks.spark.iceberg.IcebergStreamPlanner`."""
        return IcebergStreamPlanner(options, target, storage)

    def batch_partitions(self, options: SourceOptions, target: pa.Schema, end: int | None) -> list[InputPartition]:
        """:func:`~sinks.spark.iceberg.batch_partitions`: one partition per snapshot of the range."""
        return iceberg_batch_partitions(options, target, end)


#: The Spark side of each format the source reads, by format name.
SPARK_FORMATS: dict[str, SparkFormat] = {
    DELTA.name: DeltaSpark(),
    ICEBERG.name: IcebergSpark(),
    LANCE.name: LanceSpark(),
}


def spark_format(options: SourceOptions) -> SparkFormat:
    """The Spark side of the options' table format (known: :meth:`SourceOptions.resolved`).

    Raises:
        ConfigError: if the Spark source does not read that format.
    """
    name = options.resolved().table_format
    found = SPARK_FORMATS.get(name or "")
    if found is None:
        raise ConfigError(f"the Spark source does not read {name} tables", table=options.path)
    return found
