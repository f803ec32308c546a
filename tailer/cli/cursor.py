"""``deltatail status``, ``seek`` and ``reset``: see and move cursors (:mod:`tailer.follow.control`).

``STATE`` is a ``deltatail run`` state directory (it holds ``cursor.json``) or a
``deltatail serve`` state root (one directory per table); in a state root,
``--table`` names the table (by name, path or id).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import orjson

from deltatail.state.errors import ConfigError
from deltatail.tailer.cli.tables import flag_storage_options
from deltatail.tailer.follow.control import TableState, describe, reset, seek
from deltatail.tailer.follow.state_store import CURSOR_FILE, StateStore
from deltatail.tailer.parse import parse_timestamp_ms
from deltatail.tailer.serve.state_root import StateRoot, read_status
from deltatail.tailer.table import table_storage


def _targets(state: Path, table: str | None) -> list[tuple[Path, str | None, str]]:
    """(directory, table path if registered, name) of the state directories ``STATE`` means."""
    if (state / CURSOR_FILE).exists() or (state / "LOCK").exists():
        return [(state, None, state.name)]
    entries = StateRoot(state).entries()
    if table is not None:
        entry = StateRoot(state).find(table)
        return [(entry.directory, entry.path, entry.name)]
    if not entries:
        raise ConfigError(f"{state} is neither a state directory nor a state root with tables")
    return [(e.directory, e.path, e.name) for e in entries]


def _one(state: Path, table: str | None, command: str) -> tuple[Path, str]:
    targets = _targets(state, table)
    if len(targets) != 1:
        raise ConfigError(f"{command}: name the table with --table (this state root follows several)")
    directory, path, _ = targets[0]
    if path is None:
        saved = StateStore(str(directory)).load()
        if saved is None:
            raise ConfigError(f"{command}: {directory} holds no cursor yet")
        path = saved.table
    return directory, path


def status(args: argparse.Namespace) -> int:
    """Print every table's cursor, version, lag and state."""
    options = flag_storage_options(args)
    rows: list[TableState] = []
    for directory, path, name in _targets(Path(args.state), args.table):
        recorded = read_status(directory)
        table = path
        if table is None:
            saved = StateStore(str(directory)).load()
            table = saved.table if saved is not None else None
        if table is None and recorded is not None and isinstance(recorded.get("table"), str):
            table = recorded["table"]  # a running tailer that has not saved a cursor yet
        store = table_storage(table, options) if table else None
        rows.append(describe(directory, path, name, store, recorded))
    if args.json:
        sys.stdout.buffer.write(orjson.dumps([r.to_json() for r in rows], option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    for r in rows:
        cursor = "-" if r.cursor is None else r.cursor.text()
        lag = "-" if r.versions_behind is None else f"{r.versions_behind} versions"
        seconds = "" if r.seconds_behind is None else f" ({r.seconds_behind:.0f}s: the oldest undelivered commit's age)"
        print(f"{r.name}: {r.state}, cursor {cursor}, latest version {r.latest_version}, {lag} behind{seconds}")
        print(f"  {r.path}")
        if r.readable_seconds is not None:
            print(f"  oldest undelivered version readable for at least {r.readable_seconds:.0f}s more (retention)")
        if r.data_losses:
            print(f"  data lost {r.data_losses} times, {r.versions_lost} versions passed over (on_data_loss)")
        if r.error:
            print(f"  error: {r.error}")
    return 0


def seek_command(args: argparse.Namespace) -> int:
    """Move a stopped table's cursor."""
    directory, table = _one(Path(args.state), args.table, "seek")
    ts = None if args.to_timestamp is None else parse_timestamp_ms(args.to_timestamp, name="--to-timestamp")
    cursor = seek(
        directory,
        table,
        table_storage(table, flag_storage_options(args)),
        to_version=args.to_version,
        to_timestamp_ms=ts,
        to_latest=args.to_latest,
    )
    print(f"{table}: the cursor is at version {cursor.version}; the next start delivers from there")
    return 0


def reset_command(args: argparse.Namespace) -> int:
    """Start a table over from a fresh snapshot, after ``--yes``."""
    if not args.yes:
        raise ConfigError("reset drops the table's cursor and delivers its current rows again: confirm with --yes")
    state = Path(args.state)
    if (state / CURSOR_FILE).exists() or (state / "LOCK").exists():
        directory, table = _one(state, args.table, "reset")
    else:
        root = StateRoot(state)
        if args.table is None:
            raise ConfigError("reset: name the table with --table")
        entry = root.find(args.table)
        directory, table = entry.directory, entry.path
    cursor = reset(directory, table, table_storage(table, flag_storage_options(args)))
    print(f"{table}: starts over with its rows at version {cursor.version}, then the changes after it")
    return 0


def add_parsers(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], add: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The ``status``, ``seek`` and ``reset`` subcommands (``add`` gives each the storage options)."""
    st = sub.add_parser("status", help="each followed table's cursor, version, lag and state")
    st.add_argument("state", help="a run's --state-dir, or a service's state_root")
    st.add_argument("--table", default=None, help="only this table (name, path or id)")
    st.add_argument("--json", action="store_true", help="one JSON document")
    add(st)
    st.set_defaults(handler=status)
    sk = sub.add_parser("seek", help="move a stopped table's cursor")
    sk.add_argument("state", help="a run's --state-dir, or a service's state_root")
    sk.add_argument("--table", default=None, help="the table (name, path or id), in a state root")
    to = sk.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-version", type=int, default=None, help="deliver from this version on")
    to.add_argument("--to-timestamp", default=None, help="from the first commit at or after this time")
    to.add_argument("--to-latest", action="store_true", help="only the commits after the latest one")
    add(sk)
    sk.set_defaults(handler=seek_command)
    rs = sub.add_parser("reset", help="start a table over: its current rows, then its changes")
    rs.add_argument("state", help="a run's --state-dir, or a service's state_root")
    rs.add_argument("--table", default=None, help="the table (name, path or id), in a state root")
    rs.add_argument("--yes", action="store_true", help="confirm: the cursor is dropped")
    add(rs)
    rs.set_defaults(handler=reset_command)
