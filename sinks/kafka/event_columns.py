"""JSON texts of change-row columns under :class:`~sinks.kafka.connect_schema.ValueModes`, column by column.

:func:`mode_text` gives every column's JSON texts for the ``debezium`` and ``flat`` formats
without falling back to a row-by-row path for the whole batch: scalar columns are written by
Arrow kernels (:func:`sinks.json_text.column_text`, or here for floats, binary and the value
modes), and only a column that needs Python objects (nested types, a string holding a control
character) is written value by value with ``orjson``, its logical leaves converted first
(:func:`convert`) so that nested values follow the same modes. The rules are in
:mod:`sinks.kafka.connect_schema`.
"""

from __future__ import annotations

from binascii import b2a_base64
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.sinks.json_text import Text, Wrapped, column_text, json_values, text_scalar, variant_texts
from deltatail.sinks.kafka.connect_schema import ValueModes, is_json_extension
from deltatail.state.variant import is_variant_type

_NULL = text_scalar("null")
_EMPTY = text_scalar("")
_PLUS = text_scalar("+")
#: Microseconds since the epoch of 10000-01-01: from here on a year needs five digits and a ``+``.
_YEAR_10000 = 253_402_300_800_000_000
#: ... and of 0000-01-01: before it Arrow writes a ``-`` and the year (``-0001-12-31``).
_YEAR_0 = -62_167_219_200_000_000


def mode_text(column: pa.Array, modes: ValueModes) -> Text:
    """Every slot's JSON text under ``modes`` (a null slot is ``null``); never ``None``.

    Args:
        column: an Arrow array (not chunked); slices are honoured.
        modes: how logical values are written.
    """
    t = column.type
    if isinstance(t, pa.BaseExtensionType):
        return mode_text(column.storage, modes)
    if pa.types.is_dictionary(t):
        return mode_text(column.dictionary_decode(), modes)
    if pa.types.is_null(t):
        return _NULL
    if pa.types.is_floating(t):
        return _float_text(column)
    if pa.types.is_decimal(t) and modes.decimal != "string":
        if modes.decimal == "double":
            return _float_text(pc.cast(column, pa.float64()))
        return _quoted_texts(_decimal_base64(column))
    if pa.types.is_date(t) and modes.time in ("micros", "connect"):
        return _null_filled(pc.cast(pc.cast(column, pa.date32()).cast(pa.int32()), pa.string()))
    if pa.types.is_timestamp(t):
        return _timestamp_text(column, modes)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return _quoted_python(column, _base64)
    if pa.types.is_binary_view(t):
        return mode_text(pc.cast(column, pa.large_binary()), modes)
    if is_variant_type(t):
        return mode_text(variant_texts(column), modes)  # a string holding the JSON text (io.debezium.data.Json)
    if not pa.types.is_nested(t):
        text = column_text(column)
        if text is not None:
            return text
    return _dumped(convert(column, modes))


def _null_filled(text: pa.Array) -> pa.Array:
    return pc.fill_null(text, _NULL) if text.null_count else text


def _float_text(column: pa.Array) -> pa.Array:
    """Arrow's shortest round-trip text of each float (``1e+20``, ``-0``: valid JSON).

    NaN, infinities and nulls are ``null``.
    """
    if pa.types.is_float16(column.type):
        column = pc.cast(column, pa.float32())
    text = pc.cast(column, pa.string())
    finite = pc.is_finite(column)
    if column.null_count or not pc.all(finite).as_py():
        text = pc.if_else(pc.fill_null(finite, False), text, _NULL)
    return text


def _quoted_python(column: pa.Array, write: Any) -> pa.Array | Wrapped:
    """``"text"`` of each value written by ``write`` (text needing no JSON escapes), ``null`` for nulls."""
    return _quoted_texts(pa.array([None if v is None else write(v) for v in column.to_pylist()], pa.string()))


def _quoted_texts(texts: pa.Array) -> pa.Array | Wrapped:
    """``"text"`` of each string (text needing no JSON escapes), ``null`` for nulls."""
    if not texts.null_count:
        return Wrapped('"', texts, '"')
    return pc.fill_null(pc.binary_join_element_wise(text_scalar('"'), texts, text_scalar('"'), _EMPTY), _NULL)


def _base64(value: bytes) -> str:
    return b2a_base64(value, newline=False).decode("ascii")


def _decimal_base64(column: pa.Array) -> pa.Array:
    """Kafka Connect's ``Decimal`` bytes of each value as base64 text (a string array, nulls kept).

    The bytes are the unscaled value in big-endian two's complement, as few as Java's
    ``BigInteger.toByteArray`` writes; the unscaled value is read from the Arrow buffer
    (little-endian two's complement, ``byte_width`` bytes a value), so no digit is rounded.
    """
    width = column.type.byte_width
    data = memoryview(column.buffers()[1])[column.offset * width : (column.offset + len(column)) * width]
    valid = column.is_valid().to_pylist() if column.null_count else [True] * len(column)
    texts: list[str | None] = []
    for i, ok in enumerate(valid):
        if not ok:
            texts.append(None)
            continue
        unscaled = int.from_bytes(data[i * width : (i + 1) * width], "little", signed=True)
        bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
        texts.append(_base64(unscaled.to_bytes(bits // 8 + 1, "big", signed=True)))
    return pa.array(texts, pa.string())


def _dumped(column: pa.Array) -> pa.Array:
    """Each value's ``orjson`` text (``json_values`` rules): for nested columns and strings the kernels cannot write."""
    return pa.array([orjson.dumps(v).decode() for v in json_values(column)], pa.string())


# ------------------------------------------------------------------ timestamps --


def _timestamp_text(column: pa.Array, modes: ValueModes) -> Text:
    if modes.time in ("micros", "connect"):
        return _null_filled(pc.cast(timestamp_numbers(column, modes), pa.string()))
    body = timestamp_body(column, "T" if modes.time == "iso" else " ")
    after = 'Z"' if column.type.tz is not None else '"'
    if not body.null_count:
        return Wrapped('"', body, after)
    return pc.fill_null(pc.binary_join_element_wise(text_scalar('"'), body, text_scalar(after), _EMPTY), _NULL)


def _micros(column: pa.Array) -> pa.Array:
    """The column as naive microsecond timestamps (UTC wall time for a zoned one)."""
    micros = pc.cast(column, pa.timestamp("us", tz=column.type.tz), safe=False)
    return pc.cast(micros, pa.timestamp("us")) if column.type.tz is not None else micros


def timestamp_numbers(column: pa.Array, modes: ValueModes) -> pa.Array:
    """Epoch microseconds (``micros``) or milliseconds, floored (``connect``), as ``int64``."""
    micros = _micros(column)
    if modes.time == "connect":
        micros = pc.cast(pc.floor_temporal(micros, unit="millisecond"), pa.timestamp("ms"))
    return pc.cast(micros, pa.int64())


def timestamp_body(column: pa.Array, separator: str) -> pa.Array:
    """``YYYY-MM-DD?HH:MM:SS.ffffff`` (``?`` the separator) of each timestamp, years past 9999 with a ``+``."""
    micros = _micros(column)
    text = pc.cast(micros, pa.string())  # always six fraction digits, a space at byte 10 for four-digit years
    numbers = pc.cast(micros, pa.int64())
    bounds = pc.min_max(numbers)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None:
        return text
    four_digit = low >= _YEAR_0 and high < _YEAR_10000
    if separator != " ":
        if four_digit:
            text = pc.binary_replace_slice(text, 10, 11, separator)  # bytes, not characters: 3x faster
        else:
            text = pc.replace_substring(text, " ", separator, max_replacements=1)
    if high >= _YEAR_10000:
        long_year = pc.greater_equal(numbers, pa.scalar(_YEAR_10000, pa.int64()))
        text = pc.if_else(long_year, pc.binary_join_element_wise(_PLUS, text, _EMPTY), text)
    return text


# ------------------------------------------------------------------ nested --


def needs_conversion(t: pa.DataType, modes: ValueModes) -> bool:
    """Whether :func:`convert` changes values of type ``t`` (``json_values`` alone would write them otherwise)."""
    if isinstance(t, pa.BaseExtensionType):
        return needs_conversion(t.storage_type, modes)
    if pa.types.is_dictionary(t):
        return needs_conversion(t.value_type, modes)
    if pa.types.is_timestamp(t):
        return True  # iso and sql: the separator and years past 9999; micros, connect: numbers
    if pa.types.is_date(t):
        return modes.time in ("micros", "connect")
    if pa.types.is_decimal(t):
        return modes.decimal != "string"
    if pa.types.is_struct(t):
        return is_variant_type(t) or any(needs_conversion(f.type, modes) for f in t)
    if pa.types.is_map(t):
        return needs_conversion(t.key_type, modes) or needs_conversion(t.item_type, modes)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return needs_conversion(t.value_type, modes)
    return False


def convert(column: pa.Array, modes: ValueModes) -> pa.Array:
    """``column`` with every logical leaf replaced by the value ``modes`` write.

    Timestamps become their text (``iso``, ``sql``) or numbers, dates numbers (``micros``,
    ``connect``), decimals base64 text (``precise``) or doubles, variants their JSON text (a string,
    as Debezium writes ``io.debezium.data.Json``); structs, lists and maps are
    rebuilt around their converted children with the same nulls. :func:`sinks.json_text.json_values`
    of the result writes what the modes ask for.
    """
    t = column.type
    if is_json_extension(t) or isinstance(t, pa.BaseExtensionType):
        return convert(column.storage, modes)
    if is_variant_type(t):
        return variant_texts(column)
    if not needs_conversion(t, modes):
        return column
    if pa.types.is_dictionary(t):
        return convert(column.dictionary_decode(), modes)
    if pa.types.is_timestamp(t):
        if modes.time in ("micros", "connect"):
            return timestamp_numbers(column, modes)
        body = timestamp_body(column, "T" if modes.time == "iso" else " ")
        return pc.binary_join_element_wise(body, text_scalar("Z"), _EMPTY) if t.tz is not None else body
    if pa.types.is_date(t):
        return pc.cast(pc.cast(column, pa.date32()), pa.int32())
    if pa.types.is_decimal(t):
        if modes.decimal == "double":
            return pc.cast(column, pa.float64())
        return _decimal_base64(column)
    mask = column.is_null() if column.null_count else None
    if pa.types.is_struct(t):
        children = [convert(child, modes) for child in column.flatten()]
        fields = [pa.field(f.name, c.type, f.nullable) for f, c in zip(t, children, strict=True)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    if pa.types.is_fixed_size_list(t):
        return convert(pc.cast(column, pa.list_(t.value_field)), modes)
    offsets = column.offsets
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    relative = pc.subtract(offsets, pa.scalar(start, offsets.type)) if start else offsets
    if pa.types.is_map(t):
        keys = convert(column.keys.slice(start, end - start), modes)
        items = convert(column.items.slice(start, end - start), modes)
        return pa.MapArray.from_arrays(relative, keys, items, mask=mask)
    values = convert(column.values.slice(start, end - start), modes)
    if pa.types.is_large_list(t):
        return pa.LargeListArray.from_arrays(relative, values, mask=mask)
    return pa.ListArray.from_arrays(relative, values, mask=mask)
