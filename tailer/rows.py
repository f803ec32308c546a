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

import dataclasses
import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyroaring import BitMap64

from state.errors import ConfigError, DeletionVectorError, DeltaTailError, InvalidLogError, MissingFileError
from state.schema import (
    PARQUET_FIELD_ID,
    ArrayType,
    DataType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    to_arrow_type,
)
from tailer.storage import Storage, to_local_path

CHANGE_TYPE_COLUMN = "_change_type"
"""The column a cdc file carries with ``insert``, ``delete``, ``update_preimage`` or ``update_postimage``."""

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")


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
    fields = [arrow.field(f.name) for f in _selected_fields(schema, columns)]
    if keep_change_type:
        fields.append(pa.field(CHANGE_TYPE_COLUMN, pa.string()))
    return pa.schema(fields)


def resolve_data_path(table_root: str, path: str) -> str:
    """The location of a data or cdc file: ``path`` itself if absolute (a URI or ``/...``), else under the root.

    ``path`` is already percent-decoded (see :mod:`state.actions`).
    """
    if path.startswith("/") or (":" in path and _SCHEME.match(path)):
        return path
    return f"{table_root.rstrip('/')}/{path}"


def read_file_rows(
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
    columns: list[str] | None = None,
    batch_size: int = 65536,
    table: str | None = None,
    version: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Stream the rows of one logical file in the table's logical shape.

    The file is read batch by batch (never whole), projecting only the physical
    columns needed. Batches left empty by the row filter are not yielded; use
    :func:`output_schema` for the schema of an empty result. Being a generator,
    it raises its errors once iteration starts, not when called.

    Args:
        storage: where the file lives (only local storages are supported: Parquet is opened by local path).
        table_root: the table root; relative paths resolve against it.
        path: the ``add``/``remove``/``cdc`` path, percent-decoded; relative or an absolute URI.
        schema: the table schema in effect for the file.
        partition_columns: the logical names of the partition columns.
        partition_values: the action's ``partitionValues`` (keys are physical names under
            column mapping ``name``/``id``, logical names otherwise).
        column_mapping_mode: ``none``, ``name`` or ``id``.
        row_filter: rows to drop (``keep=False``) or to emit exclusively (``keep=True``); ``None`` emits all.
        keep_change_type: append the file's ``_change_type`` column (cdc files); otherwise it is ignored.
        columns: logical top-level columns to emit, in schema order; ``None`` for all.
        batch_size: the largest number of file rows read per batch.
        table: the table named in errors (defaults to ``table_root``).
        version: the table version named in errors.

    Yields:
        Record batches with the schema ``output_schema(schema, columns=..., keep_change_type=...)``.

    Raises:
        MissingFileError: if the file does not exist.
        InvalidLogError: if a partition value is missing or does not parse as its column's type, a file
            column cannot be converted to the schema's type, or ``_change_type`` is requested but absent.
        DeletionVectorError: if the row filter names a row index beyond the end of the file.
        ConfigError: if ``columns`` names a column the schema does not have.
        DeltaTailError: if the file is not readable Parquet.
    """
    selected = None if columns is None else tuple(columns)
    try:
        out = _output_schema(schema, selected, keep_change_type)
    except DeltaTailError as e:
        table_name = table if table is not None else table_root
        e.at(table=table_name, version=version, file=resolve_data_path(table_root, path))
        raise
    file_batches = read_file_batches(
        storage,
        table_root,
        path,
        schema=schema,
        partition_columns=partition_columns,
        partition_values=partition_values,
        column_mapping_mode=column_mapping_mode,
        row_filter=row_filter,
        keep_change_type=keep_change_type,
        columns=selected,
        batch_size=batch_size,
        table=table,
        version=version,
    )
    for file_batch in file_batches:
        yield pa.RecordBatch.from_arrays(file_batch.columns(), schema=out)


@dataclass(frozen=True, slots=True)
class FileBatch:
    """Stage one of reading a file: one decoded, row-filtered batch of its physical columns.

    :meth:`columns` is stage two (type conversions, logical names, partition
    constants). The stages may run on different threads: a worker decodes the
    next batch while the consumer converts this one.
    """

    batch: pa.RecordBatch
    plan: _Plan
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
) -> Iterator[FileBatch]:
    """Stage one of :func:`read_file_rows`: open, plan, decode and row-filter, batch by batch.

    Arguments as :func:`read_file_rows`. Every yielded batch has at least one row;
    :meth:`FileBatch.columns` finishes it.

    Raises:
        MissingFileError: if the file does not exist.
        InvalidLogError: if a partition value is missing or does not parse, or ``_change_type``
            is requested but absent.
        DeletionVectorError: if the row filter names a row index beyond the end of the file.
        ConfigError: if ``columns`` names a column the schema does not have.
        DeltaTailError: if the file is not readable Parquet.
    """
    location = resolve_data_path(table_root, path)
    table_name = table if table is not None else table_root
    selected = None if columns is None else tuple(columns)
    try:
        opened = _open_parquet(storage, location, change_types=keep_change_type)
    except DeltaTailError as e:
        e.at(table=table_name, version=version, file=location)
        raise
    source, parquet = opened.source, opened.parquet
    try:
        plan = _bind(
            _file_plan(opened, schema, selected, tuple(partition_columns), column_mapping_mode, keep_change_type),
            partition_values,
        )
        if row_filter is not None:
            _check_filter(row_filter, parquet.metadata.num_rows)
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


#: Change data files at least this large read ``_change_type`` as a dictionary. A dictionary read and its
#: cast cost ~45 µs more per file and save ~14 ns per row, so small files (thousands of rows at most) skip it.
DICTIONARY_MIN_BYTES = 256 << 10
#: Files up to this size are read into memory whole, in one system call (instead of one per column chunk).
WHOLE_FILE_BYTES = 256 << 10
#: How much of a larger file's end is read at once to find its footer (a larger footer takes a second read).
FOOTER_READ_BYTES = 64 << 10

_MAGIC = b"PAR1"
#: The stored Arrow schema's key as the footer holds it: Thrift's compact protocol writes a string as its
#: length (12, one byte) and its bytes. Renamed to a key of the same length, the footer's layout is unchanged.
_ARROW_SCHEMA_KEY = b"\x0cARROW:schema"
_SET_ASIDE_KEY = b"\x0cARROW:schem_"


@dataclass(frozen=True, slots=True)
class _OpenFile:
    """An open Parquet file (close ``parquet``, then ``source``) and how its Arrow schema came about.

    ``derived``: the Arrow schema follows from the Parquet schema and the read options alone (no
    stored Arrow schema is in effect). ``dictionary``: ``_change_type`` is read as a dictionary.
    """

    source: pa.NativeFile
    parquet: pq.ParquetFile
    derived: bool
    dictionary: bool


def _open_parquet(storage: Storage, location: str, *, change_types: bool = False) -> _OpenFile:
    """Open a Parquet file. The one place that assumes a local file system (pyarrow reads the path itself).

    The file is read without pre-buffering (coalesced reads are for
    high-latency stores; locally they only add work), and a file of at most
    :data:`WHOLE_FILE_BYTES` is read into memory in one go. INT96 timestamps are
    read at microsecond precision, Delta's timestamp precision. With
    ``change_types`` (a change data file) of at least
    :data:`DICTIONARY_MIN_BYTES`, ``_change_type`` is read as a dictionary array:
    its pages are dictionary-encoded, and decoding the indices skips building a
    string per row (28 ms for 2,000,000 rows); the one cast to strings later
    costs 7 ms. The caller closes both returned objects.

    The Arrow schema a writer stored in the footer (``ARROW:schema``) is set
    aside, so columns take the types their Parquet logical types give. Rows are
    read into the table's logical types in any case (:func:`_assemble`); what
    the stored schema adds is its writer's in-memory choices, such as delta-rs's
    ``string_view``, which would then be cast to ``string`` (~10 ns a value: 8%
    of reading 3,000,000 cdc rows). It is set aside by renaming its key in the
    bytes read (never in the file: in the whole file read into memory, or in a
    copy of a larger file's footer), and only where the footer holds that key
    exactly once and the renamed footer reads back with the renamed key;
    otherwise the file is read as written.

    Raises:
        MissingFileError: if the file does not exist.
        InvalidLogError: if ``change_types`` and the file has no ``_change_type`` column.
        DeltaTailError: if the file is not readable Parquet.
    """
    try:
        file = pa.OSFile(to_local_path(location))
    except FileNotFoundError as e:
        raise MissingFileError("data file does not exist", file=location) from e
    except (pa.ArrowException, OSError) as e:
        raise DeltaTailError(f"cannot read Parquet data: {e}", file=location) from e
    source: pa.NativeFile = file
    try:
        size = file.size()
        dictionaries = [CHANGE_TYPE_COLUMN] if change_types and size >= DICTIONARY_MIN_BYTES else None
        if size <= WHOLE_FILE_BYTES:
            data = bytearray(size)
            file.readinto(data)
            file.close()
            source = pa.BufferReader(pa.py_buffer(data))
            parquet, derived = _open_whole(source, data, dictionaries)
        else:
            metadata, derived = _footer_without_arrow_schema(file, size)
            parquet = _parquet_file(source, metadata, dictionaries)
        return _OpenFile(source, parquet, derived, dictionaries is not None)
    except KeyError:  # pyarrow: a dictionary column the file does not have
        source.close()
        raise InvalidLogError(f"change data file has no {CHANGE_TYPE_COLUMN} column", file=location) from None
    except (pa.ArrowException, OSError) as e:
        source.close()
        raise DeltaTailError(f"cannot read Parquet data: {e}", file=location) from e


def _parquet_file(
    source: pa.NativeFile, metadata: pq.FileMetaData | None, dictionaries: list[str] | None
) -> pq.ParquetFile:
    return pq.ParquetFile(
        source, metadata=metadata, pre_buffer=False, coerce_int96_timestamp_unit="us", read_dictionary=dictionaries
    )


def _footer_length(tail: bytes | bytearray, size: int) -> int | None:
    """The footer's length from a file's last bytes (``tail``), or ``None`` where they do not end a Parquet file."""
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        return None
    length = int.from_bytes(tail[-8:-4], "little")
    return length if length + 12 <= size else None


def _key_once(data: bytes | bytearray, begin: int, end: int) -> int | None:
    """Where the stored Arrow schema's key is in ``data[begin:end]``.

    Its offset if it is there exactly once, -1 if it is not there, ``None`` if it is there more than once.
    """
    at = data.find(_ARROW_SCHEMA_KEY, begin, end)
    if at >= 0 and data.find(_ARROW_SCHEMA_KEY, at + 1, end) >= 0:
        return None
    return at


def _sets_aside(metadata: pq.FileMetaData) -> bool:
    """Whether ``metadata`` (read from a renamed footer) holds the renamed key, i.e. the rename hit the key."""
    keys = metadata.metadata
    return keys is not None and _SET_ASIDE_KEY[1:] in keys


def _open_whole(source: pa.NativeFile, data: bytearray, dictionaries: list[str] | None) -> tuple[pq.ParquetFile, bool]:
    """Open a file read whole into ``data`` (which ``source`` reads), setting its Arrow schema aside in place.

    Returns the file and whether its Arrow schema is derived (no stored one in effect).
    """
    length = _footer_length(data, len(data))
    if length is not None:
        at = _key_once(data, len(data) - 8 - length, len(data) - 8)
        if at == -1:
            return _parquet_file(source, None, dictionaries), True
        if at is not None:
            key = slice(at, at + len(_SET_ASIDE_KEY))
            data[key] = _SET_ASIDE_KEY
            try:
                parquet = _parquet_file(source, None, dictionaries)
            except (pa.ArrowException, OSError, KeyError):
                parquet = None  # read as written below, for the genuine error
            if parquet is not None and _sets_aside(parquet.metadata):
                return parquet, True
            if parquet is not None:
                parquet.close()
            data[key] = _ARROW_SCHEMA_KEY  # the bytes renamed were not the key: read the file as written
    return _parquet_file(source, None, dictionaries), False


def _footer_without_arrow_schema(file: pa.NativeFile, size: int) -> tuple[pq.FileMetaData | None, bool]:
    """A large file's footer with its Arrow schema set aside (``None``: read the footer as written).

    Returns the footer and whether the file's Arrow schema is then derived (no stored one in effect).
    """
    tail = file.read_at(min(size, FOOTER_READ_BYTES), max(size - FOOTER_READ_BYTES, 0))
    length = _footer_length(tail, size)
    if length is None:
        return None, False
    footer = tail[-8 - length : -8] if length + 8 <= len(tail) else file.read_at(length, size - 8 - length)
    at = _key_once(footer, 0, len(footer))
    if at is None or at == -1:
        return None, at == -1
    renamed = footer[:at] + _SET_ASIDE_KEY + footer[at + len(_SET_ASIDE_KEY) :]
    try:
        metadata = pq.read_metadata(pa.BufferReader(renamed + tail[-8:]))
    except (pa.ArrowException, OSError):
        return None, False  # read as written, for the genuine error
    return (metadata, True) if _sets_aside(metadata) else (None, False)


def _selected_fields(schema: StructType, columns: Sequence[str] | None) -> list[StructField]:
    if columns is None:
        return list(schema.fields)
    unknown = sorted(set(columns) - set(schema.names))
    if unknown:
        raise ConfigError(f"unknown columns {unknown}; the table has {schema.names}")
    wanted = set(columns)
    return [f for f in schema.fields if f.name in wanted]


# ---------------------------------------------------------------- the read plan


@dataclass(frozen=True, slots=True)
class _Partition:
    """A partition column before the file's ``partitionValues`` are known.

    The value comes from ``partitionValues`` under the first of ``keys`` present
    (physical name, then logical), else from the file column ``fallback``.
    """

    field: StructField
    keys: tuple[str, ...]
    fallback: str | None
    fallback_direct: bool


@dataclass(frozen=True, slots=True)
class _Plan:
    """How each output column is produced from a file batch.

    ``sources[i]`` is the position in ``file_columns`` (the top-level file columns
    read) of the column for ``fields[i]``, a constant scalar (a partition value),
    ``None`` (absent from the file: nulls), or a :class:`_Partition` still to be
    bound to a file's partition values.
    ``direct[i]`` says the file column already has the output type (no conversion).
    """

    fields: tuple[StructField, ...]
    sources: tuple[int | pa.Scalar | _Partition | None, ...]
    direct: tuple[bool, ...]
    targets: tuple[pa.DataType, ...]
    file_columns: tuple[str, ...]
    mode: str
    change_type: bool
    change_type_direct: bool
    partitioned: bool
    bound: dict[tuple[tuple[str, str | None], ...], _Plan] = dataclasses.field(
        default_factory=dict, compare=False, hash=False, repr=False
    )


@functools.lru_cache(maxsize=256)
def _plan(
    file_schema: pa.Schema,
    schema: StructType,
    columns: tuple[str, ...] | None,
    partition_columns: tuple[str, ...],
    mode: str,
    keep_change_type: bool,
    field_ids: tuple[bytes | None, ...],
) -> _Plan:
    """The read plan for files with ``file_schema`` (cached: a table's files mostly share one schema).

    ``field_ids`` (the file's top-level Parquet field ids, in ``id`` mode) is part
    of the cache key only: Arrow schemas compare and hash without field metadata.
    """
    fields = _selected_fields(schema, columns)
    file_fields = list(file_schema)
    sources: list[str | int | pa.Scalar | _Partition | None] = []
    direct: list[bool] = []
    targets = [to_arrow_type(f.type) for f in fields]
    for field, target in zip(fields, targets, strict=True):
        index = _match_field(file_fields, field, mode)
        # Nested types in id mode are matched by id field by field (type equality ignores the ids).
        same = (
            index is not None
            and file_fields[index].type == target
            and not (mode == "id" and pa.types.is_nested(target))
        )
        if field.name in partition_columns:
            keys = tuple(dict.fromkeys((field.physical_name(mode), field.name)))
            fallback = None if index is None else file_fields[index].name
            sources.append(_Partition(field, keys, fallback, same))
            direct.append(False)
        else:
            sources.append(None if index is None else file_fields[index].name)
            direct.append(same)
    file_columns, positions = _positions(sources)
    change_type_direct = False
    if keep_change_type:
        change_type_index = file_schema.get_field_index(CHANGE_TYPE_COLUMN)
        if change_type_index < 0:
            raise InvalidLogError(f"change data file has no {CHANGE_TYPE_COLUMN} column")
        change_type_direct = file_schema.field(change_type_index).type == pa.string()
    return _Plan(
        tuple(fields),
        positions,
        tuple(direct),
        tuple(targets),
        file_columns,
        mode,
        keep_change_type,
        change_type_direct,
        any(isinstance(s, _Partition) for s in sources),
    )


class _PlansByParquetSchema:
    """Plans of files whose Arrow schema is derived, by the other arguments of :func:`_plan` and the Parquet schema.

    A few (Parquet schema, plan) pairs per key, matched by ``ParquetSchema.equals``
    (0.1 µs, where hashing and comparing Arrow schemas for the ``_plan`` cache costs
    ~7 µs a file). A Parquet schema keeps its file's whole footer alive, so what is
    held is bounded by footer bytes (everything is dropped when a new footer would
    pass :data:`PLAN_FOOTER_BYTES`) as well as by :data:`PLAN_KEYS` keys and
    :data:`PARQUET_SCHEMAS` schemas per key. Lookups take no lock (a lookup racing
    an update can only miss); updates take one.
    """

    def __init__(self) -> None:
        self._by_key: dict[tuple[object, ...], list[tuple[pq.ParquetSchema, _Plan, int]]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def find(self, key: tuple[object, ...], physical: pq.ParquetSchema) -> _Plan | None:
        """The plan remembered for ``key`` and a Parquet schema equal to ``physical``, if any."""
        for seen, plan, _ in self._by_key.get(key, ()):
            if physical.equals(seen):
                return plan
        return None

    def add(self, key: tuple[object, ...], physical: pq.ParquetSchema, plan: _Plan, footer_bytes: int) -> None:
        """Remember ``plan`` for ``key`` and ``physical`` (whose footer holds ``footer_bytes``)."""
        with self._lock:
            if len(self._by_key) >= PLAN_KEYS or self._bytes + footer_bytes > PLAN_FOOTER_BYTES:
                self._by_key = {}
                self._bytes = 0
            known = self._by_key.setdefault(key, [])
            if len(known) >= PARQUET_SCHEMAS:
                self._bytes -= known.pop(0)[2]
            known.append((physical, plan, footer_bytes))
            self._bytes += footer_bytes


#: Bounds of what :class:`_PlansByParquetSchema` holds: keys, Parquet schemas per key, footer bytes in all.
PLAN_KEYS = 256
PARQUET_SCHEMAS = 16
PLAN_FOOTER_BYTES = 16 << 20
_PLANS_BY_PARQUET_SCHEMA = _PlansByParquetSchema()


def _file_plan(
    opened: _OpenFile,
    schema: StructType,
    columns: tuple[str, ...] | None,
    partition_columns: tuple[str, ...],
    mode: str,
    keep_change_type: bool,
) -> _Plan:
    """:func:`_plan` for an open file, found by its Parquet schema where its Arrow schema is derived.

    A derived Arrow schema is a function of the Parquet schema (names, types, repetition, field ids:
    what ``ParquetSchema.equals`` compares) and the read options (the INT96 unit, fixed; the dictionary
    read of ``_change_type``, in the key), so equal Parquet schemas give equal plans.

    Raises:
        InvalidLogError, ConfigError: as :func:`_plan`.
    """
    memo = (schema, columns, partition_columns, mode, keep_change_type, opened.dictionary) if opened.derived else None
    metadata = opened.parquet.metadata
    if memo is not None:
        found = _PLANS_BY_PARQUET_SCHEMA.find(memo, metadata.schema)
        if found is not None:
            return found
    file_schema = opened.parquet.schema_arrow
    field_ids = _field_ids(file_schema) if mode == "id" else ()
    plan = _plan(file_schema, schema, columns, partition_columns, mode, keep_change_type, field_ids)
    if memo is not None:
        _PLANS_BY_PARQUET_SCHEMA.add(memo, metadata.schema, plan, metadata.serialized_size)
    return plan


def _bind(plan: _Plan, partition_values: dict[str, str | None]) -> _Plan:
    """``plan`` with its partition columns resolved against one file's ``partitionValues``.

    Raises:
        InvalidLogError: if a partition column has neither a value nor a file column, or its value does not parse.
    """
    if not plan.partitioned:
        return plan
    key = tuple(partition_values.items())
    bound = plan.bound.get(key)
    if bound is None:
        if len(plan.bound) >= BOUND_PLANS:
            plan.bound.clear()
        bound = plan.bound[key] = _bind_values(plan, partition_values)
    return bound


#: Bound plans remembered per plan (one per distinct ``partitionValues``).
BOUND_PLANS = 4096


def _bind_values(plan: _Plan, partition_values: dict[str, str | None]) -> _Plan:
    sources: list[str | int | pa.Scalar | _Partition | None] = []
    direct = list(plan.direct)
    for i, source in enumerate(plan.sources):
        if type(source) is int:
            sources.append(plan.file_columns[source])
        elif isinstance(source, _Partition):
            key = next((k for k in source.keys if k in partition_values), None)
            if key is not None:
                sources.append(_partition_scalar(partition_values[key], source.field))
            elif source.fallback is not None:
                sources.append(source.fallback)
                direct[i] = source.fallback_direct
            else:
                raise InvalidLogError(f"partitionValues has no value for partition column {source.field.name!r}")
        else:
            sources.append(source)
    file_columns, positions = _positions(sources)
    return _Plan(
        plan.fields,
        positions,
        tuple(direct),
        plan.targets,
        file_columns,
        plan.mode,
        plan.change_type,
        plan.change_type_direct,
        False,
    )


def _positions(
    sources: list[str | int | pa.Scalar | _Partition | None],
) -> tuple[tuple[str, ...], tuple[int | pa.Scalar | _Partition | None, ...]]:
    """The file columns to read, and ``sources`` with each file column name replaced by its position among them."""
    names = tuple(s for s in sources if isinstance(s, str))
    index = {name: i for i, name in enumerate(names)}
    return names, tuple(index[s] if isinstance(s, str) else s for s in sources)


def _field_ids(file_schema: pa.Schema) -> tuple[bytes | None, ...]:
    return tuple(None if f.metadata is None else f.metadata.get(PARQUET_FIELD_ID) for f in file_schema)


@functools.lru_cache(maxsize=4096)
def _partition_scalar(raw: str | None, field: StructField) -> pa.Scalar:
    return parse_partition_value(raw, field)


def _match_field(file_fields: Sequence[pa.Field], field: StructField, mode: str) -> int | None:
    """The position of ``field`` among ``file_fields``: by Parquet field id (``id`` mode), then by name.

    The name is the physical name under ``name``/``id`` mode and the logical name under ``none``.
    """
    if mode == "id" and field.field_id is not None:
        wanted = str(field.field_id).encode()
        for i, f in enumerate(file_fields):
            if f.metadata is not None and f.metadata.get(PARQUET_FIELD_ID) == wanted:
                return i
    name = field.physical_name(mode)
    for i, f in enumerate(file_fields):
        if f.name == name:
            return i
    return None


# ---------------------------------------------------------------- partition values


def _parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"{raw!r} is not 'true' or 'false'")
    return lowered == "true"


def _parse_timestamp(raw: str) -> datetime:
    """``{year}-{month}-{day} {hour}:{minute}:{second}[.fraction]`` or ISO 8601; a zone-less value is UTC."""
    value = datetime.fromisoformat(raw)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _parse_timestamp_ntz(raw: str) -> datetime:
    """A wall-clock timestamp; a value carrying a zone is taken at UTC."""
    return _parse_timestamp(raw).replace(tzinfo=None)


_PARSERS: dict[str, Callable[[str], Any]] = {
    "string": str,
    "long": int,
    "integer": int,
    "short": int,
    "byte": int,
    "float": float,
    "double": float,
    "boolean": _parse_bool,
    "date": date.fromisoformat,
    "timestamp": _parse_timestamp,
    "timestamp_ntz": _parse_timestamp_ntz,
    "binary": lambda raw: raw.encode("utf-8"),
}


def parse_partition_value(raw: str | None, field: StructField) -> pa.Scalar:
    """Parse one serialized partition value into an Arrow scalar of the column's type.

    Protocol, "Partition Value Serialization": "An empty string for any type
    translates to a null partition value"; numbers are "the string
    representation of the number"; date is ``{year}-{month}-{day}``; timestamp is
    ``{year}-{month}-{day} {hour}:{minute}:{second}`` (ISO 8601 forms with ``T``,
    fractions and ``Z`` are accepted too; ``timestamp`` values without a zone are
    UTC); boolean is ``"true"`` or ``"false"``; binary is the string's UTF-8 bytes.

    Args:
        raw: the serialized value; ``None`` or ``""`` is null.
        field: the partition column.

    Raises:
        InvalidLogError: if the column's type cannot be a partition column or the value does not parse.
    """
    target = to_arrow_type(field.type)
    if raw is None or raw == "":
        return pa.scalar(None, target)
    try:
        return pa.scalar(_parse_value(raw, field.type), target)
    except (ValueError, OverflowError, InvalidOperation, pa.ArrowException) as e:
        raise InvalidLogError(f"partition value {raw!r} of column {field.name!r} is not a valid {target}: {e}") from e


def _parse_value(raw: str, dtype: DataType) -> Any:
    if isinstance(dtype, DecimalType):
        return Decimal(raw)
    if isinstance(dtype, PrimitiveType) and dtype.name in _PARSERS:
        return _PARSERS[dtype.name](raw)
    raise ValueError(f"type {dtype} cannot be a partition column")


# ---------------------------------------------------------------- batches


#: Files with at most this many rows (and at most one batch) are read whole, on one thread.
SMALL_FILE_ROWS = 100_000


def _check_filter(row_filter: RowFilter, num_rows: int) -> None:
    if row_filter.rows and row_filter.rows.max() >= num_rows:
        raise DeletionVectorError(f"row index {row_filter.rows.max()} is beyond the file's {num_rows} rows")


def _batches(
    parquet: pq.ParquetFile, plan: _Plan, row_filter: RowFilter | None, batch_size: int
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
            yield _change_types_as_strings(batch) if plan.change_type else batch


def _change_types_as_strings(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its last column, ``_change_type`` read as a dictionary, cast to strings.

    Done here, on the thread that decoded the batch (a worker thread for a large file), so that
    the consumer's share of the work does not grow.
    """
    last = batch.num_columns - 1
    column = batch.column(last)
    if not pa.types.is_dictionary(column.type):
        return batch
    return batch.set_column(
        last, batch.schema.field(last).with_type(column.type.value_type), column.cast(column.type.value_type)
    )


def _filter(batch: pa.RecordBatch, row_filter: RowFilter, start: int) -> pa.RecordBatch:
    """Keep the batch rows the filter selects; ``start`` is the file row index of the batch's first row."""
    window = BitMap64()
    window.add_range(start, start + batch.num_rows)
    hits = row_filter.rows & window
    chosen = hits if row_filter.keep else window - hits
    if len(chosen) == batch.num_rows:
        return batch
    positions = pa.Array.from_buffers(pa.uint64(), len(chosen), [None, pa.py_buffer(chosen.to_array())])
    return batch.take(pc.subtract(positions, pa.scalar(start, pa.uint64())))


def _assemble(batch: pa.RecordBatch, plan: _Plan) -> list[pa.Array]:
    """The output columns of one file batch (read with ``plan.file_columns``, then ``_change_type`` if kept)."""
    n = batch.num_rows
    read = batch.columns
    arrays = []
    for field, source, direct, target in zip(plan.fields, plan.sources, plan.direct, plan.targets, strict=True):
        if source is None:
            arrays.append(pa.nulls(n, target))
        elif type(source) is int:
            column = read[source]
            arrays.append(column if direct else _conform(column, field.type, plan.mode, field.name))
        else:
            assert isinstance(source, pa.Scalar)
            arrays.append(pa.repeat(source, n))
    if plan.change_type:
        arrays.append(read[-1] if plan.change_type_direct else _cast(read[-1], pa.string(), CHANGE_TYPE_COLUMN))
    return arrays


# ---------------------------------------------------------------- type conversion


def _conform(array: pa.Array, dtype: DataType, mode: str, name: str) -> pa.Array:
    """Convert a file array to the logical Arrow type of ``dtype``, renaming nested fields to logical names."""
    if isinstance(dtype, StructType):
        return _conform_struct(array, dtype, mode, name)
    if isinstance(dtype, ArrayType):
        return _conform_list(array, dtype, mode, name)
    if isinstance(dtype, MapType):
        return _conform_map(array, dtype, mode, name)
    return _cast(array, to_arrow_type(dtype), name)


def _null_mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _conform_struct(array: pa.Array, dtype: StructType, mode: str, name: str) -> pa.Array:
    if not pa.types.is_struct(array.type):
        raise InvalidLogError(f"column {name!r} is {array.type} in the data file, the schema says struct")
    file_fields = list(array.type)
    children = []
    for field in dtype.fields:
        index = _match_field(file_fields, field, mode)
        if index is None:
            children.append(pa.nulls(len(array), to_arrow_type(field.type)))
        else:
            children.append(_conform(array.field(index), field.type, mode, f"{name}.{field.name}"))
    logical = list(to_arrow_type(dtype))
    return pa.StructArray.from_arrays(children, fields=logical, mask=_null_mask(array))


def _conform_list(array: pa.Array, dtype: ArrayType, mode: str, name: str) -> pa.Array:
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise InvalidLogError(f"column {name!r} is {array.type} in the data file, the schema says array")
    array = _unsliced(array)
    values = _conform(array.values, dtype.element_type, mode, f"{name}.element")
    offsets = array.offsets.cast(pa.int32())
    return pa.ListArray.from_arrays(offsets, values, type=to_arrow_type(dtype), mask=_null_mask(array))


def _conform_map(array: pa.Array, dtype: MapType, mode: str, name: str) -> pa.Array:
    if not pa.types.is_map(array.type):
        raise InvalidLogError(f"column {name!r} is {array.type} in the data file, the schema says map")
    array = _unsliced(array)
    keys = _conform(array.keys, dtype.key_type, mode, f"{name}.key")
    items = _conform(array.items, dtype.value_type, mode, f"{name}.value")
    return pa.MapArray.from_arrays(array.offsets, keys, items, type=to_arrow_type(dtype), mask=_null_mask(array))


def _unsliced(array: pa.Array) -> pa.Array:
    """A list or map array with offset 0 (a copy if it is a slice).

    Rebuilding a list or map from offsets with a null mask refuses sliced offsets
    ("Null bitmap with offsets slice not supported").
    """
    return pa.concat_arrays([array]) if array.offset else array


def _cast(array: pa.Array, target: pa.DataType, name: str) -> pa.Array:
    """Cast a primitive file array (type widening, string/binary variants, timestamp units and zones).

    Timestamps are cast unsafely so that nanosecond values truncate to Delta's microseconds.
    """
    if array.type == target:
        return array
    lossy = pa.types.is_timestamp(array.type) and pa.types.is_timestamp(target)
    try:
        return pc.cast(array, target, safe=not lossy)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise InvalidLogError(
            f"column {name!r} is {array.type} in the data file and cannot be read as {target}: {e}"
        ) from e
