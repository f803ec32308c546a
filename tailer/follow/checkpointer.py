"""The tailer's checkpoints: when one is due, and its steps in order.

A checkpoint is three numbered steps; a crash between any two repeats rows
(after the last saved cursor), never loses them:

1. **Flush the sink**: every row written so far is durable at the destination.
2. **Save the snapshot** (every ``snapshot_commits`` versions, and only at a
   version boundary, with a snapshot that is exact for its version): a Delta
   checkpoint file of the state, so that a restart does not replay the
   table's history.
3. **Save the cursor** (the position of the next row to deliver), naming the
   saved snapshot it goes with; a cursor is never saved ahead of what step 1
   made durable.

A checkpoint is due every ``checkpoint_commits`` delivered versions or every
``checkpoint_seconds`` seconds with at least one version delivered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from deltatail.state.cursor import Position
from deltatail.state.signals import SnapshotRequest
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.follow.state_store import SavedState, StateStore
from deltatail.tailer.runtime.faults import crash_point


class Flushable(Protocol):
    """What a checkpoint flushes first: a :class:`~tailer.sink.Sink`, or an auditor's outputs."""

    def flush(self) -> None:
        """Make everything written so far durable (raises if it cannot)."""


class Checkpointer:
    """Takes one tailer's checkpoints (see the module docstring).

    Args:
        store: the state directory.
        sink: the sink (or any outputs) to flush first.
        table: the table root, recorded in the cursor file.
        table_id: the table id, recorded in the cursor file.
        checkpoint_commits: a checkpoint is due after this many delivered versions.
        checkpoint_seconds: or after this many seconds with at least one delivered version.
        snapshot_commits: the snapshot is saved again once it is this many versions old.
        clock: monotonic seconds.
        earlier_order: ``(version, row order)`` if a cursor inside ``version`` counts in an earlier
            row order, saved with it (:meth:`tailer.read.feed.ChangeFeed.earlier_order`).
    """

    def __init__(
        self,
        store: StateStore,
        sink: Flushable,
        *,
        table: str,
        table_id: str,
        checkpoint_commits: int,
        checkpoint_seconds: float,
        snapshot_commits: int,
        clock: Callable[[], float] = time.monotonic,
        earlier_order: Callable[[int], tuple[int, int] | None] | None = None,
    ) -> None:
        self.store = store
        self.sink = sink
        self.table = table
        self.table_id = table_id
        self.checkpoint_commits = checkpoint_commits
        self.checkpoint_seconds = checkpoint_seconds
        self.snapshot_commits = snapshot_commits
        self._clock = clock
        #: The saved snapshot's version and file name, once there is one.
        self.saved_snapshot: tuple[int, str] | None = None
        #: Versions delivered since the last checkpoint.
        self.since = 0
        self.last = clock()
        #: The on-demand snapshot the cursor is inside (saved with it), if any.
        self.signal: SnapshotRequest | None = None
        self._earlier_order = earlier_order

    def delivered_version(self) -> None:
        """Count one more delivered version."""
        self.since += 1

    def is_due(self) -> bool:
        """Whether a checkpoint is due (by versions, or by time with something delivered)."""
        by_time = self._clock() - self.last >= self.checkpoint_seconds
        return self.since >= self.checkpoint_commits or (by_time and self.since > 0)

    def seconds_until_due(self) -> float | None:
        """Seconds until a checkpoint is due by time (0 if it is), or ``None`` with nothing delivered."""
        if not self.since:
            return None
        return max(self.last + self.checkpoint_seconds - self._clock(), 0.0)

    def snapshot_due_at(self, first: int) -> int:
        """The last version of a stretch planned ahead from ``first``: where the snapshot can next be saved.

        While versions are planned ahead, the snapshot in hand is exact only for the
        newest one planned, so a stretch ends where a snapshot save is due (or, once
        that is passed, at the next checkpoint by commit count).
        """
        saved = self.saved_snapshot
        due = None if saved is None else saved[0] + self.snapshot_commits
        if due is None or due <= first:
            # Any checkpoint would save the snapshot: plan ahead only up to the next one by commit count.
            due = first + max(self.checkpoint_commits - self.since, 1) - 1
        return due

    def take(self, snap: Snapshot, cursor: Position, previous_ms: int | None, rows_end: Position | None = None) -> None:
        """Steps 1 to 3 for ``cursor``, the position of the next row, with ``snap`` the delivered snapshot.

        ``rows_end`` (the position after the last row delivered) is saved with the cursor.

        The snapshot in hand is consistent with the cursor only at a version
        boundary (cursor at the first row of the next version, or inside the
        initial snapshot of the snapshot's own version). Inside a commit, the cursor
        is saved with the last saved snapshot, and resuming replays the commits
        after it without delivering them. A snapshot handed on (planned past) is
        never saved.

        Raises:
            SinkError: if the flush fails; nothing is saved then.
            StateError: if the state directory cannot be written.
        """
        self.sink.flush()  # 1
        crash_point("after_flush")
        at_boundary = (not cursor.snapshot and cursor == Position.change(snap.version + 1, 0)) or (
            cursor.snapshot and cursor.version == snap.version
        )
        saved = self.saved_snapshot
        due = saved is None or snap.version - saved[0] >= self.snapshot_commits
        if at_boundary and due and snap.protocol is not None and not snap.handed_on:  # 2
            if previous_ms is not None:
                snap.expire_tombstones(previous_ms)
            saved = (snap.version, self.store.save_snapshot(snap))
            crash_point("after_snapshot")
            self.saved_snapshot = saved
        if saved is None or (not at_boundary and saved[0] >= cursor.version):
            return  # nothing consistent to resume from yet; a restart redoes this from the start
        earlier = None if self._earlier_order is None else self._earlier_order(cursor.version)
        self.store.save(
            SavedState(
                self.table,
                self.table_id,
                cursor,
                saved[0],
                saved[1],
                previous_ms,
                rows_end,
                self.signal,
                earlier_order=earlier,
            )
        )  # 3
        crash_point("after_save")
        self.since = 0
        self.last = self._clock()
