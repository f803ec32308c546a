"""The life cycle every tailer shares, whatever it follows (a Delta log, a Lance dataset's versions).

:meth:`FollowLoop.run` is :meth:`~FollowLoop.open` (lock the state directory, resume or start,
open the sink, deliver an initial snapshot if due), then :meth:`~FollowLoop.step` (look once,
deliver what is new) and :meth:`~FollowLoop.rest` (caught up: flush, report, heartbeat) until
stopped or caught up, then a checkpoint and :meth:`~FollowLoop.close`. ``deltatail serve``
(:mod:`tailer.serve.service`) drives the same methods for every table of a service.

A subclass says what it follows: how it starts (:meth:`FollowLoop._start`), which versions are
new (:meth:`FollowLoop._new_versions`), how they are delivered
(:meth:`FollowLoop._deliver_versions`) and how a checkpoint is taken. This class holds what
the guarantees rest on and is the same for both: rows at or before the position a sink reports
it holds are skipped (:meth:`FollowLoop._write_batches`), the cursor moves with every batch
written, and every error on the way out is counted and leaves the table's state ``failed``.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from state.cursor import Position
from state.errors import DeltaTailError
from state.feed import ChangeBatch, FollowStatus, TableInfo
from tailer.follow.config import TailerConfig
from tailer.follow.faults import crash_point
from tailer.follow.sink import Sink
from tailer.follow.state_store import StateStore
from tailer.follow.stats import TableState, TableStats
from tailer.follow.status import Progress, count_change_types, status
from tailer.log.watch import LogWatcher, Watcher

log = logging.getLogger("deltatail")

#: Seconds between repeated "following" status lines when nothing changes.
STATUS_SECONDS = 30.0


class FollowLoop(ABC):
    """Follows one table into one sink. Not reusable: construct one per run.

    Args:
        config: the settings.
        sink: where rows go (not yet opened).
        table: the table's path or URI (names its figures).
        store: the state directory; by default ``StateStore(config.state_dir)``.
        watcher: makes the watcher of the directory new versions appear in (the directory,
            whether to watch); by default :class:`~tailer.log.watch.LogWatcher`.
        clock: monotonic seconds (checkpoint intervals, status lines).
        wall_clock: epoch seconds (how far behind the newest version the tailer is).
        stats: where the tailer's figures go (metrics, status); a new one by default.
    """

    #: What one version is called in status lines ("commit" for Delta, "version" for Lance).
    unit = "version"

    def __init__(
        self,
        config: TailerConfig,
        sink: Sink,
        table: str,
        *,
        store: StateStore | None,
        watcher: Callable[[str, bool], Watcher] | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stats: TableStats | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        self.store = store if store is not None else StateStore(config.state_dir)
        self._make_watcher = watcher if watcher is not None else _watcher
        self._clock = clock
        self._wall_clock = wall_clock
        self.progress = Progress()
        self.stats = stats if stats is not None else TableStats(table, table_name(table))
        self._stop = threading.Event()
        self._watcher: Watcher | None = None
        #: The position of the next row to deliver (set by the subclass's start).
        self._cursor = Position.change(0, 0)
        self._table_id = ""
        self._resume: Position | None = None
        self._unflushed = False
        self._idle_polls = 0
        self._open = False
        self._status = (-2, 0.0)

    # -- what a subclass says ------------------------------------------------------------------

    @property
    @abstractmethod
    def _watch_dir(self) -> str:
        """The directory new versions appear in (watched where it is local)."""

    @property
    @abstractmethod
    def _remote(self) -> bool:
        """Whether the table is on an object store (polled, with backoff while idle)."""

    @abstractmethod
    def _start(self) -> None:
        """Resume from the saved state or start new, and open the sink (:meth:`_open_sink`)."""

    @abstractmethod
    def _deliver_initial_snapshot(self) -> None:
        """Deliver the snapshot at the cursor's version, then checkpoint."""

    @abstractmethod
    def _new_versions(self, limit: int | None = None) -> list[int]:
        """The versions after the one delivered up to that are there now (at most ``limit``)."""

    @abstractmethod
    def _deliver_versions(self, versions: list[int]) -> None:
        """Deliver ``versions`` in order, checkpointing when due; stop early when asked to."""

    @abstractmethod
    def _checkpoint(self) -> None:
        """Flush the sink, then save the cursor."""

    @abstractmethod
    def _checkpoint_due(self) -> bool:
        """Whether a checkpoint is due now."""

    @abstractmethod
    def _seconds_until_due(self) -> float | None:
        """Seconds until a checkpoint falls due (``None``: none pending)."""

    @abstractmethod
    def _head(self) -> tuple[int, float | None]:
        """The version delivered up to (-1 before any) and its commit time in epoch seconds, if known."""

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, checkpoint and return (thread- and signal-safe)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.wake()

    def run(self) -> Progress:
        """Follow until stopped (or caught up, with ``until_caught_up``); returns what was delivered.

        Raises:
            DeltaTailError: what :meth:`open` and :meth:`step` raise; the cursor is saved first
                wherever that keeps what was delivered.
        """
        self.open()
        # An object store cannot be watched: it is polled (listing from the last position).
        watcher = self._make_watcher(self._watch_dir, self.config.watch and not self._remote)
        self._watcher = watcher
        try:
            while not self._stop.is_set():
                delivered = self.step()
                if self._stop.is_set() or (not delivered and self.config.until_caught_up):
                    break
                if not delivered:
                    self.rest()
                    watcher.wait(self.idle_timeout())
            self._checkpoint()
        finally:
            watcher.close()
            self.close()
        return self.progress

    def open(self) -> None:
        """Lock the state directory, resume or start, open the sink, and deliver an initial snapshot if due.

        Raises:
            StateError, DeltaTailError: as :meth:`run`; the state directory is unlocked again then.
        """
        self.store.lock()
        try:
            self._start()
            self._open = True
            if self._cursor.snapshot:  # an initial snapshot is due before the first version
                self._deliver_initial_snapshot()
        except BaseException as e:
            if isinstance(e, DeltaTailError):
                self._failed(e)
            if self._open:
                self.sink.close()
                self._open = False
            self.store.unlock()
            raise

    def step(self, max_versions: int | None = None) -> int:
        """Look once and deliver what is new (at most ``max_versions`` versions); returns how many were found.

        Fewer than ``max_versions`` (or none) means caught up for now.

        Raises:
            DeltaTailError: as :meth:`run` (the cursor is saved first where that keeps what was delivered).
        """
        try:
            try:
                versions = self._new_versions(max_versions)
            except DeltaTailError:
                self._checkpoint()  # keep what was delivered: a restart then refuses or resumes from here
                raise
            self._deliver_versions(versions)
        except DeltaTailError as e:
            self._failed(e)
            raise
        self._idle_polls = 0 if versions else self._idle_polls + 1
        if versions and self.stats.state is not TableState.CATCHING_UP and self.stats.versions_behind:
            self.stats.set_state(TableState.CATCHING_UP)
        return len(versions)

    def rest(self) -> None:
        """Caught up: flush what was delivered, report, and let the sink send a heartbeat if one is due."""
        if self.stats.state is not TableState.FOLLOWING:
            self.stats.set_state(TableState.FOLLOWING)
        self._flush_idle()
        self._report_following()
        self.sink.heartbeat(self._follow_status())  # the sink decides whether one is due

    def close(self) -> None:
        """Close the sink and unlock the state directory (checkpoint first: :meth:`checkpoint`)."""
        if self._open:
            self._open = False
            try:
                self.sink.close()
            finally:
                self.store.unlock()
        if self.stats.state not in (TableState.FAILED, TableState.UNAVAILABLE):
            self.stats.set_state(TableState.STOPPED)

    def checkpoint(self) -> None:
        """Flush the sink and save the cursor now.

        Raises:
            SinkError: if the flush fails (the cursor is not saved).
        """
        self._checkpoint()

    def idle_timeout(self, poll: float | None = None) -> float:
        """How long to wait for news: ``poll`` (default the poll interval), but no later than a checkpoint due.

        On an object store (polled: nothing can be watched) the default interval doubles with
        every idle poll, up to ``max_poll_interval``, and is back to ``poll_interval`` once a
        version is found.
        """
        c = self.config
        timeout = c.poll_interval if poll is None else poll
        if poll is None and self._remote:
            doublings = min(max(self._idle_polls - 1, 0), 60)  # 2**60 outgrows any interval; 2**1024 overflows
            backoff = c.poll_interval * 2**doublings
            timeout = min(backoff, max(c.max_poll_interval, c.poll_interval))
        due_in = self._seconds_until_due()
        return timeout if due_in is None else min(timeout, due_in)

    # -- delivering ----------------------------------------------------------------------------

    def _open_sink(self, info: TableInfo) -> None:
        """Open the sink; rows up to the position it reports holding (beyond the cursor) are skipped."""
        held = self.sink.open(info)
        if held is not None and held > self._cursor:
            log.info("sink already holds rows up to %s; skipping them", held)
            self._resume = held

    def _write_batches(self, batches: Iterable[ChangeBatch], counts: dict[str, int]) -> bool:
        """Write batches, skipping rows already delivered; ``False`` if stopped inside them.

        Each written batch is counted into ``counts`` by change type, and the cursor moves to its
        end (the next row) as soon as it is written.
        """
        for batch in batches:
            batch = self._skip_delivered(batch)
            if len(batch):
                self.sink.write(batch)
                self._unflushed = True
                crash_point("after_write")
                self.progress.rows += len(batch)
                self._account(batch, counts)
            self._cursor = batch.end
            if self._stop.is_set():
                return False
        return True

    def _delivered(self, version: int, timestamp_ms: int, remaining: int) -> None:
        """Count a delivered version; every 100 while catching up, a status line."""
        self.progress.versions += 1
        self.stats.delivered_version = version
        self.stats.delivered_commit_ms = timestamp_ms
        self.stats.newest_version = max(self.stats.newest_version, version)
        self.stats.commits += 1
        if remaining > 0 and self.progress.versions % 100 == 0:
            rate = self.progress.rows / max(self._clock() - self.progress.started, 1e-9)
            status(
                "catching_up",
                f"{self.stats.name}: catching up: version {version}, {remaining} versions remaining, "
                f"{self.progress.versions} versions and {self.progress.rows} rows done, {rate:,.0f} rows/s",
                table=self.stats.name,
                version=version,
                versions_remaining=remaining,
                versions_done=self.progress.versions,
                rows_done=self.progress.rows,
                rows_per_second=round(rate),
            )

    def _account(self, batch: ChangeBatch, counts: dict[str, int]) -> None:
        """Count a written batch's rows (and bytes, shared out by rows) by change type."""
        here: dict[str, int] = {}
        count_change_types(batch.rows.column("_change_type"), here)
        size = batch.rows.nbytes
        for kind, n in here.items():
            counts[kind] = counts.get(kind, 0) + n
            self.stats.rows[kind] += n
            self.stats.bytes[kind] += size * n // len(batch)

    def _skip_delivered(self, batch: ChangeBatch) -> ChangeBatch:
        """The part of ``batch`` after the position the sink holds (all of it once that is passed)."""
        if self._resume is None:
            return batch
        if batch.end <= self._resume:
            return batch.slice_from(batch.end)
        out = batch.slice_from(self._resume)
        self._resume = None
        return out

    def _failed(self, e: DeltaTailError) -> None:
        self.stats.errors[type(e).__name__] += 1
        self.stats.set_state(TableState.FAILED, str(e))

    # -- idle ----------------------------------------------------------------------------------

    def _flush_idle(self) -> None:
        """Caught up: make delivered rows durable now (latency); save the cursor only when a checkpoint is due.

        Saving the cursor costs a few fsyncs and renames, so following a table one
        version at a time does it on the checkpoint interval, not per version; a crash
        in between repeats at most those versions' rows, and none with a sink that
        reports what it holds.
        """
        if self._unflushed:
            self.sink.flush()
            self._unflushed = False
        if self._checkpoint_due():
            self._checkpoint()

    def _seconds_behind(self) -> float:
        """Seconds since the delivered version's commit time (0 when unknown)."""
        _, at = self._head()
        return 0.0 if at is None else max(self._wall_clock() - at, 0.0)

    def _follow_status(self) -> FollowStatus:
        version, _ = self._head()
        return FollowStatus(self._table_id, version, version, self._seconds_behind())

    def _report_following(self) -> None:
        """A status line when following: on a new version, else at most every ``STATUS_SECONDS``.

        None when ``config.status_lines`` is off (a table of ``deltatail serve``).
        """
        if not self.config.status_lines:
            return
        version, _ = self._head()
        now = self._clock()
        if version == self._status[0] and now - self._status[1] < STATUS_SECONDS:
            return
        self._status = (version, now)
        behind = self._seconds_behind()
        status(
            "following",
            f"{self.stats.name}: following: at version {version}, 0 versions behind, "
            f"newest {self.unit} {behind:.1f}s ago",
            table=self.stats.name,
            version=version,
            versions_behind=0,
            seconds_behind=round(behind, 3),
        )


def _watcher(directory: str, watch: bool) -> Watcher:
    return LogWatcher(directory, watch=watch)


def table_name(path: str) -> str:
    """The last part of a table's path or URI (``s3://bucket/sales/orders`` → ``orders``)."""
    return path.rstrip("/").rsplit("/", 1)[-1] or path
