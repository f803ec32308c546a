"""Spark partitions: file tasks shipped to executors, and how an executor reads one."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from deltatail.sinks.spark.iceberg import iceberg_partitions
from deltatail.sinks.spark.lance import lance_partitions
from deltatail.sinks.spark.offsets import AnyPlan
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.schema import conform
from deltatail.state.changes import FileTask
from deltatail.state.feed import change_schema
from deltatail.state.iceberg.planning import IcebergPlan
from deltatail.state.lance.planning import LancePlan
from deltatail.state.planning import ReadContext, VersionPlan
from deltatail.tailer.read.net_changes import net_batches
from deltatail.tailer.read.tasks import read_task
from deltatail.tailer.storage import Storage

BATCH_SIZE = 65536


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


def make_partitions(plan: AnyPlan, first: int, last: int, options: SourceOptions) -> list[InputPartition]:
    """Partitions for tasks ``first..last-1`` of a plan: one per task, or one for a netted commit.

    A Lance plan's partitions are :class:`~sinks.spark.lance.LancePartition` objects, one per row task;
    an Iceberg plan's one :class:`~sinks.spark.iceberg.IcebergPartition` for the whole snapshot.
    """
    if isinstance(plan, LancePlan):
        return list(lance_partitions(plan, first, last, options.path))
    if isinstance(plan, IcebergPlan):
        return list(iceberg_partitions(plan, first, last))
    tasks = plan.tasks[first:last]
    if not tasks:
        return []
    if uses_net(plan, options):
        return [ChangePartition(plan.context, tasks, net=True)]
    return [ChangePartition(plan.context_of(t), (t,)) for t in tasks]


def read_partition(
    partition: InputPartition,
    target: pa.Schema,
    key_columns: tuple[str, ...],
    storage: Storage,
    batch_size: int = BATCH_SIZE,
) -> Iterator[pa.RecordBatch]:
    """The rows of one partition in ``target``'s layout (runs on an executor).

    Anything but a :class:`ChangePartition` (Spark's placeholder for an empty
    read, or a Lance partition: :func:`sinks.spark.lance.read_lance_partition`) yields nothing.

    Raises:
        MissingFileError: if a data, cdc or DV file is missing.
        DeletionVectorError: if a DV does not decode.
    """
    if not isinstance(partition, ChangePartition):
        return
    ctx = partition.context
    batches: Iterator[pa.RecordBatch] = (b for t in partition.tasks for b in read_task(storage, ctx, t, batch_size))
    if partition.net:
        rows = pa.Table.from_batches(list(batches), schema=change_schema(ctx.schema()))
        batches = net_batches(rows, key_columns, batch_size)
    for batch in batches:
        if batch.num_rows:
            yield conform(batch, target)
