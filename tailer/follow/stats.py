"""What a tailer has done and where it stands: the figures behind metrics, status lines and ``deltatail status``.

The tailer updates a :class:`TableStats` as it goes (plain counters, no locks:
a reader on another thread may see a figure one update old); the service's
metrics endpoint reads them when scraped.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum


class TableState(Enum):
    """Where a followed table stands."""

    STARTING = "starting"
    CATCHING_UP = "catching_up"
    FOLLOWING = "following"
    UNAVAILABLE = "unavailable"  # the sink or the store is down: waiting, cursor held
    STOPPED = "stopped"
    FAILED = "failed"


@dataclass
class TableStats:
    """One table's figures (see the module docstring)."""

    table: str
    name: str
    state: TableState = TableState.STARTING
    table_id: str = ""
    delivered_version: int = -1
    newest_version: int = -1
    delivered_commit_ms: int | None = None
    rows: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    commits: int = 0
    #: Rows the sink already held and were skipped (not delivered again).
    rows_held: int = 0
    #: Times the sink was found holding fewer rows than were delivered to it (rows lost outside deltatail).
    sink_gaps: int = 0
    last_checkpoint: float | None = None
    errors: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    error: str | None = None
    updated: float = field(default_factory=time.time)

    @property
    def versions_behind(self) -> int:
        """Versions seen in the log and not yet delivered."""
        return max(self.newest_version - self.delivered_version, 0)

    def seconds_behind(self, now: float) -> float:
        """Seconds since the delivered version's commit time (0 when unknown)."""
        return 0.0 if self.delivered_commit_ms is None else max(now - self.delivered_commit_ms / 1000, 0.0)

    def set_state(self, state: TableState, error: str | None = None) -> None:
        """Move to ``state`` (with the error that caused a failure)."""
        self.state = state
        self.error = error
        self.updated = time.time()
