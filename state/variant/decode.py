r"""Parquet Variant values decoded: the binary encoding, its metadata dictionary, and Python values.

A variant is two byte strings (Parquet ``VariantEncoding.md``): the *metadata*, a header byte and a
dictionary of field names, and the *value*, a self-describing tree whose first byte gives the basic
type (primitive, short string, object, array) and whose objects name their fields by dictionary id.
This module reads that encoding: the dictionary (:func:`metadata_keys`), the layout of objects and
arrays, primitives, and whole values as Python values (:func:`variant_to_python`). The JSON text
(:mod:`state.variant.json_text`) and the unshredding of Arrow columns
(:mod:`state.variant.shredding`) read values through the helpers here.

Python values (:func:`variant_to_python`): ``None``, ``bool``, ``int``, ``float``,
``decimal.Decimal`` (with the stored scale), ``datetime.date``, ``datetime.datetime`` (aware in
UTC, or naive), ``datetime.time``, ``bytes``, ``str``, ``uuid.UUID``, ``dict``, ``list``;
nanosecond timestamps as :class:`TimestampNanos`, which Python's datetime cannot hold.

Malformed bytes are a :class:`~state.errors.DataFileError` saying what is wrong.
"""

from __future__ import annotations

import datetime
import decimal
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from deltatail.state.errors import DataFileError

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
        """The JSON text of the value without quotes, as :mod:`state.variant.json_text` writes it."""
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


# -- calendar text (nanosecond timestamps here, every date and time in the JSON text) ---------------


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
