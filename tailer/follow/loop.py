"""The life cycle every follow loop shares, whatever it follows and whatever it delivers.

Three loops run on it: the Delta tailer and the Lance tailer (change rows into a sink, through
:class:`~tailer.follow.change_loop.ChangeLoop`) and the auditor (audit events into audit outputs,
:class:`~tailer.follow.audit.AuditFollower`).

:meth:`FollowLoop.run` is :meth:`~FollowLoop.open` (lock the state directory, resume or start,
open the sink, deliver an initial snapshot if due), then :meth:`~FollowLoop.step` (look once,
deliver what is new) and :meth:`~FollowLoop.rest` (caught up: flush, report, heartbeat) until
stopped or caught up, then a checkpoint and :meth:`~FollowLoop.close`. ``deltatail serve``
(:mod:`tailer.serve.service`) drives the same methods for every table of a service.

A subclass says what it follows: how it starts (:meth:`FollowLoop._start`), which versions are
new (:meth:`FollowLoop._new_versions`), how they are delivered
(:meth:`FollowLoop._deliver_versions`) and how a checkpoint is taken. This class holds the life
cycle and is the same for all: one watcher made in one place, the idle backoff on an object
store, a flush when caught up and a checkpoint when due, the status lines and the status file,
the output closed and the state directory unlocked on the way out, and every error on the way
out counted, leaving the table's state ``failed``.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from deltatail.state.cursor import Position
from deltatail.state.errors import DeltaTailError
from deltatail.state.feed import FollowStatus
from deltatail.tailer.follow.config import FollowConfig
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.follow.status_file import StatusWriter
from deltatail.tailer.log.notifications import NotifiedWatcher, hub_for
from deltatail.tailer.log.watch import LogWatcher, Watcher
from deltatail.tailer.runtime.backoff import idle_poll_interval
from deltatail.tailer.runtime.status import Progress, StatusThrottle, status

log = logging.getLogger("deltatail")


class Output(Protocol):
    """What the life cycle needs of where a loop delivers (a :class:`~tailer.sink.Sink`, audit outputs)."""

    def flush(self) -> None:
        """Make what was delivered durable (the cursor is saved only after this returns)."""

    def heartbeat(self, status: FollowStatus) -> None:
        """Caught up: the output may tell its readers the table is followed (it decides whether one is due)."""

    def close(self) -> None:
        """Release the output (after the last checkpoint)."""


OutputT = TypeVar("OutputT", bound=Output)


class FollowLoop(ABC, Generic[OutputT]):
    """Follows one table into one output. Not reusable: construct one per run.

    Args:
        config: the settings.
        sink: where what is delivered goes (not yet opened).
        table: the table's path or URI (names its figures).
        store: the state directory; by default ``StateStore(config.state_dir)``.
        watcher: makes the watcher of the directory new versions appear in (the directory,
            whether to watch); by default :class:`~tailer.log.watch.LogWatcher`.
        clock: monotonic seconds (checkpoint intervals, status lines).
        wall_clock: epoch seconds (how far behind the newest version the tailer is).
        stats: where the tailer's figures go (metrics, status); a new one by default.
        status_file: whether the loop keeps ``status.json`` in its state directory.
    """

    #: What one version is called in status lines ("commit" for Delta, "version" for Lance).
    unit = "version"

    def __init__(
        self,
        config: FollowConfig,
        sink: OutputT,
        table: str,
        *,
        store: StateStore | None,
        watcher: Callable[[str, bool], Watcher] | None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stats: TableStats | None = None,
        status_file: bool = True,
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
        self._unflushed = False
        self._idle_polls = 0
        self._open = False
        self._status_lines = StatusThrottle(clock)
        self._status_file = (
            StatusWriter(self.store.dir, self.stats, clock=clock, wall_clock=wall_clock) if status_file else None
        )
        self._status_failure_logged = False

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

    def _commit_time_ms(self, version: int) -> int | None:
        """When ``version`` was committed, if the last look found it (its file's modification time), else ``None``."""
        return None

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
        watcher = self._notified() or self._make_watcher(self._watch_dir, self.config.watch and not self._remote)
        self._watcher = watcher
        try:
            while not self._stop.is_set():
                delivered = self.step()
                if self._stop.is_set() or (not delivered and self.config.until_caught_up):
                    break
                if not delivered:
                    self.rest()
                    self._wait_for_news(watcher)
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
        """Caught up: flush what was delivered, report, and let the sink send a heartbeat if one is due.

        The table is ``following`` only once the flush succeeded: rows that are not durable are not
        delivered, and a sink that cannot flush must not be reported as followed.
        """
        self._flush_idle()
        if self.stats.state is not TableState.FOLLOWING:
            self.stats.set_state(TableState.FOLLOWING)
        self._write_status()
        self._report_following()
        self.sink.heartbeat(self._follow_status())  # the sink decides whether one is due

    def close(self) -> None:
        """Close the sink and unlock the state directory (checkpoint first: :meth:`checkpoint`)."""
        if self.stats.state not in (TableState.FAILED, TableState.UNAVAILABLE):
            self.stats.set_state(TableState.STOPPED)
        if self._open:
            self._open = False
            try:
                self._write_status(force=True)  # while the state directory is still this tailer's
                self.sink.close()
            finally:
                self.store.unlock()

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
        if poll is None and self._remote and c.notifications:
            timeout = max(c.max_poll_interval, c.poll_interval)  # notified: this is only the safety poll
        elif poll is None and self._remote:
            timeout = idle_poll_interval(c.poll_interval, c.max_poll_interval, self._idle_polls)
        writer = self._status_file
        status_due = None if writer is None or writer.failure else writer.seconds_until_due()
        for due_in in (self._seconds_until_due(), status_due):  # a status that cannot be written waits its turn
            if due_in is not None:
                timeout = min(timeout, due_in)
        return timeout

    def _wait_for_news(self, watcher: Watcher) -> None:
        """Wait for the watcher's signal or the idle timeout; notified, only a notification or the safety poll ends it.

        A wait cut short for a checkpoint or a status write (:meth:`idle_timeout`) is not a reason to
        look at an object store whose notifications say when to: those are done (:meth:`rest`) and
        the wait goes on.
        """
        if not (self._remote and self.config.notifications):
            watcher.wait(self.idle_timeout())
            return
        safety = self._clock() + max(self.config.max_poll_interval, self.config.poll_interval)
        while not self._stop.is_set():
            if watcher.wait(min(self.idle_timeout(), max(safety - self._clock(), 0.0))) or self._clock() >= safety:
                return
            self.rest()

    def _notified(self) -> Watcher | None:
        """On an object store with ``notifications``: a watcher woken by the queue's notifications of its log."""
        if not (self._remote and self.config.notifications):
            return None
        hub = hub_for(self.config.notifications, self.config.storage_options)
        return NotifiedWatcher(hub, self._watch_dir)

    def _write_status(self, *, force: bool = False) -> None:
        """Write ``status.json`` if the figures changed (at most about once a second unless ``force``).

        A failed write is logged once (until a write succeeds again) and never stops the table.
        """
        if self._status_file is None:
            return
        self._status_file.maybe_write(force=force)
        failure = self._status_file.failure
        if failure is not None and not self._status_failure_logged:
            log.warning("%s: cannot write its status file in %s: %s", self.stats.name, self.store.dir, failure)
        self._status_failure_logged = failure is not None

    def _failed(self, e: DeltaTailError) -> None:
        self.stats.errors[type(e).__name__] += 1
        self.stats.set_state(TableState.FAILED, str(e))
        self._write_status(force=True)

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
        if not self._status_lines.due(version):
            return
        age = self._seconds_behind()
        status(
            "following",
            f"{self.stats.name}: following: at version {version}, 0 versions behind, newest {self.unit} {age:.1f}s ago",
            table=self.stats.name,
            version=version,
            versions_behind=0,
            seconds_behind=0.0,  # the lag: caught up
            seconds_since_newest_commit=round(age, 3),
        )


def _watcher(directory: str, watch: bool) -> Watcher:
    return LogWatcher(directory, watch=watch)


def table_name(path: str) -> str:
    """The last part of a table's path or URI (``s3://bucket/sales/orders`` → ``orders``)."""
    return path.rstrip("/").rsplit("/", 1)[-1] or path
