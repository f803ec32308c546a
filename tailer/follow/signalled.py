"""The Delta tailer with on-demand snapshots: a request taken between two commits, delivered in chunks.

:class:`SignalledTailer` is the :class:`~tailer.follow.tailer.Tailer` that ``run`` and ``serve``
follow Delta tables with. Before each look at the log (:meth:`SignalledTailer.step`) it takes the
snapshot request waiting in its state directory (:mod:`tailer.follow.signals`), if the cursor is
between two commits, and delivers it by :mod:`state.signals`'s rule: the table's rows at the
version delivered up to, at the positions just before the next version's, in chunks with the
cursor saved after each, before that next version. A restart inside the snapshot goes on with it
(:meth:`SignalledTailer._deliver_initial_snapshot`, which :meth:`~tailer.follow.loop.FollowLoop.open`
calls for a cursor at a snapshot position).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from dataclasses import replace

from state.cursor import Position
from state.errors import ConfigError, DeltaTailError, MissingFileError, StateError
from state.feed import ChangeBatch
from state.planning import plan_snapshot
from state.signals import SnapshotRequest, both, resume_version
from state.snapshot import Snapshot
from tailer.follow import signals
from tailer.follow.checkpointer import Checkpointer
from tailer.follow.state_store import SavedState
from tailer.follow.tailer import Tailer
from tailer.log.starts import snapshot_time
from tailer.read.feed import ChangeFeed

log = logging.getLogger("deltatail")


class SignalledTailer(Tailer):
    """A :class:`~tailer.follow.tailer.Tailer` that also delivers on-demand snapshots (same arguments)."""

    #: The request being delivered (saved with the cursor), if any.
    _signal: SnapshotRequest | None = None
    _cancelled = False

    # -- taking a request ----------------------------------------------------------------------

    def step(self, max_versions: int | None = None) -> int:
        """Deliver a waiting snapshot request first, if the cursor is between two commits; then look once.

        Raises:
            DeltaTailError: as :meth:`~tailer.follow.loop.FollowLoop.step`.
        """
        try:
            self._take_request()
        except DeltaTailError as e:
            self._failed(e)
            raise
        return super().step(max_versions)

    def _take_request(self) -> None:
        """Take and deliver the waiting request, if any and if every row up to a version is delivered.

        A request that cannot be read is dropped with an error logged and recorded (the stream goes on).
        """
        snap, cursor = self._snap, self._cursor
        held = self._resume  # rows the sink holds past the cursor come first (their positions are taken)
        between = not cursor.snapshot and cursor.index == 0 and (held is None or held <= cursor)
        if snap is None or snap.version < 0 or not between or cursor.version != snap.version + 1:
            return
        directory = self.store.dir
        try:
            request = signals.pending(directory)
        except StateError as e:
            log.error("%s: snapshot request dropped: %s", self.stats.name, e)
            signals.drop(directory)
            return
        if request is None:
            return
        if signals.cancel_asked(directory, request.id):
            signals.drop(directory, request.id)
            signals.record_end(directory, request, "cancelled")
            return
        self._checkpoint()  # at the boundary: the state at this version saved, for the request's cursor
        self._resume = None  # the sink holds nothing past the cursor; the snapshot's positions come before it
        taken = request.taken_at(snap.version, self._rows_end)
        self._set_signal(taken)
        self._cursor = taken.position(0)
        self._checkpoint()  # the request is now the tailer's: saved with the cursor, in one write
        signals.drop(directory, request.id)
        log.info(
            "%s: on-demand snapshot %s at version %d%s",
            self.stats.name,
            request.id,
            snap.version,
            "" if request.where is None else f" where {request.where}",
        )
        self._deliver_signal()

    def _set_signal(self, request: SnapshotRequest | None) -> None:
        self._signal = request
        if self._checkpoints is not None:
            self._checkpoints.signal = request

    # -- delivering it -------------------------------------------------------------------------

    def _deliver_initial_snapshot(self) -> None:
        """A restart inside an on-demand snapshot goes on with it; otherwise the initial snapshot."""
        if self._signal is None:
            super()._deliver_initial_snapshot()
        else:
            self._deliver_signal()

    def _deliver_signal(self) -> None:
        """Deliver the taken request's rows (those after the cursor), then go on at the next version.

        Files gone (vacuumed) or a predicate the table's columns no longer satisfy end the request as
        ``failed``, logged; the stream goes on.
        """
        request, snap = self._signal, self._snap
        if request is None or request.version is None or snap is None:
            raise RuntimeError("no on-demand snapshot was taken")  # a program error: the callers check
        if signals.cancel_asked(self.store.dir, request.id):
            self._end_signal("cancelled")
            return
        try:
            if not self._write_signal_rows(request, snap):
                return  # stopped inside it: the cursor (with the request) is saved on the way out
        except (MissingFileError, ConfigError) as e:
            log.error("%s: on-demand snapshot %s failed: %s", self.stats.name, request.id, e)
            self._end_signal("failed", str(e))
            return
        self._end_signal("cancelled" if self._cancelled else "done")

    def _write_signal_rows(self, request: SnapshotRequest, snap: Snapshot) -> bool:
        """Write the snapshot's rows at their positions; ``False`` if stopped inside them."""
        feed = self._signal_feed(request)
        feed.check_filter()
        ts = snapshot_time(self.log, snap)
        plan = feed.filtered(plan_snapshot(snap, ts, self.config.options.external_roots))
        counts: dict[str, int] = {}
        with contextlib.closing(feed.read_plans(iter([plan]))) as reading:
            for planned, task_batches in reading:
                rows = (
                    ChangeBatch(request.position(b.start.index), b.rows)
                    for b in feed.plan_batches(planned, task_batches)
                )
                if not self._write_batches(self._chunks(rows, request), counts):
                    return False
        return True

    def _signal_feed(self, request: SnapshotRequest) -> ChangeFeed:
        """The run's feed with the request's predicate added to the run's and its chunk size as the batch size."""
        options = self.config.options
        where = both(options.filter.where, request.where)
        chunk = min(options.batch_size, request.chunk_rows)
        return ChangeFeed(
            self.log.table,
            self.log.storage,
            replace(options, filter=replace(options.filter, where=where), batch_size=chunk, net_changes=False),
        )

    def _chunks(self, batches: Iterable[ChangeBatch], request: SnapshotRequest) -> Iterator[ChangeBatch]:
        """``batches`` cut to ``chunk_rows``; after each chunk is written, the cursor saved and a cancel looked for."""
        self._cancelled = False
        for batch in batches:
            for start in range(0, len(batch), request.chunk_rows):
                rows = batch.rows.slice(start, request.chunk_rows)
                yield ChangeBatch(batch.position(start), rows)
                self._checkpoint()  # the chunk is written (the caller asks for the next one after writing)
                if signals.cancel_asked(self.store.dir, request.id):
                    self._cancelled = True
                    return

    def _end_signal(self, outcome: str, error: str | None = None) -> None:
        """Go on at the version after the snapshot's, the request ended as ``outcome`` (saved, then recorded)."""
        request = self._signal
        if request is None or request.version is None:
            return
        self._set_signal(None)
        self._cursor = Position.change(request.version + 1, 0)
        self._checkpoint()
        signals.record_end(self.store.dir, request, outcome, error)
        log.info("%s: on-demand snapshot %s %s", self.stats.name, request.id, outcome)

    # -- the tailer's hooks --------------------------------------------------------------------

    def _resume_version(self, saved: SavedState) -> int:
        self._signal = saved.signal
        return resume_version(saved.cursor, saved.signal)

    def _start(self) -> None:
        super()._start()
        request = self._signal
        if request is not None and request.version is not None:
            signals.drop(self.store.dir, request.id)  # taken before a crash that came before its removal
            self.stats.delivered_version = request.version

    def _checkpointer(self) -> Checkpointer:
        checkpoints = super()._checkpointer()
        checkpoints.signal = self._signal
        return checkpoints

    def _jump(self, snap: Snapshot, cursor: Position) -> None:
        """Data lost (``on_data_loss``): a snapshot in progress ends as failed before the tailer jumps."""
        request = self._signal
        if request is not None:
            self._set_signal(None)
            signals.record_end(self.store.dir, request, "failed", "data lost: the tailer jumped past its version")
        super()._jump(snap, cursor)
