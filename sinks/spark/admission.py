"""Admission: how much of the planned versions one micro-batch takes (``maxFilesPerTrigger``/``maxBytesPerTrigger``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxBytes, ReadMaxFiles

from deltatail.sinks.spark.offsets import AnyPlan, Offset, after, is_snapshot, plan_key, plan_version
from deltatail.sinks.spark.options import SourceOptions
from deltatail.state.changes import FileTask
from deltatail.state.errors import ConfigError, DeltaTailError
from deltatail.state.iceberg.planning import IcebergPlan
from deltatail.state.iceberg.planning import RowTask as IcebergTask
from deltatail.state.lance.planning import LancePlan, RowTask

log = logging.getLogger("deltatail")


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

    def take(self, tasks: Sequence[FileTask | RowTask | IcebergTask]) -> None:
        """Charge a unit of tasks (a Lance or Iceberg row task counts as one file and no bytes)."""
        self.taken = True
        if self.files is not None:
            self.files -= len(tasks)
        if self.bytes is not None:
            self.bytes -= sum(t.size or 0 for t in tasks if isinstance(t, FileTask))


def whole_unit(plan: AnyPlan, options: SourceOptions) -> bool:
    """Whether a plan is admitted whole (one unit), rather than task by task (``splitCommits``).

    A split never loses or repeats a row: an offset inside a version names the next task, and a
    version's tasks are in a fixed order (the order of its actions in the commit file; see
    :meth:`state.changes.PreparedCommit.tasks`), so a restarted query replans the version and
    skips the same tasks. What a split changes is which rows of a version share a micro-batch:

    - Delta commits with deletion vectors but no cdc files: split unless ``splitCommits=never``
      (Delta keeps them whole). Each task yields whole ``delete`` or ``insert`` rows of one file
      (a deletion vector's rows, or a file's), and nothing pairs rows across tasks: such a commit
      reads as a plain add/remove commit does, which is always split.
    - Delta commits with cdc files: split only with ``splitCommits=always``. The protocol puts no
      bound on where a row's images go ("``preimage`` is the value before the update,
      ``postimage`` is the value after the update", one ``_change_type`` per row, in any of the
      version's cdc files), and writers do separate them (delta-rs writes an UPDATE that moves
      rows to another partition with the preimages in the old partition's cdc file and the
      postimages in the new one's): a consumer that pairs images per micro-batch (a
      ``foreachBatch`` MERGE) would see halves. ``always`` is for consumers that treat each row
      on its own, as Spark's own change data feed consumers do.
    - Under ``netChanges``: every commit whole (its rows are netted together).
    - Lance: versions with updates whole (their preimage and postimage rows are in different row
      tasks). Iceberg: every snapshot whole (its rows are netted and paired across the snapshot).
    """
    if isinstance(plan, IcebergPlan):
        return True
    if plan.snapshot:
        return False
    if isinstance(plan, LancePlan):
        return any(t.change_type in ("update_preimage", "update_postimage") for t in plan.tasks)
    if options.net_changes:
        return True
    if any(t.is_cdc for t in plan.tasks):
        return options.split_commits != "always"
    dv = any(t.selection.within is not None or t.selection.minus is not None for t in plan.tasks)
    return dv and options.split_commits == "never"


def admit(plans: Iterable[AnyPlan], start: Offset, budget: Budget, options: SourceOptions) -> Offset:
    """The end offset of a micro-batch from ``start``; a planning error ends the batch before its version.

    Raises:
        DeltaTailError: what planning raises, when it is raised at ``start`` itself.
    """
    end = start
    try:
        for plan in plans:
            first = start.index if plan_key(plan) == start.key else 0
            tasks: Sequence[FileTask | RowTask | IcebergTask] = plan.tasks[first:]
            if whole_unit(plan, options) and tasks:
                if not budget.admits():
                    return end
                budget.take(tasks)
            else:
                for i, task in enumerate(tasks, first):
                    if not budget.admits():
                        return Offset(start.table_id, plan_version(plan), i, is_snapshot(plan))
                    budget.take((task,))
            end = after(plan, start.table_id)
    except DeltaTailError:
        if end == start:
            raise
        log.info("ending the micro-batch at %s, before a version that cannot be read", end)
    return end
