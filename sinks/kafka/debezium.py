"""Debezium-compatible change events: the envelope, the source block, the flat form, schemas, heartbeats.

Formats (``format=`` of the Kafka sink; :class:`sinks.kafka.encoding.ChangeEncoder` hands both here):

``debezium``
    Debezium's change event envelope, field for field::

        {"before": ROW|null, "after": ROW|null,
         "source": {"version": "0.1.0", "connector": "deltatail", "name": SERVER_NAME,
                    "ts_ms": ..., "snapshot": "true"|"false", "db": DB, "ts_us": ..., "ts_ns": ...,
                    "schema": SCHEMA|null, "table": TABLE,
                    "table_path": ..., "table_id": ..., "commit_version": ..., "operation": ...|null,
                    "index": ...},
         "op": "c"|"u"|"d"|"r", "ts_ms": ..., "ts_us": ..., "ts_ns": ...}

    ``source.version`` is deltatail's version string (Debezium: the connector's version);
    ``name`` the logical server name (``server_name=``, default ``deltatail``; Debezium's
    ``topic.prefix``); ``ts_ms``/``ts_us``/``ts_ns`` the commit's timestamp; ``snapshot``
    ``"true"`` for rows of an initial snapshot (``op`` ``r``), else ``"false"`` (Debezium's
    ``"last"``, ``"first"``... are never written: a sink does not know which batch of a snapshot is
    its last); ``db``/``schema``/``table`` from ``source_db=`` (default ``delta``),
    ``source_schema=`` (default ``null``) and ``source_table=`` (default the table's name).
    deltatail's own fields: ``table_path``, ``table_id``, ``commit_version`` (the Delta version),
    ``operation`` (the commit's Delta operation, ``WRITE``, ``MERGE``, ``DELETE``...; ``null``
    for an initial snapshot or when the tailer did not say, see :meth:`tailer.sink.Sink.commit_started`)
    and ``index`` (the row's index in its commit, or in the snapshot): ``(commit_version, snapshot,
    index)`` is the row's position. The top-level ``ts_ms`` is when the event was encoded
    (``ts_us``, ``ts_ns``: the same instant in finer units). With ``transactions=true`` a
    ``transaction`` block follows ``source`` (:mod:`sinks.kafka.transactions`).

    ``op`` and the pairing of updates: :mod:`sinks.kafka.pairing` (with key columns, the pre- and
    post-image of one key are one ``u`` event, at any commit size; otherwise a pre-image is a
    ``d`` of the old row and a post-image a ``c`` of the new one).

``flat``
    The row itself, as Debezium's ``ExtractNewRecordState`` transform produces it with
    ``add.fields=op,table,commit_version,source.ts_ms`` and ``delete.handling.mode=rewrite``
    (``delete.tombstone.handling.mode=rewrite``; with ``tombstones=true``, ``rewrite-with-tombstone``)::

        {...the row's columns..., "__op": "c"|"u"|"d"|"r", "__table": TABLE,
         "__commit_version": ..., "__source_ts_ms": ..., "__deleted": "true"|"false"}

    A ``d`` event carries the deleted row (the before image) with ``"__deleted": "true"``; every
    other event its after image with ``"false"`` (strings, as the transform writes them). A
    column whose name is one of these five is refused.

With ``schemas=true`` every key and value is wrapped as Kafka Connect's ``JsonConverter`` writes
with ``schemas.enable=true``: ``{"schema": ..., "payload": ...}`` (:mod:`sinks.kafka.connect_schema`).
Schema names follow Debezium's: ``SERVER.DB.TABLE.Envelope`` (``SERVER.SCHEMA.TABLE`` when
``source_schema`` is given), ``.Value``, ``.Key``; the source block is ``deltatail.Source`` and a
position key ``deltatail.Position``. Values follow ``time_mode=`` and ``decimal_mode=``
(:class:`~sinks.kafka.connect_schema.ValueModes`), keys too.

Heartbeats (:func:`heartbeat_message`): key ``{"serverName": SERVER_NAME, "table_id": ...}``, value
``{"ts_ms": ..., "table_path", "table_id", "table", "commit_version", "newest_version",
"seconds_behind"}``: Debezium's heartbeat (schemas ``io.debezium.connector.common.ServerNameKey`` and
``io.debezium.connector.common.Heartbeat``, whose ``ts_ms`` they keep) with deltatail's position.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.sinks.json_text import (
    EncodedBatch,
    Text,
    Wrapped,
    counting_texts,
    joined_objects,
)
from deltatail.sinks.json_text import text_scalar as _scalar
from deltatail.sinks.kafka.connect_schema import ValueModes, schema_name, struct_schema
from deltatail.sinks.kafka.event_columns import mode_text
from deltatail.sinks.kafka.pairing import Events, pair_key
from deltatail.sinks.kafka.pairing import events as batch_events
from deltatail.sinks.kafka.transactions import BLOCK_SCHEMA, block_parts
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import CHANGE_COLUMNS, ChangeBatch, FollowStatus, TableInfo

#: Message formats with Debezium's conventions.
EVENT_FORMATS = ("debezium", "flat")
#: The metadata fields the ``flat`` format adds to each row.
FLAT_FIELDS = ("__op", "__table", "__commit_version", "__source_ts_ms", "__deleted")
#: Default heartbeat topic (a template): Debezium's ``__debezium-heartbeat.<topic.prefix>``.
HEARTBEAT_TOPIC = "__debezium-heartbeat.{server_name}"


def deltatail_version() -> str:
    """The version string of deltatail (``source.version``); ``unknown`` when it is not installed as a package."""
    try:
        return importlib.metadata.version("deltatail")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True)
class EventOptions:
    """Options of the ``debezium`` and ``flat`` formats (the Kafka URI options of the same names).

    Args:
        schemas: wrap keys and values as Kafka Connect's JSON converter does (``schemas=true``).
        modes: how timestamps, dates and decimals are written (``time_mode=``, ``decimal_mode=``).
        server_name: the logical server name (``source.name``, schema names, heartbeat topic).
        source_db: ``source.db``.
        source_schema: ``source.schema``.
        source_table: ``source.table``; default the table's name.
        positions: rows carry their position, written as ``source.index``; ``False`` where they
            do not (the Spark writer: a micro-batch's rows come without one), and ``index`` is ``null``.
        transactions: every event carries a ``transaction`` block, and is one change row
            (:mod:`sinks.kafka.transactions`).
    """

    schemas: bool = False
    modes: ValueModes = field(default_factory=ValueModes)
    server_name: str = "deltatail"
    source_db: str = "delta"
    source_schema: str | None = None
    source_table: str | None = None
    positions: bool = True
    transactions: bool = False

    def table_name(self, table: TableInfo) -> str:
        """``source.table``: the option, else the table's name, else its id."""
        return self.source_table or table.name or table.table_id

    def schema_prefix(self, table: TableInfo) -> str:
        """``SERVER.DB.TABLE`` (``SERVER.SCHEMA.TABLE`` with a schema), Avro-safe: the stem of schema names."""
        return schema_name(self.server_name, self.source_schema or self.source_db, self.table_name(table))


def check_ordering(
    format: str, key_columns: Sequence[str], partitions: int, *, allow_unordered: bool, topic: str, table: str
) -> None:
    """Refuse Debezium-style events without key columns on a topic of several partitions.

    Raises:
        ConfigError: for ``format`` ``debezium`` or ``flat``, no key columns, ``partitions > 1`` and
            no ``allow_unordered``.
    """
    if format not in EVENT_FORMATS or key_columns or partitions <= 1 or allow_unordered:
        return
    raise ConfigError(
        f"format={format} without key= on topic {topic} with {partitions} partitions: each message would be keyed "
        "by its row's position, so the events of one row (its create, the halves of its updates, its delete) "
        "would land in different partitions and consumers would apply them out of order (Flink's debezium-json "
        "fails; a Connect sink may apply a delete before its create). Give key=COL,... (the table's key "
        "columns), or use a topic with one partition, or accept the disorder with allow_unordered=true",
        table=table,
    )


# ---------------------------------------------------------------- encoding --


def _join(length: int, parts: Sequence[str | pa.Array | pa.Scalar | Wrapped]) -> pa.Array:
    """Concatenate per-row texts and constants (neighbouring constants joined first) into one string array."""
    merged: list[str | pa.Array] = []
    for part in parts:
        pieces: Sequence[str | pa.Array | pa.Scalar] = (
            (part.before, part.body, part.after) if isinstance(part, Wrapped) else (part,)
        )
        for piece in pieces:
            if isinstance(piece, pa.Scalar):
                piece = piece.as_py()
            if isinstance(piece, str) and merged and isinstance(merged[-1], str):
                merged[-1] += piece
            else:
                merged.append(piece)
    if len(merged) == 1 and isinstance(merged[0], str):
        return pa.repeat(_scalar(merged[0]), length)
    arrays = [_scalar(p) if isinstance(p, str) else p for p in merged]
    joined: pa.Array = pc.binary_join_element_wise(*arrays, _scalar(""))
    return joined


def _binary_list(texts: pa.Array) -> list[bytes]:
    return list(pc.cast(texts, pa.binary()).to_pylist())


def _dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


class EventEncoder:
    """Encodes change batches into ``debezium`` or ``flat`` messages (see the module docstring).

    Args:
        table: the table the rows belong to.
        format: ``debezium`` or ``flat``.
        key_columns: the key columns (empty: position keys).
        options: the format's options.
        clock_ms: the encoding time in epoch milliseconds (the top-level ``ts_ms``).

    Raises:
        ConfigError: on another format.
    """

    def __init__(
        self,
        table: TableInfo,
        format: str,
        key_columns: Sequence[str],
        options: EventOptions,
        clock_ms: Callable[[], int],
    ) -> None:
        if format not in EVENT_FORMATS:
            raise ConfigError(f"not a Debezium-style format: {format!r}")
        self.table = table
        self.format = format
        self.key_columns = tuple(key_columns)
        self.options = options
        self._clock_ms = clock_ms
        self._version = deltatail_version()
        self._prefix = options.schema_prefix(table)
        self._pair_key = pair_key(format, self.key_columns, transactions=options.transactions)
        self._schemas: dict[tuple[pa.Schema, bool], tuple[str, str]] = {}

    def encode(self, batch: ChangeBatch, change_types: list[str], operation: str | None = None) -> EncodedBatch:
        """Encode ``batch`` (change columns and change types already checked), without tombstones.

        Raises:
            SinkError: if a column has no Connect schema (``schemas=true``), or (``flat``) a column
                is named like one of the format's metadata fields.
        """
        n, rows, modes = len(batch), batch.rows, self.options.modes
        data = [f for f in rows.schema if f.name not in CHANGE_COLUMNS]
        if self.format == "flat":
            self._check_flat_names(batch, data)
        key_texts = self._key_texts(batch)
        events = batch_events(batch, change_types, key_texts if self._pair_key else None)
        texts = [mode_text(rows.column(f.name), modes) for f in data]
        tail = ["}"] if self.format == "debezium" else [""]
        images = joined_objects(n, [f.name for f in data], texts, tail)
        value_schema, key_schema = self._schema_texts(batch, data)
        m = len(events.rows)
        if self.format == "debezium":
            parts = self._envelope_parts(batch, events, images, operation)
        else:
            parts = self._flat_parts(batch, events, images, bool(data))
        if value_schema:
            parts = ['{"schema":' + value_schema + ',"payload":', *parts, "}"]
        values: list[bytes | None] = list(_binary_list(_join(m, parts)))
        keys = key_texts if len(events.rows) == n else key_texts.take(pa.array(events.rows, pa.int64()))
        if key_schema:
            keys = _join(m, ['{"schema":' + key_schema + ',"payload":', keys, "}"])
        return EncodedBatch(events.rows, _binary_list(keys), values, events.change_types)

    # -- keys and events ---------------------------------------------------------

    def _key_texts(self, batch: ChangeBatch) -> pa.Array:
        n = len(batch)
        if self.key_columns:
            modes = self.options.modes
            texts = [mode_text(batch.rows.column(c), modes) for c in self.key_columns]
            return joined_objects(n, self.key_columns, texts)
        start = batch.start
        index = counting_texts(start.index, start.index + n)
        snapshot = "true" if start.snapshot else "false"
        return _join(n, [f'{{"v":{start.version},"i":', index, ',"s":' + snapshot + "}"])

    # -- values ----------------------------------------------------------------------

    def _images(self, events: Events, images: pa.Array) -> tuple[Text | str, Text | str]:
        """The before and after texts of every message."""
        if events.before is not None and events.after is not None:
            return (
                pc.fill_null(images.take(events.before), _scalar("null")),
                pc.fill_null(images.take(events.after), _scalar("null")),
            )
        if isinstance(events.old, bool):
            return (images, "null") if events.old else ("null", images)
        null = _scalar("null")
        return pc.if_else(events.old, images, null), pc.if_else(events.old, null, images)

    def _source_prefix(self, batch: ChangeBatch, operation: str | None) -> str:
        commit_us = _commit_micros(batch.rows.column("_commit_timestamp"))
        options, table = self.options, self.table
        source = {
            "version": self._version,
            "connector": "deltatail",
            "name": options.server_name,
            "ts_ms": None if commit_us is None else commit_us // 1000,
            "snapshot": "true" if batch.start.snapshot else "false",
            "db": options.source_db,
            "ts_us": commit_us,
            "ts_ns": None if commit_us is None else commit_us * 1000,
            "schema": options.source_schema,
            "table": options.table_name(table),
            "table_path": table.path,
            "table_id": table.table_id,
            "commit_version": batch.start.version,
            "operation": operation,
        }
        return _dumps(source)[:-1] + ',"index":'

    def _envelope_parts(self, batch: ChangeBatch, events: Events, images: pa.Array, operation: str | None) -> list[Any]:
        before, after = self._images(events, images)
        ts_ms = self._clock_ms()
        index = _index_text(batch, events) if self.options.positions else "null"
        op: Any = f'"{events.op}"' if isinstance(events.op, str) else Wrapped('"', events.op, '"')
        tx = self.options.transactions and not batch.start.snapshot
        return [
            '{"before":',
            before,
            ',"after":',
            after,
            ',"source":' + self._source_prefix(batch, operation),
            index,
            "}",
            *(block_parts(self.table.table_id, batch.start.version, batch.start.index, events.rows) if tx else []),
            ',"op":',
            op,
            f',"ts_ms":{ts_ms},"ts_us":{ts_ms * 1000},"ts_ns":{ts_ms * 1_000_000}}}',
        ]

    def _flat_parts(self, batch: ChangeBatch, events: Events, images: pa.Array, has_columns: bool) -> list[Any]:
        if events.before is not None and events.after is not None:
            image_rows = pc.coalesce(events.after, events.before)
            image: Any = images.take(image_rows)
        else:
            image = images
        commit_us = _commit_micros(batch.rows.column("_commit_timestamp"))
        source_ms = "null" if commit_us is None else commit_us // 1000
        op: Any = events.op if isinstance(events.op, str) else Wrapped("", events.op, "")
        if isinstance(events.old, bool):
            deleted: Any = "true" if events.old else "false"
        else:
            deleted = pc.if_else(events.old, _scalar("true"), _scalar("false"))
        return [
            image,
            (',"__op":"' if has_columns else '"__op":"'),
            op,
            '","__table":' + _dumps(self.options.table_name(self.table)),
            f',"__commit_version":{batch.start.version},"__source_ts_ms":{source_ms},"__deleted":"',
            deleted,
            '"}',
        ]

    def _check_flat_names(self, batch: ChangeBatch, data: list[pa.Field]) -> None:
        clash = sorted({f.name for f in data} & set(FLAT_FIELDS))
        if clash:
            raise SinkError(
                f"format=flat adds the fields {', '.join(FLAT_FIELDS)} to each row, and the table has a column "
                f"named {', '.join(clash)}; use format=debezium for this table",
                table=self.table.path,
                version=batch.start.version,
            )

    # -- schemas -------------------------------------------------------------------------

    def _schema_texts(self, batch: ChangeBatch, data: list[pa.Field]) -> tuple[str, str]:
        """The value and key schema texts (``""`` without ``schemas``), cached by the batch's Arrow schema."""
        if not self.options.schemas:
            return "", ""
        cache_key = (batch.rows.schema, batch.start.snapshot)
        found = self._schemas.get(cache_key)
        if found is None:
            try:
                found = (_dumps(self._value_schema(data)), _dumps(self._key_schema(batch.rows.schema)))
            except SinkError as e:
                raise e.at(table=self.table.path, version=batch.start.version) from e
            if len(self._schemas) > 64:
                self._schemas.clear()
            self._schemas[cache_key] = found
        return found

    def connect_schemas(self, schema: pa.Schema) -> tuple[dict[str, Any], dict[str, Any]]:
        """The Connect value and key schemas of rows of Arrow ``schema`` (the ``avro`` encoding's source).

        Raises:
            SinkError: if a column has no Connect schema.
        """
        data = [f for f in schema if f.name not in CHANGE_COLUMNS]
        return self._value_schema(data), self._key_schema(schema)

    def _value_schema(self, data: list[pa.Field]) -> dict[str, Any]:
        modes, prefix = self.options.modes, self._prefix
        if self.format == "flat":
            row = struct_schema(data, modes, name=f"{prefix}.Value", optional=False)
            row["fields"] += [
                {"type": "string", "optional": False, "field": "__op"},
                {"type": "string", "optional": False, "field": "__table"},
                {"type": "int64", "optional": False, "field": "__commit_version"},
                {"type": "int64", "optional": True, "field": "__source_ts_ms"},
                {"type": "string", "optional": False, "field": "__deleted"},
            ]
            return row
        return {
            "type": "struct",
            "fields": [
                struct_schema(data, modes, name=f"{prefix}.Value", optional=True, field="before"),
                struct_schema(data, modes, name=f"{prefix}.Value", optional=True, field="after"),
                SOURCE_SCHEMA,
                *([BLOCK_SCHEMA] if self.options.transactions else []),
                {"type": "string", "optional": False, "field": "op"},
                {"type": "int64", "optional": True, "field": "ts_ms"},
                {"type": "int64", "optional": True, "field": "ts_us"},
                {"type": "int64", "optional": True, "field": "ts_ns"},
            ],
            "optional": False,
            "name": f"{prefix}.Envelope",
            "version": 1,
        }

    def _key_schema(self, schema: pa.Schema) -> dict[str, Any]:
        if not self.key_columns:
            return POSITION_KEY_SCHEMA
        fields = [schema.field(c) for c in self.key_columns]
        return struct_schema(fields, self.options.modes, name=f"{self._prefix}.Key", optional=False)


def _commit_micros(column: pa.Array) -> int | None:
    """The commit timestamp in epoch microseconds (first row; a batch is one commit)."""
    first = column.slice(0, 1)
    if pa.types.is_timestamp(column.type):
        first = pc.cast(pc.cast(first, pa.timestamp("us", tz=column.type.tz), safe=False), pa.int64())
    value = first.to_pylist()[0]
    return None if value is None else int(value)


def _index_text(batch: ChangeBatch, events: Events) -> pa.Array:
    base = batch.start.index
    return pc.cast(pa.array([base + r for r in events.rows], pa.int64()), pa.string())


def _required(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "optional": False, "field": name}


def _optional(kind: str, name: str) -> dict[str, Any]:
    return {"type": kind, "optional": True, "field": name}


#: The Connect schema of the ``source`` block.
SOURCE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        _required("string", "version"),
        _required("string", "connector"),
        _required("string", "name"),
        _optional("int64", "ts_ms"),
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Enum",
            "version": 1,
            "parameters": {"allowed": "true,false"},
            "default": "false",
            "field": "snapshot",
        },
        _required("string", "db"),
        _optional("int64", "ts_us"),
        _optional("int64", "ts_ns"),
        _optional("string", "schema"),
        _required("string", "table"),
        _required("string", "table_path"),
        _required("string", "table_id"),
        _required("int64", "commit_version"),
        _optional("string", "operation"),
        _optional("int64", "index"),
    ],
    "optional": False,
    "name": "deltatail.Source",
    "field": "source",
}

#: The Connect schema of a position key ``{"v": version, "i": index, "s": snapshot}``.
POSITION_KEY_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_required("int64", "v"), _required("int64", "i"), _required("boolean", "s")],
    "optional": False,
    "name": "deltatail.Position",
}


# ---------------------------------------------------------------- heartbeats --

HEARTBEAT_KEY_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_required("string", "serverName"), _required("string", "table_id")],
    "optional": False,
    "name": "io.debezium.connector.common.ServerNameKey",
    "version": 1,
}
HEARTBEAT_VALUE_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [
        _required("int64", "ts_ms"),
        _required("string", "table_path"),
        _required("string", "table_id"),
        _required("string", "table"),
        _required("int64", "commit_version"),
        _required("int64", "newest_version"),
        _required("float64", "seconds_behind"),
    ],
    "optional": False,
    "name": "io.debezium.connector.common.Heartbeat",
    "version": 1,
}


def heartbeat_message(
    table: TableInfo, options: EventOptions, status: FollowStatus, now_ms: int
) -> tuple[bytes, bytes]:
    """The key and value of one heartbeat (see the module docstring)."""
    key: dict[str, Any] = {"serverName": options.server_name, "table_id": status.table_id}
    value: dict[str, Any] = {
        "ts_ms": now_ms,
        "table_path": table.path,
        "table_id": status.table_id,
        "table": options.table_name(table),
        "commit_version": status.delivered_version,
        "newest_version": status.newest_version,
        "seconds_behind": float(status.seconds_behind),
    }
    if options.schemas:
        key = {"schema": HEARTBEAT_KEY_SCHEMA, "payload": key}
        value = {"schema": HEARTBEAT_VALUE_SCHEMA, "payload": value}
    return orjson.dumps(key), orjson.dumps(value)
