"""Audit logs on disk: JSON lines (one event's dict form per line) or Parquet (query columns plus the event).

A JSON-lines log holds exactly :meth:`AuditEvent.to_json <state.audit.AuditEvent.to_json>` per line,
and reads back with :func:`read_audit_log`. A Parquet log has a fixed schema
(:data:`AUDIT_ARROW_SCHEMA`): the fields people filter on as typed columns, and the whole event's
JSON in ``event``, so nothing is lost although writers' free-form fields (parameters, metrics) vary
in type from commit to commit.

:func:`write_audit_log` writes a range's log in one go. A follower appends with
:func:`open_audit_log` instead, exactly once across restarts:

``FILE.jsonl``
    events appended; :meth:`~AuditOutput.flush` fsyncs. On open a torn last line (a crash
    mid-write, never flushed) is cut off and the last complete line tells the version the log
    holds; events up to it are not written again.
``FILE.parquet``
    a directory of part files, ``part-v<first>-v<last>.parquet`` (versions 20 digits wide), one
    per flush, each written to a hidden temporary name, fsynced and renamed; Parquet readers
    (pyarrow, DuckDB, Spark) read the directory as one table. Every :data:`COMPACT_PARTS` parts
    a run writes are merged into one (written, then the merged parts removed; a part inside
    another part's range, left by a crash in between, is removed on open), so a long follow
    leaves one part per :data:`COMPACT_PARTS` flushes and never rewrites older parts.
    On open temporary leftovers are removed and the largest ``last`` is the version held.

Either refuses, on open, a log whose last event belongs to another table.
"""

from __future__ import annotations

import contextlib
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from deltatail.state.alerts import Alert
from deltatail.state.audit import AuditEvent
from deltatail.state.errors import ConfigError, DeltaTailError, InvalidLogError, SinkError
from deltatail.tailer.runtime.files import fsync_dir

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
    """The events of an audit log written by :func:`write_audit_log` or :func:`open_audit_log` (either format).

    Raises:
        DeltaTailError: if the file cannot be read.
        InvalidLogError: if a line or row is not an audit event (the message names the line).
    """
    try:
        if path.endswith(".parquet") and os.path.isdir(path):
            texts: list[str] = []
            for _, _, part in _parts(Path(path)):
                texts += pq.read_table(part, columns=["event"]).column("event").to_pylist()
        elif path.endswith(".parquet"):
            texts = pq.read_table(path, columns=["event"]).column("event").to_pylist()
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


# -- appending ----------------------------------------------------------------------------------

#: A Parquet audit log's parts written by one run are merged into one once there are this many.
COMPACT_PARTS = 64

_PART = re.compile(r"^part-v(\d{20})-v(\d{20})\.parquet$")


class AuditOutput(ABC):
    """Where a follower's audit events (and their alerts) go: a log appended exactly once, or a stream.

    The life cycle is ``open``, then ``write`` per event in version order and ``flush`` (the
    follower saves its cursor only after every output's flush returned), then ``close``.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        #: The last version the output held when opened (``None``: none, or it cannot tell);
        #: nothing up to it is written again.
        self.held: int | None = None

    @abstractmethod
    def open(self, table_id: str) -> int | None:
        """Open (creating it if needed), repair, and return the last version the output holds, if it can tell.

        Raises:
            SinkError: if it cannot be opened or read, or its last entry is not an entry of table ``table_id``.
        """

    @abstractmethod
    def write(self, event: AuditEvent, alerts: Sequence[Alert]) -> None:
        """Append what of ``event`` (and its ``alerts``) the log does not hold yet; durable after :meth:`flush`.

        Raises:
            SinkError: if it cannot be written.
        """

    @abstractmethod
    def flush(self) -> None:
        """Make everything written durable.

        Raises:
            SinkError: if it cannot.
        """

    @abstractmethod
    def close(self) -> None:
        """Release the file (does not flush)."""


class _JsonLines:
    """A JSON-lines file opened for appending, with its torn tail cut off on open."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fh: BinaryIO | None = None

    def open(self) -> bytes | None:
        """Open for appending; the last complete line (``None`` for an empty file).

        Raises:
            OSError: if the file cannot be opened, read or truncated.
        """
        fh = open(self.path, "a+b")  # noqa: SIM115 - held open until close()
        try:
            size = fh.seek(0, os.SEEK_END)
            chunk = min(size, 1 << 22)
            fh.seek(size - chunk)
            tail = fh.read(chunk)
            end = tail.rfind(b"\n")
            if end != len(tail) - 1:
                fh.truncate(size - chunk + end + 1)  # a torn line: never flushed, so never acknowledged
                fh.seek(0, os.SEEK_END)
        except OSError:
            fh.close()
            raise
        self._fh = fh
        if end < 0:
            return None
        return tail[tail.rfind(b"\n", 0, end) + 1 : end]

    def append(self, data: bytes) -> None:
        if self._fh is None:
            raise SinkError("the log is not open", file=self.path)
        try:
            self._fh.write(data)
        except OSError as e:
            raise SinkError(f"cannot write: {e.strerror or e}", file=self.path) from e

    def flush(self) -> None:
        if self._fh is None:
            return
        try:
            self._fh.flush()
            os.fsync(self._fh.fileno())
        except OSError as e:
            raise SinkError(f"cannot flush: {e.strerror or e}", file=self.path) from e

    def close(self) -> None:
        """Close; what a failed flush left in the buffer is dropped (it was never acknowledged)."""
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None


def _check_owner(raw: object, table_id: str, path: str, what: str) -> None:
    table = raw.get("table") if isinstance(raw, dict) else None
    owner = table.get("id") if isinstance(table, dict) else None
    if owner != table_id:
        raise SinkError(
            f"the {what} holds entries of table id {owner}, not of this table ({table_id}); use another file",
            file=path,
        )


class _JsonLinesOutput(AuditOutput):
    """An output appended to one JSON-lines file."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._file = _JsonLines(path)

    def flush(self) -> None:
        """Flush and fsync.

        Raises:
            SinkError: if it cannot.
        """
        self._file.flush()

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class JsonlAuditLog(_JsonLinesOutput):
    """An audit log of JSON lines (``FILE.jsonl``), appended exactly once."""

    def open(self, table_id: str) -> int | None:
        """Open, cut a torn tail, and return the last version held (see :meth:`AuditOutput.open`).

        Raises:
            SinkError: if it cannot be opened, or its last line is not an audit event of table ``table_id``.
        """
        try:
            last = self._file.open()
        except OSError as e:
            raise SinkError(f"cannot open the audit log: {e.strerror or e}", file=self.path) from e
        if last is None:
            return None
        try:
            raw = orjson.loads(last)
            held = AuditEvent.from_json(raw).version
        except (orjson.JSONDecodeError, InvalidLogError) as e:
            self.close()
            raise SinkError(f"the last line of the audit log is not an audit event ({e})", file=self.path) from e
        _check_owner(raw, table_id, self.path, "audit log")
        self.held = held
        return held

    def write(self, event: AuditEvent, alerts: Sequence[Alert]) -> None:
        """Append the event unless the log holds its version.

        Raises:
            SinkError: if the log is not open or cannot be written.
        """
        if self.held is not None and event.version <= self.held:
            return
        self._file.append(orjson.dumps(event.to_json()) + b"\n")


def _parts(directory: Path) -> list[tuple[int, int, Path]]:
    """The part files of a Parquet audit log directory, by version range."""
    found = []
    for entry in directory.iterdir():
        m = _PART.match(entry.name)
        if m:
            found.append((int(m.group(1)), int(m.group(2)), entry))
    return sorted(found)


class ParquetAuditLog(AuditOutput):
    """An audit log of Parquet part files in a directory (``FILE.parquet``), appended exactly once."""

    def __init__(self, path: str, *, compact_parts: int = COMPACT_PARTS) -> None:
        super().__init__(path)
        self.dir = Path(path)
        self.compact_parts = compact_parts
        self._pending: list[AuditEvent] = []
        self._parts: list[tuple[int, int, Path]] = []  # written by this run since the last merge

    def open(self, table_id: str) -> int | None:
        """Create the directory, remove leftovers of a crash, and return the last version held.

        Raises:
            SinkError: if the directory cannot be used, a part cannot be read, or the last part holds
                events of another table.
        """
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            for entry in self.dir.iterdir():
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    entry.unlink()
            parts = _parts(self.dir)
            kept: list[tuple[int, int, Path]] = []
            for first, last, part in parts:
                if any(f <= first and last <= end and p != part for f, end, p in parts):
                    part.unlink()  # merged into a larger part before a crash: its events are there
                else:
                    kept.append((first, last, part))
            if not kept:
                return None
            last_part = kept[-1][2]
            events = pq.read_table(last_part, columns=["event"]).column("event")
            raw = orjson.loads(events[len(events) - 1].as_py())
        except (OSError, pa.ArrowInvalid, orjson.JSONDecodeError, IndexError) as e:
            raise SinkError(f"cannot use the Parquet audit log: {e}", file=self.path) from e
        _check_owner(raw, table_id, self.path, "audit log")
        self.held = kept[-1][1]
        return self.held

    def write(self, event: AuditEvent, alerts: Sequence[Alert]) -> None:
        """Hold the event (unless the log holds its version) until :meth:`flush`."""
        if self.held is not None and event.version <= self.held:
            return
        self._pending.append(event)

    def flush(self) -> None:
        """Write the held events as one part file, atomically; merge this run's parts once there are many.

        Raises:
            SinkError: if a file cannot be written.
        """
        if self._pending:
            events, self._pending = self._pending, []
            first, last = events[0].version, events[-1].version
            self._parts.append((first, last, self._write_part(events_table(events), first, last)))
        if len(self._parts) >= self.compact_parts:
            self._compact()

    def _write_part(self, table: pa.Table, first: int, last: int) -> Path:
        name = f"part-v{first:020d}-v{last:020d}.parquet"
        tmp = self.dir / f".{name}.tmp"
        try:
            pq.write_table(table, tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.dir / name)
            fsync_dir(self.dir)
        except OSError as e:
            raise SinkError(f"cannot write an audit log part: {e.strerror or e}", file=str(self.dir / name)) from e
        return self.dir / name

    def _compact(self) -> None:
        parts = self._parts
        try:
            table = pa.concat_tables([pq.read_table(p, schema=AUDIT_ARROW_SCHEMA) for _, _, p in parts])
        except (OSError, pa.ArrowInvalid) as e:
            raise SinkError(f"cannot read the audit log's parts to merge them: {e}", file=self.path) from e
        merged = self._write_part(table, parts[0][0], parts[-1][1])
        for _, _, part in parts:
            if part != merged:
                part.unlink(missing_ok=True)
        self._parts = []  # the merged part is never rewritten

    def close(self) -> None:
        """Drop what was not flushed."""
        self._pending = []


class AlertLog(_JsonLinesOutput):
    """Alerts as JSON lines (:meth:`Alert.to_json <state.alerts.Alert.to_json>` per line), appended exactly once.

    An alert is held when the file ends with an alert of a later version, or of the same version
    and rule, so a restart repeats no alert, even when it stopped between two alerts of one commit.
    """

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._held_rules: set[str] = set()

    def open(self, table_id: str) -> int | None:
        """Open, cut a torn tail, and return the version of the last alert held.

        Raises:
            SinkError: if it cannot be opened or read, or it ends with an alert of another table.
        """
        try:
            last = self._file.open()
            if last is None:
                return None
            raw = orjson.loads(last)
            if not isinstance(raw, dict) or raw.get("format") != "deltatail.audit.alert/1":
                raise ValueError("not an alert of format deltatail.audit.alert/1")
            _check_owner(raw, table_id, self.path, "alert log")
            held = int(raw["version"])
            rules = self._rules_at(held)
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            self.close()
            raise SinkError(f"cannot use the alert log: its last line: {e}", file=self.path) from e
        except SinkError:
            self.close()
            raise
        self.held, self._held_rules = held, rules
        return held

    def _rules_at(self, version: int) -> set[str]:
        """The rules of the alerts of ``version`` at the end of the file."""
        rules: set[str] = set()
        with open(self.path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - (1 << 22)))
            for line in reversed(fh.read().splitlines()):
                try:
                    raw = orjson.loads(line)
                except orjson.JSONDecodeError:
                    break  # the first (cut) line of the chunk read
                if not isinstance(raw, dict) or raw.get("version") != version:
                    break
                rules.add(str(raw.get("rule")))
        return rules

    def write(self, event: AuditEvent, alerts: Sequence[Alert]) -> None:
        """Append the alerts the log does not hold yet.

        Raises:
            SinkError: if the log is not open or cannot be written.
        """
        for alert in alerts:
            if self.held is not None and (
                alert.version < self.held or (alert.version == self.held and alert.rule in self._held_rules)
            ):
                continue
            self._file.append(orjson.dumps(alert.to_json()) + b"\n")


def open_audit_log(path: str) -> JsonlAuditLog | ParquetAuditLog:
    """The appendable audit log at ``path`` (not opened yet): ``.jsonl`` or ``.parquet`` (see the module docstring).

    Raises:
        ConfigError: if the extension is neither.
    """
    if path.endswith(".jsonl"):
        return JsonlAuditLog(path)
    if path.endswith(".parquet"):
        return ParquetAuditLog(path)
    raise ConfigError(f"an audit log is FILE.jsonl or FILE.parquet, got {path!r}", file=path)
