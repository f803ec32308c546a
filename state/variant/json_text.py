r"""The JSON text of a Parquet Variant value, as Spark's ``to_json`` gives it.

Text follows Spark's ``to_json`` of a variant (``Variant.toJson`` in Spark's ``common/variant``), so
that a change row's JSON equals what Spark shows for the same value:

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

Malformed bytes are a :class:`~state.errors.DataFileError` saying what is wrong.
"""

from __future__ import annotations

import base64
import decimal
import math
import re
import struct
from typing import Any

import orjson

from deltatail.state.variant.decode import (
    _ARRAY,
    _BINARY,
    _DATE,
    _DECIMAL_LIMITS,
    _DOUBLE,
    _FALSE,
    _FLOAT,
    _INT64,
    _NULL,
    _PRIMITIVE,
    _SHORT_STRING,
    _STRING,
    _TIME_NTZ,
    _TIMESTAMP,
    _TIMESTAMP_NANOS,
    _TIMESTAMP_NTZ,
    _TIMESTAMP_NTZ_NANOS,
    MAX_DEPTH,
    _check_unique,
    _container,
    _format_date,
    _format_time,
    _format_timestamp,
    _key,
    _malformed,
    _primitive,
    _short_string,
    metadata_keys,
)

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
