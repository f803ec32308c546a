"""deltatail's own checkpoints: a cursor and a saved snapshot in a state directory.

Layout of ``--state-dir``::

    LOCK                      the running tailer's pid (the lock is an flock() on the directory)
    cursor.json               the cursor, the table id, the saved snapshot's version, the on-demand
                              snapshot in progress (if any); CRC-checked
    signal.json               an on-demand snapshot asked for, not yet taken (tailer/follow/signals.py)
    snapshot-<version>.parquet the snapshot at that version, in Delta's checkpoint format

Every file is written atomically: to a temporary file, fsync, rename over the
target, fsync the directory. The cursor file names the snapshot file it goes
with, so a crash between the two writes leaves the previous, consistent pair.
A corrupt or truncated cursor file is an error with a recovery hint, never a
silent restart from version 0.
"""

from __future__ import annotations

import fcntl
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from deltatail.state.actions import DeletionVector
from deltatail.state.cursor import Position
from deltatail.state.errors import StateError
from deltatail.state.files import FileTable
from deltatail.state.signals import SnapshotRequest
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.log.checkpoint import CheckpointState, read_parquet_checkpoint_file
from deltatail.tailer.read.net_changes import ROW_ORDER
from deltatail.tailer.runtime.files import atomic_write, fsync_dir, remove_quietly
from deltatail.tailer.storage import LocalStorage

FORMAT_VERSION = 1
CURSOR_FILE = "cursor.json"


@dataclass(frozen=True, slots=True)
class SavedState:
    """What ``cursor.json`` records."""

    table: str
    table_id: str
    cursor: Position
    snapshot_version: int
    snapshot_file: str
    previous_timestamp_ms: int | None
    #: The position just after the last row delivered before ``cursor`` (``None``: no row yet, or
    #: unknown - a cursor saved by an older deltatail or set by ``deltatail seek``). A sink that
    #: reports holding less than this lost rows (see :meth:`tailer.follow.change_loop.ChangeLoop._open_sink`).
    rows_end: Position | None = None
    #: The on-demand snapshot the cursor is inside (:mod:`state.signals`), saved with it in one write.
    signal: SnapshotRequest | None = None
    #: The order of the rows of a commit netted in passes the cursor counts in
    #: (:data:`~tailer.read.net_changes.ROW_ORDER`; 1 for a cursor saved by an older deltatail).
    row_order: int = ROW_ORDER
    #: ``(version, row order)``: the commit the cursor is inside is read in that earlier row order
    #: (:meth:`tailer.read.feed.ChangeFeed.adopt_row_order`); ``None``: in ``row_order``.
    earlier_order: tuple[int, int] | None = None


def _earlier_order(value: object) -> tuple[int, int] | None:
    """``earlier_order`` as ``cursor.json`` holds it (absent, or ``[version, row order]``).

    Raises:
        ValueError: if it is anything else.
    """
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and all(type(v) is int and v >= 0 for v in value)):
        raise ValueError(f"earlier_order is not [version, row order]: {value!r}"[:200])
    return value[0], value[1]


def _problem(e: OSError) -> str:
    """An OS error in words, without the path (errors name their file separately)."""
    return e.strerror or str(e)


class StateStore:
    """The state directory of one tailer. Use as a context manager to hold its lock."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self._lock_fd: int | None = None

    def __enter__(self) -> StateStore:
        self.lock()
        return self

    def __exit__(self, *exc: object) -> None:
        self.unlock()

    def lock(self) -> None:
        """Take the directory's exclusive lock.

        The lock is an ``flock`` on the state directory itself, not on ``LOCK``: a file can be
        unlinked while a tailer holds it (and a second tailer would then lock a new file of the
        same name), a directory that holds files cannot be removed. ``LOCK`` only records the
        holder's pid, for messages.

        Raises:
            StateError: if another process holds it.
        """
        self.create()
        dir_fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(dir_fd)
            raise StateError(
                f"another tailer (pid {self._holder_pid()}) is running with this state directory; stop it first",
                file=str(self.dir / "LOCK"),
            ) from None
        try:
            fd = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        except BaseException:
            os.close(dir_fd)  # closing the descriptor releases the lock
            raise
        self._lock_fd = dir_fd
        for leftover in self.dir.glob(".*.tmp-*"):
            leftover.unlink(missing_ok=True)  # a write cut short by a crash; the rename never happened

    def _holder_pid(self) -> str:
        """The pid ``LOCK`` names (``unknown`` if it is gone or empty)."""
        try:
            return (self.dir / "LOCK").read_bytes()[:64].decode(errors="replace").strip() or "unknown"
        except OSError:
            return "unknown"

    def create(self) -> None:
        """Make the state directory if it is not there.

        Raises:
            StateError: if it cannot be made (a regular file in its place, a read-only file system, ...).
        """
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            where = f" ({e.filename} is in the way)" if isinstance(e, FileExistsError | NotADirectoryError) else ""
            raise StateError(
                f"cannot create the state directory: {_problem(e)}{where}; --state-dir must be a directory",
                file=str(self.dir),
            ) from None

    def locked_by(self) -> str | None:
        """The pid holding the lock, or ``None`` if no process does (a tailer following the table holds it)."""
        if not self.dir.is_dir() or self._lock_fd is not None:
            return None
        fd = os.open(self.dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return self._holder_pid()
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def unlock(self) -> None:
        """Release the lock (also released by the OS if the process dies)."""
        if self._lock_fd is not None:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- cursor ----------------------------------------------------------------------------------

    def load(self) -> SavedState | None:
        """The saved state, or ``None`` for a new state directory.

        Raises:
            StateError: if ``cursor.json`` cannot be read (a directory in its place, ...), is corrupt,
                truncated, of another format, or names a missing snapshot file; the message says how to
                recover.
        """
        path = self.dir / CURSOR_FILE
        if not path.exists():
            return None
        hint = (
            "the state directory is damaged; restore it from a backup, or start a new state directory "
            "with --starting-version set to the version after the last one your sink holds"
        )
        try:
            try:
                data = path.read_bytes()
            except OSError as e:
                raise StateError(f"{_problem(e)}") from None
            raw = orjson.loads(data)
            body, crc = raw["state"], raw["crc32"]
            if zlib.crc32(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)) != crc:
                raise ValueError("checksum mismatch")
            if body["format"] != FORMAT_VERSION:
                raise ValueError(f"unknown state format {body['format']}")
            saved = SavedState(
                table=body["table"],
                table_id=body["table_id"],
                cursor=Position.from_json(body["cursor"]),
                snapshot_version=int(body["snapshot_version"]),
                snapshot_file=str(body["snapshot_file"]),
                previous_timestamp_ms=body.get("previous_timestamp_ms"),
                rows_end=None if body.get("rows_end") is None else Position.from_json(body["rows_end"]),
                signal=None if body.get("signal") is None else SnapshotRequest.from_json(body["signal"]),
                row_order=int(body.get("row_order", 1)),
                earlier_order=_earlier_order(body.get("earlier_order")),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, StateError) as e:
            damaged = not isinstance(e, StateError)  # a file that reads but is wrong; a read that fails may pass
            raise StateError(f"cannot read the tailer's cursor ({e}); {hint}", permanent=damaged, file=str(path)) from e
        if saved.snapshot_version >= 0 and not (self.dir / saved.snapshot_file).exists():
            raise StateError(
                f"the saved snapshot {saved.snapshot_file} is missing; {hint}", permanent=True, file=str(path)
            )
        return saved

    def save(self, saved: SavedState) -> None:
        """Write ``cursor.json`` atomically, then drop snapshot files it no longer names.

        Raises:
            StateError: if it cannot be written (disk full, read-only, ...); the previous cursor stays.
        """
        body: dict[str, Any] = {
            "format": FORMAT_VERSION,
            "table": saved.table,
            "table_id": saved.table_id,
            "cursor": saved.cursor.to_json(),
            "snapshot_version": saved.snapshot_version,
            "snapshot_file": saved.snapshot_file,
            "previous_timestamp_ms": saved.previous_timestamp_ms,
            "row_order": ROW_ORDER,
        }
        if saved.rows_end is not None:
            body["rows_end"] = saved.rows_end.to_json()
        if saved.signal is not None:
            body["signal"] = saved.signal.to_json()
        if saved.earlier_order is not None:
            body["earlier_order"] = list(saved.earlier_order)
        crc = zlib.crc32(orjson.dumps(body, option=orjson.OPT_SORT_KEYS))
        path = self.dir / CURSOR_FILE
        try:
            atomic_write(path, orjson.dumps({"state": body, "crc32": crc}, option=orjson.OPT_INDENT_2))
        except OSError as e:
            raise StateError(
                f"cannot save the tailer's cursor: {_problem(e)}; the previous cursor is kept, and a restart "
                "after the fault is fixed resumes from it",
                table=saved.table,
                file=str(path),
            ) from None
        for old in self.dir.glob("snapshot-*.parquet"):
            if old.name != saved.snapshot_file:
                old.unlink(missing_ok=True)

    # -- snapshots -------------------------------------------------------------------------------

    def save_snapshot(self, snap: Snapshot) -> str:
        """Write ``snap`` as a Delta-format checkpoint file; returns its file name.

        Raises:
            StateError: if it cannot be written (disk full, read-only, ...); no partial file is left.
        """
        name = f"snapshot-{snap.version:020d}.parquet"
        tmp = self.dir / f".{name}.tmp-{os.getpid()}"
        try:
            pq.write_table(snapshot_table(snap), tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.dir / name)
            fsync_dir(self.dir)
        except OSError as e:
            remove_quietly(tmp)
            raise StateError(
                f"cannot save the snapshot: {_problem(e)}; the previous cursor and snapshot are kept",
                table=snap.table,
                file=str(self.dir / name),
            ) from None
        return name

    def load_snapshot(self, saved: SavedState) -> Snapshot:
        """The snapshot a saved state names (the empty snapshot for version -1).

        Raises:
            StateError: if the file is unreadable.
        """
        if saved.snapshot_version < 0:  # a cursor at version 0 (a seek there): the state before the table
            return Snapshot.empty(saved.table)
        path = self.dir / saved.snapshot_file
        state = CheckpointState()
        try:
            read_parquet_checkpoint_file(LocalStorage(), str(path), state)
            snap = state.to_snapshot(saved.table, saved.snapshot_version)
        except Exception as e:
            raise StateError(
                f"the saved snapshot cannot be read ({e}); start a new state directory", file=str(path)
            ) from e
        return snap


_MAP = pa.map_(pa.string(), pa.string())
_DV = pa.struct(
    [
        ("storageType", pa.string()),
        ("pathOrInlineDv", pa.string()),
        ("offset", pa.int32()),
        ("sizeInBytes", pa.int32()),
        ("cardinality", pa.int64()),
    ]
)
_FILE_FIELDS = [
    ("path", pa.string()),
    ("partitionValues", _MAP),
    ("size", pa.int64()),
    ("deletionVector", _DV),
    ("baseRowId", pa.int64()),
    ("defaultRowCommitVersion", pa.int64()),
]
_PROTOCOL = pa.struct(
    [
        ("minReaderVersion", pa.int32()),
        ("minWriterVersion", pa.int32()),
        ("readerFeatures", pa.list_(pa.string())),
        ("writerFeatures", pa.list_(pa.string())),
    ]
)
_METADATA = pa.struct(
    [
        ("id", pa.string()),
        ("name", pa.string()),
        ("description", pa.string()),
        ("format", pa.struct([("provider", pa.string()), ("options", _MAP)])),
        ("schemaString", pa.string()),
        ("partitionColumns", pa.list_(pa.string())),
        ("configuration", _MAP),
        ("createdTime", pa.int64()),
    ]
)
_DOMAIN = pa.struct([("domain", pa.string()), ("configuration", pa.string()), ("removed", pa.bool_())])
CHECKPOINT_SCHEMA = pa.schema(
    [
        ("protocol", _PROTOCOL),
        ("metaData", _METADATA),
        ("txn", pa.struct([("appId", pa.string()), ("version", pa.int64())])),
        ("domainMetadata", _DOMAIN),
        ("add", pa.struct([*_FILE_FIELDS, ("modificationTime", pa.int64()), ("dataChange", pa.bool_())])),
        ("remove", pa.struct([*_FILE_FIELDS, ("deletionTimestamp", pa.int64()), ("dataChange", pa.bool_())])),
    ]
)


def _dv_struct(dv: DeletionVector) -> dict[str, Any]:
    return {
        "storageType": dv.storage_type,
        "pathOrInlineDv": dv.path_or_inline_dv,
        "offset": dv.offset,
        "sizeInBytes": dv.size_in_bytes,
        "cardinality": dv.cardinality,
    }


def _sparse(n: int, values: dict[int, Any], dtype: pa.DataType) -> pa.Array:
    if not values:
        return pa.nulls(n, dtype)
    return pa.array([values.get(i) for i in range(n)], dtype)


def _absent_as_null(values: list[int]) -> pa.Array:
    array = pa.array(values, pa.int64())
    return pc.if_else(pc.equal(array, pa.scalar(-1, pa.int64())), pa.scalar(None, pa.int64()), array)


def _file_struct(files: FileTable, time_field: str, kind: pa.StructType) -> pa.StructArray:
    """One side of the snapshot (live files or tombstones) as a checkpoint ``add``/``remove`` struct column."""
    cols = files.columns()
    n = len(cols.paths)
    maps = pa.array([None if m is None else list(m.items()) for m in cols.partition_maps], _MAP)
    arrays = {
        # Stored paths are decoded; the checkpoint format holds URI-encoded ones, and only "%" needs it
        # for the reader's percent-decoding to give the same path back.
        "path": pc.replace_substring(pa.array(cols.paths, pa.string()), "%", "%25"),
        "partitionValues": maps.take(pa.array(cols.partition_ids, pa.int64())),
        "size": _absent_as_null(cols.sizes),
        "deletionVector": _sparse(n, {r: _dv_struct(dv) for r, dv in cols.dvs.items()}, _DV),
        "baseRowId": _sparse(n, {r: t[0] for r, t in cols.row_tracking.items()}, pa.int64()),
        "defaultRowCommitVersion": _sparse(n, {r: t[1] for r, t in cols.row_tracking.items()}, pa.int64()),
        time_field: _absent_as_null(cols.timestamps),
        "dataChange": pa.repeat(pa.scalar(False, pa.bool_()), n),
    }
    return pa.StructArray.from_arrays([arrays[f.name] for f in kind], fields=list(kind))


def snapshot_table(snap: Snapshot) -> pa.Table:
    """The snapshot as rows of a Delta classic checkpoint (one action per row), built column by column."""
    p, m = snap.require_valid()
    head: list[dict[str, Any]] = [
        {"protocol": p.to_json()},
        {
            "metaData": {
                "id": m.id,
                "name": m.name,
                "description": m.description,
                "format": {"provider": m.format.provider, "options": m.format.options},
                "schemaString": m.schema_string,
                "partitionColumns": list(m.partition_columns),
                "configuration": m.configuration,
                "createdTime": m.created_time,
            }
        },
    ]
    head += [{"txn": {"appId": app, "version": v}} for app, v in snap.txns.items()]
    head += [
        {"domainMetadata": {"domain": d.domain, "configuration": d.configuration, "removed": False}}
        for d in snap.domains.values()
    ]
    add_type = CHECKPOINT_SCHEMA.field("add").type
    remove_type = CHECKPOINT_SCHEMA.field("remove").type
    adds = _file_struct(snap.files, "modificationTime", add_type)
    removes = _file_struct(snap.tombstones, "deletionTimestamp", remove_type)
    k, a, r = len(head), len(adds), len(removes)
    columns = []
    for field in CHECKPOINT_SCHEMA:
        if field.name == "add":
            columns.append(pa.concat_arrays([pa.nulls(k, add_type), adds, pa.nulls(r, add_type)]))
        elif field.name == "remove":
            columns.append(pa.concat_arrays([pa.nulls(k + a, remove_type), removes]))
        else:
            values = pa.array([row.get(field.name) for row in head], field.type)
            columns.append(pa.concat_arrays([values, pa.nulls(a + r, field.type)]))
    return pa.Table.from_arrays(columns, schema=CHECKPOINT_SCHEMA)
