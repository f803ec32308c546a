"""Kafka Connect schemas as Avro schemas, and Connect JSON payloads as Avro data.

The ``avro`` encoding of the Kafka sink writes what Confluent's ``AvroConverter`` writes for the
Connect schemas of :mod:`sinks.kafka.connect_schema` (the rules of its ``AvroData.fromConnectSchema``):

=========================================== ====================================================
Connect schema                              Avro schema
=========================================== ====================================================
``struct`` named ``a.b.C``                  ``record`` ``C`` in namespace ``a.b`` (a name met a
                                            second time is a reference to the first record);
                                            an unnamed one is ``io.confluent.connect.avro.
                                            ConnectDefault<N>``, ``N`` counting from 1
``int8``/``int16``                          ``int`` with ``connect.type`` ``int8``/``int16``
``int32``/``int64``                         ``int``/``long``
``float32``/``float64``                     ``float``/``double``
``boolean``/``string``/``bytes``            ``boolean``/``string``/``bytes``
``array``                                   ``array``
``map`` (string keys)                       ``map``
``org.apache.kafka.connect.data.Decimal``   ``bytes``, ``logicalType`` ``decimal`` (``precision``,
                                            ``scale``): the unscaled value, big-endian
``org.apache.kafka.connect.data.Date``      ``int``, ``logicalType`` ``date``
``org.apache.kafka.connect.data.Timestamp`` ``long``, ``logicalType`` ``timestamp-millis``
other names (Debezium's ``io.debezium.*``)  the type itself with ``connect.name``,
                                            ``connect.version`` and ``connect.parameters``
optional                                    union ``["null", T]``, default ``null``
=========================================== ====================================================

Every named Connect type keeps ``connect.name`` (and ``connect.version``, ``connect.parameters``), as
the converter writes them. Field names that Avro does not allow (``[A-Za-z_][A-Za-z0-9_]*``) are
made Avro-safe as Debezium's ``field.name.adjustment.mode=avro`` does: every other character becomes
``_``, and a leading digit gets a ``_`` before it; two columns that become the same name are refused.
The data: a payload decoded from Connect JSON becomes the Avro datum by base64-decoding ``bytes``
(binary columns, decimals), renaming adjusted fields, and naming the branch of each optional
record (fastavro's tuple notation, ``(NAME, VALUE)``), which spares fastavro a search of the union.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deltatail.sinks.kafka.connect_schema import CONNECT_DATE, CONNECT_DECIMAL, CONNECT_TIMESTAMP
from deltatail.state.errors import SinkError

#: Turns a decoded Connect JSON payload into the Avro datum (``None``: the payload is the datum).
Converter = Callable[[Any], Any] | None

_PRIMITIVES = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "long",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "bytes",
}
_LOGICAL = {CONNECT_DATE: "date", CONNECT_TIMESTAMP: "timestamp-millis"}
_NOT_AVRO = re.compile(r"[^A-Za-z0-9_]")
DEFAULT_NAMESPACE = "io.confluent.connect.avro"


def avro_name(name: str) -> str:
    """``name`` made a legal Avro name (see the module docstring)."""
    safe = _NOT_AVRO.sub("_", name) or "_"
    return "_" + safe if safe[0].isdigit() else safe


@dataclass(slots=True)
class AvroSchema:
    """An Avro schema made from a Connect schema, and how to turn its payloads into Avro data.

    Attributes:
        schema: the Avro schema (JSON-ready).
        convert: turns a decoded payload into the datum; ``None`` when the payload already is it.
    """

    schema: Any
    convert: Converter


@dataclass(slots=True)
class _Context:
    defined: dict[str, Converter] = field(default_factory=dict)  # record full name -> its converter
    anonymous: int = 0


def to_avro(connect: dict[str, Any], where: str = "the value") -> AvroSchema:
    """The Avro schema of the Connect schema ``connect`` and its payload converter.

    Args:
        connect: a Connect schema (``{"type": "struct", "fields": [...], ...}``).
        where: names the schema in errors (``the key``, ``the value``).

    Raises:
        SinkError: if two fields of one struct have the same Avro-safe name.
    """
    return _convert(connect, _Context(), where)


def _convert(connect: dict[str, Any], context: _Context, where: str) -> AvroSchema:
    plain = _plain(connect, context, where)
    if not connect.get("optional"):
        return plain
    inner = plain.convert
    if connect["type"] == "struct":  # name the union's branch (fastavro's tuple notation): no branch search
        name = _full_name(plain.schema)
        return AvroSchema(["null", plain.schema], _named_branch(name, inner))
    return AvroSchema(["null", plain.schema], None if inner is None else _or_none(inner))


def _full_name(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    return f"{schema['namespace']}.{schema['name']}" if "namespace" in schema else str(schema["name"])


def _named_branch(name: str, inner: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    if inner is None:
        return lambda value: None if value is None else (name, value)
    return lambda value: None if value is None else (name, inner(value))


def _or_none(inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else inner(value)


def _plain(connect: dict[str, Any], context: _Context, where: str) -> AvroSchema:
    kind = connect["type"]
    if kind == "struct":
        return _record(connect, context, where)
    if kind == "array":
        items = _convert(connect["items"], context, where)
        each = items.convert
        return AvroSchema(
            {"type": "array", "items": items.schema}, None if each is None else lambda v: [each(x) for x in v]
        )
    if kind == "map":  # Connect maps of this sink have string keys (connect_schema._map)
        values = _convert(connect["values"], context, where)
        one = values.convert
        return AvroSchema(
            {"type": "map", "values": values.schema},
            None if one is None else lambda v: {k: one(x) for k, x in v.items()},
        )
    return _primitive(connect, kind)


def _primitive(connect: dict[str, Any], kind: str) -> AvroSchema:
    schema: dict[str, Any] = {"type": _PRIMITIVES[kind]}
    if kind in ("int8", "int16"):
        schema["connect.type"] = kind
    name = connect.get("name")
    if name is not None:
        parameters = connect.get("parameters") or {}
        if name == CONNECT_DECIMAL:
            schema["logicalType"] = "decimal"
            schema["precision"] = int(parameters.get("connect.decimal.precision", 64))
            schema["scale"] = int(parameters["scale"])
        elif name in _LOGICAL:
            schema["logicalType"] = _LOGICAL[name]
        schema["connect.version"] = connect.get("version", 1)
        if parameters:
            schema["connect.parameters"] = dict(parameters)
        schema["connect.name"] = name
    if kind == "bytes":
        return AvroSchema(schema, base64.b64decode)
    if len(schema) == 1:
        return AvroSchema(schema["type"], None)
    return AvroSchema(schema, None)


def _record(connect: dict[str, Any], context: _Context, where: str) -> AvroSchema:
    name = connect.get("name")
    if name is None:
        context.anonymous += 1
        full = f"{DEFAULT_NAMESPACE}.ConnectDefault{context.anonymous}"
    else:
        full = ".".join(avro_name(part) for part in name.split("."))
        if full in context.defined:  # a second use of a named record: a reference by name (same fields)
            return AvroSchema(full, context.defined[full])
    names: dict[str, str] = {}
    fields: list[dict[str, Any]] = []
    converters: list[tuple[str, str, Callable[[Any], Any] | None]] = []
    for member in connect["fields"]:
        column = member["field"]
        safe = avro_name(column)
        if safe in names:
            raise SinkError(
                f"{where}: the columns {names[safe]!r} and {column!r} both become the Avro field name {safe!r}"
            )
        names[safe] = column
        inner = _convert(member, context, f"{where} (column {column!r})")
        entry: dict[str, Any] = {"name": safe, "type": inner.schema}
        if member.get("optional"):
            entry["default"] = None
        fields.append(entry)
        converters.append((safe, column, inner.convert))
    namespace, _, short = full.rpartition(".")
    schema: dict[str, Any] = {"type": "record", "name": short, "fields": fields}
    if namespace:
        schema["namespace"] = namespace
    if name is not None:
        schema["connect.name"] = name
        if "version" in connect:
            schema["connect.version"] = connect["version"]
    convert = None
    if any(safe != column or inner is not None for safe, column, inner in converters):
        convert = _record_converter(converters)
    context.defined[full] = convert
    return AvroSchema(schema, convert)


def _record_converter(converters: list[tuple[str, str, Callable[[Any], Any] | None]]) -> Callable[[Any], Any]:
    def convert(value: dict[str, Any]) -> dict[str, Any]:
        out = {}
        for safe, column, inner in converters:
            item = value.get(column)
            out[safe] = item if inner is None else inner(item)
        return out

    return convert
