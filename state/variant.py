r"""Parquet Variant values (Delta's ``variantType`` and ``variantShredding`` features): decode, reconstruct, JSON.

A variant is two byte strings (Parquet ``VariantEncoding.md``): the *metadata*, a header byte and a
dictionary of field names, and the *value*, a self-describing tree whose first byte gives the basic
type (primitive, short string, object, array) and whose objects name their fields by dictionary id.
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
- :func:`variant_json_array` turns it into the JSON text of each value;
- :func:`variant_to_json` and :func:`variant_to_python` decode one ``(metadata, value)`` pair.

JSON text follows Spark's ``to_json`` of a variant (``Variant.toJson`` in Spark's
``common/variant``), so that a change row's JSON equals what Spark shows for the same value:

==========================  =====================================================================
variant type                JSON text
==========================  =====================================================================
null, boolean               ``null``, ``true``/``false``
int8/16/32/64               the integer
double, float               Java's ``Double.toString``/``Float.toString``: shortest round-trip
                            digits, ``1.0``, ``0.001``, ``1.0E7``, ``1.0E-4``; NaN and the
                            infinities, which JSON lacks, as the strings ``"NaN"``,
                            ``"Infinity"``, ``"-Infinity"``
decimal4/8/16               the plain decimal without trailing fraction zeros (``12.50`` gives
                            ``12.5``, ``100`` stays ``100``); never an exponent
date                        ``"2024-02-29"`` (years beyond 9999 as ``"+10000-01-01"``)
timestamp (UTC-adjusted)    ``"2024-02-29 13:45:00.5+00:00"``: Spark's format, in UTC (Spark
                            uses its session time zone; deltatail has none), fraction digits
                            only as needed; microsecond and nanosecond types alike
timestamp without zone      ``"2024-02-29 13:45:00.5"``
time without zone           ``"13:45:00.5"``
binary                      base64 (RFC 4648, padded) in a string
string                      the string, escaped as Jackson does (control characters as
                            ``\\n``... or ``\\u001F``, non-ASCII kept)
uuid                        ``"00112233-4455-6677-8899-aabbccddeeff"``
object, array               ``{...}`` with fields in stored (name) order, ``[...]``; no spaces
==========================  =====================================================================

Python values (:func:`variant_to_python`): ``None``, ``bool``, ``int``, ``float``,
``decimal.Decimal`` (with the stored scale), ``datetime.date``, ``datetime.datetime`` (aware in
UTC, or naive), ``datetime.time``, ``bytes``, ``str``, ``uuid.UUID``, ``dict``, ``list``;
nanosecond timestamps as :class:`TimestampNanos`, which Python's datetime cannot hold.

Malformed input (bytes that break the encoding, a shredded layout that breaks the shredding rules)
is a :class:`~state.errors.DataFileError` saying what is wrong and, for arrays, in which row.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import math
import re
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from state.errors import DataFileError

#: Field metadata that marks a struct as a variant: on its ``metadata`` child, as PySpark's Arrow conversion
#: marks ``VariantType`` (``pyspark.sql.pandas.types.is_variant``), so Spark reads such a column back as a variant.
VARIANT_MARKER = {b"variant": b"true"}

#: The Arrow type of an unshredded variant: what :func:`unshred` returns, and what deltatail emits. A plain
#: struct of two binaries (Arrow type equality ignores the marker on ``metadata``; :func:`is_variant_type`
#: looks for it).
VARIANT_STORAGE_TYPE = pa.struct(
    [pa.field("metadata", pa.binary(), False, VARIANT_MARKER), pa.field("value", pa.binary(), False)]
)

#: How deep objects and arrays may nest before a value is refused (as malformed, not as a crash).
MAX_DEPTH = 256

_PRIMITIVE, _SHORT_STRING, _OBJECT, _ARRAY = 0, 1, 2, 3

# Primitive type ids (VariantEncoding.md, "Variant primitive types").
_NULL, _TRUE, _FALSE = 0, 1, 2
_INT8, _INT16, _INT32, _INT64 = 3, 4, 5, 6
_DOUBLE = 7
_DECIMAL4, _DECIMAL8, _DECIMAL16 = 8, 9, 10
_DATE, _TIMESTAMP, _TIMESTAMP_NTZ = 11, 12, 13
_FLOAT, _BINARY, _STRING = 14, 15, 16
_TIME_NTZ, _TIMESTAMP_NANOS, _TIMESTAMP_NTZ_NANOS, _UUID = 17, 18, 19, 20

# Fixed sizes of primitive values after the header byte (strings and binaries are length-prefixed).
_FIXED_SIZE = {
    _NULL: 0,
    _TRUE: 0,
    _FALSE: 0,
    _INT8: 1,
    _INT16: 2,
    _INT32: 4,
    _INT64: 8,
    _DOUBLE: 8,
    _DECIMAL4: 5,
    _DECIMAL8: 9,
    _DECIMAL16: 17,
    _DATE: 4,
    _TIMESTAMP: 8,
    _TIMESTAMP_NTZ: 8,
    _FLOAT: 4,
    _TIME_NTZ: 8,
    _TIMESTAMP_NANOS: 8,
    _TIMESTAMP_NTZ_NANOS: 8,
    _UUID: 16,
}
_DECIMAL_LIMITS = {_DECIMAL4: 10**9, _DECIMAL8: 10**18, _DECIMAL16: 10**38}
_MAX_SCALE = 38


@dataclass(frozen=True, slots=True)
class TimestampNanos:
    """A nanosecond timestamp (variant types 18 and 19): nanoseconds since the epoch, and whether UTC-adjusted."""

    epoch_nanos: int
    adjusted_to_utc: bool

    def isoformat(self) -> str:
        """The JSON text of the value without quotes, as :func:`variant_to_json` writes it."""
        return _format_timestamp(self.epoch_nanos, 9, utc=self.adjusted_to_utc)


def _malformed(what: str) -> DataFileError:
    return DataFileError(f"malformed variant: {what}")


# -- metadata ----------------------------------------------------------------------------------------


# Rows of a column usually share one metadata: decoded dictionaries are kept, for small metadata only
# (so that the cache's memory stays bounded by about _CACHE_ENTRIES x _CACHE_MAX_BYTES).
_CACHE_ENTRIES = 1024
_CACHE_MAX_BYTES = 4096
_keys_cache: dict[bytes, tuple[str, ...]] = {}
_ids_cache: dict[bytes, dict[str, int]] = {}


def metadata_keys(metadata: bytes) -> tuple[str, ...]:
    """The dictionary of field names a variant's metadata holds, in id order.

    Raises:
        DataFileError: if the metadata is malformed: empty, a version other than 1, a dictionary that
            does not fit, offsets that decrease or point past the end, or a name that is not UTF-8.
    """
    found = _keys_cache.get(metadata)
    if found is not None:
        return found
    keys = _parse_metadata(metadata)
    if len(metadata) <= _CACHE_MAX_BYTES:
        if len(_keys_cache) >= _CACHE_ENTRIES:
            _keys_cache.clear()
        _keys_cache[metadata] = keys
    return keys


def _parse_metadata(metadata: bytes) -> tuple[str, ...]:
    if not metadata:
        raise _malformed("the metadata is empty")
    header = metadata[0]
    if header & 0x0F != 1:
        raise _malformed(f"metadata version {header & 0x0F} is not 1")
    size = (header >> 6) + 1
    if len(metadata) < 1 + size:
        raise _malformed("the metadata ends inside its dictionary size")
    count = int.from_bytes(metadata[1 : 1 + size], "little")
    if count == 0:  # the specification's own examples write an empty dictionary as "01 00", without its offset
        return ()
    offsets_start = 1 + size
    strings_start = offsets_start + (count + 1) * size
    if strings_start > len(metadata):
        raise _malformed(f"the metadata is too short for {count} dictionary offsets")
    offsets = [
        int.from_bytes(metadata[offsets_start + i * size : offsets_start + (i + 1) * size], "little")
        for i in range(count + 1)
    ]
    available = len(metadata) - strings_start
    keys: list[str] = []
    for i in range(count):
        start, end = offsets[i], offsets[i + 1]
        if not start <= end <= available:
            raise _malformed(f"dictionary string {i} spans bytes {start}..{end} of {available}")
        try:
            keys.append(metadata[strings_start + start : strings_start + end].decode("utf-8"))
        except UnicodeDecodeError as e:
            raise _malformed(f"dictionary string {i} is not UTF-8") from e
    return tuple(keys)


def _key_ids(metadata: bytes) -> dict[str, int]:
    """Name -> the first id it has in the dictionary (what shredded object fields are encoded with)."""
    found = _ids_cache.get(metadata)
    if found is not None:
        return found
    ids: dict[str, int] = {}
    for i, key in enumerate(metadata_keys(metadata)):
        ids.setdefault(key, i)
    if len(metadata) <= _CACHE_MAX_BYTES:
        if len(_ids_cache) >= _CACHE_ENTRIES:
            _ids_cache.clear()
        _ids_cache[metadata] = ids
    return ids


# -- reading values ----------------------------------------------------------------------------------


def _int(value: bytes, pos: int, size: int, end: int, what: str, *, signed: bool = False) -> int:
    if pos + size > end:
        raise _malformed(f"{what} at byte {pos} runs past the end ({end})")
    return int.from_bytes(value[pos : pos + size], "little", signed=signed)


@dataclass(frozen=True, slots=True)
class _Container:
    """An object's or array's layout: element count, id and offset sizes, where ids, offsets and data start."""

    count: int
    id_size: int
    offset_size: int
    ids_at: int
    offsets_at: int
    data_at: int
    data_end: int

    def offset(self, value: bytes, i: int) -> int:
        at = self.offsets_at + i * self.offset_size
        return int.from_bytes(value[at : at + self.offset_size], "little")

    def element(self, value: bytes, i: int) -> int:
        """Where element ``i`` starts, checked to lie inside the data."""
        offset = self.offset(value, i)
        if self.data_at + offset >= self.data_end:
            raise _malformed(f"element {i} starts at data byte {offset}, past the end of the data")
        return self.data_at + offset

    def field_id(self, value: bytes, i: int) -> int:
        at = self.ids_at + i * self.id_size
        return int.from_bytes(value[at : at + self.id_size], "little")


def _container(value: bytes, pos: int, end: int, basic: int, info: int) -> _Container:
    if basic == _OBJECT:
        large, id_size, offset_size = (info >> 4) & 1, ((info >> 2) & 3) + 1, (info & 3) + 1
    else:
        large, id_size, offset_size = (info >> 2) & 1, 0, (info & 3) + 1
    count_size = 4 if large else 1
    count = _int(value, pos + 1, count_size, end, "the element count")
    ids_at = pos + 1 + count_size
    offsets_at = ids_at + count * id_size
    data_at = offsets_at + (count + 1) * offset_size
    if data_at > end:
        kind = "object" if basic == _OBJECT else "array"
        raise _malformed(f"an {kind} of {count} elements at byte {pos} does not fit in {end - pos} bytes")
    layout = _Container(count, id_size, offset_size, ids_at, offsets_at, data_at, 0)
    data_size = layout.offset(value, count)
    if data_at + data_size > end:
        raise _malformed(f"the elements of the value at byte {pos} end past the end of the value")
    return _Container(count, id_size, offset_size, ids_at, offsets_at, data_at, data_at + data_size)


def _value_end(value: bytes, pos: int, end: int) -> int:
    """Where the value starting at ``pos`` ends (exclusive)."""
    if pos >= end:
        raise _malformed(f"a value at byte {pos} starts past the end ({end})")
    header = value[pos]
    basic, info = header & 3, header >> 2
    if basic == _SHORT_STRING:
        stop = pos + 1 + info
    elif basic in (_OBJECT, _ARRAY):
        stop = _container(value, pos, end, basic, info).data_end
    elif info in (_BINARY, _STRING):
        stop = pos + 5 + _int(value, pos + 1, 4, end, "a length")
    elif info in _FIXED_SIZE:
        stop = pos + 1 + _FIXED_SIZE[info]
    else:
        raise _malformed(f"unknown primitive type {info} at byte {pos}")
    if stop > end:
        raise _malformed(f"the value at byte {pos} runs past the end ({end})")
    return stop


def _primitive(value: bytes, pos: int, end: int, info: int) -> tuple[int, Any]:
    """``(type id, decoded payload)`` of the primitive at ``pos``; payloads are raw (ints for times)."""
    body = pos + 1
    if info in (_BINARY, _STRING):
        size = _int(value, body, 4, end, "a length")
        if body + 4 + size > end:
            raise _malformed(
                f"a {size}-byte {'string' if info == _STRING else 'binary'} at byte {pos} runs past the end"
            )
        raw = value[body + 4 : body + 4 + size]
        if info == _BINARY:
            return info, bytes(raw)
        try:
            return info, raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _malformed(f"the string at byte {pos} is not UTF-8") from e
    fixed = _FIXED_SIZE.get(info)
    if fixed is None:
        raise _malformed(f"unknown primitive type {info} at byte {pos}")
    size = fixed
    if body + size > end:
        raise _malformed(f"primitive type {info} at byte {pos} needs {size} bytes, {end - body} remain")
    if info <= _FALSE:
        return info, None if info == _NULL else info == _TRUE
    if info <= _INT64:
        return info, int.from_bytes(value[body : body + size], "little", signed=True)
    if info == _DOUBLE:
        return info, struct.unpack_from("<d", value, body)[0]
    if info == _FLOAT:
        return info, struct.unpack_from("<f", value, body)[0]
    if info in _DECIMAL_LIMITS:
        scale = value[body]
        unscaled = int.from_bytes(value[body + 1 : body + size], "little", signed=True)
        if scale > _MAX_SCALE or abs(unscaled) >= _DECIMAL_LIMITS[info]:
            raise _malformed(f"decimal at byte {pos} has scale {scale} and unscaled value {unscaled} beyond its type")
        return info, (unscaled, scale)
    if info == _UUID:
        return info, uuid.UUID(bytes=bytes(value[body : body + 16]))
    # date, time and timestamps: the signed integer count
    return info, int.from_bytes(value[body : body + size], "little", signed=True)


def _short_string(value: bytes, pos: int, end: int, length: int) -> str:
    if pos + 1 + length > end:
        raise _malformed(f"a {length}-byte short string at byte {pos} runs past the end")
    try:
        return value[pos + 1 : pos + 1 + length].decode("utf-8")
    except UnicodeDecodeError as e:
        raise _malformed(f"the string at byte {pos} is not UTF-8") from e


def _key(keys: tuple[str, ...], field_id: int) -> str:
    if field_id >= len(keys):
        raise _malformed(f"field id {field_id} is not in the metadata's {len(keys)}-name dictionary")
    return keys[field_id]


def _check_unique(names: list[str]) -> None:
    if len(set(names)) != len(names):
        seen: set[str] = set()
        for name in names:
            if name in seen:
                raise _malformed(f"an object holds the field {name!r} twice")
            seen.add(name)


# -- to Python ---------------------------------------------------------------------------------------


def _epoch_date(days: int) -> datetime.date:
    try:
        return datetime.date(1970, 1, 1) + datetime.timedelta(days=days)
    except OverflowError as e:
        raise DataFileError(f"variant date {days} days from 1970 is outside Python's years 1 to 9999") from e


def _epoch_datetime(micros: int, *, utc: bool) -> datetime.datetime:
    base = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC if utc else None)
    try:
        return base + datetime.timedelta(microseconds=micros)
    except OverflowError as e:
        raise DataFileError(f"variant timestamp {micros} µs from 1970 is outside Python's years 1 to 9999") from e


def _python_primitive(info: int, payload: Any) -> Any:
    if info in _DECIMAL_LIMITS:
        unscaled, scale = payload
        return decimal.Decimal(unscaled).scaleb(-scale)
    if info == _DATE:
        return _epoch_date(payload)
    if info in (_TIMESTAMP, _TIMESTAMP_NTZ):
        return _epoch_datetime(payload, utc=info == _TIMESTAMP)
    if info == _TIME_NTZ:
        if not 0 <= payload < 86_400_000_000:
            raise _malformed(f"time of day {payload} µs is outside one day")
        seconds, micros = divmod(payload, 1_000_000)
        return datetime.time(seconds // 3600, seconds // 60 % 60, seconds % 60, micros)
    if info in (_TIMESTAMP_NANOS, _TIMESTAMP_NTZ_NANOS):
        return TimestampNanos(payload, info == _TIMESTAMP_NANOS)
    return payload


def _to_python(value: bytes, pos: int, end: int, keys: tuple[str, ...], depth: int) -> Any:
    if pos >= end:
        raise _malformed(f"a value at byte {pos} starts past the end ({end})")
    header = value[pos]
    basic, info = header & 3, header >> 2
    if basic == _PRIMITIVE:
        return _python_primitive(*_primitive(value, pos, end, info))
    if basic == _SHORT_STRING:
        return _short_string(value, pos, end, info)
    if depth >= MAX_DEPTH:
        raise _malformed(f"objects and arrays nest deeper than {MAX_DEPTH} levels")
    layout = _container(value, pos, end, basic, info)
    # Plain loops, not comprehensions: a comprehension is one more stack frame per level of nesting.
    if basic == _ARRAY:
        items = []
        for i in range(layout.count):
            items.append(_to_python(value, layout.element(value, i), layout.data_end, keys, depth + 1))
        return items
    names = [_key(keys, layout.field_id(value, i)) for i in range(layout.count)]
    _check_unique(names)
    fields = {}
    for i, name in enumerate(names):
        fields[name] = _to_python(value, layout.element(value, i), layout.data_end, keys, depth + 1)
    return fields


def variant_to_python(metadata: bytes, value: bytes) -> Any:
    """The Python value of a variant (see the module docstring for the types).

    Raises:
        DataFileError: if the bytes break the encoding, or a date or timestamp lies outside the
            years Python's ``datetime`` can hold.
    """
    return _to_python(value, 0, len(value), metadata_keys(metadata), 0)


# -- to JSON -----------------------------------------------------------------------------------------

_CONTROL_ESCAPE = re.compile(rb"(\\\\)|\\u00([0-9a-f]{2})")


def _upper_escape(match: re.Match[bytes]) -> bytes:
    return match.group(1) or b"\\u00" + match.group(2).upper()


def json_string(text: str) -> str:
    r"""``text`` as a JSON string literal, escaped as Spark's Jackson does (``\u001F``, not ``\u001f``)."""
    raw = orjson.dumps(text)
    if b"\\u00" in raw:
        raw = _CONTROL_ESCAPE.sub(_upper_escape, raw)
    return raw.decode("utf-8")


def _java_decimal_text(digits: str, exponent: int, negative: bool) -> str:
    """Java's ``Double.toString`` layout of the decimal whose significant ``digits`` end at 10^``exponent``."""
    e = exponent + len(digits) - 1  # the power of ten of the first digit
    if -3 <= e < 7:
        if e >= 0:
            whole = digits[: e + 1].ljust(e + 1, "0")
            fraction = digits[e + 1 :] or "0"
        else:
            whole, fraction = "0", "0" * (-e - 1) + digits
        text = f"{whole}.{fraction}"
    else:
        text = f"{digits[0]}.{digits[1:] or '0'}E{e}"
    return "-" + text if negative else text


def _shortest_digits(text: str) -> tuple[str, int]:
    """``(significant digits, exponent of the last digit)`` of a finite decimal literal such as ``1.5e-07``."""
    _, digit_tuple, exponent = decimal.Decimal(text).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    return digits, int(exponent) + (len(digit_tuple) - len(digits))


def _as_single(x: float) -> float:
    """``x`` rounded to the nearest float32 (infinite beyond the float32 range)."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def java_double_text(x: float, *, single: bool = False) -> str:
    """Java's ``Double.toString(x)`` (or ``Float.toString`` with ``single``): Spark's JSON for variant doubles.

    The shortest decimal that reads back as ``x`` (JDK 19 and later; where one digit suffices, a
    closer two-digit decimal is preferred), laid out plainly for 10^-3 <= |x| < 10^7 and in
    computerized scientific notation (``1.0E-4``) otherwise. NaN and the infinities give
    ``NaN``, ``Infinity`` and ``-Infinity``.
    """
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    negative = math.copysign(1.0, x) < 0
    if x == 0:
        return "-0.0" if negative else "0.0"
    magnitude = abs(x)

    def reads_back(text: str) -> bool:
        return (_as_single(float(text)) if single else float(text)) == magnitude

    # Python's repr is the shortest round-trip decimal of a double; for a float, try 1 to 9 digits.
    shortest = next(t for t in (f"{magnitude:.{p}e}" for p in range(9)) if reads_back(t)) if single else repr(magnitude)
    digits, exponent = _shortest_digits(shortest)
    if len(digits) == 1:  # JDK 19+: among one- and two-digit decimals that read back, the closest to x
        two = f"{magnitude:.1e}"
        if reads_back(two):
            digits, exponent = _shortest_digits(two)
    return _java_decimal_text(digits, exponent, negative)


def _decimal_text(unscaled: int, scale: int) -> str:
    """Java's ``BigDecimal.stripTrailingZeros().toPlainString()``."""
    while scale > 0 and unscaled % 10 == 0:
        unscaled //= 10
        scale -= 1
    if unscaled == 0:
        return "0"
    digits = str(abs(unscaled))
    if scale > 0:
        digits = digits.rjust(scale + 1, "0")
        digits = f"{digits[:-scale]}.{digits[-scale:]}"
    return "-" + digits if unscaled < 0 else digits


def _civil(days: int) -> tuple[int, int, int]:
    """The proleptic Gregorian ``(year, month, day)`` of ``days`` since 1970-01-01, for any range."""
    z = days + 719_468
    era = z // 146_097
    doe = z - era * 146_097
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    return yoe + era * 400 + (month <= 2), month, day


def _format_date(days: int) -> str:
    year, month, day = _civil(days)
    if year > 9999:
        year_text = f"+{year}"
    elif year < 0:
        year_text = f"-{-year:04d}"
    else:
        year_text = f"{year:04d}"
    return f"{year_text}-{month:02d}-{day:02d}"


def _format_time(fraction_units: int, digits: int) -> str:
    """``HH:MM:SS[.f]`` of a time of day given in units of 10^-digits seconds (ISO_LOCAL_TIME)."""
    per_second = 10**digits
    seconds, fraction = divmod(fraction_units, per_second)
    text = f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
    if fraction:
        text += "." + f"{fraction:0{digits}d}".rstrip("0")
    return text


def _format_timestamp(count: int, digits: int, *, utc: bool) -> str:
    per_day = 86_400 * 10**digits
    days, of_day = divmod(count, per_day)
    text = f"{_format_date(days)} {_format_time(of_day, digits)}"
    return text + "+00:00" if utc else text


def _json_primitive(info: int, payload: Any) -> str:
    if info <= _FALSE:
        return "null" if info == _NULL else ("true" if payload else "false")
    if info <= _INT64:
        return str(payload)
    if info in (_DOUBLE, _FLOAT):
        text = java_double_text(payload, single=info == _FLOAT)
        return text if math.isfinite(payload) else f'"{text}"'
    if info in _DECIMAL_LIMITS:
        return _decimal_text(*payload)
    if info == _STRING:
        return json_string(payload)
    if info == _BINARY:
        return '"' + base64.b64encode(payload).decode("ascii") + '"'
    if info == _DATE:
        return f'"{_format_date(payload)}"'
    if info in (_TIMESTAMP, _TIMESTAMP_NTZ):
        return f'"{_format_timestamp(payload, 6, utc=info == _TIMESTAMP)}"'
    if info in (_TIMESTAMP_NANOS, _TIMESTAMP_NTZ_NANOS):
        return f'"{_format_timestamp(payload, 9, utc=info == _TIMESTAMP_NANOS)}"'
    if info == _TIME_NTZ:
        if not 0 <= payload < 86_400_000_000:
            raise _malformed(f"time of day {payload} µs is outside one day")
        return f'"{_format_time(payload, 6)}"'
    return f'"{payload}"'  # uuid


def _to_json(value: bytes, pos: int, end: int, keys: tuple[str, ...], out: list[str], depth: int) -> None:
    if pos >= end:
        raise _malformed(f"a value at byte {pos} starts past the end ({end})")
    header = value[pos]
    basic, info = header & 3, header >> 2
    if basic == _PRIMITIVE:
        out.append(_json_primitive(*_primitive(value, pos, end, info)))
        return
    if basic == _SHORT_STRING:
        out.append(json_string(_short_string(value, pos, end, info)))
        return
    if depth >= MAX_DEPTH:
        raise _malformed(f"objects and arrays nest deeper than {MAX_DEPTH} levels")
    layout = _container(value, pos, end, basic, info)
    if basic == _ARRAY:
        out.append("[")
        for i in range(layout.count):
            if i:
                out.append(",")
            _to_json(value, layout.element(value, i), layout.data_end, keys, out, depth + 1)
        out.append("]")
        return
    names = [_key(keys, layout.field_id(value, i)) for i in range(layout.count)]
    _check_unique(names)
    out.append("{")
    for i, name in enumerate(names):
        if i:
            out.append(",")
        out.append(json_string(name))
        out.append(":")
        _to_json(value, layout.element(value, i), layout.data_end, keys, out, depth + 1)
    out.append("}")


def variant_to_json(metadata: bytes, value: bytes) -> str:
    """The JSON text of a variant, as Spark's ``to_json`` gives it (see the module docstring).

    Raises:
        DataFileError: if the bytes break the encoding.
    """
    out: list[str] = []
    _to_json(value, 0, len(value), metadata_keys(metadata), out, 0)
    return "".join(out)


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
