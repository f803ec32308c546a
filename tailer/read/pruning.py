"""Files a filter drops whole: marked ``pruned`` in the plan, so they are counted instead of read.

A file task's rows all share its partition values, its commit's version and
timestamp and, for a data file (not a cdc file), its change type. When the
filter drops those values (:meth:`state.filters.ChangeFilter.drops_every_row`)
the task is marked pruned: readers skip it and the feed counts its rows
(:func:`tailer.read.tasks.count_task_rows`: the file's footer and its deletion
vectors) so that every later row keeps its unfiltered position.

Protocol, "Partition Value Serialization": partition values are strings in the
``add``/``remove``/``cdc`` action, parsed by the column's type; under column
mapping they "must be resolved by their physical names". A task whose action
lacks a value for a column the predicate reads is never pruned (the value may
be in the file).
"""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa

from deltatail.state.changes import FileTask
from deltatail.state.errors import DeltaTailError
from deltatail.state.feed import COMMIT_TIMESTAMP_TYPE
from deltatail.state.filters import ChangeFilter
from deltatail.state.planning import ReadContext, VersionPlan
from deltatail.tailer.read.partition_values import parse_partition_value


def prune(plan: VersionPlan, change_filter: ChangeFilter) -> VersionPlan:
    """``plan`` with the tasks ``change_filter`` (compiled) drops whole marked ``pruned``.

    Raises:
        InvalidLogError: if a partition value the predicate reads does not parse (naming the table and version).
        ConfigError: if the predicate cannot be evaluated on the partition columns' types.
    """
    if not change_filter.prunes or not plan.tasks:
        return plan
    verdicts: dict[tuple[tuple[tuple[str, str | None], ...], str | None], bool] = {}
    tasks: list[FileTask] = []
    changed = False
    for task in plan.tasks:
        if plan.context_of(task) is not plan.context:  # a removed row read in the schema before: not pruned
            tasks.append(task)
            continue
        key = (tuple(sorted(task.partition_values.items())), task.change_type)
        drop = verdicts.get(key)
        if drop is None:
            try:
                drop = verdicts[key] = change_filter.drops_every_row(_constants(plan.context, task), task.change_type)
            except DeltaTailError as e:
                raise e.at(table=plan.context.table_root, version=plan.context.version, file=task.path) from None
        if drop:
            task = replace(task, pruned=True)
            changed = True
        tasks.append(task)
    return replace(plan, tasks=tuple(tasks)) if changed else plan


def _constants(ctx: ReadContext, task: FileTask) -> pa.RecordBatch:
    """One row of the values every row of ``task`` has: partition columns present in its action, version, time."""
    names = ["_commit_version", "_commit_timestamp"]
    values: list[pa.Array] = [
        pa.array([ctx.version], pa.int64()),
        pa.array([ctx.timestamp_ms * 1000], COMMIT_TIMESTAMP_TYPE),
    ]
    if ctx.partition_columns:
        partitioned = set(ctx.partition_columns)
        for f in ctx.schema().fields:
            if f.name not in partitioned:
                continue
            keys = (f.physical_name(ctx.column_mapping_mode), f.name)
            key = next((k for k in keys if k in task.partition_values), None)
            if key is None:
                continue  # unknown here: the predicate over it decides nothing
            names.append(f.name)
            scalar = parse_partition_value(task.partition_values[key], f)
            values.append(pa.array([scalar.as_py()], scalar.type))
    return pa.RecordBatch.from_arrays(values, names=names)
