"""The table schema: parsed from ``metaData.schemaString``, converted to Arrow.

Protocol, "Schema Serialization Format": a schema is a ``struct`` of fields,
each with ``name``, ``type``, ``nullable`` and ``metadata``; types are primitive
names (``string``, ``long``, ``integer``, ``short``, ``byte``, ``float``,
``double``, ``boolean``, ``binary``, ``date``, ``timestamp``, ``timestamp_ntz``,
``decimal(p,s)``, and ``variant`` under the ``variantType`` feature) or nested
``struct``, ``array`` (``elementType``, ``containsNull``) and ``map``
(``keyType``, ``valueType``, ``valueContainsNull``). Column mapping keeps each field's physical name and id
in its metadata (``delta.columnMapping.physicalName``, ``delta.columnMapping.id``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa

from deltatail.state.errors import InvalidLogError

PHYSICAL_NAME_KEY = "delta.columnMapping.physicalName"
FIELD_ID_KEY = "delta.columnMapping.id"
PARQUET_FIELD_ID = b"PARQUET:field_id"

#: Field metadata that marks a struct as a variant: on its ``metadata`` child, as PySpark's Arrow conversion
#: marks ``VariantType`` (``pyspark.sql.pandas.types.is_variant``), so Spark reads such a column back as a variant.
VARIANT_MARKER = {b"variant": b"true"}

#: The Arrow type of an unshredded variant: what :func:`state.variant.unshred` returns, and what deltatail
#: emits. A plain struct of two binaries (Arrow type equality ignores the marker on ``metadata``;
#: :func:`state.variant.is_variant_type` looks for it). Defined here, not in :mod:`state.variant`, so that a
#: schema is read without importing the variant codecs (and ``pyarrow.compute``): they load with the first
#: variant column.
VARIANT_STORAGE_TYPE = pa.struct(
    [pa.field("metadata", pa.binary(), False, VARIANT_MARKER), pa.field("value", pa.binary(), False)]
)

_DECIMAL = re.compile(r"^decimal\(\s*(\d+)\s*,\s*(\d+)\s*\)$")

_PRIMITIVES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "integer": pa.int32(),
    "short": pa.int16(),
    "byte": pa.int8(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
    "void": pa.null(),
    # Delta 4.0's semi-structured type (protocol, "Variant Data Type"): the unshredded variant, a struct of
    # its metadata and value binaries (state/variant/); files may hold it shredded, readers unshred it.
    "variant": VARIANT_STORAGE_TYPE,
}

#: The Delta type of variant columns.
VARIANT_NAME = "variant"


@dataclass(frozen=True, slots=True)
class PrimitiveType:
    """A primitive Delta type such as ``long`` or ``timestamp_ntz``."""

    name: str


@dataclass(frozen=True, slots=True)
class DecimalType:
    """``decimal(precision, scale)``."""

    precision: int
    scale: int


@dataclass(frozen=True, slots=True)
class ArrayType:
    """``array`` of ``element_type``."""

    element_type: DataType
    contains_null: bool


@dataclass(frozen=True, slots=True)
class MapType:
    """``map`` from ``key_type`` to ``value_type``."""

    key_type: DataType
    value_type: DataType
    value_contains_null: bool


@dataclass(frozen=True, slots=True)
class StructField:
    """One named field; ``metadata`` is kept whole (column mapping lives there)."""

    name: str
    type: DataType
    nullable: bool = True
    metadata: dict[str, Any] = field(default_factory=dict, compare=True, hash=False)

    def physical_name(self, mode: str) -> str:
        """The name of this field inside data files under column-mapping ``mode``."""
        if mode in ("name", "id"):
            name = self.metadata.get(PHYSICAL_NAME_KEY)
            if isinstance(name, str):
                return name
        return self.name

    @property
    def field_id(self) -> int | None:
        """The column-mapping field id, if the field has one."""
        value = self.metadata.get(FIELD_ID_KEY)
        return value if isinstance(value, int) else None


@dataclass(frozen=True, slots=True)
class StructType:
    """A struct; the table schema is one.

    Hashable with the hash computed once (schemas key the readers' caches, so a
    lookup per file must not walk the whole schema).
    """

    fields: tuple[StructField, ...]
    _hash: int = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.fields))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[StructType], tuple[tuple[StructField, ...]]]:
        # The cached hash is per process (string hashing is salted): rebuild it on unpickling.
        return (StructType, (self.fields,))

    def field(self, name: str) -> StructField:
        """The field named ``name``; raises ``KeyError`` if absent."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def names(self) -> list[str]:
        """Field names in order."""
        return [f.name for f in self.fields]

    def to_arrow(self) -> pa.Schema:
        """The Arrow schema with logical names (what deltatail emits)."""
        return pa.schema([to_arrow_field(f, "none", logical=True) for f in self.fields])

    def to_physical_arrow(self, mode: str) -> pa.Schema:
        """The Arrow schema as stored in data files under column-mapping ``mode``.

        In ``id`` mode each field carries its Parquet field id in the field
        metadata (``PARQUET:field_id``), so readers can match columns by id.
        """
        return pa.schema([to_arrow_field(f, mode, logical=False) for f in self.fields])


DataType = PrimitiveType | DecimalType | ArrayType | MapType | StructType


def is_variant(dtype: DataType) -> bool:
    """Whether ``dtype`` is the ``variant`` type itself."""
    return isinstance(dtype, PrimitiveType) and dtype.name == VARIANT_NAME


def contains_variant(dtype: DataType) -> bool:
    """Whether ``dtype`` is ``variant`` or nests one (in a struct field, an array element, a map key or value)."""
    if isinstance(dtype, PrimitiveType):
        return dtype.name == VARIANT_NAME
    if isinstance(dtype, ArrayType):
        return contains_variant(dtype.element_type)
    if isinstance(dtype, MapType):
        return contains_variant(dtype.key_type) or contains_variant(dtype.value_type)
    if isinstance(dtype, StructType):
        return any(contains_variant(f.type) for f in dtype.fields)
    return False


def to_arrow_type(dtype: DataType, mode: str = "none", logical: bool = True) -> pa.DataType:
    """Convert a Delta type to Arrow; ``logical=False`` uses physical names for nested fields."""
    if isinstance(dtype, PrimitiveType):
        return _PRIMITIVES[dtype.name]
    if isinstance(dtype, DecimalType):
        return pa.decimal128(dtype.precision, dtype.scale)
    if isinstance(dtype, ArrayType):
        return pa.list_(pa.field("element", to_arrow_type(dtype.element_type, mode, logical), dtype.contains_null))
    if isinstance(dtype, MapType):
        return pa.map_(
            pa.field("key", to_arrow_type(dtype.key_type, mode, logical), False),
            pa.field("value", to_arrow_type(dtype.value_type, mode, logical), dtype.value_contains_null),
        )
    return pa.struct([to_arrow_field(f, mode, logical) for f in dtype.fields])


def to_arrow_field(f: StructField, mode: str, logical: bool) -> pa.Field:
    """Convert one field; physical fields carry their Parquet field id in ``id`` mode."""
    name = f.name if logical else f.physical_name(mode)
    metadata = None
    if not logical and mode == "id" and f.field_id is not None:
        metadata = {PARQUET_FIELD_ID: str(f.field_id).encode()}
    return pa.field(name, to_arrow_type(f.type, mode, logical), f.nullable, metadata)


def _parse_type(raw: Any) -> DataType:
    if isinstance(raw, str):
        if raw in _PRIMITIVES:
            return PrimitiveType(raw)
        m = _DECIMAL.match(raw)
        if m:
            return DecimalType(int(m.group(1)), int(m.group(2)))
        if raw == "decimal":
            return DecimalType(10, 0)
        raise InvalidLogError(f"unknown schema type {raw!r}")
    if isinstance(raw, dict):
        kind = raw.get("type")
        if kind == "struct":
            return _parse_struct(raw)
        if kind == "array":
            return ArrayType(_parse_type(raw["elementType"]), _flag(raw, "containsNull"))
        if kind == "map":
            return MapType(
                _parse_type(raw["keyType"]),
                _parse_type(raw["valueType"]),
                _flag(raw, "valueContainsNull"),
            )
    raise InvalidLogError(f"unknown schema type {raw!r}")


def _flag(raw: dict[str, Any], key: str) -> bool:
    """A Boolean member of a schema object (``true`` when absent); anything but ``true``/``false`` is refused."""
    value = raw.get(key, True)
    if type(value) is not bool:
        raise InvalidLogError(f"schema member {key!r} must be true or false, got {value!r}")
    return value


def _parse_struct(raw: dict[str, Any]) -> StructType:
    items = raw.get("fields", [])
    if type(items) is not list:
        raise InvalidLogError(f"schema struct 'fields' must be an array, got {items!r}")
    fields = []
    for f in items:
        if type(f) is not dict or type(f.get("name")) is not str:
            raise InvalidLogError(f"schema field must be an object with a string 'name', got {f!r}")
        metadata = f.get("metadata")
        if metadata is not None and type(metadata) is not dict:
            raise InvalidLogError(f"schema field {f['name']!r} has metadata that is not an object: {metadata!r}")
        fields.append(
            StructField(
                name=f["name"],
                type=_parse_type(f["type"]),
                nullable=_flag(f, "nullable"),
                metadata=dict(metadata or {}),
            )
        )
    return StructType(tuple(fields))


def parse_schema(schema_string: str) -> StructType:
    """Parse ``metaData.schemaString``.

    Raises:
        InvalidLogError: if the string is not JSON, holds an unknown type, or a field of the wrong
            shape (a ``name`` that is not a string, a ``nullable`` that is not a boolean, ``metadata``
            that is not an object), or nests too deeply to parse.
    """
    try:
        raw = orjson.loads(schema_string)
        if not isinstance(raw, dict) or raw.get("type") != "struct":
            raise InvalidLogError("schemaString is not a struct type")
        return _parse_struct(raw)
    except (orjson.JSONDecodeError, KeyError, TypeError, RecursionError) as e:
        raise InvalidLogError(f"invalid schemaString: {type(e).__name__}: {e}") from e
