"""Many tables followed by one process: the service behind ``deltatail serve``.

Each table has its own :class:`~tailer.follow.tailer.Tailer` (its own sink,
filters and start options, its state in the state root,
:mod:`tailer.serve.state_root`), but they share what one process needs only
once: the reader processes, one inotify descriptor for every local log
directory (:class:`~tailer.log.watch_many.DirectoryWatcher`), and a few
worker threads that step the tables.

Scheduling: a table is stepped when its log directory signals a change, when
its poll is due (object stores; local tables poll only as a safety net), or at
once again after a step that did not catch up, or during which its directory
signalled a change (the step may have listed the log before it). A step delivers at most
``step_versions`` versions, so a table catching up a long backlog takes its
turn with the others instead of holding a worker until it is done: the live
tables keep their latency (``python -m benchmarks.serve`` measures it). A
table is never stepped by two workers at once.

Every table format is followed the same way: a :class:`TableSource` holds the table's handle
(:class:`~tailer.table.TableRef`), and its format (:mod:`tailer.formats`) gives the tailer (a
:class:`~tailer.follow.change_loop.ChangeLoop`: a Lance dataset's is a
:class:`~tailer.lance.follow.LanceTailer`), the directory to watch (``_delta_log``, ``_versions/``)
and the id keying its state directory in the state root (a Lance dataset's is
:func:`~tailer.lance.follow.lance_state_id`: Lance datasets have no table id).

Failures stay with their table: one place (:meth:`Service._step`) turns whatever a
table's step raises into that table's state, by the rule of :mod:`tailer.runtime.transient`.
A transient fault (the sink or the store unavailable, or any ``OSError``: too many open
files, disk full, a file too large, a read-only or replaced path) makes the table
``unavailable``: its tailer and sink are closed, its cursor is held at the last
checkpoint, and it is opened again from there with backoff (0.5 s doubling to
``max_backoff``), as ``deltatail run`` does. Anything else (a gap, a schema change, a
broken file, a table removed, or an unexpected exception: a bug) makes it ``failed``
with the error's text, logged once in one line (its traceback at debug level); the
others go on. No fault of a table ends a worker thread or the dispatcher.

The process itself cannot serve when its dispatcher stalls, a worker thread has died,
or the state root has been unusable for every table (a probe file cannot be written
in it) for ``fatal_seconds``: :meth:`Service.health` then says why (``/healthz``
answers 503), and :meth:`Service.run` closes the tables and raises, so that the
command exits non-zero and an orchestrator restarts it.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from deltatail.state.errors import DeltaTailError
from deltatail.tailer.follow.change_loop import ChangeLoop
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.formats.registry import FALLBACK, open_table
from deltatail.tailer.log.notifications import Subscription, hub_for
from deltatail.tailer.log.watch_many import DirectoryWatcher
from deltatail.tailer.runtime.backoff import POLL_JITTER, next_poll, retry_delay
from deltatail.tailer.runtime.status import status
from deltatail.tailer.runtime.transient import describe, fault_of, is_transient
from deltatail.tailer.serve.state_root import StateRoot, probe_state_root, write_status
from deltatail.tailer.sink import Sink
from deltatail.tailer.table import TableRef

log = logging.getLogger("deltatail")

#: Seconds without a turn of the dispatcher after which the service is reported unhealthy.
DISPATCHER_STALL_SECONDS = 30.0


@dataclass
class TableSource:
    """A table the service follows: what it needs to make the table's tailer and sink.

    Attributes:
        name: the table's name (unique in the service; metrics label, ``{table_name}``).
        config: the tailer's settings (``state_dir`` is set by the service from the state root).
        make_sink: makes a new, unopened sink for the table, given its table id.
        resolve: when set, the format could not be told yet (the store was unavailable): called
            before the table is first opened for the table's real source (and retried, as any
            transient fault, while it raises one).
        table: the table's handle (:class:`~tailer.table.TableRef`); without one, :meth:`handle`
            opens the table at ``config.table`` as a table of the fallback format (Delta).
    """

    name: str
    config: TailerConfig
    make_sink: Callable[[str], Sink]
    resolve: Callable[[], TableSource] | None = None
    table: TableRef | None = None

    @property
    def table_format(self) -> str:
        """The table's format's name (``delta``, ``lance``...)."""
        return FALLBACK.name if self.table is None else self.table.format.name

    def handle(self) -> TableRef:
        """The table's handle: :attr:`table`, else one opened now from ``config``.

        Raises:
            ConfigError: if the storage options do not fit the table's location.
        """
        if self.table is not None:
            return self.table
        c = self.config
        return open_table(
            c.table, c.storage_options, external_roots=c.options.external_roots, format_name=self.table_format
        )


@dataclass
class _Table:
    source: TableSource
    stats: TableStats
    tailer: ChangeLoop | None = None
    due: float = 0.0
    busy: bool = False
    queued: bool = False
    done: bool = False
    failures: int = 0
    watched: bool = False
    reported: tuple[object, ...] = field(default=())
    #: The table's handle, kept across reopenings: an object store's client is made once, not again
    #: while a fault lasts (making one needs file descriptors, certificates...).
    ref: TableRef | None = None
    remote: bool = False  # on an object store: a step that found a commit does not show it caught up
    notified: Subscription | None = None  # notifications of an object-store table's log
    started: float | None = None  # when the step in hand began
    stalled: bool = False  # the step in hand was reported as not answering
    signals: int = 0  # changes signalled for the table so far (its directory's events, notifications)


@dataclass(frozen=True)
class ServiceOptions:
    """How the service runs its tables.

    Attributes:
        workers: threads stepping tables.
        step_versions: the most versions one step delivers before the table takes its turn again.
        safety_poll_seconds: how often a watched local table is looked at without a signal.
        discover_seconds: how often :attr:`Service.discover` is called for new tables.
        status_seconds: how often each table's figures go to the status lines.
        max_backoff: the longest wait before retrying a table whose sink or store is unavailable.
        fatal_seconds: how long the state root may stay unusable (its probe failing) before the
            service gives up and :meth:`Service.run` raises (the process exits non-zero).
        stall_seconds: a table whose step has not returned for this long (a store or sink that
            does not answer) is reported ``unavailable`` until the step returns.
        poll_jitter: an object-store table's polls are its interval times 1 +- this (:func:`next_poll`).
    """

    workers: int = 2
    step_versions: int = 50
    safety_poll_seconds: float = 10.0
    discover_seconds: float = 30.0
    status_seconds: float = 30.0
    max_backoff: float = 60.0
    fatal_seconds: float = 60.0
    stall_seconds: float = 30.0
    poll_jitter: float = POLL_JITTER


class Service:
    """Follows many tables (see the module docstring).

    Args:
        state_root: where every table's state lives.
        tables: the tables named in the configuration.
        options: scheduling settings.
        discover: called every ``discover_seconds`` for the tables to follow now (discovered ones);
            tables already followed (by name) are left as they are.
        unavailable: tables whose store was found unavailable at start-up, with why: they start
            ``unavailable`` (and are tried at once, then with backoff).
        clock: monotonic seconds.
        rng: draws the polls' jitter (:func:`next_poll`); seeded in tests, by default seeded from the system.
    """

    def __init__(
        self,
        state_root: StateRoot,
        tables: Iterable[TableSource],
        options: ServiceOptions | None = None,
        *,
        discover: Callable[[], list[TableSource]] | None = None,
        unavailable: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.state_root = state_root
        self._rng = rng or random.Random()
        self.options = options or ServiceOptions()
        self.discover = discover
        self._clock = clock
        self._lock = threading.Lock()
        self._tables: dict[str, _Table] = {}
        self._ready: queue.Queue[_Table | None] = queue.Queue()
        self._stopping = threading.Event()
        self._watcher = DirectoryWatcher()
        self._last_discovery = -float("inf")
        self._last_status = clock()
        self._workers: list[threading.Thread] = []
        self._heartbeat: float | None = None
        self._last_probe = -float("inf")
        self._root_failing: tuple[float, str] | None = None
        self._dispatch_failing: str | None = None
        #: Why the service gave up (``None`` while it serves); set once, read by :meth:`health`.
        self.fatal: str | None = None
        for source in tables:
            self._add(source)
        for name, why in (unavailable or {}).items():
            if name in self._tables:
                self._tables[name].stats.set_state(TableState.UNAVAILABLE, why)

    # -- tables ---------------------------------------------------------------------------------

    def _add(self, source: TableSource) -> None:
        if source.name in self._tables:
            return
        stats = TableStats(source.config.table, source.name)
        self._tables[source.name] = _Table(source, stats)
        log.info("following table %s (%s)", source.name, source.config.table)

    @property
    def stats(self) -> list[TableStats]:
        """Every table's figures (for metrics and health)."""
        with self._lock:
            return [t.stats for t in self._tables.values()]

    @property
    def watch_overflows(self) -> int:
        """Times the kernel dropped the watched logs' file events (each time every watched table was looked at)."""
        return self._watcher.overflows

    # -- running --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every table to stop after its step in hand, then checkpoint and return (signal-safe)."""
        self._stopping.set()
        self._watcher.wake()

    def run(self) -> None:
        """Follow the tables until :meth:`stop`; each is checkpointed and closed on the way out.

        Raises:
            DeltaTailError: when the service gave up (see :meth:`health`): the state root unusable
                for ``fatal_seconds``, or a worker thread died; the tables are checkpointed where
                they can be and closed first.
        """
        self._workers = [
            threading.Thread(target=self._work, name=f"deltatail-serve-{i}", daemon=True)
            for i in range(self.options.workers)
        ]
        for w in self._workers:
            w.start()
        try:
            while not self._stopping.is_set() and self.fatal is None:
                self._heartbeat = self._clock()
                try:
                    self._turn()
                    self._dispatch_failing = None
                except Exception as e:  # the dispatcher never dies of one bad turn: it says so and goes on
                    self._dispatcher_fault(e)
                self._watchdog()
        finally:
            for _ in self._workers:
                self._ready.put(None)
            for w in self._workers:
                w.join()
            self._close_all()
            self._watcher.close()
        if self.fatal is not None:
            raise DeltaTailError(f"the service cannot serve and stops: {self.fatal}")

    def _turn(self) -> None:
        """One turn of the dispatcher: discover, queue what is due, report, wait for a change or the next due."""
        self._maybe_discover()
        timeout = self._dispatch()
        self._maybe_report()
        changed = self._watcher.wait(timeout)
        if changed:
            with self._lock:
                for name in changed:
                    table = self._tables.get(name)
                    if table is not None:
                        table.due = 0.0
                        table.signals += 1

    def _dispatcher_fault(self, error: Exception) -> None:
        text = describe(error)
        if text != self._dispatch_failing:  # once per distinct error, not once per turn
            log.error("the dispatcher failed a turn (it goes on): %s", text)
            log.debug("the dispatcher's error", exc_info=error)
        self._dispatch_failing = text
        self._stopping.wait(1.0)

    def _watchdog(self) -> None:
        """Give up (:attr:`fatal`) when a worker thread has died or the state root stays unusable."""
        dead = [w.name for w in self._workers if not w.is_alive()]
        if dead and not self._stopping.is_set():
            self.fatal = f"worker thread {', '.join(dead)} died"
            log.error("%s: the service stops so that it can be restarted", self.fatal)
            return
        now = self._clock()
        if now - self._last_probe < min(5.0, self.options.fatal_seconds / 4):
            return
        self._last_probe = now
        try:
            probe_state_root(self.state_root.root)
        except DeltaTailError as e:
            if self._root_failing is None:
                self._root_failing = (now, str(e))
                log.error("%s; the service stops if it stays so for %gs", e, self.options.fatal_seconds)
            elif now - self._root_failing[0] >= self.options.fatal_seconds:
                self.fatal = f"{e}, for {now - self._root_failing[0]:.0f}s"
                log.error("%s: the service stops so that it can be restarted", self.fatal)
            else:
                self._root_failing = (self._root_failing[0], str(e))
            return
        if self._root_failing is not None:
            log.info("the state root %s is usable again", self.state_root.root)
        self._root_failing = None

    def health(self) -> str | None:
        """Why the process cannot serve now, or ``None`` when it can (``/healthz``).

        It cannot when it gave up (:attr:`fatal`), a worker thread is dead, its dispatcher has not
        turned for ``DISPATCHER_STALL_SECONDS``, or the state root is unusable (the service gives
        up when that lasts ``fatal_seconds``). A table that is unavailable or failed is that
        table's state (``/readyz``), not the process's.
        """
        if self.fatal is not None:
            return self.fatal
        dead = [w.name for w in self._workers if not w.is_alive()]
        if dead and not self._stopping.is_set():
            return f"worker thread {', '.join(dead)} died"
        if self._heartbeat is not None and not self._stopping.is_set():
            idle = self._clock() - self._heartbeat
            if idle > DISPATCHER_STALL_SECONDS:
                return f"the dispatcher has not turned for {idle:.0f}s"
        failing = self._root_failing
        if failing is not None:
            return failing[1]
        return None

    def _maybe_discover(self) -> None:
        if self.discover is None or self._clock() - self._last_discovery < self.options.discover_seconds:
            return
        self._last_discovery = self._clock()
        try:
            found = self.discover()
        except DeltaTailError as e:
            log.error("discovering tables failed: %s", e)
            return
        with self._lock:
            for source in found:
                self._add(source)

    def _dispatch(self) -> float:
        """Queue the tables that are due; returns how long until the next one is."""
        now = self._clock()
        wait = 1.0
        with self._lock:
            for table in self._tables.values():
                if table.busy:
                    self._check_stall(table, now)
                if table.done or table.busy or table.queued:
                    continue
                if table.due <= now:
                    table.queued = True
                    self._ready.put(table)
                else:
                    wait = min(wait, table.due - now)
        return max(wait, 0.0)

    def _check_stall(self, table: _Table, now: float) -> None:
        """A step that has not returned for ``stall_seconds``: the table is not delivering; say so (under the lock)."""
        if table.stalled or table.started is None or now - table.started < self.options.stall_seconds:
            return
        table.stalled = True
        why = f"its step has not returned for {now - table.started:.0f}s (the store or the sink does not answer)"
        table.stats.set_state(TableState.UNAVAILABLE, why)
        log.warning("table %s: %s", table.source.name, why)

    def _work(self) -> None:
        while (table := self._ready.get()) is not None:
            caught_up: bool | None = None
            signals = 0
            try:
                with self._lock:
                    table.queued = False
                    table.busy = True
                    table.started = self._clock()
                    signals = table.signals
                if not self._stopping.is_set():
                    caught_up = self._step(table)
            except Exception as e:  # a bug in the handling below; still the table's, never the worker's end
                log.error("table %s: %s", table.source.name, describe(e))
                log.debug("table %s: the error", table.source.name, exc_info=e)
            finally:
                with self._lock:
                    table.busy = False
                    table.started = None
                    if caught_up and table.signals != signals:
                        # A change was signalled while the step ran, maybe after it listed the log: the
                        # step's idle wait must not postpone it to the safety poll. Look again at once.
                        table.due = 0.0
                    if table.stalled:  # reported as not answering while it ran: it answered
                        table.stalled = False
                        if caught_up is not None:
                            table.stats.set_state(TableState.FOLLOWING if caught_up else TableState.CATCHING_UP)
                self._record(table)
                self._wake()  # the dispatcher looks again: this table may be due at once

    def _wake(self) -> None:
        try:
            self._watcher.wake()
        except Exception as e:  # the dispatcher turns at least every second anyway
            log.debug("cannot wake the dispatcher: %s", describe(e))

    def _step(self, table: _Table) -> bool | None:
        """Step one table; whatever it raises becomes that table's state (see the module docstring).

        Returns whether it caught up (``None``: it failed or is unavailable).
        """
        now = self._clock()
        try:
            if table.tailer is None:
                table.tailer = self._open(table)
            tailer = table.tailer
            limit = self.options.step_versions
            found = delivered = tailer.step(limit)
            while table.remote and found and delivered < limit:
                # On an object store a step probes one commit by name; only the listing after it tells
                # whether more came: the table is caught up (following) once a look finds nothing.
                found = tailer.step(limit - delivered)
                delivered += found
            table.failures = 0
            if delivered >= limit:
                table.due = 0.0  # more to do: its turn again after the others
                return False
            tailer.rest()
            wait = tailer.idle_timeout(self.options.safety_poll_seconds if table.watched else None)
            if table.remote:  # polls of many tables spread over time, never in step
                wait = next_poll(wait, self._rng, self.options.poll_jitter)
            table.due = self._clock() + wait
            return True
        except Exception as e:
            if is_transient(e):
                self._unavailable(table, e, now)
            else:
                self._fail(table, e)
            return None
        finally:
            counter = None if table.ref is None else getattr(table.ref.storage, "counter", None)
            if counter is not None:
                table.stats.store_requests = counter.requests()

    def _unavailable(self, table: _Table, error: Exception, now: float) -> None:
        """A transient fault: close the table's tailer and sink, hold its cursor, retry with backoff."""
        self._close(table, checkpoint=False)
        table.failures += 1
        table.stats.retries += 1
        delay = retry_delay(table.failures, self.options.max_backoff)
        text = describe(error)
        table.stats.set_state(TableState.UNAVAILABLE, text)
        status(
            "table_unavailable",
            f"{table.source.name}: {fault_of(error)} unavailable: {text}; holding its cursor, "
            f"retrying in {delay:.1f}s (attempt {table.failures})",
            level=logging.WARNING,
            table=table.source.name,
            retry_in_seconds=delay,
            attempt=table.failures,
        )
        table.due = now + delay

    def _open(self, table: _Table) -> ChangeLoop:
        if table.source.resolve is not None:
            table.source = table.source.resolve()
        if table.ref is None:
            table.ref = table.source.handle()
        config = table.source.config
        followed = table.ref.format.follow(table.ref, config.options)
        tid = followed.table_id
        entry = self.state_root.register(tid, followed.root, table.source.name)
        config = replace(config, state_dir=str(entry.directory), status_lines=False)
        tailer = followed.tailer(config, table.source.make_sink(tid), table.stats, status_file=False)
        table.remote = followed.remote
        tailer.open()
        if config.watch and not followed.remote:
            self._watch(table, tailer, followed.watch_dir)
        elif config.notifications and followed.remote:  # hints: the queue's one long poll serves every table
            hub = hub_for(config.notifications, config.storage_options)
            table.notified = Subscription(hub, followed.watch_dir, lambda: self._watcher.notify(table.source.name))
        return tailer

    def _watch(self, table: _Table, tailer: ChangeLoop, directory: str) -> None:
        """Watch an opened table's directory; on failure the tailer is closed again (its lock released)."""
        try:
            table.watched = self._watcher.add(table.source.name, directory)
        except BaseException:
            tailer.close()
            raise

    def _fail(self, table: _Table, error: Exception) -> None:
        """A permanent fault: the table stops, failed, with the error's text; an unexpected one's traceback at debug."""
        table.done = True
        if table.stats.state is not TableState.FAILED:  # the tailer counts the errors it raises itself
            table.stats.errors[type(error).__name__] += 1
        table.stats.set_state(TableState.FAILED, describe(error))
        log.error("table %s stopped: %s", table.source.name, describe(error))
        if not isinstance(error, DeltaTailError):
            log.debug("table %s: the unexpected error", table.source.name, exc_info=error)
        self._close(table, checkpoint=False)

    def _close(self, table: _Table, *, checkpoint: bool) -> None:
        """Close the table's tailer (checkpointing first if asked); never raises: failures are logged."""
        tailer, table.tailer = table.tailer, None
        try:
            self._watcher.remove(table.source.name)
        except Exception as e:
            log.debug("table %s: cannot stop watching: %s", table.source.name, describe(e))
        table.watched = False
        notified, table.notified = table.notified, None
        if notified is not None:
            notified.close()
        if tailer is None:
            return
        try:
            if checkpoint:
                tailer.checkpoint()
        except Exception as e:
            log.error("table %s: the last checkpoint failed: %s", table.source.name, describe(e))
        finally:
            try:
                tailer.close()
            except Exception as e:  # a sink that cannot close (its last write failing) is closed all the same
                log.warning("table %s: closing it failed: %s", table.source.name, describe(e))

    def _close_all(self) -> None:
        for table in list(self._tables.values()):
            self._close(table, checkpoint=not table.done)
            if not table.done:
                table.stats.set_state(TableState.STOPPED)
            self._record(table)

    # -- reporting ------------------------------------------------------------------------------

    def _record(self, table: _Table) -> None:
        """Write the table's status file when its state or versions changed (after every step, and on close).

        The one writer of a served table's ``status.json``: its tailer keeps none (``status_file=False``).
        """
        s = table.stats
        key = (s.state, s.error, s.delivered_version, s.newest_version, s.data_losses, s.retention)
        if key == table.reported or s.table_id == "":
            return
        table.reported = key
        try:
            write_status(self.state_root.root / s.table_id, s, durable=False)  # reports only: no fsync per step
        except Exception as e:
            table.reported = ()  # written again on the next turn
            log.warning("cannot write the status of table %s: %s", table.source.name, describe(e))

    def _maybe_report(self) -> None:
        now = self._clock()
        if now - self._last_status < self.options.status_seconds:
            return
        self._last_status = now
        wall = time.time()
        for s in self.stats:
            status(
                "table_status",
                f"{s.name}: {s.state.value}, version {s.delivered_version}, {s.versions_behind} versions behind",
                table=s.name,
                state=s.state.value,
                delivered_version=s.delivered_version,
                versions_behind=s.versions_behind,
                seconds_behind=round(s.seconds_behind(wall), 3),
                rows=dict(s.rows),
                bytes=dict(s.bytes),
                commits=s.commits,
                checkpoint_age_seconds=None if s.last_checkpoint is None else round(wall - s.last_checkpoint, 3),
                errors=dict(s.errors),
                retries=s.retries,
            )
