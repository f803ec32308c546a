"""Planning the change rows of one commit: prepare, then emit. Pure: no IO.

Rules (Delta Spark's change data feed is the reference; the protocol's
"Change Data Files" section states the first two):

1. "When change data readers encounter a cdc action in a particular Delta
   table version, they must read the changes made in that version exclusively
   using the cdc files." Their rows carry ``_change_type`` as written
   (``insert``, ``delete``, ``update_preimage``, ``update_postimage``).
2. "If a version has no cdc action, then the data in add and remove actions
   are read as inserted and deleted rows, respectively": an ``add`` with
   ``dataChange=true`` gives ``insert`` rows (those its DV does not delete), a
   ``remove`` with ``dataChange=true`` gives ``delete`` rows (those that were
   live under the removed file's DV). Actions with ``dataChange=false``
   (OPTIMIZE, compaction, purge) give nothing.
3. A remove and an add of the same path in one commit are a DV update and are
   paired: rows in the add's DV but not in the remove's are ``delete``; rows in
   the remove's DV but not in the add's are ``insert`` (a restore). A pair
   with neither DV is an invalid log.
4. A MERGE without cdc files whose ``operationMetrics`` report zero inserted,
   updated and deleted rows produces nothing (Delta Spark skips it; delta-rs
   and kernel emit spurious delete/insert pairs of the rewritten files).

Emit order inside a commit is fixed, so a row's index is stable: cdc files in
log order; otherwise unpaired removes, then pairs (their deletes, then their
restores), then unpaired adds, each group in log order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from deltatail.state.actions import Add, DeletionVector, Metadata, Remove
from deltatail.state.commit import Commit
from deltatail.state.errors import InvalidLogError, SchemaChangeError
from deltatail.state.files import FileEntry, FileKey
from deltatail.state.schema import ArrayType, DataType, MapType, StructType

ChangeType = Literal["insert", "delete", "update_preimage", "update_postimage"]


@dataclass(frozen=True, slots=True)
class RowSelection:
    """Which rows of a data file a task reads: the rows in ``within`` (all rows when ``None``) minus those in ``minus``.

    Row indexes are the physical positions in the Parquet file, as deletion
    vectors number them.
    """

    within: DeletionVector | None = None
    minus: DeletionVector | None = None


@dataclass(frozen=True, slots=True)
class FileTask:
    """One file to read for one commit: everything a reader (local or on an executor) needs.

    ``change_type`` is ``None`` for cdc files (the file carries its own
    ``_change_type`` column). ``pruned``: a filter drops every row of the file
    (:meth:`state.filters.ChangeFilter.drops_every_row`), so its rows are
    counted, not read.
    """

    path: str
    partition_values: dict[str, str | None]
    change_type: ChangeType | None
    selection: RowSelection
    size: int | None = None
    pruned: bool = False

    @property
    def is_cdc(self) -> bool:
        """Whether the task reads a change data (cdc) file."""
        return self.change_type is None


@dataclass(frozen=True, slots=True)
class PreparedCommit:
    """Phase one: what a commit holds, checked; phase two (:meth:`tasks`) turns it into file tasks."""

    commit: Commit
    cdc: bool
    noop_merge: bool
    removes: tuple[Remove, ...]
    adds: tuple[Add, ...]
    pairs: tuple[tuple[Remove, Add], ...]

    def tasks(self) -> list[FileTask]:
        """Phase two: the file tasks of the commit, in emit order."""
        if self.cdc:
            return [FileTask(c.path, c.partition_values, None, RowSelection(), c.size) for c in self.commit.cdcs]
        if self.noop_merge:
            return []
        tasks = [
            _task(r.path, r.partition_values or {}, "delete", None, r.deletion_vector, r.size) for r in self.removes
        ]
        restores: list[FileTask] = []
        for remove, add in self.pairs:
            if add.deletion_vector is not None:
                tasks.append(
                    _task(add.path, add.partition_values, "delete", add.deletion_vector, remove.deletion_vector)
                )
            if remove.deletion_vector is not None:
                restores.append(
                    _task(add.path, add.partition_values, "insert", remove.deletion_vector, add.deletion_vector)
                )
        tasks += restores
        tasks += [_task(a.path, a.partition_values, "insert", None, a.deletion_vector, a.size) for a in self.adds]
        return tasks


def _task(
    path: str,
    partition_values: dict[str, str | None],
    change_type: ChangeType,
    within: DeletionVector | None,
    minus: DeletionVector | None,
    size: int | None = None,
) -> FileTask:
    return FileTask(path, partition_values, change_type, RowSelection(within, minus), size)


def _metric(metrics: dict[str, object], name: str) -> int | None:
    value = metrics.get(name)
    try:
        return None if value is None else int(str(value))
    except ValueError:
        return None


def is_noop_merge(commit: Commit) -> bool:
    """Whether the commit is a MERGE whose metrics report no inserted, updated or deleted rows."""
    info = commit.commit_info
    if info is None or info.operation != "MERGE":
        return False
    metrics = info.operation_metrics
    for names in (_SPARK_MERGE_METRICS, _RS_MERGE_METRICS):
        counts = [_metric(metrics, name) for name in names]
        if all(c is not None for c in counts):
            return all(c == 0 for c in counts)
    return False


#: MERGE row-count metrics as Delta Spark and delta-rs name them (inserted, updated, deleted).
_SPARK_MERGE_METRICS = ("numTargetRowsInserted", "numTargetRowsUpdated", "numTargetRowsDeleted")
_RS_MERGE_METRICS = ("num_target_rows_inserted", "num_target_rows_updated", "num_target_rows_deleted")


Lookup = Callable[[FileKey], FileEntry | None]


def _with_partition_values(remove: Remove, lookup: Lookup | None, partitioned: bool, version: int) -> Remove:
    """A remove may omit ``partitionValues`` (``extendedFileMetadata`` false): take them from the live file."""
    if remove.partition_values is not None:
        return remove
    if not partitioned:
        return replace(remove, partition_values={})
    entry = None if lookup is None else lookup(FileKey(remove.path, remove.dv_id))
    if entry is None or entry.partition_values is None:
        raise InvalidLogError(
            f"remove of {remove.path!r} has no partitionValues and the file is not live before this commit",
            version=version,
        )
    return replace(remove, partition_values=entry.partition_values, size=remove.size or entry.size)


def prepare(commit: Commit, lookup: Lookup | None = None, *, partitioned: bool = True) -> PreparedCommit:
    """Phase one: classify a commit's file actions and pair DV updates.

    Args:
        commit: the commit.
        lookup: the live files *before* the commit (``snapshot.files.get``), used to
            complete removes that omit their partition values.
        partitioned: whether the table has partition columns (if not, a remove
            without partition values needs no lookup).

    Raises:
        InvalidLogError: if a remove and an add of the same path (both ``dataChange``)
            both lack a deletion vector, or a data-changing remove lacks partition
            values and the file was not live.
    """
    removes = {
        r.path: _with_partition_values(r, lookup, partitioned, commit.version) for r in commit.removes if r.data_change
    }
    pairs: list[tuple[Remove, Add]] = []
    adds: list[Add] = []
    paired: set[str] = set()
    for add in commit.adds:
        if not add.data_change:
            continue
        remove = removes.get(add.path)
        if remove is None:
            adds.append(add)
            continue
        if remove.deletion_vector is None and add.deletion_vector is None:
            raise InvalidLogError(
                f"commit removes and adds {add.path!r} without a deletion vector on either", version=commit.version
            )
        pairs.append((remove, add))
        paired.add(add.path)
    return PreparedCommit(
        commit=commit,
        cdc=bool(commit.cdcs),
        noop_merge=is_noop_merge(commit),
        removes=tuple(r for r in removes.values() if r.path not in paired),
        adds=tuple(adds),
        pairs=tuple(pairs),
    )


def cdf_enabled(metadata: Metadata) -> bool:
    """Whether ``delta.enableChangeDataFeed`` is on."""
    return metadata.configuration.get("delta.enableChangeDataFeed", "false").lower() == "true"


def ict_enabled(metadata: Metadata) -> bool:
    """Whether in-commit timestamps are on (``delta.enableInCommitTimestamps``)."""
    return metadata.configuration.get("delta.enableInCommitTimestamps", "false").lower() == "true"


def commit_timestamp(commit: Commit, metadata: Metadata, file_mtime_ms: int, previous_ms: int | None) -> int:
    """The ``_commit_timestamp`` of a commit, in epoch milliseconds.

    With in-commit timestamps enabled, the commit's ``inCommitTimestamp``.
    Otherwise the commit file's modification time, made monotonic as Delta Spark
    does: a time not greater than the previous commit's becomes the previous
    commit's plus one millisecond.
    """
    ict = commit.in_commit_timestamp
    if ict is not None and ict_enabled(metadata):
        return ict
    if previous_ms is not None and file_mtime_ms <= previous_ms:
        return previous_ms + 1
    return file_mtime_ms


def _additive_type(old: DataType, new: DataType) -> bool:
    if isinstance(old, StructType) and isinstance(new, StructType):
        return additive_change(old, new) is None
    if isinstance(old, ArrayType) and isinstance(new, ArrayType):
        return _additive_type(old.element_type, new.element_type)
    if isinstance(old, MapType) and isinstance(new, MapType):
        return _additive_type(old.key_type, new.key_type) and _additive_type(old.value_type, new.value_type)
    return old == new


def additive_change(old: StructType, new: StructType) -> str | None:
    """``None`` if ``new`` only adds columns (at any depth) to ``old``; otherwise what breaks it."""
    new_fields = {f.name: f for f in new.fields}
    for f in old.fields:
        g = new_fields.get(f.name)
        if g is None:
            return f"column {f.name!r} was dropped or renamed"
        if not _additive_type(f.type, g.type):
            return f"column {f.name!r} changed type"
        if f.physical_name("name") != g.physical_name("name"):
            return f"column {f.name!r} changed its physical name"
    return None


def check_schema_change(old: StructType, new: StructType, *, version: int, allow: bool) -> None:
    """Refuse a non-additive schema change inside a range unless ``allow``.

    Raises:
        SchemaChangeError: naming the version and what changed.
    """
    if allow:
        return
    problem = additive_change(old, new)
    if problem is not None:
        raise SchemaChangeError(
            f"non-additive schema change: {problem}; stopped as on_schema_change = stop asks: set it to evolve "
            "to go on (each row in its version's schema), or read the versions on each side separately",
            version=version,
        )
