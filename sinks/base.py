"""The sink contract every destination implements.

The tailer drives a sink through a fixed life cycle::

    resume = sink.open(table)      # once; may report what the sink already holds
    sink.write(batch) ...          # any number of batches, in position order
    sink.flush()                   # durable on return; only then is the cursor saved
    sink.close()

Delivery: the tailer saves its cursor only after ``flush`` returned, so a crash
repeats at most the rows after the last saved cursor (at-least-once). A sink
that can tell where it stopped returns that position from ``open``; the tailer
then skips every row before it, which makes delivery exactly-once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from state.cursor import Position

#: The three columns deltatail adds to every change row.
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")


@dataclass(frozen=True, slots=True)
class TableInfo:
    """The table a sink receives changes of."""

    path: str
    table_id: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class FollowStatus:
    """Where a tailer stands while it waits for news (for :meth:`Sink.heartbeat`).

    Attributes:
        table_id: the table's id.
        delivered_version: every row of this version and of those before it was written to the sink.
        newest_version: the newest version the tailer has seen in the log.
        seconds_behind: seconds since the newest commit's timestamp (0 when unknown).
    """

    table_id: str
    delivered_version: int
    newest_version: int
    seconds_behind: float


@dataclass(frozen=True, slots=True)
class ChangeBatch:
    """Consecutive change rows of one commit (or of one initial snapshot).

    Row ``i`` of ``rows`` is at position ``start`` advanced by ``i``. A batch
    never spans two versions. ``rows`` has the table's logical columns plus
    :data:`CHANGE_COLUMNS`.
    """

    start: Position
    rows: pa.RecordBatch

    def __len__(self) -> int:
        return int(self.rows.num_rows)

    def position(self, i: int) -> Position:
        """The position of row ``i``."""
        return Position(self.start.version, self.start.snapshot_rank, self.start.index + i)

    @property
    def end(self) -> Position:
        """The position just after the last row (the cursor once this batch is delivered)."""
        return self.position(len(self))

    def slice_from(self, position: Position) -> ChangeBatch:
        """The rows at or after ``position`` (the whole batch, part of it, or an empty batch)."""
        if position <= self.start:
            return self
        if position >= self.end:
            return ChangeBatch(self.end, self.rows.slice(0, 0))
        skip = position.index - self.start.index
        return ChangeBatch(position, self.rows.slice(skip))


@dataclass(frozen=True, slots=True)
class CommitEvent:
    """One commit's summary, for sinks that publish commit-level events."""

    version: int
    timestamp_ms: int
    operation: str | None
    operation_metrics: dict[str, Any] = field(default_factory=dict)
    row_counts: dict[str, int] = field(default_factory=dict)


class Sink(ABC):
    """A destination for change rows. See the module docstring for the life cycle."""

    @abstractmethod
    def open(self, table: TableInfo) -> Position | None:
        """Prepare to receive rows of ``table``.

        Returns:
            The position just after the last row the sink already holds (rows
            before it must not be written again), or ``None`` if the sink
            cannot tell and relies on the tailer's cursor.

        Raises:
            SinkError: if the sink cannot be opened or holds rows of another table.
        """

    @abstractmethod
    def write(self, batch: ChangeBatch) -> None:
        """Accept a batch; may buffer. Batches arrive in position order.

        Raises:
            SinkError: if the rows cannot be accepted.
        """

    @abstractmethod
    def flush(self) -> None:
        """Make every accepted row durable before returning.

        Raises:
            SinkError: if any row could not be made durable; the tailer then keeps its cursor.
        """

    def commit_event(self, event: CommitEvent) -> None:  # noqa: B027 - optional hook, no-op by default
        """Receive a commit's summary after its rows were written; ignored unless a sink overrides it."""

    def commit_started(self, version: int, operation: str | None) -> None:  # noqa: B027 - optional hook
        """Receive a commit's Delta operation (``WRITE``, ``MERGE``...) before its rows; ignored unless overridden.

        A sink must not rely on it: rows of a version may arrive without it (an initial snapshot, a
        tailer that does not call it).
        """

    def heartbeat(self, status: FollowStatus) -> None:  # noqa: B027 - optional hook, no-op by default
        """Called whenever the tailer is idle (caught up, waiting for news), at most once per poll interval.

        A sink that sends heartbeats decides itself whether one is due. Nothing it sends here may
        touch what :meth:`open` reads back (heartbeats are not change rows).

        Raises:
            SinkError: if the sink has failed or cannot send.
        """

    @abstractmethod
    def close(self) -> None:
        """Release resources. Does not flush: call :meth:`flush` first."""
