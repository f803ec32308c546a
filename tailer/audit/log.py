"""Audit logs on disk: JSON lines (one event's dict form per line) or Parquet (query columns plus the event).

A JSON-lines log holds exactly :meth:`AuditEvent.to_json <state.audit.AuditEvent.to_json>` per line,
and reads back with :func:`read_audit_log`. A Parquet log has a fixed schema
(:data:`AUDIT_ARROW_SCHEMA`): the fields people filter on as typed columns, and the whole event's
JSON in ``event``, so nothing is lost although writers' free-form fields (parameters, metrics) vary
in type from commit to commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from state.audit import AuditEvent
from state.errors import DeltaTailError, InvalidLogError

#: The columns of a Parquet audit log, in order.
AUDIT_ARROW_SCHEMA = pa.schema(
    [
        pa.field("table_id", pa.string()),
        pa.field("version", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("operation", pa.string()),
        pa.field("user", pa.string()),
        pa.field("engine", pa.string()),
        pa.field("predicate", pa.string()),
        pa.field("rows_inserted", pa.int64()),
        pa.field("rows_deleted", pa.int64()),
        pa.field("rows_updated", pa.int64()),
        pa.field("files_added", pa.int64(), nullable=False),
        pa.field("files_removed", pa.int64(), nullable=False),
        pa.field("bytes_added", pa.int64(), nullable=False),
        pa.field("bytes_removed", pa.int64()),
        pa.field("schema_changed", pa.bool_(), nullable=False),
        pa.field("protocol_changed", pa.bool_(), nullable=False),
        pa.field("properties_changed", pa.int32(), nullable=False),
        pa.field("data_change", pa.bool_(), nullable=False),
        pa.field("no_op", pa.bool_(), nullable=False),
        pa.field("event", pa.string(), nullable=False),
    ]
)


def events_table(events: Sequence[AuditEvent]) -> pa.Table:
    """The events as an Arrow table of :data:`AUDIT_ARROW_SCHEMA`."""
    columns: dict[str, list[object]] = {f.name: [] for f in AUDIT_ARROW_SCHEMA}
    for e in events:
        c = e.counts
        row: dict[str, object] = {
            "table_id": e.table_id,
            "version": e.version,
            "timestamp": e.timestamp_ms,
            "operation": e.operation,
            "user": e.user,
            "engine": e.actor.engine_info or e.actor.client_version,
            "predicate": e.predicate,
            "rows_inserted": c.rows_inserted,
            "rows_deleted": c.rows_deleted,
            "rows_updated": c.rows_updated,
            "files_added": c.files_added,
            "files_removed": c.files_removed,
            "bytes_added": c.bytes_added,
            "bytes_removed": c.bytes_removed,
            "schema_changed": e.schema_change is not None,
            "protocol_changed": e.protocol_change is not None,
            "properties_changed": len(e.property_changes),
            "data_change": e.data_change,
            "no_op": e.no_op,
            "event": orjson.dumps(e.to_json()).decode(),
        }
        for name, value in row.items():
            columns[name].append(value)
    return pa.table(columns, schema=AUDIT_ARROW_SCHEMA)


def write_audit_log(events: Iterable[AuditEvent], path: str) -> int:
    """Write ``events`` to ``path``: JSON lines for ``.jsonl``/``.json``, Parquet for ``.parquet``; returns the count.

    Raises:
        DeltaTailError: if the extension is neither, or the file cannot be written (the message names it).
    """
    items = list(events)
    try:
        if path.endswith((".jsonl", ".json")):
            with open(path, "wb") as fh:
                for e in items:
                    fh.write(orjson.dumps(e.to_json()))
                    fh.write(b"\n")
        elif path.endswith(".parquet"):
            pq.write_table(events_table(items), path)
        else:
            raise DeltaTailError("an audit log is .jsonl (JSON lines) or .parquet", file=path)
    except OSError as e:
        raise DeltaTailError(f"cannot write the audit log: {e.strerror or e}", file=path) from e
    return len(items)


def read_audit_log(path: str) -> Iterator[AuditEvent]:
    """The events of an audit log written by :func:`write_audit_log` (either format).

    Raises:
        DeltaTailError: if the file cannot be read.
        InvalidLogError: if a line or row is not an audit event (the message names the line).
    """
    try:
        if path.endswith(".parquet"):
            texts: list[str] = pq.read_table(path, columns=["event"]).column("event").to_pylist()
        else:
            with open(path, "rb") as fh:
                texts = [line.decode() for line in fh if line.strip()]
    except (OSError, pa.ArrowInvalid) as e:
        raise DeltaTailError(f"cannot read the audit log: {e}", file=path) from e
    for number, text in enumerate(texts, start=1):
        try:
            yield AuditEvent.from_json(orjson.loads(text))
        except (orjson.JSONDecodeError, InvalidLogError) as e:
            raise InvalidLogError(f"entry {number} is not an audit event: {e}", file=path) from None
