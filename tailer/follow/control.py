"""Cursor control, as Kafka Connect's offsets API offers it: where each table stands, moving a cursor, starting over.

Used by ``deltatail status``, ``deltatail seek`` and ``deltatail reset`` on a
``deltatail run`` state directory or on a ``deltatail serve`` state root. A
cursor is moved only while no tailer follows the table (its state directory's
lock is free), and only to a version the log can still give: the same checks as
a start. The sink is not consulted: a sink that reports what it holds (JSON
lines or Parquet files, Kafka with ``exactly_once``) still skips every row it
holds, so seeking backwards re-delivers only into sinks that do not.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, DeltaTailError, StateError, VersionNotFoundError
from deltatail.state.signals import resume_version
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.follow.state_store import CURSOR_FILE, SavedState, StateStore
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.starts import snapshot_before, snapshot_time, table_id, version_at_or_after
from deltatail.tailer.storage import Storage


@dataclass(frozen=True, slots=True)
class TableState:
    """Where one table's tailer stands, as ``deltatail status`` shows it."""

    name: str
    path: str
    directory: str
    table_id: str | None
    cursor: Position | None
    delivered_version: int | None
    latest_version: int | None
    versions_behind: int | None
    seconds_behind: float | None
    state: str
    error: str | None
    #: Seconds the oldest undelivered version stays readable at least (``None``: caught up or unknown).
    readable_seconds: float | None = None
    #: Data losses ``on_data_loss`` went on past, and the versions they passed over (from ``status.json``).
    data_losses: int = 0
    versions_lost: int = 0

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``deltatail status --json`` prints."""
        return {
            "name": self.name,
            "path": self.path,
            "directory": self.directory,
            "table_id": self.table_id,
            "cursor": None if self.cursor is None else self.cursor.to_json(),
            "delivered_version": self.delivered_version,
            "latest_version": self.latest_version,
            "versions_behind": self.versions_behind,
            "seconds_behind": self.seconds_behind,
            "state": self.state,
            "error": self.error,
            "readable_seconds": self.readable_seconds,
            "data_losses": self.data_losses,
            "versions_lost": self.versions_lost,
        }


def describe(
    directory: Path, path: str | None, name: str, storage: Storage | None, recorded: dict[str, Any] | None = None
) -> TableState:
    """Where the tailer of one state directory stands: cursor, the table's latest version, lag, state.

    ``recorded`` is the status the tailer wrote (``status.json``, :mod:`tailer.follow.status_file`);
    its state is taken unless the directory is unlocked while it says the table is following (the
    tailer is gone: ``stopped``). While a tailer holds the directory, its recorded delivered version
    (written within about a second of a delivery) counts when it is past the saved cursor's, which
    only moves at checkpoints; a stopped table shows its cursor, where it resumes. The lag
    (``seconds_behind``) is the age of the oldest version not yet delivered (its commit file's
    modification time: one request), 0 when caught up. A table whose log cannot be read shows the
    error instead of its lag. How long that version stays readable (``readable_seconds``) is the
    retention the tailer recorded (:mod:`state.retention`) less that age; the data losses are the
    recorded counts.
    """
    store = StateStore(str(directory))
    try:
        saved = store.load()
    except StateError as e:
        return TableState(name, path or "", str(directory), None, None, None, None, None, None, "damaged", e.message)
    holder = store.locked_by()
    live = holder is not None and recorded is not None and isinstance(recorded.get("delivered_version"), int)
    table = path or (saved.table if saved is not None else "")
    if not table and live and recorded is not None:
        table = str(recorded.get("table") or "")
    state = "following" if holder is not None else "stopped"
    error = None
    if recorded is not None and isinstance(recorded.get("state"), str):
        if recorded["state"] in ("failed", "unavailable") or holder is not None:
            state = recorded["state"]
        error = recorded.get("error") if state == recorded["state"] else None
    if saved is None and not live:
        return TableState(name, table, str(directory), None, None, None, None, None, None, "not started", error)
    delivered = -1 if saved is None else resume_version(saved.cursor, saved.signal)  # inside a snapshot: its version
    if live and recorded is not None:
        delivered = max(delivered, recorded["delivered_version"])
    latest: int | None = None
    seconds: float | None = None
    try:
        log = DeltaLog(table, storage)
        latest = log.latest_version()
    except Exception as e:
        error = error or f"cannot read the table's log: {e}"
    else:
        seconds = 0.0 if latest <= delivered else _age_of_commit(log, delivered + 1)
    behind = None if latest is None else max(latest - delivered, 0)
    tid, cursor = (None, None) if saved is None else (saved.table_id, saved.cursor)
    recorded = recorded or {}
    return TableState(
        name,
        table,
        str(directory),
        tid,
        cursor,
        delivered,
        latest,
        behind,
        seconds,
        state,
        error,
        readable_seconds=_readable(recorded.get("retention_readable_ms"), seconds if behind else None),
        data_losses=_count(recorded.get("data_losses")),
        versions_lost=_count(recorded.get("versions_lost")),
    )


def _readable(readable_ms: Any, age: float | None) -> float | None:
    """Seconds left of ``readable_ms`` for a commit ``age`` seconds old (``None`` if either is unknown)."""
    if not isinstance(readable_ms, int) or age is None:
        return None
    return round(readable_ms / 1000 - age, 3)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def _age_of_commit(log: DeltaLog, version: int) -> float | None:
    """Seconds since commit ``version``'s file was written (``None``: it cannot be looked at)."""
    try:
        committed = log.storage.stat(log.commit_path(version)).modification_time
    except DeltaTailError:
        return None
    return round(max(time.time() - committed / 1000, 0.0), 3)


def _locked(store: StateStore) -> None:
    holder = store.locked_by()
    if holder is not None:
        raise StateError(
            f"the table is being followed (pid {holder}); stop its tailer before moving its cursor",
            file=str(store.dir / "LOCK"),
        )


def seek(
    directory: Path,
    table: str,
    storage: Storage | None,
    *,
    to_version: int | None = None,
    to_timestamp_ms: int | None = None,
    to_latest: bool = False,
) -> Position:
    """Move a stopped table's cursor to the first row of a version; returns the new cursor.

    Exactly one of ``to_version``, ``to_timestamp_ms`` (the first commit at or after it) and
    ``to_latest`` (only commits after the latest) is given.

    Raises:
        StateError: if the table is being followed, or its state belongs to another table id.
        VersionNotFoundError: if the version is after the latest + 1, or the log no longer holds
            what is needed to start there (cleaned up).
        ConfigError: if not exactly one target is given.
    """
    if sum(x is not None and x is not False for x in (to_version, to_timestamp_ms, to_latest or None)) != 1:
        raise ConfigError("give exactly one of --to-version, --to-timestamp and --to-latest")
    log = DeltaLog(table, storage)
    store = StateStore(str(directory))
    _locked(store)
    with store:
        saved = store.load()
        tid = table_id(log)
        if saved is not None and saved.table_id != tid:
            raise StateError(
                f"this state belongs to table id {saved.table_id}, but {log.table} now has id {tid}: "
                "use deltatail reset to start the new table over",
                table=log.table,
                file=str(directory),
            )
        latest = log.latest_version()
        if to_latest:
            version = latest + 1
        elif to_timestamp_ms is not None:
            version = version_at_or_after(log, to_timestamp_ms)
        else:
            version = int(to_version or 0)
        if version < 0 or version > latest + 1:
            raise VersionNotFoundError(
                f"cannot seek to version {version}: the table's versions are 0..{latest}", table=log.table
            )
        snap = snapshot_before(log, version) if version <= latest else log.snapshot(latest)
        cursor = Position.change(version, 0)
        _save(store, log, tid, snap, cursor)
        return cursor


def reset(directory: Path, table: str, storage: Storage | None) -> Position:
    """Start a table over: a fresh snapshot at its latest version, delivered as ``insert`` rows, then its changes.

    The state's earlier cursor is dropped (also one of a table since deleted and recreated).

    Raises:
        StateError: if the table is being followed.
    """
    log = DeltaLog(table, storage)
    store = StateStore(str(directory))
    _locked(store)
    with store:
        snap = log.snapshot()
        cursor = Position.in_snapshot(snap.version, 0)
        (store.dir / CURSOR_FILE).unlink(missing_ok=True)
        _save(store, log, table_id(log, snap), snap, cursor)
        return cursor


def _save(store: StateStore, log: DeltaLog, tid: str, snap: Snapshot, cursor: Position) -> None:
    if snap.version < 0:  # version 0: the state before the table needs no file
        store.save(SavedState(log.table, tid, cursor, -1, "", None))
        return
    name = store.save_snapshot(snap)
    store.save(SavedState(log.table, tid, cursor, snap.version, name, snapshot_time(log, snap)))
