"""Avro binary of a whole batch of Connect JSON payloads at once, column by column.

The per-message path (:mod:`sinks.kafka.avro`) decodes each payload with ``orjson`` and writes it
with one ``fastavro.schemaless_writer`` call: tens of microseconds a message, most of it fastavro
walking the schema for every datum. Here the batch's payloads are parsed once by Arrow's JSON
reader into columns typed by the Connect schema, and each column's Avro binary is made for every
row at once (numpy and Arrow kernels), then the columns are joined row by row. The bytes are the
ones the Avro specification's "Binary Encoding" gives, and those fastavro writes:

- ``int`` and ``long`` (dates, timestamps, Connect's ``int8``/``int16``): "variable-length zig-zag
  coding", little groups of 7 bits first, the high bit set on every byte but the last;
- ``float``, ``double``: "4 [8] bytes ... converted into an integer using a method equivalent to
  Java's floatToIntBits [doubleToLongBits] and then encoded in little-endian format";
- ``boolean``: "a single byte whose value is either 0 (false) or 1 (true)";
- ``string``, ``bytes``: "a long followed by that many bytes" (strings UTF-8); Connect JSON carries
  bytes (binary columns, ``Decimal``) as base64, decoded value by value;
- ``record``: "the concatenation of the encodings of its fields", in the order they are declared;
- a union (an optional field, ``["null", T]``): "a long value indicating the zero-based position
  within the union of the schema of its value", then the value: ``0x00`` for null, ``0x02`` and T;
- ``array``: blocks, "a long count ... followed by that many array items"; one block of all the
  items, then "a block with count zero indicates the end of the array".

What this path does not write is left to the per-message path: :func:`encode_payloads` returns
``None`` for a schema with a ``map`` (Arrow's JSON reader makes objects structs), for payloads Arrow
cannot read as the schema types them, and for a batch where a required value is null (fastavro then
names the value that does not fit).
"""

from __future__ import annotations

from binascii import a2b_base64
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

_BINARY = pa.large_binary()
_EMPTY = pa.scalar(b"", _BINARY)
_NULL_BRANCH = pa.scalar(b"\x00", _BINARY)
_VALUE_BRANCH = pa.scalar(b"\x02", _BINARY)
_TRUE = pa.scalar(b"\x01", _BINARY)
_FALSE = pa.scalar(b"\x00", _BINARY)
_END_OF_ARRAY = pa.scalar(b"\x00", _BINARY)
_INTEGERS = {"int8", "int16", "int32", "int64"}
_READ_TYPES = {
    "int8": pa.int64(),
    "int16": pa.int64(),
    "int32": pa.int64(),
    "int64": pa.int64(),
    "float32": pa.float64(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.string(),  # base64 text in Connect JSON
}
#: Arrow's JSON reader takes the batch in blocks of at most this many bytes (a block size is a 32-bit
#: number); a payload longer than a block is read across blocks.
_MOST_BLOCK_BYTES = 1 << 30
#: The most bytes a zig-zag varint of a 64-bit value takes (ceil(64 / 7)).
_MOST_VARINT_BYTES = 10


def encode_payloads(connect: dict[str, Any], header: bytes, payloads: Sequence[bytes]) -> list[bytes] | None:
    """``header`` followed by the Avro binary of each Connect JSON payload, or ``None`` if this path cannot write them.

    Args:
        connect: the Connect schema of the payloads (a ``struct``); its Avro schema is
            :func:`sinks.kafka.avro_schema.to_avro`'s, whose fields keep the struct's order.
        header: the bytes before each datum (Confluent's magic byte and schema id).
        payloads: one JSON object a payload, as the JSON encodings write them (one line each).
    """
    read_type = _read_type(connect)
    if read_type is None or not payloads:
        return None if read_type is None else []
    rows = _read(payloads, read_type)
    if rows is None or len(rows) != len(payloads):
        return None
    parts = _parts(connect, rows)
    if parts is None:
        return None
    framed = _joined([pa.scalar(header, _BINARY), *parts], len(rows))
    if framed.null_count:
        return None
    out: list[bytes] = framed.to_pylist()
    return out


def _read(payloads: Sequence[bytes], read_type: pa.DataType) -> pa.StructArray | None:
    """The payloads as one struct array typed ``read_type`` (``None`` if Arrow cannot read them so)."""
    text = b"\n".join(payloads)
    schema = pa.schema(list(read_type))
    try:
        table = pa_json.read_json(
            pa.BufferReader(text),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=min(len(text) + 1, _MOST_BLOCK_BYTES)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    columns = [column.combine_chunks() for column in table.columns]
    return pa.StructArray.from_arrays(columns, fields=list(schema))


def _read_type(connect: dict[str, Any]) -> pa.DataType | None:
    """The Arrow type Connect JSON of ``connect`` is read as (``None``: a type this path does not write)."""
    kind = connect["type"]
    if kind == "struct":
        fields = []
        for member in connect["fields"]:
            child = _read_type(member)
            if child is None:
                return None
            fields.append(pa.field(member["field"], child))
        return pa.struct(fields)
    if kind == "array":
        items = _read_type(connect["items"])
        return None if items is None else pa.list_(items)
    return _READ_TYPES.get(kind)


#: Parts whose row-wise concatenation is each row's Avro binary: arrays (a value a row) and scalars (one for all).
Parts = list[pa.Array | pa.Scalar]


def _encode(connect: dict[str, Any], column: pa.Array) -> pa.Array | None:
    """Each slot's Avro binary under ``connect`` (see :func:`_parts`)."""
    parts = _parts(connect, column)
    return None if parts is None else _joined(parts, len(column))


def _joined(parts: Parts, length: int) -> pa.Array:
    if not any(isinstance(part, pa.Array) for part in parts):
        parts = [*parts, pa.array([b""] * length, _BINARY)]
    return pc.binary_join_element_wise(*parts, _EMPTY)


def _parts(connect: dict[str, Any], column: pa.Array) -> Parts | None:
    """Each slot's Avro binary under ``connect`` as parts; a null slot of a required type is null (it does not fit).

    Parts are joined only where a null needs them whole: a record's parts are its fields' parts, an
    optional value without nulls is the branch byte (one scalar) and its parts.
    """
    nulls = column.null_count
    if nulls == len(column) and nulls:
        return [_NULL_BRANCH] if connect.get("optional") else [pa.nulls(nulls, _BINARY)]
    plain = _plain(connect, column)
    if plain is None:
        return None
    if not connect.get("optional"):
        return (
            [pc.if_else(column.is_valid(), _joined(plain, len(column)), pa.scalar(None, _BINARY))] if nulls else plain
        )
    if not nulls:
        return [_VALUE_BRANCH, *plain]
    return [pc.if_else(column.is_valid(), _joined([_VALUE_BRANCH, *plain], len(column)), _NULL_BRANCH)]


def _plain(connect: dict[str, Any], column: pa.Array) -> Parts | None:
    kind = connect["type"]
    if kind == "struct":
        return _record(connect, column)
    if kind == "array":
        array = _array(connect, column)
        return None if array is None else [array]
    if kind in _INTEGERS:
        return [_varints(_numbers(column, np.int64))]
    if kind == "float32":
        return [_fixed(_numbers(column, np.float64).astype("<f4"))]
    if kind == "float64":
        return [_fixed(_numbers(column, np.float64).astype("<f8"))]
    if kind == "boolean":
        return [pc.if_else(pc.fill_null(column, False), _TRUE, _FALSE)]
    if kind == "string":
        return _length_prefixed(pc.cast(column, _BINARY))
    if kind == "bytes":
        return _length_prefixed(_base64_decoded(column))
    return None


def _record(connect: dict[str, Any], column: pa.StructArray) -> Parts | None:
    """The concatenation of the fields' parts."""
    parts: Parts = []
    for member, child in zip(connect["fields"], column.flatten(), strict=True):
        part = _parts(member, child)
        if part is None:
            return None
        parts.extend(part)
    return parts


def _array(connect: dict[str, Any], column: pa.ListArray) -> pa.Array | None:
    """One block of all a row's items and the end block; an empty (or null) list is the end block alone."""
    items = _encode(connect["items"], column.flatten())
    if items is None or items.null_count:
        return None
    counts = _numbers(pc.list_value_length(column), np.int64)
    bounds = np.concatenate(([0], np.cumsum(counts)))
    offsets = _offsets_of(items)[bounds]
    data = items.buffers()[2] or pa.py_buffer(b"")
    bodies = pa.LargeBinaryArray.from_buffers(_BINARY, len(column), [None, pa.py_buffer(offsets), data])
    blocks = pc.binary_join_element_wise(_varints(counts), bodies, _END_OF_ARRAY, _EMPTY)
    return pc.if_else(pa.array(counts > 0), blocks, _END_OF_ARRAY)


def _offsets_of(binary: pa.Array) -> np.ndarray[Any, np.dtype[np.int64]]:
    """The ``len + 1`` offsets of a ``large_binary`` array into its data buffer."""
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int64)
    return offsets[binary.offset : binary.offset + len(binary) + 1]


def _numbers(column: pa.Array, dtype: Any) -> Any:
    """The column as a numpy array of ``dtype``, nulls as 0 (their slots are masked by the caller)."""
    filled = pc.fill_null(column, 0) if column.null_count else column
    return np.asarray(filled.to_numpy(zero_copy_only=False), dtype=dtype)


def _varints(values: np.ndarray[Any, np.dtype[np.int64]]) -> pa.Array:
    """The zig-zag varint of each 64-bit value (Avro ``int`` and ``long``)."""
    zigzag = ((values << 1) ^ (values >> 63)).view(np.uint64)
    if not len(values) or int(zigzag.max()) < 0x80:  # one byte each (lengths of short texts, small numbers)
        return _fixed(zigzag.astype(np.uint8))
    sizes = np.ones(len(values), dtype=np.int64)
    rest = zigzag >> np.uint64(7)
    while rest.any():
        sizes += rest != 0
        rest = rest >> np.uint64(7)
    width = int(sizes.max()) if len(sizes) else 1
    groups = np.empty((len(values), width), dtype=np.uint8)
    for k in range(min(width, _MOST_VARINT_BYTES)):
        low = (zigzag >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = (sizes > k + 1).astype(np.uint64) << np.uint64(7)
        groups[:, k] = (low | more).astype(np.uint8)
    data = groups[np.arange(width) < sizes[:, None]]
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    return pa.LargeBinaryArray.from_buffers(
        _BINARY, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())]
    )


def _fixed(values: np.ndarray[Any, Any]) -> pa.Array:
    """Each value's little-endian bytes (Avro ``float``, ``double``)."""
    width = values.dtype.itemsize
    offsets = np.arange(len(values) + 1, dtype=np.int64) * width
    return pa.LargeBinaryArray.from_buffers(
        _BINARY, len(values), [None, pa.py_buffer(offsets), pa.py_buffer(values.tobytes())]
    )


def _length_prefixed(data: pa.Array) -> Parts:
    """Avro ``string``/``bytes``: the byte length as a zig-zag varint, then the bytes."""
    return [_varints(_numbers(pc.binary_length(data), np.int64)), data]


def _base64_decoded(column: pa.Array) -> pa.Array:
    """Connect JSON's base64 text of ``bytes`` (binary columns, ``Decimal``) as the bytes."""
    return pa.array([None if v is None else a2b_base64(v) for v in column.to_pylist()], _BINARY)
