"""Variant columns as pyarrow reads them from Parquet, shredded or not: unshredded, checked, as JSON.

In Parquet a variant column is a group with a binary ``metadata`` and a binary ``value``; a
*shredded* column (``VariantShredding.md``) moves parts of the value into typed columns: the group
holds ``metadata``, an optional ``value`` and an optional ``typed_value`` (a primitive, a list of
``{value, typed_value}`` elements, or a group of ``{value, typed_value}`` fields for an object),
nested to any depth. pyarrow 26 reads either layout as a plain ``struct`` (it has no variant Arrow
type; a Python extension type named ``arrow.parquet.variant`` crashes its Parquet writer), so this
module works on those structs:

- :func:`unshred` turns a variant column as read (shredded or not) into
  ``struct<metadata: binary not null, value: binary not null>``, the unshredded form, nulls kept,
  its ``metadata`` field marked as PySpark marks a variant (:func:`is_variant_type` tells it apart);
- :func:`check_values` checks that every value of that form decodes;
- :func:`variant_json_array` turns it into the JSON text of each value.

A shredded layout that breaks the shredding rules, or a value that breaks the encoding, is a
:class:`~state.errors.DataFileError` naming the column and, where it can, the row.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltatail.state.errors import DataFileError
from deltatail.state.schema import VARIANT_STORAGE_TYPE
from deltatail.state.variant.decode import (
    _ARRAY,
    _BINARY,
    _DATE,
    _DECIMAL4,
    _DECIMAL8,
    _DECIMAL16,
    _DOUBLE,
    _FALSE,
    _FIXED_SIZE,
    _FLOAT,
    _INT8,
    _INT16,
    _INT32,
    _INT64,
    _MAX_SCALE,
    _OBJECT,
    _SHORT_STRING,
    _STRING,
    _TIME_NTZ,
    _TIMESTAMP,
    _TIMESTAMP_NANOS,
    _TIMESTAMP_NTZ,
    _TIMESTAMP_NTZ_NANOS,
    _TRUE,
    _UUID,
    _check_unique,
    _container,
    _key,
    _key_ids,
    _malformed,
    _value_end,
    metadata_keys,
)
from deltatail.state.variant.json_text import (
    _to_json,
    variant_to_json,
)

# -- encoding (for reconstructing shredded values) ---------------------------------------------------


def _width(n: int) -> int:
    """Bytes (1 to 4) needed for the unsigned ``n``."""
    return 1 if n < 0x100 else 2 if n < 0x10000 else 3 if n < 0x1000000 else 4


def _encode_object(metadata: bytes, fields: list[tuple[str, bytes]]) -> bytes:
    """An object of ``(name, encoded value)`` fields, ids from ``metadata``'s dictionary, in name order."""
    ids = _key_ids(metadata)
    fields.sort(key=lambda f: f[0].encode("utf-8"))
    field_ids = []
    for name, _ in fields:
        field_id = ids.get(name)
        if field_id is None:
            raise _malformed(f"the shredded field {name!r} is not in the variant's metadata dictionary")
        field_ids.append(field_id)
    data = b"".join(encoded for _, encoded in fields)
    offsets = [0]
    for _, encoded in fields:
        offsets.append(offsets[-1] + len(encoded))
    id_size = _width(max(field_ids, default=0))
    offset_size = _width(len(data))
    large = len(fields) > 0xFF
    header = _OBJECT | ((large << 4 | (id_size - 1) << 2 | (offset_size - 1)) << 2)
    return b"".join(
        [
            bytes([header]),
            len(fields).to_bytes(4 if large else 1, "little"),
            b"".join(i.to_bytes(id_size, "little") for i in field_ids),
            b"".join(o.to_bytes(offset_size, "little") for o in offsets),
            data,
        ]
    )


def _encode_array(elements: list[bytes]) -> bytes:
    data = b"".join(elements)
    offsets = [0]
    for encoded in elements:
        offsets.append(offsets[-1] + len(encoded))
    offset_size = _width(len(data))
    large = len(elements) > 0xFF
    header = _ARRAY | ((large << 2 | (offset_size - 1)) << 2)
    return b"".join(
        [
            bytes([header]),
            len(elements).to_bytes(4 if large else 1, "little"),
            b"".join(o.to_bytes(offset_size, "little") for o in offsets),
            data,
        ]
    )


def _object_fields(metadata: bytes, value: bytes) -> list[tuple[str, bytes]]:
    """The ``(name, encoded value)`` fields of an encoded object (the unshredded rest of a partly shredded one).

    Raises:
        DataFileError: if ``value`` is not a well-formed object.
    """
    end = len(value)
    if not value or value[0] & 3 != _OBJECT:
        raise _malformed("the value beside a shredded object (typed_value) is not an object")
    keys = metadata_keys(metadata)
    layout = _container(value, 0, end, _OBJECT, value[0] >> 2)
    fields = []
    for i in range(layout.count):
        start = layout.element(value, i)
        fields.append((_key(keys, layout.field_id(value, i)), value[start : _value_end(value, start, layout.data_end)]))
    return fields


_PRIMITIVE_HEADER = {type_id: bytes([type_id << 2]) for type_id in range(21)}
_INT_TYPES = {pa.int8(): (_INT8, 1), pa.int16(): (_INT16, 2), pa.int32(): (_INT32, 4), pa.int64(): (_INT64, 8)}


def _encode_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) < 64:
        return bytes([len(raw) << 2 | _SHORT_STRING]) + raw
    return _PRIMITIVE_HEADER[_STRING] + len(raw).to_bytes(4, "little") + raw


def _primitive_encoder(dtype: pa.DataType) -> tuple[pa.DataType | None, Callable[[Any], bytes]]:
    """How to encode a shredded primitive column: an Arrow type to cast it to first, and a per-value encoder.

    Raises:
        DataFileError: if ``dtype`` is not a type the shredding specification allows for ``typed_value``.
    """
    if pa.types.is_boolean(dtype):
        return None, lambda v: _PRIMITIVE_HEADER[_TRUE if v else _FALSE]
    if dtype in _INT_TYPES:
        type_id, size = _INT_TYPES[dtype]
        header = _PRIMITIVE_HEADER[type_id]
        return None, lambda v: header + v.to_bytes(size, "little", signed=True)
    if pa.types.is_float64(dtype):
        return None, lambda v: _PRIMITIVE_HEADER[_DOUBLE] + struct.pack("<d", v)
    if pa.types.is_float32(dtype):
        return None, lambda v: _PRIMITIVE_HEADER[_FLOAT] + struct.pack("<f", v)
    if pa.types.is_decimal(dtype) and dtype.precision <= 38:
        type_id = _DECIMAL4 if dtype.precision <= 9 else _DECIMAL8 if dtype.precision <= 18 else _DECIMAL16
        size = _FIXED_SIZE[type_id] - 1
        scale = dtype.scale
        if not 0 <= scale <= _MAX_SCALE:
            raise DataFileError(f"shredded decimal column has scale {scale}, outside 0 to 38")
        header = _PRIMITIVE_HEADER[type_id] + bytes([scale])
        return None, lambda v: header + int(v.scaleb(scale)).to_bytes(size, "little", signed=True)
    if pa.types.is_date32(dtype):
        return pa.int32(), lambda v: _PRIMITIVE_HEADER[_DATE] + v.to_bytes(4, "little", signed=True)
    if pa.types.is_timestamp(dtype) and dtype.unit in ("us", "ns"):
        micros = dtype.unit == "us"
        if dtype.tz is not None:
            type_id = _TIMESTAMP if micros else _TIMESTAMP_NANOS
        else:
            type_id = _TIMESTAMP_NTZ if micros else _TIMESTAMP_NTZ_NANOS
        header = _PRIMITIVE_HEADER[type_id]
        return pa.int64(), lambda v: header + v.to_bytes(8, "little", signed=True)
    if pa.types.is_time64(dtype) and dtype.unit == "us":
        return pa.int64(), lambda v: _PRIMITIVE_HEADER[_TIME_NTZ] + v.to_bytes(8, "little", signed=True)
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return None, _encode_string
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return None, lambda v: _PRIMITIVE_HEADER[_BINARY] + len(v).to_bytes(4, "little") + v
    if pa.types.is_fixed_size_binary(dtype) and dtype.byte_width == 16:
        return None, lambda v: _PRIMITIVE_HEADER[_UUID] + v
    raise DataFileError(f"a shredded typed_value of Arrow type {dtype} is not a type variant shredding allows")


def _child(struct_array: pa.StructArray, name: str) -> pa.Array | None:
    index = struct_array.type.get_field_index(name)
    return None if index < 0 else struct_array.field(index)


def _storage(array: pa.Array) -> pa.Array:
    return array.storage if isinstance(array, pa.ExtensionArray) else array


def _reconstruct(
    value_array: pa.Array | None, typed_array: pa.Array | None, metas: list[bytes | None], need: list[bool]
) -> list[bytes | None]:
    """The encoded variant value of each row from its ``value`` and ``typed_value`` columns; ``None`` = missing.

    ``metas`` is each row's metadata; rows whose ``need`` is false are not looked at (they lie under a
    null parent, where the columns hold nothing meaningful).
    """
    n = len(need)
    values: list[bytes | None] = [None] * n if value_array is None else value_array.cast(pa.binary()).to_pylist()
    if typed_array is None:
        return values
    typed_array = _storage(typed_array)
    dtype = typed_array.type
    present = typed_array.is_valid().to_pylist()
    out: list[bytes | None] = [None] * n
    if pa.types.is_struct(dtype):  # a shredded object
        inner = [need[i] and present[i] for i in range(n)]
        shredded: list[tuple[str, list[bytes | None]]] = []
        for f in dtype:
            field_array = _storage(typed_array.field(f.name))
            if not pa.types.is_struct(field_array.type):
                raise DataFileError(f"shredded object field {f.name!r} is not a group of value and typed_value")
            shredded.append(
                (f.name, _reconstruct(_child(field_array, "value"), _child(field_array, "typed_value"), metas, inner))
            )
        for i in range(n):
            if not need[i]:
                continue
            if not present[i]:
                out[i] = values[i]
                continue
            meta = metas[i]
            assert meta is not None  # needed rows have metadata: checked by unshred
            fields = [(name, column[i]) for name, column in shredded if column[i] is not None]
            rest = values[i]
            if rest is not None:
                extra = _object_fields(meta, rest)
                names = {name for name, _ in fields}
                for name, _ in extra:
                    if name in names:
                        raise _malformed(f"the field {name!r} is both shredded and in the object's value")
                _check_unique([name for name, _ in extra])
                fields += extra
            out[i] = _encode_object(meta, [(name, encoded) for name, encoded in fields if encoded is not None])
        return out
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):  # a shredded array
        elements = _storage(typed_array.flatten())
        if not pa.types.is_struct(elements.type):
            raise DataFileError("shredded array elements are not groups of value and typed_value")
        parents = pc.list_parent_indices(typed_array).to_pylist()
        lengths = pc.fill_null(pc.list_value_length(typed_array), 0).to_pylist()
        element_metas = [metas[p] for p in parents]
        element_need = [need[p] for p in parents]
        encoded = _reconstruct(_child(elements, "value"), _child(elements, "typed_value"), element_metas, element_need)
        cursor = 0
        for i in range(n):
            items = encoded[cursor : cursor + lengths[i]]
            cursor += lengths[i]
            if not need[i]:
                continue
            if not present[i]:
                out[i] = values[i]
                continue
            if values[i] is not None:
                raise _malformed("a shredded array has both value and typed_value")
            if any(item is None for item in items):
                raise _malformed("a shredded array has a missing element (both value and typed_value null)")
            out[i] = _encode_array([item for item in items if item is not None])
        return out
    cast_to, encode = _primitive_encoder(dtype)
    raw = (typed_array if cast_to is None else typed_array.cast(cast_to)).to_pylist()
    for i in range(n):
        if not need[i]:
            continue
        if not present[i]:
            out[i] = values[i]
            continue
        if values[i] is not None:
            raise _malformed("a shredded primitive has both value and typed_value")
        out[i] = encode(raw[i])
    return out


def is_variant_group(dtype: pa.DataType) -> bool:
    """Whether an Arrow type is a variant column as pyarrow reads it from Parquet, shredded or not.

    That is a struct with a binary ``metadata`` field, a binary ``value`` and/or a ``typed_value``
    field, and no other field. (A user struct of the same shape is indistinguishable: the table
    schema, not this test, says which columns are variants.)
    """
    if not pa.types.is_struct(dtype):
        return False
    names = {f.name for f in dtype}
    if "metadata" not in names or not names <= {"metadata", "value", "typed_value"} or len(names) < 2:
        return False
    binary_kinds = (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view)
    if not any(kind(dtype.field("metadata").type) for kind in binary_kinds):
        return False
    return "value" not in names or any(kind(dtype.field("value").type) for kind in binary_kinds)


def is_variant_type(dtype: pa.DataType) -> bool:
    """Whether an Arrow type is a variant as deltatail emits it (:data:`VARIANT_STORAGE_TYPE`, or PySpark's).

    That is a struct with a ``value`` field and a ``metadata`` field marked with :data:`VARIANT_MARKER`,
    in either order: the marker, not the shape, tells a variant from a user's struct of two binaries.
    """
    if not pa.types.is_struct(dtype) or dtype.num_fields != 2:
        return False
    index = dtype.get_field_index("metadata")
    if index < 0 or dtype.get_field_index("value") < 0:
        return False
    marker = dtype.field(index).metadata
    return marker is not None and marker.get(b"variant") == b"true"


def check_values(array: pa.Array, *, column: str = "variant column") -> None:
    """Check that every non-null value of an unshredded variant array (:data:`VARIANT_STORAGE_TYPE`) decodes.

    Decodes each value as :func:`variant_to_json` does, so that a value that reads here also
    converts to JSON later; nothing is kept.

    Raises:
        DataFileError: if a value's bytes break the encoding; the message names the column and the
            row (counted from 0 within the array).
    """
    if not len(array) or array.null_count == len(array):
        return
    valid = array.is_valid().to_pylist() if array.null_count else None
    metas = array.field(0).to_pylist()
    values = array.field(1).to_pylist()
    for i, (meta, value) in enumerate(zip(metas, values, strict=True)):
        if valid is not None and not valid[i]:
            continue
        try:
            _to_json(value, 0, len(value), metadata_keys(meta), [], 0)
        except DataFileError as e:
            raise DataFileError(f"in {column}, row {i}: {e.message}") from None


def _unshred_chunk(array: pa.Array, column: str) -> pa.StructArray:
    array = _storage(array)
    if not is_variant_group(array.type):
        raise DataFileError(f"{column} is not a variant group (metadata, value, typed_value): {array.type}")
    metadata = _child(array, "metadata")
    assert metadata is not None  # is_variant_group
    metadata = metadata.cast(pa.binary())
    value = _child(array, "value")
    typed = _child(array, "typed_value")
    valid = array.is_valid()
    missing_metadata = pc.and_(valid, metadata.is_null())
    if missing_metadata.true_count:
        row = pc.index(missing_metadata, True).as_py()
        raise DataFileError(f"malformed variant in {column}, row {row}: the metadata is null")
    mask = pc.invert(valid)
    if typed is None and value is not None:  # unshredded: the columns are the variant already
        encoded = pc.fill_null(value.cast(pa.binary()), pa.scalar(b"\x00", pa.binary()))
        return pa.StructArray.from_arrays(
            [pc.if_else(valid, metadata, b""), pc.if_else(valid, encoded, b"")],
            fields=list(VARIANT_STORAGE_TYPE),
            mask=mask,
        )
    metas: list[bytes | None] = metadata.to_pylist()
    need: list[bool] = valid.to_pylist()
    try:
        rows = _reconstruct(value, typed, metas, need)
    except DataFileError as e:
        raise DataFileError(f"in {column}: {e.message}") from None
    # A variant that is missing where a value is required reads as variant null (VariantShredding.md).
    filled = [(b"\x00" if r is None else r) if need[i] else b"" for i, r in enumerate(rows)]
    return pa.StructArray.from_arrays(
        [pc.if_else(valid, metadata, b""), pa.array(filled, pa.binary())],
        fields=list(VARIANT_STORAGE_TYPE),
        mask=mask,
    )


def unshred(array: pa.Array | pa.ChunkedArray, *, column: str = "variant column") -> pa.Array | pa.ChunkedArray:
    """The unshredded form of a variant column as pyarrow reads it from Parquet: ``VARIANT_STORAGE_TYPE``.

    An unshredded column (``metadata`` and ``value``, in either order) costs no copy of its bytes; a
    shredded one is rebuilt row by row, following "Reconstructing a Shredded Variant" of
    VariantShredding.md: ``typed_value`` objects are merged with the fields left in ``value``,
    arrays and primitives are encoded from their typed columns, object fields use the ids of the
    row's metadata dictionary. Null rows stay null; a row whose ``value`` and ``typed_value`` are
    both null reads as the variant null. The bytes are not otherwise validated here
    (:func:`variant_to_json` validates what it decodes).

    Args:
        array: the column (a struct array, or chunked).
        column: how messages name the column.

    Raises:
        DataFileError: if the column is not a variant group, a row's metadata is null, or the
            shredded columns break the shredding rules (a primitive or array with both ``value``
            and ``typed_value``, a field both shredded and in ``value``, a missing array element,
            a shredded field name absent from the metadata, a ``typed_value`` type the
            specification does not allow); the message names the column.
    """
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([_unshred_chunk(c, column) for c in array.chunks], type=VARIANT_STORAGE_TYPE)
    return _unshred_chunk(array, column)


def variant_json_array(
    array: pa.Array | pa.ChunkedArray, *, column: str = "variant column"
) -> pa.Array | pa.ChunkedArray:
    """The JSON text (:func:`variant_to_json`) of every value of a variant column, shredded or not; nulls stay null.

    Raises:
        DataFileError: as :func:`unshred`, or if a value's bytes break the encoding; the message
            names the column and the row (counted from 0 within the array or chunk).
    """
    if isinstance(array, pa.ChunkedArray):
        return pa.chunked_array([variant_json_array(c, column=column) for c in array.chunks], type=pa.string())
    storage = unshred(array, column=column)
    assert isinstance(storage, pa.StructArray)
    valid = storage.is_valid().to_pylist()
    metas = storage.field(0).to_pylist()
    values = storage.field(1).to_pylist()
    texts: list[str | None] = []
    for i, ok in enumerate(valid):
        if not ok:
            texts.append(None)
            continue
        try:
            texts.append(variant_to_json(metas[i], values[i]))
        except DataFileError as e:
            raise DataFileError(f"in {column}, row {i}: {e.message}") from None
    return pa.array(texts, pa.string())
