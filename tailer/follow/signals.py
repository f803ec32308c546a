"""The signal files of a state directory: on-demand snapshots asked for, cancelled and ended.

``deltatail signal`` writes them and the tailer reads them between two commits (the rule is
:mod:`state.signals`'s). Each is written atomically (:func:`~tailer.runtime.files.atomic_write`),
so a reader sees a whole file or none:

- ``signal.json``: a snapshot asked for and not yet taken (one at a time). Once a tailer takes it,
  the request is saved with the cursor (``cursor.json``) and this file is removed;
- ``signal-cancel.json``: the id of a request to end (asked for or running);
- ``signal-end.json``: how the last request ended (``done``, ``cancelled`` or ``failed`` and why).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from deltatail.state.errors import ConfigError, StateError
from deltatail.state.signals import SnapshotRequest
from deltatail.tailer.runtime.files import atomic_write

REQUEST_FILE = "signal.json"
CANCEL_FILE = "signal-cancel.json"
END_FILE = "signal-end.json"
#: The largest signal file read (a request holds at most a 64 KiB predicate).
MAX_SIGNAL_BYTES = 256 << 10
OUTCOMES = ("done", "cancelled", "failed")


def ask(directory: Path, request: SnapshotRequest) -> None:
    """Ask for ``request`` (the tailer following the directory's table takes it between two commits).

    Raises:
        ConfigError: if another request is asked for and not yet taken.
        StateError: if the file cannot be written.
    """
    waiting = pending(directory)
    if waiting is not None:
        raise ConfigError(
            f"snapshot request {waiting.id} is already waiting to be taken; "
            f"`deltatail signal {directory} cancel` drops it",
        )
    _write(directory / REQUEST_FILE, request.to_json())


def pending(directory: Path) -> SnapshotRequest | None:
    """The request asked for and not yet taken, if any.

    Raises:
        StateError: if ``signal.json`` is not a request (naming the file).
    """
    raw = _read(directory / REQUEST_FILE)
    if raw is None:
        return None
    try:
        return SnapshotRequest.from_json(raw)
    except StateError as e:
        raise StateError(e.message, file=str(directory / REQUEST_FILE)) from None


def drop(directory: Path, request_id: str | None = None) -> None:
    """Remove the waiting request (only if it is ``request_id``, when given)."""
    path = directory / REQUEST_FILE
    if request_id is not None:
        raw = _read_quietly(path)
        if not isinstance(raw, dict) or raw.get("id") != request_id:
            return
    path.unlink(missing_ok=True)


def ask_cancel(directory: Path, request_id: str) -> None:
    """Ask the tailer to end request ``request_id`` (it does between two chunks, or at its next start).

    Raises:
        StateError: if the file cannot be written.
    """
    _write(directory / CANCEL_FILE, {"id": request_id})


def cancel_asked(directory: Path, request_id: str) -> bool:
    """Whether ending ``request_id`` was asked for."""
    raw = _read_quietly(directory / CANCEL_FILE)
    return isinstance(raw, dict) and raw.get("id") == request_id


def record_end(directory: Path, request: SnapshotRequest, outcome: str, error: str | None = None) -> None:
    """Record how ``request`` ended (``outcome``: one of :data:`OUTCOMES`), and forget a cancel of it.

    Raises:
        StateError: if the file cannot be written.
    """
    _write(directory / END_FILE, {"request": request.to_json(), "outcome": outcome, "error": error})
    (directory / CANCEL_FILE).unlink(missing_ok=True)


def last_end(directory: Path) -> dict[str, Any] | None:
    """How the last request ended (:func:`record_end`'s record), if one did."""
    raw = _read_quietly(directory / END_FILE)
    return raw if isinstance(raw, dict) else None


def _write(path: Path, body: dict[str, Any]) -> None:
    try:
        atomic_write(path, orjson.dumps(body, option=orjson.OPT_INDENT_2))
    except OSError as e:
        raise StateError(f"cannot write the signal: {e.strerror or e}", file=str(path)) from None


def _read(path: Path) -> Any:
    """The JSON a signal file holds, ``None`` if there is none.

    Raises:
        StateError: if it cannot be read, is larger than :data:`MAX_SIGNAL_BYTES` or is not JSON.
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_SIGNAL_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StateError(f"cannot read the signal: {e.strerror or e}", file=str(path)) from None
    if len(data) > MAX_SIGNAL_BYTES:
        raise StateError(f"the signal file is larger than {MAX_SIGNAL_BYTES} bytes", file=str(path))
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise StateError(f"the signal file is not JSON ({e})", file=str(path)) from None


def _read_quietly(path: Path) -> Any:
    """:func:`_read`, ``None`` for a file that cannot be read (a cancel or an end record is advisory)."""
    try:
        return _read(path)
    except StateError:
        return None
