"""The ``encoding=avro`` form of Kafka messages: Avro in Confluent's wire format, schemas in a Schema Registry.

Every key and every value is Confluent's wire format: a zero *magic byte*, the schema id as 4 bytes
big-endian, then the Avro binary encoding of the datum (Confluent's "Wire format" documentation).
Schemas are registered under the *topic-name strategy*: ``<topic>-key`` and ``<topic>-value``.

What is encoded is exactly what the JSON encodings carry (:mod:`sinks.kafka.encoding`,
:mod:`sinks.kafka.debezium`), with the Connect schemas of ``schemas=true`` made Avro schemas as
Confluent's ``AvroConverter`` makes them (:mod:`sinks.kafka.avro_schema`): Debezium's record names
(``SERVER.DB.TABLE.Envelope``, ``.Value``, ``.Key``), Debezium's and Connect's logical types under
``time_mode`` and ``decimal_mode``. The ``json`` format's value is the record ``SERVER.DB.TABLE.Value``
of every column, the change columns included, its values under the same modes. Tombstones stay null.

A new Arrow schema of the rows (a schema change of the table) registers its Avro schemas: the
registry keeps them as new versions of the subjects, or refuses one under the subject's
compatibility rule; the refusal is a :class:`~state.errors.SinkError` naming the columns that break
the rule. Schema ids are cached (one registry request per new schema, never one per message).

A batch's keys and values are written all at once, column by column (:mod:`sinks.kafka.avro_columns`);
what that path does not write (maps, a value that does not fit its schema) is written message by
message with ``fastavro.schemaless_writer``, which also names the value that does not fit.
"""

from __future__ import annotations

import importlib
import io
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.sinks.json_text import EncodedBatch, joined_objects
from deltatail.sinks.kafka.avro_options import AvroOptions
from deltatail.sinks.kafka.avro_schema import AvroSchema, to_avro
from deltatail.sinks.kafka.connect_schema import struct_schema
from deltatail.sinks.kafka.debezium import EVENT_FORMATS, POSITION_KEY_SCHEMA, EventEncoder, EventOptions
from deltatail.sinks.kafka.encoding import ChangeEncoder, wall_clock_ms
from deltatail.sinks.kafka.event_columns import mode_text
from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.registry import Refused, RegistryClient
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, TableInfo


@dataclass(frozen=True, slots=True)
class _Writer:
    """One registered Avro schema: the wire-format header and how to write payloads after it."""

    header: bytes
    connect: dict[str, Any]
    parsed: Any
    schema: AvroSchema
    writer: Callable[[Any, Any, Any], None]
    columns: Callable[[dict[str, Any], bytes, Sequence[bytes]], list[bytes] | None]

    def write_all(self, payloads: Sequence[bytes]) -> list[bytes]:
        """Each payload framed and written: the whole batch column by column where it can, else one by one."""
        written = self.columns(self.connect, self.header, payloads)
        return written if written is not None else [self.write(p) for p in payloads]

    def write(self, payload: bytes) -> bytes:
        datum = orjson.loads(payload)
        if self.schema.convert is not None:
            datum = self.schema.convert(datum)
        out = io.BytesIO()
        out.write(self.header)
        self.writer(out, self.parsed, datum)
        return out.getvalue()


class AvroEncoder:
    """Encodes change batches of one table as Avro keys and values (see the module docstring).

    Args:
        table: the table the rows belong to.
        topic: the topic (its subjects are ``<topic>-key`` and ``<topic>-value``).
        registry: the Schema Registry client.
        format: ``json``, ``debezium`` or ``flat``.
        key_columns: the key columns (empty: position keys).
        tombstones: a null value after each delete's event.
        events: options of the formats; ``schemas`` is ignored (the registry holds the schemas).
        clock_ms: the encoding time (Debezium's ``ts_ms``).

    Raises:
        ConfigError: as :class:`~sinks.kafka.encoding.ChangeEncoder`; if fastavro or numpy is not installed.
    """

    def __init__(
        self,
        table: TableInfo,
        *,
        topic: str,
        registry: RegistryClient,
        format: str,
        key_columns: Sequence[str],
        tombstones: bool,
        events: EventOptions,
        clock_ms: Callable[[], int],
    ) -> None:
        try:
            self._fastavro = importlib.import_module("fastavro")
        except ImportError:
            raise ConfigError("encoding=avro needs the package fastavro: pip install 'deltatail[avro]'") from None
        try:
            self._columns = importlib.import_module("deltatail.sinks.kafka.avro_columns").encode_payloads
        except ImportError:
            raise ConfigError("encoding=avro needs the package numpy: pip install 'deltatail[avro]'") from None
        events = replace(events, schemas=False)
        self.table = table
        self.topic = topic
        self.registry = registry
        self.format = format
        self.key_columns = tuple(key_columns)
        self.options = events
        self._json = ChangeEncoder(
            table, format=format, key_columns=key_columns, tombstones=tombstones, clock_ms=clock_ms, events=events
        )
        self._events = EventEncoder(table, format, key_columns, events, clock_ms) if format in EVENT_FORMATS else None
        self._writers: dict[pa.Schema, tuple[_Writer, _Writer]] = {}
        self._others: dict[str, tuple[_Writer, _Writer]] = {}

    def encode(self, batch: ChangeBatch, operation: str | None = None) -> EncodedBatch:
        """Encode every row of ``batch`` (registering its schemas first if they are new).

        Raises:
            SinkError: as :meth:`ChangeEncoder.encode <sinks.kafka.encoding.ChangeEncoder.encode>`; if the
                registry refuses a schema (naming the columns and the rule) or a value does not fit it.
            SinkUnavailableError: if the Schema Registry cannot be reached (nothing of the batch is sent).
        """
        encoded = self._json.encode(batch, operation)
        if not len(encoded):
            return encoded
        value_writer, key_writer = self._writers_of(batch)
        keys, values = encoded.keys, encoded.values
        if self.format not in EVENT_FORMATS:
            keys, values = self._json_texts(batch, encoded)
        try:
            out_keys = key_writer.write_all(keys)
            out_values = _with_nulls(values, value_writer.write_all([v for v in values if v is not None]))
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise SinkError(
                f"a row of the batch at {batch.start} does not fit its Avro schema: {e}",
                table=self.table.path,
                version=batch.start.version,
            ) from e
        return EncodedBatch(encoded.rows, out_keys, out_values, encoded.change_types)

    def encode_other(
        self, topic: str, schemas: tuple[dict[str, Any], dict[str, Any]], key: bytes, value: bytes
    ) -> tuple[bytes, bytes]:
        """A JSON ``key`` and ``value`` of another topic (transaction events) in Avro, Connect ``schemas`` (key, value).

        Raises:
            SinkError: if the registry refuses a schema or the message does not fit it.
            SinkUnavailableError: if the Schema Registry cannot be reached.
        """
        writers = self._others.get(topic)
        if writers is None:
            try:
                writers = (
                    self._writer(f"{topic}-key", schemas[0], "the key"),
                    self._writer(f"{topic}-value", schemas[1], "the value"),
                )
            except SinkError as e:
                raise e.at(table=self.table.path) from e
            self._others[topic] = writers
        return writers[0].write(key), writers[1].write(value)

    def _json_texts(self, batch: ChangeBatch, encoded: EncodedBatch) -> tuple[list[bytes], list[bytes | None]]:
        """The ``json`` format's keys and values under the value modes (the JSON encoding has none)."""
        n, rows, modes = len(batch), batch.rows, self.options.modes
        texts = _binary_list(joined_objects(n, rows.schema.names, [mode_text(c, modes) for c in rows.columns]))
        values = [None if v is None else texts[r] for r, v in zip(encoded.rows, encoded.values, strict=True)]
        if not self.key_columns:
            return encoded.keys, values
        key_texts = [mode_text(rows.column(c), modes) for c in self.key_columns]
        keys = _binary_list(joined_objects(n, self.key_columns, key_texts))
        return [keys[r] for r in encoded.rows], values

    def _writers_of(self, batch: ChangeBatch) -> tuple[_Writer, _Writer]:
        found = self._writers.get(batch.rows.schema)
        if found is not None:
            return found
        try:
            value_connect, key_connect = self._connect_schemas(batch.rows.schema)
            found = (
                self._writer(f"{self.topic}-value", value_connect, "the value"),
                self._writer(f"{self.topic}-key", key_connect, "the key"),
            )
        except SinkError as e:
            raise e.at(table=self.table.path, version=batch.start.version) from e
        if len(self._writers) > 64:
            self._writers.clear()
        self._writers[batch.rows.schema] = found
        return found

    def _connect_schemas(self, schema: pa.Schema) -> tuple[dict[str, Any], dict[str, Any]]:
        if self._events is not None:
            return self._events.connect_schemas(schema)
        prefix, modes = self.options.schema_prefix(self.table), self.options.modes
        value = struct_schema(list(schema), modes, name=f"{prefix}.Value", optional=False)
        if not self.key_columns:
            return value, POSITION_KEY_SCHEMA
        key_fields = [schema.field(c) for c in self.key_columns]
        return value, struct_schema(key_fields, modes, name=f"{prefix}.Key", optional=False)

    def _writer(self, subject: str, connect: dict[str, Any], where: str) -> _Writer:
        schema = to_avro(connect, where)
        text = orjson.dumps(schema.schema).decode()
        try:
            schema_id = self.registry.register(subject, text)
        except Refused as e:
            raise SinkError(refusal_message(e, schema.schema)) from e
        header = b"\x00" + schema_id.to_bytes(4, "big")
        parsed = self._fastavro.parse_schema(schema.schema)
        return _Writer(header, connect, parsed, schema, self._fastavro.schemaless_writer, self._columns)


def avro_encoder(
    table: TableInfo, topic: str, options: KafkaOptions, avro: AvroOptions, clock_ms: Callable[[], int] | None
) -> AvroEncoder:
    """The Avro encoder of a sink with ``options`` writing to ``topic``, its registry as ``avro`` says.

    Raises:
        SinkError: if the registry URL is not an http(s) URL or carries credentials.
    """
    return AvroEncoder(
        table,
        topic=topic,
        registry=avro.client(),
        format=options.format,
        key_columns=options.key_columns,
        tombstones=options.tombstones,
        events=options.events,
        clock_ms=clock_ms or wall_clock_ms,
    )


def refusal_message(refused: Refused, new: Any) -> str:
    """``refused``'s message with the columns that differ from the subject's latest schema and the rule."""
    changes = column_changes(refused.previous, new)
    told = "; ".join(changes) if changes else "no column differs from the latest version"
    return (
        f"{refused.message}; the subject's compatibility rule is {refused.rule} and the table's schema changed: {told}"
    )


def column_changes(old: Any, new: Any) -> list[str]:
    """What differs between the columns of two Avro schemas, column by column (added, removed, retyped)."""
    before, after = _columns(old), _columns(new)
    out = []
    for name, (kind, default) in after.items():
        if name not in before:
            how = "with a default" if default else "without a default (a NOT NULL column)"
            out.append(f"column {name!r} was added {how}")
        elif before[name][0] != kind:
            out.append(f"column {name!r} changed type from {before[name][0]} to {kind}")
    out.extend(f"column {name!r} was removed" for name in before if name not in after)
    return out


def _columns(schema: Any) -> dict[str, tuple[str, bool]]:
    """Column name (dotted for nested fields) -> (type text, has default), of a row record.

    The row is the record itself (``json``, ``flat``, keys) or the record of an envelope's ``after``.
    """
    if not isinstance(schema, dict) or schema.get("type") != "record":
        return {}
    fields = {f["name"]: f for f in schema["fields"]}
    if "after" in fields and "op" in fields:
        after = fields["after"]["type"]
        row = next((t for t in after if isinstance(t, dict)), None) if isinstance(after, list) else after
        return _columns(row)
    out: dict[str, tuple[str, bool]] = {}
    for name, member in fields.items():
        out[name] = (_type_text(member["type"]), "default" in member)
    return out


def _type_text(t: Any) -> str:
    if isinstance(t, list):
        others = [x for x in t if x != "null"]
        text = " or ".join(_type_text(x) for x in others)
        return f"{text} (nullable)" if len(others) < len(t) else text
    if isinstance(t, dict):
        if t.get("type") == "record":
            return "record {" + ", ".join(f"{f['name']}: {_type_text(f['type'])}" for f in t["fields"]) + "}"
        if t.get("type") == "array":
            return f"array of {_type_text(t['items'])}"
        if t.get("type") == "map":
            return f"map of {_type_text(t['values'])}"
        return str(t.get("logicalType") or t.get("connect.name") or t["type"])
    return str(t)


def _with_nulls(values: Sequence[bytes | None], written: list[bytes]) -> list[bytes | None]:
    """``written`` (one for each value that is not ``None``) back in the places of ``values``, nulls kept."""
    if len(written) == len(values):
        return list(written)
    each = iter(written)
    return [None if v is None else next(each) for v in values]


def _binary_list(texts: pa.Array) -> list[bytes]:
    return list(pc.cast(texts, pa.binary()).to_pylist())
