"""Reading one file task: its rows with the three change columns, and runs of tasks packed for another process.

A task (:class:`state.changes.FileTask`) is one data or cdc file of one version,
with the rows to keep (deletion vectors) and the change type its rows get.
Reading happens in two stages so that they can run on different threads:
:func:`decode_task` opens, decodes and filters (pyarrow, mostly without the
GIL); :func:`finish_batch` converts the columns to the table's logical types
and adds ``_change_type``, ``_commit_version`` and ``_commit_timestamp``.
:func:`read_task` is both stages in turn, the reference every faster way of
reading is checked against.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Generator, Iterator, Sequence

import pyarrow as pa
from pyroaring import BitMap64

from deltatail.state.actions import DeletionVector
from deltatail.state.changes import FileTask
from deltatail.state.errors import DeltaTailError
from deltatail.state.feed import COMMIT_TIMESTAMP_TYPE, change_schema
from deltatail.state.planning import ReadContext
from deltatail.tailer.read.deletion_vectors import read_deletion_vector
from deltatail.tailer.read.parquet_file import DEFAULT_OPENING, REMOTE_OPENING
from deltatail.tailer.read.rows import (
    FileBatch,
    RowFilter,
    check_row_filter,
    count_file_rows,
    read_file_batches,
    repeated_string,
)
from deltatail.tailer.storage import Storage


def _bitmap(storage: Storage, ctx: ReadContext, dv: DeletionVector | None, data_file: str) -> BitMap64 | None:
    if dv is None:
        return None
    return read_deletion_vector(
        storage, ctx.table_root, dv, data_file=data_file, version=ctx.version, external_roots=ctx.external_roots
    )


def _row_filter(storage: Storage, ctx: ReadContext, task: FileTask) -> RowFilter | None:
    if task.selection.within is None and task.selection.minus is None:
        return None  # the common case: no deletion vector to read
    within = _bitmap(storage, ctx, task.selection.within, task.path)
    minus = _bitmap(storage, ctx, task.selection.minus, task.path)
    if within is None:
        return None if minus is None else RowFilter(minus, keep=False)
    return RowFilter(within - minus if minus is not None else within, keep=True)


def count_task_rows(storage: Storage, ctx: ReadContext, task: FileTask) -> int:
    """How many change rows :func:`read_task` gives for ``task`` (read as if it were not pruned), without reading them.

    The rows are the file's (its footer says how many) minus those its deletion
    vector removes, or, for a deletion-vector pair, the rows in one vector and not
    the other: vectors are read and checked as for reading.

    Raises:
        MissingFileError: if the data or DV file is missing.
        DeletionVectorError: if a DV fails its checksum, does not decode, or names a row past the file's end.
        DeltaTailError: if the file is not readable Parquet.
    """
    row_filter = _row_filter(storage, ctx, task)
    if row_filter is not None and row_filter.keep and len(row_filter.rows) == 0:
        return 0  # as reading: the file is not opened
    rows = count_file_rows(
        storage, ctx.table_root, task.path, size=task.size, version=ctx.version, external_roots=ctx.external_roots
    )
    if row_filter is None:
        return rows
    try:
        check_row_filter(row_filter, rows)
    except DeltaTailError as e:
        e.at(table=ctx.table_root, version=ctx.version, file=ctx.location(task.path))
        raise
    return len(row_filter.rows) if row_filter.keep else rows - len(row_filter.rows)


def read_task(storage: Storage, ctx: ReadContext, task: FileTask, batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """The change rows of one file task, with the three change columns.

    Raises:
        MissingFileError: if the data, cdc or DV file is missing.
        DeletionVectorError: if a DV fails its checksum or does not decode.
        InvalidLogError: if a partition value or a file column does not fit the schema.
    """
    for file_batch in decode_task(storage, ctx, task, batch_size):
        yield finish_batch(ctx, task, file_batch)


def decode_task(
    storage: Storage, ctx: ReadContext, task: FileTask, batch_size: int
) -> Generator[FileBatch, None, None]:
    """Stage one of :func:`read_task` (DVs, open, decode, filter): what a worker thread may do ahead of time.

    Raises:
        MissingFileError, DeletionVectorError, InvalidLogError: as :func:`read_task`.
    """
    if task.pruned:
        return  # counted by count_task_rows, never read
    schema = ctx.schema()
    row_filter = _row_filter(storage, ctx, task)
    if row_filter is not None and row_filter.keep and len(row_filter.rows) == 0:
        return
    yield from read_file_batches(
        storage,
        ctx.table_root,
        task.path,
        schema=schema,
        partition_columns=ctx.partition_columns,
        partition_values=task.partition_values,
        column_mapping_mode=ctx.column_mapping_mode,
        row_filter=row_filter,
        keep_change_type=task.is_cdc,
        batch_size=batch_size,
        table=ctx.table_root,
        version=ctx.version,
        size=task.size,
        opening=REMOTE_OPENING if storage.remote else DEFAULT_OPENING,
        external_roots=ctx.external_roots,
    )


def _row_columns(task: FileTask, file_batch: FileBatch) -> list[pa.Array]:
    """The batch's output columns, with ``_change_type`` for a task that has one (not from a cdc file)."""
    columns = file_batch.columns()
    if task.change_type is not None:
        columns.append(repeated_string(task.change_type, len(columns[0])))
    return columns


def finish_batch(ctx: ReadContext, task: FileTask, file_batch: FileBatch) -> pa.RecordBatch:
    """Stage two of :func:`read_task`: the batch's output columns plus the three change columns.

    Raises:
        InvalidLogError: if a file column cannot be converted to the schema's type.
    """
    columns = _row_columns(task, file_batch)
    n = len(columns[0])
    columns.append(constant_int64s(pa.int64(), ctx.version, n))
    columns.append(constant_int64s(COMMIT_TIMESTAMP_TYPE, ctx.timestamp_ms * 1000, n))
    return pa.RecordBatch.from_arrays(columns, schema=change_schema(ctx.schema()))


#: What :func:`read_run` returns: per task read, the lengths of its batches; the index of the task that
#: failed (``None``: none did); the rows of every task read, in one record batch (``None``: no rows).
RunRows = tuple[list[list[int]], int | None, pa.RecordBatch | None]


def read_run(storage: Storage, items: Sequence[tuple[ReadContext, FileTask]], batch_size: int = 65536) -> RunRows:
    """The rows of several file tasks, as :func:`read_task` gives them, packed into one record batch.

    What a reader process does with a run (:mod:`tailer.read.reader_pool`). Every
    task must share one schema string. The rows are those of ``read_task``, task
    after task, batch after batch: slicing the batch by the returned lengths
    gives exactly its batches. The change columns are built once for the run
    rather than once per batch. The first task that raises ends the run (its
    rows are dropped, whatever the error): the caller reads it itself, to raise
    the genuine error where it belongs. Packing is left to pyarrow: a column
    that outgrows 32-bit offsets (over 2 GiB in one run) fails there, with
    pyarrow's own error, which the reader processes answer by handing the whole
    run back.
    """
    columns: list[list[pa.Array]] = []
    lengths: list[list[int]] = []
    commits: list[tuple[int, int, int]] = []  # (version, timestamp in µs, rows) of each batch
    failed: int | None = None
    for index, (ctx, task) in enumerate(items):
        mark = len(commits)
        read: list[int] = []
        try:
            for file_batch in decode_task(storage, ctx, task, batch_size):
                arrays = _row_columns(task, file_batch)
                n = len(arrays[0])
                columns = columns or [[] for _ in arrays]
                for column, array in zip(columns, arrays, strict=True):
                    column.append(array)
                commits.append((ctx.version, ctx.timestamp_ms * 1000, n))
                read.append(n)
        except Exception:  # the caller reads this task itself and raises the genuine error
            for column in columns:
                del column[mark:]
            del commits[mark:]
            failed = index
            break
        lengths.append(read)
    if not commits:
        return lengths, failed, None
    arrays = [pa.concat_arrays(column) for column in columns]
    arrays.append(_int64s(pa.int64(), [(version, n) for version, _, n in commits]))
    arrays.append(_int64s(COMMIT_TIMESTAMP_TYPE, [(micros, n) for _, micros, n in commits]))
    return lengths, failed, pa.RecordBatch.from_arrays(arrays, schema=change_schema(items[0][0].schema()))


def _int64s(dtype: pa.DataType, runs: list[tuple[int, int]]) -> pa.Array:
    """64-bit values (int64 or timestamp) given as ``(value, count)`` runs, straight from one buffer (no boxing)."""
    data = b"".join(value.to_bytes(8, sys.byteorder, signed=True) * n for value, n in runs)
    return pa.Array.from_buffers(dtype, len(data) // 8, [None, pa.py_buffer(data)])


@functools.lru_cache(maxsize=4)
def constant_int64s(dtype: pa.DataType, value: int, n: int) -> pa.Array:
    """``n`` copies of ``value``, shared by the batches of one commit (a large file's batches have one length).

    Arrays are immutable, so sharing is safe, and it saves building (and faulting in) a new
    buffer per batch. The cache holds the last two commits' version and timestamp columns.
    """
    return _int64s(dtype, [(value, n)])
