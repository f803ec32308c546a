"""The Delta tailer with on-demand snapshots: a request taken between two commits, delivered in chunks.

:class:`SignalledTailer` is the :class:`~tailer.follow.tailer.Tailer` that ``run`` and ``serve``
follow Delta tables with. Before each look at the log (:meth:`SignalledTailer.step`) it takes the
snapshot request waiting in its state directory (:mod:`tailer.follow.signals`), if the cursor is
between two commits, and delivers it by :mod:`state.signals`'s rule: the table's rows at the
version delivered up to, at the positions just before the next version's, in chunks with the
cursor saved after each, before that next version. A step delivers at most
:data:`CHUNKS_PER_STEP` chunks, so that ``serve``'s other tables get their turn while a large
snapshot is read (its reader stays open from one step to the next). A restart inside the
snapshot goes on with it at its first step, from the saved cursor.

With a key (``--key``, else the sink's: Kafka's ``key=``), chunks and commits take turns (rule 4 of
:mod:`state.signals`): the chunk's rows whose key changed since the snapshot's version are
dropped (:class:`~state.signals.ChangedKeys`, noted as change rows are written, rebuilt after a
restart by planning and reading those commits again).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator, Iterable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, DeltaTailError, MissingFileError, StateError
from deltatail.state.feed import ChangeBatch
from deltatail.state.planning import plan_snapshot
from deltatail.state.signals import ChangedKeys, SnapshotRequest, both, resume_version
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.follow import signals
from deltatail.tailer.follow.checkpointer import Checkpointer
from deltatail.tailer.follow.state_store import SavedState
from deltatail.tailer.follow.tailer import Tailer
from deltatail.tailer.log.starts import snapshot_time
from deltatail.tailer.read.feed import ChangeFeed

log = logging.getLogger("deltatail")

#: Chunks of an on-demand snapshot delivered per step: ``serve``'s other tables get their turn in between.
CHUNKS_PER_STEP = 16


class SignalledTailer(Tailer):
    """A :class:`~tailer.follow.tailer.Tailer` that also delivers on-demand snapshots (same arguments)."""

    #: The request being delivered (saved with the cursor), if any.
    _signal: SnapshotRequest | None = None
    #: The taken request's chunks being read (kept open from one step to the next), and their reader.
    _chunks: Iterator[ChangeBatch] | None = None
    _reading: Generator[Any, None, None] | None = None
    #: A keyed request's snapshot at its version (until its chunks are planned), and the keys changed since (rule 4).
    _at_version: Snapshot | None = None
    _keyed_chunks: Iterator[pa.RecordBatch] | None = None
    _changed: ChangedKeys | None = None
    #: Whether the rows being written are a chunk's (whose keys are not noted as changed).
    _in_chunk: bool = False
    #: Whether a keyed request's changed keys filled up (the stream waits for its rest; logged once).
    _waits: bool = False

    # -- taking a request ----------------------------------------------------------------------

    def step(self, max_versions: int | None = None) -> int:
        """Take a waiting snapshot request if the cursor is between two commits, and deliver chunks of it.

        A step delivers at most :data:`CHUNKS_PER_STEP` chunks of a snapshot and then returns as a
        step that is not caught up (``max_versions``, or 1), so that ``serve``'s other tables get
        their turn; the next version is looked for only once the snapshot is over.

        Raises:
            DeltaTailError: as :meth:`~tailer.follow.loop.FollowLoop.step`.
        """
        try:
            if self._signal is None:
                self._take_request()
            request = self._signal
            if request is not None and request.key:
                return self._interleave(max_versions)
            if request is not None and self._deliver_chunks(CHUNKS_PER_STEP):
                return max_versions or 1
        except DeltaTailError as e:
            self._failed(e)
            raise
        return super().step(max_versions)

    def _interleave(self, max_versions: int | None) -> int:
        """A keyed request's step (rule 4): the next commit if it is its turn and there is one, else a chunk.

        It is the commit's turn after a chunk delivered after the version the tailer is at, or when
        a commit is in flight (a restart whose sink holds rows past the cursor); never once the
        changed keys are :meth:`~state.signals.ChangedKeys.full`.
        """
        request, snap, changed = self._signal, self._snap, self._changed
        if request is None or snap is None:
            return super().step(max_versions)
        in_flight = self._resume is not None and self._resume > Position.change(snap.version + 1, 0)
        full = changed is not None and changed.full()
        if full and changed is not None and not self._waits:
            self._waits = True
            log.warning(
                "%s: on-demand snapshot %s: %d keys changed since version %s; the stream waits for the rest of it",
                self.stats.name, request.id, len(changed), request.version,
            )  # fmt: skip
        if in_flight or (request.after == snap.version and not full):
            self._cursor = Position.change(snap.version + 1, 0)
            if super().step(1) or in_flight:
                return max_versions or 1
        if not self._deliver_keyed_chunk():
            return super().step(max_versions) if self._signal is None else max_versions or 1
        return max_versions or 1

    def _take_request(self) -> None:
        """Take the waiting request, if any and if every row up to a version is delivered.

        A request that cannot be read is dropped with an error logged (the stream goes on).
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
        key = self.config.options.key_columns or self.sink.key_columns
        if key:
            taken = replace(taken, key=key)
            self._at_version, self._changed = snap, ChangedKeys(key)
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

    def _set_signal(self, request: SnapshotRequest | None) -> None:
        self._signal = request
        if self._checkpoints is not None:
            self._checkpoints.signal = request

    # -- delivering it -------------------------------------------------------------------------

    def _deliver_initial_snapshot(self) -> None:
        """The initial snapshot; a restart inside an on-demand snapshot goes on with it in its steps instead."""
        if self._signal is None:
            super()._deliver_initial_snapshot()

    def _deliver_chunks(self, limit: int) -> bool:
        """Deliver up to ``limit`` chunks of the taken request, the cursor saved after each; whether more remain.

        After the last chunk (or a cancel) the cursor goes on at the next version. Files gone
        (vacuumed) or a predicate the table's columns no longer satisfy end the request as
        ``failed``, logged; the stream goes on.
        """
        request = self._signal
        if request is None:
            return False
        try:
            if self._chunks is None:
                if self._signal_cancelled(request):
                    return False
                self._chunks = self._open_chunks(request)
            for _ in range(limit):
                chunk = next(self._chunks, None)
                if chunk is None:
                    self._end_signal("done")
                    return False
                if not self._write_batches([chunk], {}):
                    return True  # stopped: the cursor (with the request) is saved on the way out
                self._checkpoint()
                if self._signal_cancelled(request):
                    return False
        except (MissingFileError, ConfigError) as e:
            self._signal_failed(request, e)
            return False
        return True

    def _signal_cancelled(self, request: SnapshotRequest) -> bool:
        """Whether ``request``'s cancel was asked; if so its end is recorded (``cancelled``)."""
        if not signals.cancel_asked(self.store.dir, request.id):
            return False
        self._end_signal("cancelled")
        return True

    def _signal_failed(self, request: SnapshotRequest, error: Exception) -> None:
        """Record ``request``'s end as failed (its files vacuumed, a column its predicate reads gone)."""
        log.error("%s: on-demand snapshot %s failed: %s", self.stats.name, request.id, error)
        self._end_signal("failed", str(error))

    def _deliver_keyed_chunk(self) -> bool:
        """Deliver the next chunk of a keyed request after the commits delivered (rule 4); whether it goes on.

        ``False``: the request ended (done, cancelled or failed, recorded) or the tailer was stopped
        inside the chunk (the cursor is saved on the way out).
        """
        request, snap = self._signal, self._snap
        if request is None or snap is None:
            return False
        try:
            if self._keyed_chunks is None:
                if self._signal_cancelled(request):
                    return False
                self._keyed_chunks = self._open_keyed(request)
            start = request.position_after(snap.version)
            if self._cursor != start:  # between two commits: nothing past them is held (in flight goes first)
                self._resume = None
                self._cursor = start
                self._checkpoint()
            raw = next(self._keyed_chunks, None)
            if raw is None:
                self._end_signal("done")
                return False
            changed = self._changed
            kept = raw if changed is None else changed.unchanged(raw)
            self._in_chunk = True
            try:
                if not self._write_batches([ChangeBatch(start, kept)], {}):
                    return False
            finally:
                self._in_chunk = False
            self._set_signal(request.chunk_done(raw.num_rows, kept.num_rows, snap.version))
            self._checkpoint()
            if self._signal_cancelled(request):
                return False
        except (MissingFileError, ConfigError) as e:
            self._signal_failed(request, e)
            return False
        return True

    def _open_keyed(self, request: SnapshotRequest) -> Iterator[pa.RecordBatch]:
        """A keyed request's chunks from the first not delivered; its changed keys rebuilt after a restart.

        Raises:
            MissingFileError: if the snapshot's or a later commit's files are gone (vacuumed).
            ConfigError: if the predicate or the key names a column the rows do not have.
        """
        version = request.version
        if version is None:
            raise RuntimeError("the request was not taken")  # a program error
        at, self._at_version = self._at_version, None
        if at is None or at.version != version or at.handed_on:
            at = self.log.snapshot(version)
        feed = self._signal_feed(request)
        feed.check_filter()
        plan = feed.filtered(plan_snapshot(at, snapshot_time(self.log, at), self.config.options.external_roots))
        if self._changed is None:  # after the plan: replaying the later commits hands the snapshot's files on
            self._changed = self._changes_since(at, request.key)
        self._reading = feed.read_plans(iter([plan]))
        return _raw_chunks(feed, self._reading, request.chunk_rows, request.read)

    def _changes_since(self, at: Snapshot, key: tuple[str, ...]) -> ChangedKeys:
        """The keys of the change rows of the versions after ``at`` up to the tailer's (delivered before a restart)."""
        changed = ChangedKeys(key)
        snap = self._snap
        if snap is None or snap.version <= at.version:
            return changed
        follower = self._new_follower(at, None, self._table_id)
        plans = (self.feed.filtered(follower.plan(v).plan) for v in range(at.version + 1, snap.version + 1))
        with contextlib.closing(self.feed.read_plans(plans)) as reading:
            for plan, task_batches in reading:
                for batch in self.feed.plan_batches(plan, task_batches):
                    changed.add(batch.rows)
        log.info("%s: %d keys changed since version %d rebuilt", self.stats.name, len(changed), at.version)
        return changed

    def _write_batches(self, batches: Iterable[ChangeBatch], counts: dict[str, int]) -> bool:
        """Write batches (as the tailer does), noting a keyed request's changed keys from its change rows."""
        changed = self._changed
        if changed is None or self._in_chunk:
            return super()._write_batches(batches, counts)
        return super()._write_batches(_noted(batches, changed), counts)

    def _open_chunks(self, request: SnapshotRequest) -> Iterator[ChangeBatch]:
        """The snapshot's rows at their positions in chunks, read from the start; those before the cursor skipped."""
        snap = self._snap
        if snap is None or request.version != snap.version:
            raise RuntimeError("the tailer's state is not the snapshot's version")  # a program error
        feed = self._signal_feed(request)
        feed.check_filter()
        plan = feed.filtered(plan_snapshot(snap, snapshot_time(self.log, snap), self.config.options.external_roots))
        self._reading = feed.read_plans(iter([plan]))
        if self._resume is None or self._resume < self._cursor:
            self._resume = self._cursor  # a restart inside the snapshot: the rows before the cursor went out
        return _cut(feed, self._reading, request)

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

    def _close_chunks(self) -> None:
        reading, self._reading, self._chunks, self._keyed_chunks = self._reading, None, None, None
        if reading is not None:
            reading.close()  # stops the read-ahead workers

    def close(self) -> None:
        """Stop reading a snapshot in hand, then as :meth:`~tailer.follow.loop.FollowLoop.close`."""
        self._close_chunks()
        super().close()

    def _end_signal(self, outcome: str, error: str | None = None) -> None:
        """Go on at the version after the snapshot's, the request ended as ``outcome`` (saved, then recorded)."""
        request = self._signal
        if request is None or request.version is None:
            return
        self._close_chunks()
        self._set_signal(None)
        self._at_version, self._changed, self._waits = None, None, False
        snap = self._snap
        self._cursor = Position.change((request.version if snap is None else snap.version) + 1, 0)
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
            self.stats.delivered_version = request.version if self._snap is None else self._snap.version

    def _checkpointer(self) -> Checkpointer:
        checkpoints = super()._checkpointer()
        checkpoints.signal = self._signal
        return checkpoints

    def _jump(self, snap: Snapshot, cursor: Position) -> None:
        """Data lost (``on_data_loss``): a snapshot in progress ends as failed before the tailer jumps."""
        request = self._signal
        if request is not None:
            self._close_chunks()
            self._set_signal(None)
            self._at_version, self._changed = None, None
            signals.record_end(self.store.dir, request, "failed", "data lost: the tailer jumped past its version")
        super()._jump(snap, cursor)


def _cut(feed: ChangeFeed, reading: Iterator[Any], request: SnapshotRequest) -> Iterator[ChangeBatch]:
    """The rows of the read snapshot plan at the request's positions (rule 2), in chunks of ``chunk_rows``."""
    for planned, task_batches in reading:
        for batch in feed.plan_batches(planned, task_batches):
            placed = ChangeBatch(request.position(batch.start.index), batch.rows)
            for start in range(0, len(placed), request.chunk_rows):
                yield ChangeBatch(placed.position(start), placed.rows.slice(start, request.chunk_rows))


def _raw_chunks(feed: ChangeFeed, reading: Iterator[Any], chunk_rows: int, skip: int) -> Iterator[pa.RecordBatch]:
    """The read snapshot plan's rows in chunks of at most ``chunk_rows``, after its first ``skip`` rows (rule 4)."""
    seen = 0
    for planned, task_batches in reading:
        for batch in feed.plan_batches(planned, task_batches):
            for start in range(0, len(batch), chunk_rows):
                part = batch.rows.slice(start, chunk_rows)
                first, seen = seen, seen + part.num_rows
                if seen > skip:
                    yield part.slice(max(0, skip - first))


def _noted(batches: Iterable[ChangeBatch], changed: ChangedKeys) -> Iterator[ChangeBatch]:
    """``batches``, each one's keys noted in ``changed`` as it is handed on (rule 4)."""
    for batch in batches:
        changed.add(batch.rows)
        yield batch
