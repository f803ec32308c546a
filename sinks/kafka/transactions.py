"""Debezium's transaction metadata (``provide.transaction.metadata=true``) for Delta commits: ``transactions=true``.

One Delta commit is one transaction, its id ``TABLE_ID:VERSION``. Debezium's rules ("Transaction
metadata" in its documentation), as deltatail writes them:

- a ``BEGIN`` event before the commit's first change event and an ``END`` event after its last, on
  the transaction topic (``transaction_topic=``, default ``{server_name}.transaction``), keyed
  ``{"id": ID}``::

      {"status": "BEGIN", "id": ID, "event_count": null, "data_collections": null, "ts_ms": ...}
      {"status": "END", "id": ID, "event_count": N,
       "data_collections": [{"data_collection": "DB.TABLE", "event_count": N}], "ts_ms": ...}

  ``ts_ms`` is the commit's timestamp; ``DB`` is ``source_schema`` if given, else ``source_db``;
- every change event carries a ``transaction`` block ``{"id": ID, "total_order": K,
  "data_collection_order": K}``, ``K`` counting the commit's events from 1 (one table per
  transaction: both orders are the same).

So that ``K`` and ``N`` are the same in every run (a restart in the middle of a commit resumes at a
row position, and cannot know how earlier runs paired rows into events), every change row is its
own event with ``transactions=true``: the two images of an update are a ``d`` of the old row and a
``c`` of the new one, as without key columns. ``K`` is then the row's index in the commit plus 1,
and ``N`` the commit's row count: the ``END`` of a commit whose rows were written by two runs still
counts them all. Tombstones are not events and carry no block.
"""

from __future__ import annotations

from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.sinks.kafka.connect_schema import schema_name
from deltatail.state.errors import ConfigError
from deltatail.tailer.parse import parse_bool

#: The default transaction topic (a template), Debezium's ``<topic.prefix>.transaction``.
TRANSACTION_TOPIC = "{server_name}.transaction"


def _field(kind: str, name: str, optional: bool = False) -> dict[str, Any]:
    return {"type": kind, "optional": optional, "field": name}


#: The Connect schema of an event's ``transaction`` block (Debezium's ``event.block``).
BLOCK_SCHEMA: dict[str, Any] = {
    "type": "struct",
    "fields": [_field("string", "id"), _field("int64", "total_order"), _field("int64", "data_collection_order")],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


def transaction_id(table_id: str, version: int) -> str:
    """The id of the transaction of commit ``version``: ``TABLE_ID:VERSION``."""
    return f"{table_id}:{version}"


def block_parts(table_id: str, version: int, base: int, rows: list[int]) -> list[Any]:
    """The texts of the ``,"transaction":{...}`` member of each event (``rows``: each event's row in the batch).

    ``base`` is the batch's first row index in the commit.
    """
    orders = pc.cast(pa.array([base + r + 1 for r in rows], pa.int64()), pa.string())
    prefix = ',"transaction":{"id":' + orjson.dumps(transaction_id(table_id, version)).decode() + ',"total_order":'
    return [prefix, orders, ',"data_collection_order":', orders, "}"]


def data_collection(source_db: str, source_schema: str | None, table: str) -> str:
    """Debezium's data collection name of the table: ``DB.TABLE`` (``SCHEMA.TABLE`` with a schema)."""
    return f"{source_schema or source_db}.{table}"


def boundary_message(
    status: str, table_id: str, version: int, ts_ms: int | None, collection: str, count: int | None
) -> tuple[bytes, bytes]:
    """The key and value of a ``BEGIN`` (``count`` ``None``) or ``END`` event."""
    tx = transaction_id(table_id, version)
    collections = None if count is None else [{"data_collection": collection, "event_count": count}]
    value = {"status": status, "id": tx, "event_count": count, "data_collections": collections, "ts_ms": ts_ms}
    return orjson.dumps({"id": tx}), orjson.dumps(value)


def boundary_schemas(server_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Connect key and value schemas of transaction events (Debezium's ``TransactionMetadataKey``/``Value``)."""
    prefix = schema_name(server_name)
    key = {
        "type": "struct",
        "fields": [_field("string", "id")],
        "optional": False,
        "name": f"{prefix}.TransactionMetadataKey",
    }
    collection = {
        "type": "struct",
        "fields": [_field("string", "data_collection"), _field("int64", "event_count")],
        "optional": False,
        "name": f"{prefix}.ConnectDefault",
    }
    value = {
        "type": "struct",
        "fields": [
            _field("string", "status"),
            _field("string", "id"),
            _field("int64", "event_count", True),
            {"type": "array", "items": collection, "optional": True, "field": "data_collections"},
            _field("int64", "ts_ms", True),
        ],
        "optional": False,
        "name": f"{prefix}.TransactionMetadataValue",
    }
    return key, value


class TransactionLog:
    """Which ``BEGIN``/``END`` events one table's sink still has to send, and each commit's row count.

    With ``exactly_once``, :meth:`resume` reads where the transaction topic's partition of the table
    stopped (its last message, if this sink's): a ``BEGIN`` or ``END`` already there is not sent again.

    Args:
        table_id: the table's id (transaction ids, the partition key).
        sink_id: the sink's id (``dt.sink_id`` of the messages it recognises as its own).
    """

    def __init__(self, table_id: str, sink_id: str) -> None:
        self.table_id = table_id
        self.sink_id = sink_id
        self.begun = -1  # the newest version whose BEGIN is sent (or in the topic)
        self.ended = -1  # ... whose END is
        self.rows: dict[int, int] = {}  # version -> rows of the commit seen so far (end index of its last batch)

    def resume(self, headers: dict[str, bytes]) -> None:
        """Take the transaction topic's last message (its headers) into account."""
        sink_id, table_id = headers.get("dt.sink_id"), headers.get("dt.table_id")
        if sink_id != self.sink_id.encode() or table_id != self.table_id.encode():
            return
        version = int(headers.get("dt.version", b"-1"))
        status = headers.get("dt.change_type")
        self.begun = version
        self.ended = version if status == b"END" else version - 1

    def seen(self, version: int, end_index: int, tail_end: int = 0) -> None:
        """Rows of ``version`` up to ``end_index`` (exclusive) were given to the sink (or already held)."""
        self.rows[version] = max(self.rows.get(version, tail_end), end_index)
        if len(self.rows) > 16:
            del self.rows[min(self.rows)]


#: The URI options of transaction metadata.
TRANSACTION_OPTIONS = ("transactions", "transaction_topic")


def transaction_options(raw: dict[str, str], uri: str, fmt: str) -> dict[str, Any]:
    """The :class:`~sinks.kafka.options.KafkaOptions` fields of ``transactions`` and ``transaction_topic``.

    Raises:
        ConfigError: on a value that is not a boolean, ``transactions=true`` with another format than
            ``debezium``, or ``transaction_topic`` without ``transactions=true``.
    """
    on = parse_bool(raw.get("transactions", "false"), name=f"kafka URI {uri!r}: option transactions")
    if on and fmt != "debezium":
        raise ConfigError(
            f"kafka URI {uri!r}: transactions=true needs format=debezium (events with a transaction block)"
        )
    if "transaction_topic" in raw and not on:
        raise ConfigError(f"kafka URI {uri!r}: transaction_topic applies to transactions=true only")
    return {"transactions": on, "transaction_topic": raw.get("transaction_topic") or TRANSACTION_TOPIC}


def commit_ms(column: pa.Array) -> int | None:
    """The commit timestamp (first row of a ``_commit_timestamp`` column) in epoch milliseconds."""
    first = column.slice(0, 1)
    if pa.types.is_timestamp(column.type):
        first = pc.cast(pc.cast(first, pa.timestamp("ms", tz=column.type.tz), safe=False), pa.int64())
    value = first.to_pylist()[0]
    return None if value is None else int(value)
