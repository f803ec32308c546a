"""Kafka Connect JSON-converter schemas for change rows, and the value modes they describe.

Kafka Connect's ``JsonConverter`` with ``schemas.enable=true`` expects every key and value as
``{"schema": SCHEMA, "payload": PAYLOAD}``, where ``SCHEMA`` is a JSON object such as::

    {"type": "struct", "optional": false, "name": "deltatail.delta.orders.Value",
     "fields": [{"type": "int64", "optional": false, "field": "id"}, ...]}

Its type names are ``int8``, ``int16``, ``int32``, ``int64``, ``float32``, ``float64``,
``boolean``, ``string``, ``bytes`` (base64 text in the payload), ``array`` (``items``),
``map`` (``keys``, ``values``; a map with string keys is a JSON object in the payload) and
``struct`` (``fields``, each with its ``field`` name). Logical values carry a semantic ``name``
(and ``version``, ``parameters``), Debezium's where Debezium has one.

How each Delta type is written, by :class:`ValueModes` (the same in the payload, see
:mod:`sinks.kafka.event_columns`, and in the schema, :func:`value_schema`):

=================== ===================================== ===========================================
Delta type          payload                               Connect schema
=================== ===================================== ===========================================
boolean             ``true``/``false``                    ``boolean``
byte/short/int/long number                                ``int8``/``int16``/``int32``/``int64``
float/double        number (shortest text that reads      ``float32``/``float64``
                    back exactly); NaN and infinities
                    are ``null``
string              string                                ``string``
binary              base64 string                         ``bytes``
decimal(p, s)       ``decimal_mode=string``: ``"-1.50"``  ``string``
                    ``precise``: base64 of the unscaled   ``bytes`` named
                    value, big-endian two's complement    ``org.apache.kafka.connect.data.Decimal``
                                                          (``scale``, ``connect.decimal.precision``)
                    ``double``: number                    ``float64``
date                ``time_mode=iso``/``sql``:            ``string``
                    ``"2024-01-02"``
                    ``micros``: days since 1970-01-01     ``int32`` ``io.debezium.time.Date``
                    ``connect``: the same days            ``int32`` ``org.apache.kafka.connect.data.Date``
timestamp           ``iso``: ``"2024-01-02T03:04:05.      ``string`` ``io.debezium.time.ZonedTimestamp``
                    123456Z"``
                    ``sql``: ``"2024-01-02 03:04:05.      ``string``
                    123456Z"`` (Flink's default
                    ``timestamp-format.standard``)
                    ``micros``: microseconds since the    ``int64`` ``io.debezium.time.MicroTimestamp``
                    epoch (UTC)
                    ``connect``: milliseconds (floored)   ``int64``
                                                          ``org.apache.kafka.connect.data.Timestamp``
timestamp_ntz       as timestamp, without the ``Z``       ``string`` (iso, sql); int64 as timestamp
                                                          (micros, connect)
struct              object                                ``struct``
array               array                                 ``array``
map, string keys    object                                ``map`` with ``string`` keys
map, other keys     object whose keys are each key's      ``map`` with ``string`` keys
                    JSON text (``{"1": ...}``)
map, nested keys    array of ``{"key", "value"}``         ``array`` of ``struct`` {``key``, ``value``}
variant             string holding the JSON text          ``string`` ``io.debezium.data.Json``
                    (Spark's ``to_json``); the same for
                    an ``arrow.json`` column
void (null type)    ``null``                              optional ``string``
=================== ===================================== ===========================================

Timestamps in text (``iso``, ``sql``) whose year is above 9999 are written in ISO 8601's expanded
form with a ``+`` (``+10000-01-01T00:00:00.000000Z``), as ``java.time`` writes and reads them;
years before 1 are written with a ``-`` (``-0001-...``; year 0 as ``0000``). Flink's TIMESTAMP
holds years 0000-9999 only: use ``time_mode=micros`` for values outside it. ``micros`` and
``connect`` hold every Delta timestamp exactly (``connect`` drops the microseconds).
Debezium's own ``IsoDate``/``IsoTimestamp`` names are not used: their text carries a ``Z`` that
a date or a timestamp without time zone does not have.

Arrow types that Delta tables do not produce (unsigned 64-bit integers, times of day,
durations, intervals...) have no schema here: :func:`value_schema` raises
:class:`~state.errors.SinkError` naming the column when a schema is asked for.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pyarrow as pa

from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.variant import is_variant_type

TimeMode = Literal["iso", "sql", "micros", "connect"]
DecimalMode = Literal["string", "precise", "double"]
TIME_MODES: tuple[TimeMode, ...] = ("iso", "sql", "micros", "connect")
DECIMAL_MODES: tuple[DecimalMode, ...] = ("string", "precise", "double")

#: Debezium's and Kafka Connect's semantic type names used here.
ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
MICRO_TIMESTAMP = "io.debezium.time.MicroTimestamp"
DEBEZIUM_DATE = "io.debezium.time.Date"
CONNECT_TIMESTAMP = "org.apache.kafka.connect.data.Timestamp"
CONNECT_DATE = "org.apache.kafka.connect.data.Date"
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
DEBEZIUM_JSON = "io.debezium.data.Json"
JSON_EXTENSION = "arrow.json"


@dataclass(frozen=True, slots=True)
class ValueModes:
    """How logical values are written: Debezium's ``time.precision.mode`` and ``decimal.handling.mode``.

    Args:
        time: ``iso`` (ISO-8601 text, the default), ``sql`` (``YYYY-MM-DD HH:MM:SS.ffffff``, Flink's
            default timestamp format), ``micros`` (epoch microseconds and days, Debezium's
            ``adaptive_time_microseconds``) or ``connect`` (epoch milliseconds and days, Kafka
            Connect's own logical types, Debezium's ``connect``).
        decimal: ``string`` (the default), ``precise`` (Connect's ``Decimal``) or ``double``.

    Raises:
        ConfigError: on an unknown mode.
    """

    time: str = "iso"
    decimal: str = "string"

    def __post_init__(self) -> None:
        if self.time not in TIME_MODES:
            raise ConfigError(f"time_mode={self.time!r}; expected one of {', '.join(TIME_MODES)}")
        if self.decimal not in DECIMAL_MODES:
            raise ConfigError(f"decimal_mode={self.decimal!r}; expected one of {', '.join(DECIMAL_MODES)}")


_AVRO_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def schema_name(*parts: str) -> str:
    """A dotted schema name from ``parts``, each made Avro-safe as Debezium does (other characters become ``_``).

    A part that would start with a digit gets a leading ``_``.
    """
    safe = []
    for part in parts:
        text = _AVRO_UNSAFE.sub("_", part) or "_"
        safe.append("_" + text if text[0].isdigit() else text)
    return ".".join(safe)


def is_json_extension(t: pa.DataType) -> bool:
    """Whether ``t`` is Arrow's canonical JSON extension type (how a variant column arrives as JSON text)."""
    return isinstance(t, pa.BaseExtensionType) and t.extension_name == JSON_EXTENSION


def value_schema(
    t: pa.DataType, modes: ValueModes, *, optional: bool, field: str | None = None, where: str = "a column"
) -> dict[str, Any]:
    """The Connect schema of values of Arrow type ``t`` written under ``modes``.

    Args:
        t: the Arrow type of a change-row column (or a nested field of one).
        modes: the value modes the payload is written in.
        optional: whether the value may be null.
        field: the field name, for a member of a struct (the ``field`` key).
        where: names the column in errors.

    Raises:
        SinkError: if ``t`` has no Connect mapping (types Delta tables do not produce).
    """
    schema = _schema(t, modes, where)
    schema["optional"] = optional
    if field is not None:
        schema["field"] = field
    return schema


def struct_schema(
    fields: Sequence[pa.Field], modes: ValueModes, *, name: str | None, optional: bool, field: str | None = None
) -> dict[str, Any]:
    """A Connect ``struct`` schema of Arrow ``fields`` (each optional as the field is nullable).

    Raises:
        SinkError: if a field's type has no Connect mapping.
    """
    schema: dict[str, Any] = {
        "type": "struct",
        "fields": [value_schema(f.type, modes, optional=f.nullable, field=f.name, where=repr(f.name)) for f in fields],
        "optional": optional,
    }
    if name is not None:
        schema["name"] = name
    if field is not None:
        schema["field"] = field
    return schema


def _named(kind: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "name": name, "version": 1, **extra}


def _schema(t: pa.DataType, modes: ValueModes, where: str) -> dict[str, Any]:
    """The schema without ``optional``/``field`` (added by the callers)."""
    if is_json_extension(t) or is_variant_type(t):
        return _named("string", DEBEZIUM_JSON)
    if isinstance(t, pa.BaseExtensionType):
        return _schema(t.storage_type, modes, where)
    if pa.types.is_dictionary(t):
        return _schema(t.value_type, modes, where)
    simple = _simple(t)
    if simple is not None:
        return {"type": simple}
    if pa.types.is_decimal(t):
        if modes.decimal == "string":
            return {"type": "string"}
        if modes.decimal == "double":
            return {"type": "float64"}
        parameters = {"scale": str(t.scale), "connect.decimal.precision": str(t.precision)}
        return _named("bytes", CONNECT_DECIMAL, parameters=parameters)
    if pa.types.is_date(t):
        return _dated(modes)
    if pa.types.is_timestamp(t):
        return _timestamped(t, modes)
    if pa.types.is_struct(t):
        return struct_schema(list(t), modes, name=None, optional=True)
    if pa.types.is_map(t):
        return _map(t, modes, where)
    if _is_list(t):
        items = value_schema(t.value_type, modes, optional=t.value_field.nullable, where=where)
        return {"type": "array", "items": items}
    raise SinkError(f"{where} has Arrow type {t}, which has no Kafka Connect mapping (schemas=true)")


_SIMPLE: dict[pa.DataType, str] = {
    pa.bool_(): "boolean",
    pa.int8(): "int8",
    pa.int16(): "int16",
    pa.int32(): "int32",
    pa.int64(): "int64",
    pa.uint8(): "int16",
    pa.uint16(): "int32",
    pa.uint32(): "int64",
    pa.float16(): "float32",
    pa.float32(): "float32",
    pa.float64(): "float64",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.string_view(): "string",
    pa.binary(): "bytes",
    pa.large_binary(): "bytes",
    pa.binary_view(): "bytes",
    pa.null(): "string",
}


def _simple(t: pa.DataType) -> str | None:
    if pa.types.is_fixed_size_binary(t):
        return "bytes"
    return _SIMPLE.get(t)


def _is_list(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_list(t)
        or pa.types.is_large_list(t)
        or pa.types.is_fixed_size_list(t)
        or pa.types.is_list_view(t)
        or pa.types.is_large_list_view(t)
    )


def _dated(modes: ValueModes) -> dict[str, Any]:
    if modes.time == "micros":
        return _named("int32", DEBEZIUM_DATE)
    if modes.time == "connect":
        return _named("int32", CONNECT_DATE)
    return {"type": "string"}


def _timestamped(t: pa.TimestampType, modes: ValueModes) -> dict[str, Any]:
    if modes.time == "micros":
        return _named("int64", MICRO_TIMESTAMP)
    if modes.time == "connect":
        return _named("int64", CONNECT_TIMESTAMP)
    if modes.time == "iso" and t.tz is not None:
        return _named("string", ZONED_TIMESTAMP)
    return {"type": "string"}


def _map(t: pa.MapType, modes: ValueModes, where: str) -> dict[str, Any]:
    key_t, item = t.key_type, t.item_field
    values = value_schema(item.type, modes, optional=item.nullable, where=where)
    if pa.types.is_nested(key_t):
        entry = pa.struct([pa.field("key", key_t, nullable=False), item.with_name("value")])
        return {"type": "array", "items": struct_schema(list(entry), modes, name=None, optional=False)}
    _schema(key_t, modes, where)  # a key type without a mapping is refused like any other
    return {"type": "map", "keys": {"type": "string", "optional": False}, "values": values}
