"""The state root of a service: one state directory per followed table, keyed by table id.

Layout::

    STATE_ROOT/
      <table id>/
        table.json      the table's path (or URI) and name, written when it is first followed
        status.json     where the table stands (state, error, versions): tailer.follow.status_file
        LOCK, cursor.json, snapshot-<v>.parquet    the tailer's own state (tailer.follow.state_store)

A table deleted and recreated at the same path gets a new id; its path is
then registered to another id already, and following it is refused (with
``deltatail reset`` as the way to start it over), never silently begun again.

:func:`probe_state_root` checks that the root can hold state now (``serve`` checks at start and
every few seconds, and stops when it stays unusable).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from deltatail.state.errors import StateError
from deltatail.tailer.follow.status_file import STATUS_FILE, read_status, write_status
from deltatail.tailer.runtime.files import atomic_write

__all__ = ["STATUS_FILE", "TABLE_FILE", "StateRoot", "TableEntry", "read_status", "write_status"]

TABLE_FILE = "table.json"


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One registered table: its id, path, name and state directory."""

    table_id: str
    path: str
    name: str
    directory: Path


class StateRoot:
    """The state root (see the module docstring)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def create(self) -> None:
        """Make the state root if it is not there (checked before a service starts).

        Raises:
            StateError: if it cannot be made (a regular file in its place, a read-only file system, ...).
        """
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StateError(
                f"cannot create the state root: {e.strerror or e}; state_root must be a directory", file=str(self.root)
            ) from None

    def entries(self) -> list[TableEntry]:
        """Every registered table, by name.

        Raises:
            StateError: if a ``table.json`` is unreadable.
        """
        out: list[TableEntry] = []
        if not self.root.is_dir():
            return out
        for directory in sorted(self.root.iterdir()):
            file = directory / TABLE_FILE
            if not file.is_file():
                continue
            try:
                doc = json.loads(file.read_bytes())
                out.append(TableEntry(directory.name, str(doc["path"]), str(doc["name"]), directory))
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise StateError(f"unreadable table registration: {e}", file=str(file)) from e
        return sorted(out, key=lambda e: e.name)

    def register(self, table_id: str, path: str, name: str) -> TableEntry:
        """The state directory of table ``table_id`` at ``path``, created and registered on first use.

        Raises:
            StateError: if ``path`` is registered to another table id (deleted and recreated), or this
                id to another path (two configured tables are one table), or its state directory
                cannot be made (disk full, read-only, a file in the way).
        """
        for entry in self.entries():
            if entry.path == path and entry.table_id != table_id:
                raise StateError(
                    f"{path} was followed as table id {entry.table_id} and now has id {table_id}: it was deleted "
                    f"and recreated; to follow the new table, reset it (deltatail reset {self.root} --table {name} "
                    "--yes)",
                    table=path,
                    file=str(entry.directory),
                )
            if entry.table_id == table_id and entry.path != path:
                raise StateError(
                    f"{path} and {entry.path} are the same table (id {table_id}): follow it once",
                    table=path,
                    file=str(entry.directory),
                )
        directory = self.root / table_id
        file = directory / TABLE_FILE
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if not file.exists():
                atomic_write(file, json.dumps({"path": path, "name": name}, indent=2).encode())
        except OSError as e:
            raise StateError(f"cannot register the table: {e.strerror or e}", table=path, file=str(file)) from None
        return TableEntry(table_id, path, name, directory)

    def forget(self, entry: TableEntry) -> None:
        """Remove a table's registration and state (``deltatail reset``)."""
        for child in entry.directory.iterdir():
            if child.is_file():
                child.unlink()
        entry.directory.rmdir()

    def find(self, key: str) -> TableEntry:
        """The registered table whose name, path or id is ``key``.

        Raises:
            StateError: if none is, or several are.
        """
        matches = [e for e in self.entries() if key in (e.name, e.path, e.table_id)]
        if len(matches) != 1:
            known = ", ".join(e.name for e in self.entries()) or "none"
            what = "no table" if not matches else "several tables"
            raise StateError(f"{what} named {key!r} in this state root (tables: {known})", file=str(self.root))
        return matches[0]


#: The file :func:`probe_state_root` writes and removes in the state root.
PROBE_FILE = ".deltatail-probe"


def probe_state_root(root: Path) -> None:
    """Check that the state root can hold state now: create it if needed, write, fsync and remove a file in it.

    Raises:
        StateError: naming the state root, if any of that fails (a file where the directory should
            be, a read-only or full file system, no file descriptor left...).
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / PROBE_FILE
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"deltatail\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        probe.unlink()
    except OSError as e:
        raise StateError(f"the state root is unusable: {e.strerror or e}", file=str(root)) from e
