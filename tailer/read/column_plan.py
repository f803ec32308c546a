"""Column plans: how each output column of a file is produced from the file's physical columns.

A plan maps the table's logical columns (in schema order) onto a file's
columns: by Parquet field id or physical name under column mapping, by name
otherwise; a partition column takes its value from ``partitionValues`` (a
constant per file); a column the file lacks is nulls ("For columns that are
not found in the files, nulls need to be returned").

What the caches buy (measured by ``python -m benchmarks.changes``, see
``benchmarks/README.md``): a table's files mostly share one schema, so plans
are cached by file schema; for files whose Arrow schema is derived from the
Parquet schema, plans are shared by Parquet schema equality (0.1 µs a file,
where hashing Arrow schemas cost ~7 µs); plans bound to a file's partition
values are remembered per distinct ``partitionValues``.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from deltatail.state.errors import ConfigError, InvalidLogError
from deltatail.state.feed import CHANGE_TYPE_COLUMN
from deltatail.state.schema import PARQUET_FIELD_ID, StructField, StructType, contains_variant, to_arrow_type
from deltatail.tailer.read.parquet_file import OpenFile
from deltatail.tailer.read.partition_values import parse_partition_value


def selected_fields(schema: StructType, columns: Sequence[str] | None) -> list[StructField]:
    """The schema's fields named in ``columns`` (all for ``None``), in schema order.

    Raises:
        ConfigError: if ``columns`` names a column the schema does not have.
    """
    if columns is None:
        return list(schema.fields)
    unknown = sorted(set(columns) - set(schema.names))
    if unknown:
        raise ConfigError(f"unknown columns {unknown}; the table has {schema.names}")
    wanted = set(columns)
    return [f for f in schema.fields if f.name in wanted]


@dataclass(frozen=True, slots=True)
class _Partition:
    """A partition column before the file's ``partitionValues`` are known.

    The value comes from ``partitionValues`` under the first of ``keys`` present
    (physical name, then logical), else from the file column ``fallback``, else null.
    """

    field: StructField
    keys: tuple[str, ...]
    fallback: str | None
    fallback_direct: bool


@dataclass(frozen=True, slots=True)
class ColumnPlan:
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
    bound: dict[tuple[tuple[str, str | None], ...], ColumnPlan] = dataclasses.field(
        default_factory=dict, compare=False, hash=False, repr=False
    )


@functools.lru_cache(maxsize=256)
def plan_for(
    file_schema: pa.Schema,
    schema: StructType,
    columns: tuple[str, ...] | None,
    partition_columns: tuple[str, ...],
    mode: str,
    keep_change_type: bool,
    field_ids: tuple[bytes | None, ...],
) -> ColumnPlan:
    """The read plan for files with ``file_schema`` (cached: a table's files mostly share one schema).

    ``field_ids`` (the file's top-level Parquet field ids, in ``id`` mode) is part
    of the cache key only: Arrow schemas compare and hash without field metadata.
    """
    fields = selected_fields(schema, columns)
    file_fields = list(file_schema)
    sources: list[str | int | pa.Scalar | _Partition | None] = []
    direct: list[bool] = []
    targets = [to_arrow_type(f.type) for f in fields]
    for field, target in zip(fields, targets, strict=True):
        index = match_field(file_fields, field, mode)
        # Nested types in id mode are matched by id field by field (type equality ignores the ids). A
        # variant is always converted: unshredded, checked, and given the marked type (equality ignores the marker).
        same = (
            index is not None
            and file_fields[index].type == target
            and not (mode == "id" and pa.types.is_nested(target))
            and not contains_variant(field.type)
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
    return ColumnPlan(
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


class PlansByParquetSchema:
    """Plans of files whose Arrow schema is derived, by the other arguments of :func:`plan_for` and the Parquet schema.

    A few (Parquet schema, plan) pairs per key, matched by ``ParquetSchema.equals``
    (0.1 µs, where hashing and comparing Arrow schemas for the ``plan_for`` cache costs
    ~7 µs a file). A Parquet schema keeps its file's whole footer alive, so what is
    held is bounded by footer bytes (everything is dropped when a new footer would
    pass ``footer_bytes``) as well as by ``keys`` keys and
    ``schemas`` schemas per key. Lookups take no lock (a lookup racing
    an update can only miss); updates take one.
    """

    def __init__(self, keys: int = 256, schemas: int = 16, footer_bytes: int = 16 << 20) -> None:
        self.keys, self.schemas, self.footer_bytes = keys, schemas, footer_bytes
        self._by_key: dict[tuple[object, ...], list[tuple[pq.ParquetSchema, ColumnPlan, int]]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def find(self, key: tuple[object, ...], physical: pq.ParquetSchema) -> ColumnPlan | None:
        """The plan remembered for ``key`` and a Parquet schema equal to ``physical``, if any."""
        for seen, plan, _ in self._by_key.get(key, ()):
            if physical.equals(seen):
                return plan
        return None

    def add(self, key: tuple[object, ...], physical: pq.ParquetSchema, plan: ColumnPlan, footer_bytes: int) -> None:
        """Remember ``plan`` for ``key`` and ``physical`` (whose footer holds ``footer_bytes``)."""
        with self._lock:
            if len(self._by_key) >= self.keys or self._bytes + footer_bytes > self.footer_bytes:
                self._by_key = {}
                self._bytes = 0
            known = self._by_key.setdefault(key, [])
            if len(known) >= self.schemas:
                self._bytes -= known.pop(0)[2]
            known.append((physical, plan, footer_bytes))
            self._bytes += footer_bytes


_PLANS_BY_PARQUET_SCHEMA = PlansByParquetSchema()


def file_plan(
    opened: OpenFile,
    schema: StructType,
    columns: tuple[str, ...] | None,
    partition_columns: tuple[str, ...],
    mode: str,
    keep_change_type: bool,
) -> ColumnPlan:
    """:func:`plan_for` for an open file, found by its Parquet schema where its Arrow schema is derived.

    A derived Arrow schema is a function of the Parquet schema (names, types, repetition, field ids:
    what ``ParquetSchema.equals`` compares) and the read options (the INT96 unit, fixed; the dictionary
    read of ``_change_type``, in the key), so equal Parquet schemas give equal plans.

    Raises:
        InvalidLogError, ConfigError: as :func:`plan_for`.
    """
    memo = (schema, columns, partition_columns, mode, keep_change_type, opened.dictionary) if opened.derived else None
    metadata = opened.parquet.metadata
    if memo is not None:
        found = _PLANS_BY_PARQUET_SCHEMA.find(memo, metadata.schema)
        if found is not None:
            return found
    file_schema = opened.parquet.schema_arrow
    field_ids = _field_ids(file_schema) if mode == "id" else ()
    plan = plan_for(file_schema, schema, columns, partition_columns, mode, keep_change_type, field_ids)
    if memo is not None:
        _PLANS_BY_PARQUET_SCHEMA.add(memo, metadata.schema, plan, metadata.serialized_size)
    return plan


def bind(plan: ColumnPlan, partition_values: dict[str, str | None]) -> ColumnPlan:
    """``plan`` with its partition columns resolved against one file's ``partitionValues``.

    A partition column takes its value from ``partitionValues``; where the map has no key for it,
    from the file's column of that name if there is one, else null (a missing key is a null value,
    as Delta Spark reads it).

    Raises:
        InvalidLogError: if a partition value does not parse as its column's type.
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


def _bind_values(plan: ColumnPlan, partition_values: dict[str, str | None]) -> ColumnPlan:
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
                # Absent from partitionValues and from the file: null, as Delta Spark reads it
                # (TahoeFileIndex.getPartitionValuesRow: partitionValues.get(col).orNull). Spark's
                # writers leave a null partition value out of a remove's map (dat/multi_partitioned v2).
                sources.append(_partition_scalar(None, source.field))
        else:
            sources.append(source)
    file_columns, positions = _positions(sources)
    return ColumnPlan(
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


def match_field(file_fields: Sequence[pa.Field], field: StructField, mode: str) -> int | None:
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
