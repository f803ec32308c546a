"""Reading the rows of one logical file: a Parquet data file or a cdc file.

The output is always in the table's logical shape: the schema's columns (or a
requested subset) in schema order, under their logical names, with the Arrow
types of :meth:`state.schema.StructType.to_arrow`. Three protocol rules shape
how the physical file is mapped onto that:

* Column Mapping: "In ``none`` mode, readers must read the parquet files by
  using the display names"; "In ``name`` mode, readers must resolve columns in
  the data files by their physical names"; "In ``id`` mode, readers must
  resolve columns by using the ``field_id`` in the parquet metadata" (here
  falling back to the physical name for files written without ids). "For
  columns that are not found in the files, nulls need to be returned."
* Partition Value Serialization: "Partition values are stored as strings ...
  An empty string for any type translates to a null partition value." Under
  column mapping, "Partition values ... must be resolved by their physical
  names".
* Deletion Vectors: "If a snapshot contains logical files with records that are
  invalidated by a DV, then these records must not be returned in the output";
  row indexes are "the position (index) of a row in a parquet file starting from
  zero".
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Required, TypedDict, Unpack

import pyarrow as pa
import pyarrow.parquet as pq
from pyroaring import BitMap64

from deltatail.state.errors import DeletionVectorError, DeltaTailError, UnsafePathError
from deltatail.state.feed import CHANGE_TYPE_COLUMN
from deltatail.state.paths import resolve_logged_path
from deltatail.state.schema import StructType
from deltatail.tailer.read.column_plan import ColumnPlan, bind, file_plan, selected_fields
from deltatail.tailer.read.conform import cast, conform, nulls
from deltatail.tailer.read.parquet_file import DEFAULT_OPENING, ParquetOpening, open_parquet
from deltatail.tailer.storage import Storage


@dataclass(frozen=True, slots=True)
class RowFilter:
    """A set of row indexes (0-based positions in the file) and what to do with them.

    Attributes:
        rows: the row indexes.
        keep: ``False`` drops exactly these rows (a deletion vector); ``True``
            emits only these rows (e.g. the rows a new DV adds to an old one).
    """

    rows: BitMap64
    keep: bool


def output_schema(
    schema: StructType, *, columns: Sequence[str] | None = None, keep_change_type: bool = False
) -> pa.Schema:
    """The Arrow schema of the batches :func:`read_file_rows` yields.

    Args:
        schema: the table schema.
        columns: logical top-level columns to keep (in schema order); ``None`` for all.
        keep_change_type: append a ``_change_type`` string column.

    Raises:
        ConfigError: if ``columns`` names a column the schema does not have.
    """
    return _output_schema(schema, None if columns is None else tuple(columns), keep_change_type)


@functools.lru_cache(maxsize=256)
def _output_schema(schema: StructType, columns: tuple[str, ...] | None, keep_change_type: bool) -> pa.Schema:
    arrow = schema.to_arrow()
    fields = [arrow.field(f.name) for f in selected_fields(schema, columns)]
    if keep_change_type:
        fields.append(pa.field(CHANGE_TYPE_COLUMN, pa.string()))
    return pa.schema(fields)


def resolve_data_path(
    table_root: str, path: str, external_roots: Sequence[str] = (), *, version: int | None = None
) -> str:
    """The location of a data or cdc file, by the containment rule of :func:`state.paths.resolve_logged_path`.

    ``path`` is already percent-decoded (see :mod:`state.actions`).

    Raises:
        UnsafePathError: if the path is outside the table root and every external root (naming the version).
    """
    try:
        return resolve_logged_path(table_root, path, external_roots)
    except UnsafePathError as e:
        raise e.at(version=version) from None


def count_file_rows(
    storage: Storage,
    table_root: str,
    path: str,
    *,
    size: int | None = None,
    version: int | None = None,
    external_roots: Sequence[str] = (),
) -> int:
    """The number of rows in a Parquet file, from its footer alone (no column is read).

    Raises:
        UnsafePathError: if the path is outside the table root and every external root (never opened).
        MissingFileError: if the file does not exist.
        DeltaTailError: if the file is not readable Parquet (naming the table, version and file).
    """
    location = resolve_data_path(table_root, path, external_roots, version=version)
    try:
        source = storage.open_input(location, size)
    except DeltaTailError as e:
        e.at(table=table_root, version=version, file=location)
        raise
    except (pa.ArrowException, OSError) as e:
        raise DeltaTailError(f"cannot read Parquet data: {e}", table=table_root, version=version, file=location) from e
    try:
        return int(pq.read_metadata(source).num_rows)
    except DeltaTailError as e:
        e.at(table=table_root, version=version, file=location)
        raise
    except (pa.ArrowException, OSError) as e:
        raise DeltaTailError(f"cannot read Parquet data: {e}", table=table_root, version=version, file=location) from e
    finally:
        source.close()


class FileReadOptions(TypedDict, total=False):
    """What reading one file takes besides its location (see :func:`read_file_rows` for each)."""

    schema: Required[StructType]
    partition_columns: Required[tuple[str, ...]]
    partition_values: Required[dict[str, str | None]]
    column_mapping_mode: Required[str]
    row_filter: RowFilter | None
    keep_change_type: bool
    columns: Sequence[str] | None
    batch_size: int
    table: str | None
    version: int | None
    size: int | None
    opening: ParquetOpening
    external_roots: Sequence[str]


def read_file_rows(
    storage: Storage, table_root: str, path: str, **options: Unpack[FileReadOptions]
) -> Iterator[pa.RecordBatch]:
    """Stream the rows of one logical file in the table's logical shape.

    The file is read batch by batch (never whole), projecting only the physical
    columns needed. Batches left empty by the row filter are not yielded; use
    :func:`output_schema` for the schema of an empty result. Being a generator,
    it raises its errors once iteration starts, not when called.

    Args:
        storage: where the file lives.
        table_root: the table root; relative paths resolve against it.
        path: the ``add``/``remove``/``cdc`` path, percent-decoded; relative or an absolute URI.
        options: :class:`FileReadOptions`:

            - ``schema``: the table schema in effect for the file.
            - ``partition_columns``: the logical names of the partition columns.
            - ``partition_values``: the action's ``partitionValues`` (keys are physical names under
              column mapping ``name``/``id``, logical names otherwise).
            - ``column_mapping_mode``: ``none``, ``name`` or ``id``.
            - ``row_filter``: rows to drop (``keep=False``) or to emit exclusively (``keep=True``);
              ``None`` (default) emits all.
            - ``keep_change_type``: append the file's ``_change_type`` column (cdc files); otherwise
              it is ignored.
            - ``columns``: logical top-level columns to emit, in schema order; ``None`` for all.
            - ``batch_size``: the largest number of file rows read per batch (65,536).
            - ``table``: the table named in errors (defaults to ``table_root``).
            - ``version``: the table version named in errors.
            - ``size``: the file's size in bytes if the log records it (saves a request on an object store).
            - ``opening``: how the Parquet file is opened (see
              :class:`~tailer.read.parquet_file.ParquetOpening`).
            - ``external_roots``: roots outside the table an absolute ``path`` may name
              (:mod:`state.paths`); none by default.

    Yields:
        Record batches with the schema ``output_schema(schema, columns=..., keep_change_type=...)``.

    Raises:
        UnsafePathError: if ``path`` is outside the table root and every external root (never opened).
        MissingFileError: if the file does not exist.
        InvalidLogError: if a partition value does not parse as its column's type, a file
            column cannot be converted to the schema's type, or ``_change_type`` is requested but absent.
        DeletionVectorError: if the row filter names a row index beyond the end of the file.
        ConfigError: if ``columns`` names a column the schema does not have.
        DeltaTailError: if the file is not readable Parquet.
    """
    columns = options.get("columns")
    selected = None if columns is None else tuple(columns)
    version = options.get("version")
    location = resolve_data_path(table_root, path, options.get("external_roots", ()), version=version)
    try:
        out = _output_schema(options["schema"], selected, options.get("keep_change_type", False))
    except DeltaTailError as e:
        table = options.get("table")
        e.at(table=table if table is not None else table_root, version=version, file=location)
        raise
    for file_batch in read_file_batches(storage, table_root, path, **options):
        yield pa.RecordBatch.from_arrays(file_batch.columns(), schema=out)


@dataclass(frozen=True, slots=True)
class FileBatch:
    """Stage one of reading a file: one decoded, row-filtered batch of its physical columns.

    :meth:`columns` is stage two (type conversions, logical names, partition
    constants). The stages may run on different threads: a worker decodes the
    next batch while the consumer converts this one.
    """

    batch: pa.RecordBatch
    plan: ColumnPlan
    table: str
    version: int | None
    file: str

    def columns(self) -> list[pa.Array]:
        """The batch's output columns, in the order of :func:`output_schema` (a new list: callers may append).

        Raises:
            InvalidLogError: if a file column cannot be converted to the schema's type.
        """
        try:
            return _assemble(self.batch, self.plan)
        except DeltaTailError as e:
            e.at(table=self.table, version=self.version, file=self.file)
            raise
        except pa.ArrowException as e:
            raise DeltaTailError(
                f"cannot read Parquet data: {e}", table=self.table, version=self.version, file=self.file
            ) from e


def read_file_batches(
    storage: Storage,
    table_root: str,
    path: str,
    *,
    schema: StructType,
    partition_columns: tuple[str, ...],
    partition_values: dict[str, str | None],
    column_mapping_mode: str,
    row_filter: RowFilter | None = None,
    keep_change_type: bool = False,
    columns: Sequence[str] | None = None,
    batch_size: int = 65536,
    table: str | None = None,
    version: int | None = None,
    size: int | None = None,
    opening: ParquetOpening = DEFAULT_OPENING,
    external_roots: Sequence[str] = (),
) -> Iterator[FileBatch]:
    """Stage one of :func:`read_file_rows`: open, plan, decode and row-filter, batch by batch.

    Arguments as :func:`read_file_rows` (:class:`FileReadOptions`). Every yielded batch has at least one row;
    :meth:`FileBatch.columns` finishes it.

    Raises:
        UnsafePathError: if ``path`` is outside the table root and every external root (never opened).
        MissingFileError: if the file does not exist.
        InvalidLogError: if a partition value does not parse, or ``_change_type``
            is requested but absent.
        DeletionVectorError: if the row filter names a row index beyond the end of the file.
        ConfigError: if ``columns`` names a column the schema does not have.
        DeltaTailError: if the file is not readable Parquet.
    """
    location = resolve_data_path(table_root, path, external_roots, version=version)
    table_name = table if table is not None else table_root
    selected = None if columns is None else tuple(columns)
    try:
        opened = open_parquet(storage, location, size=size, change_types=keep_change_type, opening=opening)
    except DeltaTailError as e:
        e.at(table=table_name, version=version, file=location)
        raise
    source, parquet = opened.source, opened.parquet
    try:
        plan = bind(
            file_plan(opened, schema, selected, tuple(partition_columns), column_mapping_mode, keep_change_type),
            partition_values,
        )
        if row_filter is not None:
            check_row_filter(row_filter, parquet.metadata.num_rows)
        for batch in _batches(parquet, plan, row_filter, batch_size):
            yield FileBatch(batch, plan, table_name, version, location)
    except DeltaTailError as e:
        e.at(table=table_name, version=version, file=location)
        raise
    except (pa.ArrowException, OSError) as e:
        raise DeltaTailError(f"cannot read Parquet data: {e}", table=table_name, version=version, file=location) from e
    finally:
        parquet.close()
        source.close()


# ---------------------------------------------------------------- batches


#: Files with at most this many rows (and at most one batch) are read whole, on one thread.
SMALL_FILE_ROWS = 100_000


def check_row_filter(row_filter: RowFilter, num_rows: int) -> None:
    """Check that a row filter names rows of the file only.

    Raises:
        DeletionVectorError: if it names a row index at or past ``num_rows``.
    """
    if row_filter.rows and row_filter.rows.max() >= num_rows:
        raise DeletionVectorError(f"row index {row_filter.rows.max()} is beyond the file's {num_rows} rows")


def _batches(
    parquet: pq.ParquetFile, plan: ColumnPlan, row_filter: RowFilter | None, batch_size: int
) -> Iterator[pa.RecordBatch]:
    """Read and filter the file batch by batch, tracking each batch's first row index."""
    start = 0
    columns = list(plan.file_columns)
    if plan.change_type:
        columns.append(CHANGE_TYPE_COLUMN)
    if parquet.metadata.num_rows <= min(batch_size, SMALL_FILE_ROWS):
        # A small file in one read, on one thread: half the cost of a batch iterator's set-up.
        batches: Iterable[pa.RecordBatch] = parquet.read(columns=columns, use_threads=False).to_batches()
    else:
        batches = parquet.iter_batches(batch_size=batch_size, columns=columns)
    for batch in batches:
        length = batch.num_rows
        if row_filter is not None:
            batch = _filter(batch, row_filter, start)
        start += length
        if batch.num_rows:
            yield change_types_as_strings(batch) if plan.change_type else batch


def change_types_as_strings(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its last column, ``_change_type`` read as a dictionary, cast to strings.

    Done here, on the thread that decoded the batch (a worker thread for a large file), so that
    the consumer's share of the work does not grow.
    """
    last = batch.num_columns - 1
    column = batch.column(last)
    if not pa.types.is_dictionary(column.type):
        return batch
    strings = _uniform_strings(column)
    if strings is None:
        strings = column.cast(column.type.value_type)
    return batch.set_column(last, batch.schema.field(last).with_type(strings.type), strings)


def _uniform_strings(column: pa.DictionaryArray) -> pa.Array | None:
    """A dictionary column whose rows all hold one string, as a shared :func:`repeated_string`; else ``None``.

    A cdc file's batches mostly hold one change type (writers group pre- and post-images), and
    casting each row's index to its string copies the string once per row.
    """
    if column.null_count or column.type.value_type != pa.string() or not len(column):
        return None
    if len(column.dictionary) == 1:  # a row group of one change type: every index is 0 (the decoder checks them)
        return repeated_string(column.dictionary[0].as_py(), len(column))
    indices = column.indices.to_numpy()
    first = indices[0]
    if indices.min() != first or indices.max() != first:
        return None
    return repeated_string(column.dictionary[first].as_py(), len(column))


#: Columns of up to this many rows are kept by :func:`repeated_string` for many lengths (small files
#: repeat a few sizes); longer ones up to :data:`SHARED_LARGE_ROWS` for the last few lengths only (a large
#: file's batches have one length), so what is kept stays a few MiB whatever the batch size.
SHARED_SMALL_ROWS = 4096
SHARED_LARGE_ROWS = 65536


def repeated_string(value: str, n: int) -> pa.Array:
    """``n`` copies of ``value`` as a ``string`` array, shared by every caller asking for the same pair.

    Arrays are immutable, so sharing is safe; it saves building a buffer of ``n`` copies per batch.
    Longer than :data:`SHARED_LARGE_ROWS`, a new array is built each time.
    """
    if n <= SHARED_SMALL_ROWS:
        return _repeated_small(value, n)
    if n <= SHARED_LARGE_ROWS:
        return _repeated_large(value, n)
    return pa.repeat(pa.scalar(value, pa.string()), n)


@functools.lru_cache(maxsize=1024)
def _repeated_small(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


@functools.lru_cache(maxsize=4)
def _repeated_large(value: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(value, pa.string()), n)


def _filter(batch: pa.RecordBatch, row_filter: RowFilter, start: int) -> pa.RecordBatch:
    """Keep the batch rows the filter selects; ``start`` is the file row index of the batch's first row."""
    window = BitMap64()
    window.add_range(start, start + batch.num_rows)
    hits = row_filter.rows & window
    chosen = hits if row_filter.keep else window - hits
    if len(chosen) == batch.num_rows:
        return batch
    positions = pa.Array.from_buffers(pa.uint64(), len(chosen), [None, pa.py_buffer(chosen.to_array())])
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    return batch.take(pc.subtract(positions, pa.scalar(start, pa.uint64())))


def _assemble(batch: pa.RecordBatch, plan: ColumnPlan) -> list[pa.Array]:
    """The output columns of one file batch (read with ``plan.file_columns``, then ``_change_type`` if kept)."""
    n = batch.num_rows
    read = batch.columns
    arrays = []
    for field, source, direct, target in zip(plan.fields, plan.sources, plan.direct, plan.targets, strict=True):
        if source is None:
            arrays.append(nulls(n, target))
        elif type(source) is int:
            column = read[source]
            arrays.append(column if direct else conform(column, field.type, plan.mode, field.name))
        else:
            assert isinstance(source, pa.Scalar)
            arrays.append(pa.repeat(source, n))
    if plan.change_type:
        arrays.append(read[-1] if plan.change_type_direct else cast(read[-1], pa.string(), CHANGE_TYPE_COLUMN))
    return arrays
