"""Turn batches of change rows into Kafka message keys and values, fast.

Values are JSON, made column-wise (:mod:`sinks.json_text`, which states the
value rules: decimals as strings, timestamps as ISO-8601, binary as base64...).
Long batches (:data:`~sinks.json_text.VECTOR_ROWS` rows or more) in the
``json`` format skip Python values altogether and join Arrow-made texts.

Formats (see :class:`ChangeEncoder`):

``json``
    One flat object per change row: every column, including
    ``_change_type``, ``_commit_version`` and ``_commit_timestamp``.

``debezium`` and ``flat``
    Debezium's change event envelope, and the flat row of Debezium's
    ``ExtractNewRecordState``: written by :mod:`sinks.kafka.debezium` (envelope, source
    block, Connect schemas, value modes). ``op`` is ``r`` for rows of an initial
    snapshot, ``c`` for inserts and ``d`` for deletes. Updates: with key columns,
    the ``update_preimage`` and ``update_postimage`` of the same key *within one
    batch* become one ``u`` event (``before`` = pre-image, ``after`` = post-image)
    carried at the position of the later of the two rows; the tailer delivers both
    images of a key in one batch at any commit size (:mod:`sinks.kafka.pairing`). An
    image without a partner — every image when there are no key columns or with
    ``transactions=true``, or the two halves of an update that changed the key
    itself — is emitted on its own as a delete of the old row (pre-image: ``op``
    ``d``, ``before`` only) or a create of the new one (post-image: ``op`` ``c``,
    ``after`` only). A consumer that applies events by key still ends in the
    right state, and the exact change type stays in the message headers.

Keys: with key columns, a JSON object of them (``{"id": 7}``, in the order
given); otherwise the row's position ``{"v": version, "i": index, "s":
snapshot}``, which is stable across replays. Tombstones (``tombstones=True``,
key columns required) are a ``None`` value with the key of each ``delete``
row, right after its event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import orjson
import pyarrow.compute as pc

from deltatail.sinks.json_text import (
    CHANGE_TYPES,
    DELETE,
    VECTOR_ROWS,
    EncodedBatch,
    Text,
    column_texts,
    iter_row_dicts,
    json_objects,
    json_values,
    text_scalar,
)
from deltatail.sinks.kafka.debezium import EVENT_FORMATS, EventEncoder, EventOptions
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import CHANGE_COLUMNS, ChangeBatch, TableInfo

Format = Literal["json", "debezium", "flat"]
FORMATS: tuple[Format, ...] = ("json", "debezium", "flat")


def wall_clock_ms() -> int:
    """Now, in epoch milliseconds (Debezium's ``ts_ms`` by default)."""
    return time.time_ns() // 1_000_000


class ChangeEncoder:
    """Encodes change batches of one table into message keys and values.

    Args:
        table: the table the rows belong to (goes into Debezium ``source``).
        format: ``"json"``, ``"debezium"`` or ``"flat"`` (see the module docstring).
        key_columns: columns forming the message key; empty for position keys.
        tombstones: emit a tombstone after each ``delete`` event.
        clock_ms: the encoding time in epoch milliseconds (Debezium ``ts_ms``);
            injectable for reproducible output.
        events: options of the ``debezium`` and ``flat`` formats (:class:`sinks.kafka.debezium.EventOptions`);
            their defaults if ``None``.

    Raises:
        ConfigError: on an unknown format, duplicate key columns,
            tombstones without key columns (a position key is unique, so a
            tombstone for it would only erase the delete itself), or
            ``schemas`` with the ``json`` format.
    """

    def __init__(
        self,
        table: TableInfo,
        *,
        format: str = "json",
        key_columns: Sequence[str] = (),
        tombstones: bool = False,
        clock_ms: Callable[[], int] = wall_clock_ms,
        events: EventOptions | None = None,
    ) -> None:
        if format not in FORMATS:
            raise ConfigError(f"unknown message format {format!r}; expected one of {', '.join(FORMATS)}")
        if len(set(key_columns)) != len(key_columns):
            raise ConfigError(f"key columns repeat a name: {', '.join(key_columns)}")
        if tombstones and not key_columns:
            raise ConfigError("tombstones need key columns (key=COL,...): a position key never repeats")
        self.table = table
        self.format = format
        self.key_columns = tuple(key_columns)
        self.tombstones = tombstones
        self._clock_ms = clock_ms
        events = events or EventOptions()
        if events.schemas and format not in EVENT_FORMATS:
            raise ConfigError(f"schemas=true needs format=debezium or format=flat, not {format}")
        self._events = EventEncoder(table, format, key_columns, events, clock_ms) if format in EVENT_FORMATS else None

    def encode(self, batch: ChangeBatch, operation: str | None = None) -> EncodedBatch:
        """Encode every row of ``batch``.

        Args:
            batch: the rows.
            operation: the commit's Delta operation (Debezium ``source.operation``), if known.

        Raises:
            SinkError: if a key column or change column is missing, a row has an
                unknown change type (the message names its position), or the
                ``debezium``/``flat`` encoder refuses the batch (:meth:`sinks.kafka.debezium.EventEncoder.encode`).
        """
        if len(batch) == 0:
            return EncodedBatch()
        rows = batch.rows
        self._check_columns(batch)
        column = rows.column("_change_type")
        if self._events is not None:
            change_types = column.to_pylist()
            kinds = set(change_types)
            if not kinds <= CHANGE_TYPES:
                i = next(i for i, ct in enumerate(change_types) if ct not in CHANGE_TYPES)
                raise self._bad_change_type(batch, i, change_types[i])
            return self._with_tombstones(self._events.encode(batch, change_types, operation))
        kinds = pc.unique(column).to_pylist()  # a kernel: no Python string per row to check
        if not set(kinds) <= CHANGE_TYPES:
            change_types = column.to_pylist()
            i = next(i for i, ct in enumerate(change_types) if ct not in CHANGE_TYPES)
            raise self._bad_change_type(batch, i, change_types[i])
        change_types = kinds * len(batch) if len(kinds) == 1 else column.to_pylist()
        if len(batch) >= VECTOR_ROWS:
            # A batch of one kind (the common case) writes its change type's text once.
            one_kind = {"_change_type": text_scalar(orjson.dumps(change_types[0]).decode())} if len(kinds) == 1 else {}
            texts = column_texts(rows, one_kind)
            if texts is not None:
                return self._encode_json_columns(batch, texts, change_types)
        return self._encode_json(batch, self._keys(batch), change_types)

    def _check_columns(self, batch: ChangeBatch) -> None:
        names = set(batch.rows.schema.names)
        for col in (*CHANGE_COLUMNS, *self.key_columns):
            if col not in names:
                raise SinkError(
                    f"change rows starting at {batch.start} have no column {col!r}",
                    table=self.table.path,
                    version=batch.start.version,
                )

    def _encode_json_columns(self, batch: ChangeBatch, texts: dict[str, Text], change_types: list[Any]) -> EncodedBatch:
        """:meth:`_encode_json` from column texts (:func:`json_texts`): the same bytes, without a dict per row."""
        n = len(batch)
        if self.key_columns:
            keys = json_objects(n, self.key_columns, [texts[c] for c in self.key_columns])
        else:
            keys = self._keys(batch)
        values: list[bytes | None] = list(json_objects(n, list(texts), list(texts.values())))
        return self._with_tombstones(EncodedBatch(list(range(n)), keys, values, change_types))

    def _keys(self, batch: ChangeBatch) -> list[bytes]:
        if len(self.key_columns) == 1:
            # One key column: splice each value's JSON into a constant prefix (2x a dict per row).
            prefix, dumps = b"{" + orjson.dumps(self.key_columns[0]) + b":", orjson.dumps
            return [b"%b%b}" % (prefix, dumps(v)) for v in json_values(batch.rows.column(self.key_columns[0]))]
        if self.key_columns:
            cols = [json_values(batch.rows.column(c)) for c in self.key_columns]
            names = self.key_columns
            return list(map(orjson.dumps, iter_row_dicts(names, cols, len(batch))))
        start = batch.start
        snap = b"true" if start.snapshot else b"false"
        return [b'{"v":%d,"i":%d,"s":%s}' % (start.version, i, snap) for i in range(start.index, batch.end.index)]

    def _bad_change_type(self, batch: ChangeBatch, row: int, change_type: object) -> SinkError:
        return SinkError(
            f"unknown change type {change_type!r} at position {batch.position(row)}",
            table=self.table.path,
            version=batch.start.version,
        )

    def _encode_json(self, batch: ChangeBatch, keys: list[bytes], change_types: list[Any]) -> EncodedBatch:
        """The ``json`` format row by row (``change_types`` already checked by :meth:`encode`)."""
        names = batch.rows.schema.names
        columns = [json_values(c) for c in batch.rows.columns]
        values: list[bytes | None] = list(map(orjson.dumps, iter_row_dicts(names, columns, len(batch))))
        out = EncodedBatch(list(range(len(values))), keys, values, change_types)
        return self._with_tombstones(out)

    def _with_tombstones(self, out: EncodedBatch) -> EncodedBatch:
        if not self.tombstones or DELETE not in out.change_types:
            return out
        result = EncodedBatch()
        for row, key, value, ct in zip(out.rows, out.keys, out.values, out.change_types, strict=True):
            result.rows.append(row)
            result.keys.append(key)
            result.values.append(value)
            result.change_types.append(ct)
            if ct == DELETE:
                result.rows.append(row)
                result.keys.append(key)
                result.values.append(None)
                result.change_types.append(ct)
        return result
