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

from deltatail.state.retention import Retention


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
    pending_commit_ms: int | None = None
    rows: Counter[str] = field(default_factory=Counter)
    bytes: Counter[str] = field(default_factory=Counter)
    commits: int = 0
    #: Rows the sink already held and were skipped (not delivered again).
    rows_held: int = 0
    #: Times the sink was found holding fewer rows than were delivered to it (rows lost outside deltatail).
    sink_gaps: int = 0
    #: Times data the tailer still needed was gone (log cleaned past the cursor, files vacuumed) and
    #: ``on_data_loss`` (``resnapshot`` or ``skip``) went on past it; with ``fail`` the table fails instead.
    data_losses: int = 0
    #: Versions passed over by those losses (their changes were not delivered as changes).
    versions_lost: int = 0
    #: The last loss, in words (``None`` before any).
    last_data_loss: str | None = None
    #: The retention periods of the table as of the delivered version (``None``: not known yet, or unreadable).
    retention: Retention | None = None
    last_checkpoint: float | None = None
    errors: Counter[str] = field(default_factory=Counter)
    retries: int = 0
    #: Requests sent to the table's object store by this process (``None``: not an object store).
    store_requests: int | None = None
    error: str | None = None
    updated: float = field(default_factory=time.time)

    @property
    def versions_behind(self) -> int:
        """Versions seen in the log and not yet delivered."""
        return max(self.newest_version - self.delivered_version, 0)

    def seconds_behind(self, now: float) -> float:
        """The lag: seconds since the oldest version not yet delivered was committed; 0 when caught up.

        The commit time is the modification time of the version's file as the look that found it
        reported it (a listing or a probe: no request of its own); Delta commits carry that time as
        their timestamp. While the next version's time is not known yet (a step delivered the versions
        it found, the next look has not run), the time of the last known undelivered version stands
        in: older, so the figure errs high, never low. 0 when nothing is known to be behind.
        """
        if self.versions_behind == 0 or self.pending_commit_ms is None:
            return 0.0
        return max(now - self.pending_commit_ms / 1000, 0.0)

    def readable_seconds(self, now: float) -> float | None:
        """Seconds the oldest undelivered version stays readable at least (see :mod:`state.retention`).

        ``None`` when nothing is known to be behind (caught up, or the next version's commit time is
        not known yet) or the retention is not known. Negative once it may already be cleaned up.
        """
        if self.versions_behind == 0 or self.pending_commit_ms is None or self.retention is None:
            return None
        return self.retention.readable_seconds(self.pending_commit_ms, round(now * 1000))

    def data_lost(self, versions: int, what: str) -> None:
        """Count a loss of data the tailer needed, which ``on_data_loss`` went on past (``versions`` passed over)."""
        self.data_losses += 1
        self.versions_lost += versions
        self.last_data_loss = what

    def seconds_since_delivered_commit(self, now: float) -> float | None:
        """Seconds since the newest delivered version was committed (``None`` before any): grows on an idle table."""
        return None if self.delivered_commit_ms is None else max(now - self.delivered_commit_ms / 1000, 0.0)

    def found(self, newest: int, next_commit_ms: int | None) -> None:
        """The log holds versions up to ``newest``; ``next_commit_ms``: when ``delivered_version + 1`` was committed."""
        self.newest_version = max(self.newest_version, newest)
        if self.newest_version > self.delivered_version and next_commit_ms is not None:
            self.pending_commit_ms = next_commit_ms

    def delivered(self, version: int, commit_ms: int | None, next_commit_ms: int | None) -> None:
        """``version`` (committed at ``commit_ms``) is delivered; ``next_commit_ms``: the next one's time, if known.

        Caught up, the lag is 0; else, with the next version's time unknown, the last known pending
        time stays (see :meth:`seconds_behind`).
        """
        self.delivered_version = version
        if commit_ms is not None:
            self.delivered_commit_ms = commit_ms
        self.newest_version = max(self.newest_version, version)
        if self.newest_version <= version:
            self.pending_commit_ms = None
        elif next_commit_ms is not None:
            self.pending_commit_ms = next_commit_ms

    def set_state(self, state: TableState, error: str | None = None) -> None:
        """Move to ``state`` (with the error that caused a failure)."""
        self.state = state
        self.error = error
        self.updated = time.time()
