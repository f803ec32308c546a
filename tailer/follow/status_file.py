"""``status.json``: where a followed table stands, as fresh as the metrics, for ``deltatail status``.

A tailer (``deltatail run``, or a table of ``deltatail serve``) writes it into its state
directory whenever its figures change (state, error, delivered or newest version), at most
about once a second (:data:`STATUS_EVERY_SECONDS`), and once more when it stops. The write is
atomic (a temporary file renamed over it) but not fsynced: the file only reports, the cursor
(``cursor.json``) is what a restart resumes from. ``deltatail status`` reads it while the state
directory is locked by a live tailer, so it shows what the sink holds now, not what the last
checkpoint saved.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.runtime.files import atomic_write

STATUS_FILE = "status.json"
#: The least time between two writes of a table's status while its figures keep changing.
STATUS_EVERY_SECONDS = 1.0


def status_document(stats: TableStats, now: float) -> dict[str, Any]:
    """The JSON document of ``status.json`` for ``stats`` at ``now`` (epoch seconds)."""
    return {
        "table": stats.table,
        "state": stats.state.value,
        "error": stats.error,
        "delivered_version": stats.delivered_version,
        "newest_version": stats.newest_version,
        "delivered_commit_ms": stats.delivered_commit_ms,
        "pending_commit_ms": stats.pending_commit_ms,
        "seconds_behind": round(stats.seconds_behind(now), 3),
        "readable_seconds": _rounded(stats.readable_seconds(now)),
        "retention_readable_ms": None if stats.retention is None else stats.retention.readable_ms,
        "data_losses": stats.data_losses,
        "versions_lost": stats.versions_lost,
        "last_data_loss": stats.last_data_loss,
        "updated": stats.updated,
        "written": now,
    }


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


def write_status(directory: Path, stats: TableStats, now: float | None = None, *, durable: bool = True) -> None:
    """Record where a table stands (``status.json`` in ``directory``), atomically; fsynced if ``durable``.

    Raises:
        OSError: if the file cannot be written.
    """
    at = time.time() if now is None else now
    data = json.dumps(status_document(stats, at), indent=2).encode()
    path = directory / STATUS_FILE
    if durable:
        atomic_write(path, data)
        return
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def read_status(directory: Path) -> dict[str, Any] | None:
    """The last recorded status of a table, or ``None`` (none, or unreadable)."""
    try:
        doc = json.loads((directory / STATUS_FILE).read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


class StatusWriter:
    """Writes a table's ``status.json`` when its figures changed, at most every ``every`` seconds.

    Args:
        directory: the table's state directory.
        stats: the figures written.
        clock: monotonic seconds (the throttle).
        wall_clock: epoch seconds (written in the file).
        every: the least time between two writes.
    """

    def __init__(
        self,
        directory: Path,
        stats: TableStats,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        every: float = STATUS_EVERY_SECONDS,
    ) -> None:
        self.directory = directory
        self.stats = stats
        self._clock = clock
        self._wall_clock = wall_clock
        self._every = every
        self._written: tuple[object, ...] | None = None
        self._last = -float("inf")
        self.failure: str | None = None  # the last write's error (logged once by the caller)

    def _key(self) -> tuple[object, ...]:
        s = self.stats
        return (
            s.state,
            s.error,
            s.delivered_version,
            s.newest_version,
            s.pending_commit_ms,
            s.data_losses,
            s.retention,
        )

    @property
    def pending(self) -> bool:
        """Whether the figures changed since the last write."""
        return self._key() != self._written

    def seconds_until_due(self) -> float | None:
        """Seconds until a pending change may be written (``None``: nothing pending)."""
        if not self.pending:
            return None
        return max(self._last + self._every - self._clock(), 0.0)

    def maybe_write(self, *, force: bool = False) -> bool:
        """Write if the figures changed and the last write is ``every`` seconds old (or ``force``).

        Returns whether it wrote. A failed write is kept in :attr:`failure` (and tried again later),
        never raised: the status only reports.
        """
        key = self._key()
        now = self._clock()
        if key == self._written or (not force and now - self._last < self._every):
            return False
        self._last = now
        try:
            write_status(self.directory, self.stats, self._wall_clock(), durable=False)
        except OSError as e:
            self.failure = f"{e.strerror or e}"
            return False
        self._written = key
        self.failure = None
        return True
