"""The change feed's values: what a change row batch is, which table it belongs to, what a commit summary holds.

Every change row carries the table's logical columns plus :data:`CHANGE_COLUMNS`.
Rows travel in :class:`ChangeBatch` values: consecutive rows of one version,
each at a :class:`~state.cursor.Position` (version, snapshot flag, index), so
that a consumer can tell exactly which rows it already holds.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltatail.state.cursor import Position
from deltatail.state.schema import StructType

if TYPE_CHECKING:  # only for the annotation: a reader process does not load the audit types
    from deltatail.state.audit import AuditEvent

#: The column holding a row's change: ``insert``, ``delete``, ``update_preimage`` or ``update_postimage``
#: (a cdc file carries it; deltatail adds it to the rows of add and remove files).
CHANGE_TYPE_COLUMN = "_change_type"
#: The three columns deltatail adds to every change row.
CHANGE_COLUMNS = (CHANGE_TYPE_COLUMN, "_commit_version", "_commit_timestamp")

#: The Arrow type of ``_commit_timestamp``: microseconds, UTC.
COMMIT_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")


@functools.lru_cache(maxsize=64)
def change_schema(schema: StructType) -> pa.Schema:
    """The change rows' schema: the table's logical columns plus the three change columns."""
    base = schema.to_arrow()
    return (
        base.append(pa.field("_change_type", pa.string()))
        .append(pa.field("_commit_version", pa.int64()))
        .append(pa.field("_commit_timestamp", COMMIT_TIMESTAMP_TYPE))
    )


@dataclass(frozen=True, slots=True)
class TableInfo:
    """The table a sink receives changes of."""

    path: str
    table_id: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class FollowStatus:
    """Where a tailer stands while it waits for news (what a sink's heartbeat carries).

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

    def slices(self, size: int) -> Iterator[ChangeBatch]:
        """The batch in consecutive slices of ``size`` rows (the last one shorter), in order; itself if no longer."""
        count = len(self)
        if count <= size:
            yield self
            return
        for start in range(0, count, size):
            yield ChangeBatch(self.position(start), self.rows.slice(start, min(size, count - start)))

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
    """One commit's summary, for sinks that publish commit-level events.

    Attributes:
        version: the commit's version.
        timestamp_ms: its ``_commit_timestamp`` (epoch ms).
        operation: the Delta operation (``WRITE``, ``MERGE``...), if recorded.
        operation_metrics: ``commitInfo.operationMetrics`` as written.
        row_counts: change rows delivered for the commit by this run, per ``_change_type``.
        audit: the commit's full audit event, built only for a sink whose
            :attr:`~tailer.sink.Sink.wants_audit_events` is true; otherwise ``None``.
        schema: the table schema after the commit when the commit carries a ``metaData`` action
            (it may change the schema); ``None`` otherwise.
    """

    version: int
    timestamp_ms: int
    operation: str | None
    operation_metrics: dict[str, Any] = field(default_factory=dict)
    row_counts: dict[str, int] = field(default_factory=dict)
    audit: AuditEvent | None = None
    schema: StructType | None = None
