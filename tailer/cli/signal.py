"""``deltatail signal``: ask the tailer following a table for an on-demand snapshot, see it, cancel it.

``STATE`` is a ``deltatail run`` state directory or a ``deltatail serve`` state root (``--table``
names the table), as for ``deltatail status``. The request is a file in the table's state
directory (:mod:`tailer.follow.signals`); the tailer takes it between two commits, running now or
at its next start, and delivers it by the rule of :mod:`state.signals`.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from deltatail.state.errors import ConfigError
from deltatail.state.filters import ChangeFilter
from deltatail.state.signals import DEFAULT_CHUNK_ROWS, SnapshotRequest, checked
from deltatail.tailer.cli.cursor import _one
from deltatail.tailer.cli.tables import flag_storage_options
from deltatail.tailer.follow import signals
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.formats.base import SIGNALS
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.log.delta_log import DeltaLog

ACTIONS = ("snapshot", "status", "cancel")


def signal_command(args: argparse.Namespace) -> int:
    """Run one action of ``deltatail signal`` (see the module docstring).

    Raises:
        ConfigError: a table that is not a Delta table, a ``--where`` its columns do not satisfy
            (checked against its latest schema), a request already waiting, or nothing to cancel.
    """
    directory, table = _one(Path(args.state), args.table, "signal")
    if args.action == "snapshot":
        return _snapshot(args, directory, table)
    if args.action == "cancel":
        return _cancel(directory, table)
    return _status(args, directory, table)


def _snapshot(args: argparse.Namespace, directory: Path, table: str) -> int:
    request = checked(SnapshotRequest(args.id or f"snapshot-{uuid.uuid4().hex[:12]}", args.where, args.chunk_rows))
    ref = open_table(table, flag_storage_options(args))
    if ref.format.refused([SIGNALS]):
        raise ConfigError(f"on-demand snapshots are for Delta tables, not a {ref.format.noun}", table=table)
    if request.where is not None:
        schema = DeltaLog(ref.uri, ref.storage).snapshot().schema
        try:
            ChangeFilter(where=request.where).compile(schema.names)
        except ConfigError as e:
            raise ConfigError(f"signal snapshot --where: {e.message}", table=table) from None
    signals.ask(directory, request)
    print(f"{table}: snapshot {request.id} asked for; the tailer takes it between two commits")
    return 0


def _cancel(directory: Path, table: str) -> int:
    waiting = signals.pending(directory)
    saved = StateStore(str(directory)).load()
    running = None if saved is None else saved.signal
    if waiting is None and running is None:
        raise ConfigError(f"signal cancel: no snapshot of {table} is asked for or running", table=table)
    for request in (waiting, running):
        if request is not None:
            signals.ask_cancel(directory, request.id)  # a tailer taking it at this instant still sees this
    if waiting is not None:
        signals.drop(directory, waiting.id)
        print(f"{table}: snapshot {waiting.id} dropped before it was taken")
    if running is not None:
        print(f"{table}: snapshot {running.id} ends after its chunk in hand; the stream goes on")
    return 0


def _status(args: argparse.Namespace, directory: Path, table: str) -> int:
    waiting = signals.pending(directory)
    saved = StateStore(str(directory)).load()
    running = None if saved is None else saved.signal
    doc: dict[str, Any] = {
        "table": table,
        "waiting": None if waiting is None else waiting.to_json(),
        "running": None if running is None or saved is None else {**running.to_json(), "cursor": saved.cursor.text()},
        "last": signals.last_end(directory),
    }
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
        return 0
    print(f"{table}:")
    if waiting is not None:
        print(f"  waiting: snapshot {waiting.id}{_where(waiting)}")
    if running is not None and saved is not None:
        print(f"  running: snapshot {running.id} at version {running.version}{_where(running)}, cursor {saved.cursor}")
    last = doc["last"]
    if last is not None:
        request, error = last.get("request") or {}, last.get("error")
        print(f"  last: snapshot {request.get('id')} {last.get('outcome')}{'' if not error else f' ({error})'}")
    if waiting is None and running is None and last is None:
        print("  no snapshot asked for")
    return 0


def _where(request: SnapshotRequest) -> str:
    return "" if request.where is None else f" where {request.where}"


def add_parser(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], add: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The ``signal`` subcommand (``add`` gives it the storage options)."""
    sg = sub.add_parser("signal", help="ask a followed table for an on-demand snapshot (status, cancel)")
    sg.add_argument("state", help="a run's --state-dir, or a service's state_root")
    sg.add_argument("action", choices=ACTIONS, help="snapshot: ask for one; status: show it; cancel: end it")
    sg.add_argument("--table", default=None, help="the table (name, path or id), in a state root")
    sg.add_argument("--where", default=None, help="snapshot: only the rows this predicate holds for (as run's)")
    sg.add_argument("--id", default=None, help="snapshot: the request's id (default: a new one)")
    sg.add_argument(
        "--chunk-rows",
        type=int,
        default=DEFAULT_CHUNK_ROWS,
        help=f"snapshot: rows delivered between two saves of the cursor (default {DEFAULT_CHUNK_ROWS})",
    )
    sg.add_argument("--json", action="store_true", help="status: one JSON document")
    add(sg)
    sg.set_defaults(handler=signal_command)
