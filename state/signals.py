"""On-demand snapshots while streaming (Debezium's ``execute-snapshot`` signal): the request and its rule.

An operator asks for a table's current rows, optionally filtered (``deltatail signal STATE
snapshot --where EXPR``, or a Debezium signal message naming the table). The tailer takes the
request between two commits and delivers it as follows (the rule every function here serves):

1. **Where it is taken.** Picked up when every row of version ``V`` was delivered and none of
   ``V + 1`` yet (the cursor at ``V+1:0``), the snapshot is the table's rows at ``V``, read with
   the run's own filter and the request's ``where`` (both must hold).
2. **Where its rows sit.** Its row ``i`` is at position ``V+1:s<i>`` (:func:`snapshot_position`;
   ``V+1:s<k+i>`` after an earlier snapshot at ``V`` whose positions ended at ``k``): after every
   row of ``V``, before every row of ``V + 1``; the sinks label them as snapshot
   rows (``_change_type`` ``insert`` at ``_commit_version`` ``V``; Debezium ``op: r``,
   ``source.snapshot: "true"``), as they label an initial snapshot's rows.
3. **Without a key, the stream waits, in chunks.** The rows go out in chunks of at most
   ``chunk_rows`` rows, the cursor saved after each; version ``V + 1`` is delivered only after the
   last chunk. So no key's events are reordered: every event of a key before the snapshot row is
   at or before ``V``, every event after it from ``V + 1`` on.
4. **With a key, chunks and commits alternate** (Debezium's incremental snapshot with its
   window dedup). The request records the key columns when it is taken (``key``). A chunk is
   the next ``chunk_rows`` rows of the snapshot at ``V`` (in the order its files are read);
   chunk and commit take turns: after a chunk, the next commit if there is one, then the next
   chunk. A chunk delivered after commit ``W`` (``W >= V``) sits at positions ``W+1:s<i>``
   (``i`` going on from the request's last row: :meth:`SnapshotRequest.position_after`) and
   drops every row whose key had a change row delivered in ``(V, W]`` (:class:`ChangedKeys`):
   that key's newer events already went out, and a key deleted after ``V`` is not resurrected.
   A kept row's value is the key's value at ``W`` too (unchanged since ``V``). The changed keys
   are not saved: a restart rebuilds them by reading the change rows of ``V + 1`` to ``W``
   again. Once they number :data:`MAX_CHANGED_KEYS`, no more commits are interleaved
   (:meth:`ChangedKeys.full`): the rest of the snapshot goes out before the next commit, as
   without a key.
5. **Exactly once across a crash.** The accepted request (its id, filter, chunk size, ``V``,
   and for a keyed one the snapshot rows read and delivered so far and the version the last
   chunk followed: ``read``, ``sent``, ``after``) is saved with the cursor in one atomic write,
   so a restart finds where it was, rebuilds the table's state at the version the cursor
   follows (:func:`resume_version`) and delivers the rest.

A request that is cancelled, or whose files are gone (vacuumed) while it runs, ends there: the
cursor goes on at the next version (``V+1:0``; ``W+1:0`` with a key) and the stream resumes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, StateError
from deltatail.state.filters import MAX_WHERE_CHARS

#: The default and the largest number of rows in one chunk (Debezium's ``incremental.snapshot.chunk.size``
#: defaults to 1024; a Delta file's rows are read in batches of up to 65,536).
DEFAULT_CHUNK_ROWS = 65536
MAX_CHUNK_ROWS = 1_000_000
#: A request id: what the operator or the signal message names it (Debezium's signal ``id``).
MAX_ID_CHARS = 128
_ID = re.compile(r"[A-Za-z0-9._:@-]+")
#: The most keys :class:`ChangedKeys` holds before the stream waits for the rest of a keyed snapshot (rule 4).
MAX_CHANGED_KEYS = 1_000_000
#: The most key columns a request names.
MAX_KEY_COLUMNS = 32


@dataclass(frozen=True, slots=True)
class SnapshotRequest:
    """One on-demand snapshot: asked for (``version is None``) or taken at ``version`` (rule 1).

    Attributes:
        id: the request's id (letters, digits and ``._:@-``; at most :data:`MAX_ID_CHARS`).
        where: a row predicate in the syntax of ``--where`` (:mod:`state.filters`), or ``None``: every row.
        chunk_rows: the most rows delivered between two saves of the cursor (rule 3).
        version: the version the snapshot shows, once a tailer took the request.
        first: the index of its first row's position (rule 2: after an earlier snapshot at the same version).
        key: the key columns chunks are deduplicated by (rule 4); empty: the stream waits (rule 3).
        read: with a key, the rows of the snapshot the delivered chunks were cut from (kept or dropped).
        sent: with a key, the rows delivered so far (the next one's index is ``first + sent``).
        after: with a key, the version after which the last chunk went out (``-1``: none yet); the
            next commit's turn comes when the tailer is still there (rule 4).
    """

    id: str
    where: str | None = None
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    version: int | None = None
    first: int = 0
    key: tuple[str, ...] = ()
    read: int = 0
    sent: int = 0
    after: int = -1

    def taken_at(self, version: int, rows_end: Position | None) -> SnapshotRequest:
        """The request as taken by a tailer that delivered every row up to ``version``.

        ``rows_end`` is the position after the last row delivered: where an earlier snapshot at the
        same version ended, this one's positions start (two snapshots never share a position).
        """
        slot = snapshot_position(version, 0)
        first = rows_end.index if rows_end is not None and rows_end.version == slot.version and rows_end.snapshot else 0
        return replace(self, version=version, first=first)

    def position(self, index: int) -> Position:
        """The position of the snapshot's row ``index`` (rule 2).

        Raises:
            StateError: if the request was not taken.
        """
        if self.version is None:
            raise StateError(f"snapshot request {self.id} was not taken at a version")
        return snapshot_position(self.version, self.first + index)

    def position_after(self, version: int) -> Position:
        """Where the next row of a keyed request goes when the commits up to ``version`` were delivered (rule 4)."""
        return Position.in_snapshot(version + 1, self.first + self.sent)

    def chunk_done(self, read: int, sent: int, after: int) -> SnapshotRequest:
        """The request after a chunk cut from ``read`` snapshot rows, ``sent`` of them delivered after ``after``."""
        return replace(self, read=self.read + read, sent=self.sent + sent, after=after)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what the request file and the cursor file hold)."""
        return {
            "id": self.id,
            "where": self.where,
            "chunk_rows": self.chunk_rows,
            "version": self.version,
            "first": self.first,
            "key": list(self.key),
            "read": self.read,
            "sent": self.sent,
            "after": self.after,
        }

    @staticmethod
    def from_json(raw: Any) -> SnapshotRequest:
        """Parse and check :meth:`to_json` output (:func:`checked`).

        Raises:
            StateError: if ``raw`` is not such a dict, or a value is out of bounds.
        """
        try:
            if not isinstance(raw, dict):
                raise TypeError("not an object")
            request = SnapshotRequest(raw["id"], raw.get("where"), raw.get("chunk_rows", DEFAULT_CHUNK_ROWS))
            version = raw.get("version")
            if version is not None and (type(version) is not int or version < 0):
                raise TypeError("version must be a version number")
            counts = {name: raw.get(name, 0) for name in ("first", "read", "sent")}
            if not all(type(n) is int and n >= 0 for n in counts.values()):
                raise TypeError("first, read and sent must be row counts")
            after = raw.get("after", -1)
            if type(after) is not int or after < -1:
                raise TypeError("after must be a version number or -1")
            key = raw.get("key", [])
            if not isinstance(key, list) or len(key) > MAX_KEY_COLUMNS or not all(isinstance(k, str) for k in key):
                raise TypeError(f"key must be a list of at most {MAX_KEY_COLUMNS} column names")
            return replace(checked(request), version=version, key=tuple(key), after=after, **counts)
        except (KeyError, TypeError, ConfigError) as e:
            raise StateError(f"invalid snapshot request {str(raw)[:200]}: {e}") from None


def checked(request: SnapshotRequest) -> SnapshotRequest:
    """``request`` if its id, filter and chunk size are within bounds.

    Raises:
        ConfigError: naming the value out of bounds.
    """
    if not isinstance(request.id, str) or len(request.id) > MAX_ID_CHARS or not _ID.fullmatch(request.id):
        raise ConfigError(
            f"a signal id is 1 to {MAX_ID_CHARS} letters, digits or ._:@- characters, not {str(request.id)[:200]!r}"
        )
    if request.where is not None and (not isinstance(request.where, str) or len(request.where) > MAX_WHERE_CHARS):
        raise ConfigError(f"a snapshot's where is a predicate of at most {MAX_WHERE_CHARS} characters")
    rows = request.chunk_rows
    if type(rows) is not int or not 1 <= rows <= MAX_CHUNK_ROWS:
        raise ConfigError(f"a snapshot's chunk is 1 to {MAX_CHUNK_ROWS} rows, not {rows!r}")
    return request


def both(run_where: str | None, request_where: str | None) -> str | None:
    """The predicate a snapshot's rows are read with: the run's own and the request's, both holding (rule 1)."""
    if run_where is None or request_where is None:
        return request_where if run_where is None else run_where
    return f"({run_where}) AND ({request_where})"


def snapshot_position(version: int, index: int) -> Position:
    """The position of row ``index`` of a snapshot taken at ``version`` (rule 2): ``version+1:s<index>``."""
    return Position.in_snapshot(version + 1, index)


def resume_version(cursor: Position, request: SnapshotRequest | None) -> int:
    """The version whose state a restart rebuilds before delivering from ``cursor`` (rule 5).

    Inside a taken request's snapshot the cursor reads ``W+1:s<i>`` (``W`` is ``V`` without a key),
    but the state to rebuild is ``W``'s: version ``W + 1`` is not delivered yet. Between a keyed
    request's chunks it reads ``W+1:0``: ``W``'s state too.

    Raises:
        StateError: if the cursor and the request disagree (a cursor file not written by deltatail).
    """
    if request is None or request.version is None:
        return cursor.base_version
    inside = cursor.snapshot and cursor.version == request.version + 1
    if request.key and cursor.version > request.version:
        return cursor.version - 1
    if not inside:
        raise StateError(
            f"the cursor {cursor} is not inside snapshot request {request.id} taken at version {request.version}"
        )
    return request.version


class ChangedKeys:
    """The keys with a change row delivered after a keyed snapshot's version ``V`` (rule 4): its chunks drop them.

    Args:
        columns: the key columns (every change row and snapshot row has them).
        limit: the most keys held; once reached, :meth:`full` (the stream waits for the rest of the snapshot).
    """

    def __init__(self, columns: tuple[str, ...], limit: int = MAX_CHANGED_KEYS) -> None:
        self.columns = columns
        self.limit = limit
        self._keys: set[tuple[Any, ...]] = set()

    def __len__(self) -> int:
        return len(self._keys)

    def full(self) -> bool:
        """Whether no more commits may be interleaved (the keys held reached the limit)."""
        return len(self._keys) >= self.limit

    def add(self, rows: pa.RecordBatch) -> None:
        """Note the keys of delivered change rows (every change type: an insert, an update, a delete).

        Raises:
            ConfigError: if ``rows`` lack a key column.
        """
        self._keys.update(_keys(rows, self.columns))

    def unchanged(self, rows: pa.RecordBatch) -> pa.RecordBatch:
        """The snapshot rows whose key had no change noted, in their order (a chunk, rule 4).

        Raises:
            ConfigError: if ``rows`` lack a key column.
        """
        _check_columns(rows, self.columns)
        if not self._keys or not len(rows):
            return rows
        keep = [k not in self._keys for k in _keys(rows, self.columns)]
        return rows.filter(pa.array(keep, pa.bool_()))


def _keys(rows: pa.RecordBatch, columns: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Each row's key: its key columns' values, nested values as their JSON-like text (hashable)."""
    _check_columns(rows, columns)
    values = [_hashable(rows.column(c)) for c in columns]
    return list(zip(*values, strict=True))


def _check_columns(rows: pa.RecordBatch, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in rows.schema.names]
    if missing:
        raise ConfigError(f"the rows have no key column {', '.join(missing)} (is it left out by --columns?)")


def _hashable(column: pa.Array) -> list[Any]:
    if pa.types.is_nested(column.type):
        return [None if v is None else repr(v) for v in column.to_pylist()]
    if pa.types.is_dictionary(column.type):
        return pc.cast(column, column.type.value_type).to_pylist()  # type: ignore[no-any-return]
    return column.to_pylist()  # type: ignore[no-any-return]


#: The Debezium signal deltatail acts on; others (``log``, ``pause-snapshot``...) are ignored.
EXECUTE_SNAPSHOT = "execute-snapshot"
#: The most data collections one signal may name.
MAX_COLLECTIONS = 1000


def debezium_snapshots(value: Any, request_id: str) -> list[tuple[str, SnapshotRequest]]:
    """The snapshots a Debezium signal asks for: ``(data collection, request)`` for each table it names.

    Debezium's signal (the Kafka signal channel's message value)::

        {"type": "execute-snapshot",
         "data": {"data-collections": ["orders", ...], "type": "incremental",
                  "additional-conditions": [{"data-collection": "orders", "filter": "amount > 10"}]}}

    Each named collection gets a request whose ``where`` is its ``additional-conditions`` filter
    (none: every row) and whose id is ``request_id`` (the same for every collection: each is a
    request of its own table). Another signal type asks for nothing: ``[]``.

    Raises:
        ConfigError: if the value is not such a signal (naming what is wrong), or names more than
            :data:`MAX_COLLECTIONS` collections.
    """
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise ConfigError('a signal is a JSON object with a "type"')
    if value["type"] != EXECUTE_SNAPSHOT:
        return []
    data = value.get("data")
    collections = data.get("data-collections") if isinstance(data, dict) else None
    if not isinstance(collections, list) or not collections or not all(isinstance(c, str) for c in collections):
        raise ConfigError('an execute-snapshot signal names its tables in "data": {"data-collections": [...]}')
    if len(collections) > MAX_COLLECTIONS:
        raise ConfigError(f"an execute-snapshot signal names at most {MAX_COLLECTIONS} data collections")
    conditions: dict[str, str] = {}
    for condition in (data or {}).get("additional-conditions") or []:
        name = condition.get("data-collection") if isinstance(condition, dict) else None
        where = condition.get("filter") if isinstance(condition, dict) else None
        if not isinstance(name, str) or not isinstance(where, str):
            raise ConfigError('each additional condition is {"data-collection": NAME, "filter": PREDICATE}')
        conditions[name] = where
    return [(c, checked(SnapshotRequest(request_id, conditions.get(c)))) for c in dict.fromkeys(collections)]
