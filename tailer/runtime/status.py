"""Status lines (``catching_up``, ``following``, ``sink_unavailable``), their throttle, and progress counters.

Status lines are log records of the ``deltatail`` logger that carry an
``event`` and ``fields``; with ``--log-format json`` they become one JSON
object per line (see :mod:`tailer.cli.logs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger("deltatail")

#: Seconds between repeated ``following`` status lines when nothing changes.
STATUS_SECONDS = 30.0


def status(event: str, message: str, *, level: int = logging.INFO, **fields: object) -> None:
    """Log a status line; ``event`` and ``fields`` ride along for structured (JSON) logs."""
    log.log(level, "%s", message, extra={"event": event, "fields": fields})


class StatusThrottle:
    """When a repeated status line is due: at once for a new version, else at most every ``seconds``.

    Args:
        clock: monotonic seconds.
        seconds: the least time between two lines for the same version.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, seconds: float = STATUS_SECONDS) -> None:
        self._clock = clock
        self._seconds = seconds
        self._last: tuple[int, float] | None = None

    def due(self, version: int) -> bool:
        """Whether a line for ``version`` is due now; if it is, the throttle counts it as written."""
        now = self._clock()
        if self._last is not None and version == self._last[0] and now - self._last[1] < self._seconds:
            return False
        self._last = (version, now)
        return True


@dataclass
class Progress:
    """Counters for logs and the status line."""

    versions: int = 0
    #: Rows written to the sink by this run.
    rows: int = 0
    #: Rows the sink already held (written before, by an earlier run), skipped.
    held: int = 0
    started: float = field(default_factory=time.monotonic)

    def held_text(self) -> str:
        """``", N already held by the sink"`` when rows were skipped as held, else ``""`` (for status lines)."""
        return f", {self.held} already held by the sink" if self.held else ""


def count_change_types(column: pa.Array, counts: dict[str, int]) -> None:
    """Add each change type's number of rows in ``column`` to ``counts``."""
    if len(column) > 64:  # one kernel call instead of a Python object per row
        pairs = [(item["values"], item["counts"]) for item in pc.value_counts(column).to_pylist()]
    else:
        pairs = [(kind, 1) for kind in column.to_pylist()]
    for kind, n in pairs:
        counts[kind] = counts.get(kind, 0) + n
