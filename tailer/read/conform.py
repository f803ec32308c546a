"""Type conversion: a file column read into the table's logical Arrow type.

Nested fields are renamed from physical to logical names (column mapping) and
matched by field id or name at every level; primitive columns are cast (type
widening, string and binary types, timestamp units and zones). A variant, at
the top level or nested in structs, list elements or map keys and values, is
unshredded into :data:`~state.variant.VARIANT_STORAGE_TYPE` whatever layout the
file holds it in (``struct<value, metadata>`` as Spark 4.0 writes it,
``struct<metadata, value, typed_value>`` shredded as Spark 4.1 does, with a
shredding schema that may differ from file to file), and every value is checked
to decode, so that a malformed one is a :class:`~state.errors.DataFileError`
naming the column, row and (added by the reader) the table, version and file.
"""

from __future__ import annotations

import pyarrow as pa

from deltatail.state.errors import InvalidLogError
from deltatail.state.schema import ArrayType, DataType, MapType, StructType, contains_variant, is_variant, to_arrow_type
from deltatail.tailer.read.column_plan import match_field


def conform(array: pa.Array, dtype: DataType, mode: str, name: str) -> pa.Array:
    """Convert a file array to the logical Arrow type of ``dtype``, renaming nested fields to logical names.

    Raises:
        InvalidLogError: if the file's column does not have the shape the schema says, or cannot be cast.
        DataFileError: if a variant in it is malformed (a shredded layout that breaks the shredding
            rules, a null metadata, bytes that break the encoding).
    """
    if is_variant(dtype):
        return _conform_variant(array, name)
    if isinstance(dtype, StructType):
        return _conform_struct(array, dtype, mode, name)
    if isinstance(dtype, ArrayType):
        return _conform_list(array, dtype, mode, name)
    if isinstance(dtype, MapType):
        return _conform_map(array, dtype, mode, name)
    return cast(array, to_arrow_type(dtype), name)


def _conform_variant(array: pa.Array, name: str) -> pa.Array:
    # The variant codecs load with the first variant column (most tables have none).
    from deltatail.state.variant import check_values, is_variant_group, unshred

    storage = array.storage if isinstance(array, pa.ExtensionArray) else array
    if not is_variant_group(storage.type):
        raise InvalidLogError(
            f"column {name!r} is {array.type} in the data file, the schema says variant "
            "(a group of metadata and value, or a shredded variant)"
        )
    out = unshred(storage, column=f"variant column {name!r}")
    check_values(out, column=f"variant column {name!r}")
    return out


def nulls(n: int, target: pa.DataType) -> pa.Array:
    """``n`` nulls of ``target``, with empty values under them where a struct's binary child must not be null.

    ``pa.nulls`` makes every child of a null struct null too, which a Parquet writer refuses for a
    non-nullable child ("declared non-nullable but contains nulls"): a variant's ``metadata`` and ``value``.
    """
    if not pa.types.is_struct(target):
        return pa.nulls(n, target)
    return pa.StructArray.from_arrays(
        [_filler(n, f) for f in target], fields=list(target), mask=pa.repeat(pa.scalar(True), n)
    )


def _filler(n: int, field: pa.Field) -> pa.Array:
    """The child ``field`` under ``n`` null structs: nulls where allowed, else empty binaries or strings."""
    t = field.type
    if pa.types.is_struct(t):
        return nulls(n, t) if field.nullable else pa.StructArray.from_arrays([_filler(n, f) for f in t], fields=list(t))
    if not field.nullable and (pa.types.is_binary(t) or pa.types.is_string(t)):
        return pa.repeat(pa.scalar(b"" if pa.types.is_binary(t) else "", t), n)
    return pa.nulls(n, t)


def _null_mask(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def _conform_struct(array: pa.Array, dtype: StructType, mode: str, name: str) -> pa.Array:
    if not pa.types.is_struct(array.type):
        raise InvalidLogError(f"column {name!r} is {array.type} in the data file, the schema says struct")
    file_fields = list(array.type)
    # Under a null struct a file's required variant group reads as present with empty bytes: variants are
    # read with the struct's nulls merged in (flatten), so that only values that exist are checked.
    merged = array.flatten() if array.null_count and contains_variant(dtype) else None
    children = []
    for field in dtype.fields:
        index = match_field(file_fields, field, mode)
        if index is None:
            children.append(nulls(len(array), to_arrow_type(field.type)))
        else:
            child = merged[index] if merged is not None and contains_variant(field.type) else array.field(index)
            children.append(conform(child, field.type, mode, f"{name}.{field.name}"))
    logical = list(to_arrow_type(dtype))
    return pa.StructArray.from_arrays(children, fields=logical, mask=_null_mask(array))


def _conform_list(array: pa.Array, dtype: ArrayType, mode: str, name: str) -> pa.Array:
    if not (pa.types.is_list(array.type) or pa.types.is_large_list(array.type)):
        raise InvalidLogError(f"column {name!r} is {array.type} in the data file, the schema says array")
    array = _unsliced(array)
    values = conform(array.values, dtype.element_type, mode, f"{name}.element")
    offsets = array.offsets.cast(pa.int32())
    return pa.ListArray.from_arrays(offsets, values, type=to_arrow_type(dtype), mask=_null_mask(array))


def _conform_map(array: pa.Array, dtype: MapType, mode: str, name: str) -> pa.Array:
    if not pa.types.is_map(array.type):
        raise InvalidLogError(f"column {name!r} is {array.type} in the data file, the schema says map")
    array = _unsliced(array)
    keys = conform(array.keys, dtype.key_type, mode, f"{name}.key")
    items = conform(array.items, dtype.value_type, mode, f"{name}.value")
    return pa.MapArray.from_arrays(array.offsets, keys, items, type=to_arrow_type(dtype), mask=_null_mask(array))


def _unsliced(array: pa.Array) -> pa.Array:
    """A list or map array with offset 0 (a copy if it is a slice).

    Rebuilding a list or map from offsets with a null mask refuses sliced offsets
    ("Null bitmap with offsets slice not supported").
    """
    return pa.concat_arrays([array]) if array.offset else array


def cast(array: pa.Array, target: pa.DataType, name: str) -> pa.Array:
    """Cast a primitive file array (type widening, string/binary variants, timestamp units and zones).

    Timestamps are cast unsafely so that nanosecond values truncate to Delta's microseconds.
    """
    if array.type == target:
        return array
    lossy = pa.types.is_timestamp(array.type) and pa.types.is_timestamp(target)
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    try:
        return pc.cast(array, target, safe=not lossy)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise InvalidLogError(
            f"column {name!r} is {array.type} in the data file and cannot be read as {target}: {e}"
        ) from e
