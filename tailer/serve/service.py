"""Many tables followed by one process: the service behind ``deltatail serve``.

Each table has its own :class:`~tailer.follow.tailer.Tailer` (its own sink,
filters and start options, its state in the state root,
:mod:`tailer.serve.state_root`), but they share what one process needs only
once: the reader processes, one inotify descriptor for every local log
directory (:class:`~tailer.log.watch_many.DirectoryWatcher`), and a few
worker threads that step the tables.

Scheduling: a table is stepped when its log directory signals a change, when
its poll is due (object stores; local tables poll only as a safety net), or at
once again after a step that did not catch up. A step delivers at most
``step_versions`` versions, so a table catching up a long backlog takes its
turn with the others instead of holding a worker until it is done: the live
tables keep their latency (``python -m benchmarks.serve`` measures it). A
table is never stepped by two workers at once.

Lance datasets are followed alongside Delta tables: a :class:`TableSource` of format ``lance``
gets a :class:`~tailer.lance.follow.LanceTailer` (the same open/step/rest/close interface), its
``_versions/`` directory is watched as a Delta table's log is, and its state directory in the state
root is keyed by :func:`~tailer.lance.follow.lance_state_id` (Lance datasets have no table id).

Failures stay with their table: an error that stops a tailer (a gap, a schema
change, a broken file, a table removed) marks that table failed and reports
it; the others go on. An unavailable sink or store holds the table's cursor
and retries it with backoff, as ``deltatail run`` does.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Literal

from state.errors import DeltaTailError, SinkUnavailableError, StorageError
from tailer.follow.sink import Sink
from tailer.follow.stats import TableState, TableStats
from tailer.follow.status import status
from tailer.follow.tailer import Tailer, TailerConfig
from tailer.lance.feed import LanceFeed, LanceOptions
from tailer.lance.follow import LanceTailer, lance_state_id
from tailer.log.starts import table_id
from tailer.log.watch_many import DirectoryWatcher
from tailer.read.feed import ChangeFeed
from tailer.serve.state_root import StateRoot, write_status
from tailer.storage.factory import storage_for

log = logging.getLogger("deltatail")


@dataclass
class TableSource:
    """A table the service follows: what it needs to make the table's tailer and sink.

    Attributes:
        name: the table's name (unique in the service; metrics label, ``{table_name}``).
        config: the tailer's settings (``state_dir`` is set by the service from the state root).
        make_sink: makes a new, unopened sink for the table, given its table id.
        table_format: ``delta`` or ``lance``.
    """

    name: str
    config: TailerConfig
    make_sink: Callable[[str], Sink]
    table_format: Literal["delta", "lance"] = "delta"


@dataclass
class _Table:
    source: TableSource
    stats: TableStats
    tailer: Tailer | LanceTailer | None = None
    due: float = 0.0
    busy: bool = False
    queued: bool = False
    done: bool = False
    failures: int = 0
    watched: bool = False
    reported: tuple[object, ...] = field(default=())


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
    """

    workers: int = 2
    step_versions: int = 50
    safety_poll_seconds: float = 10.0
    discover_seconds: float = 30.0
    status_seconds: float = 30.0
    max_backoff: float = 60.0


class Service:
    """Follows many tables (see the module docstring).

    Args:
        state_root: where every table's state lives.
        tables: the tables named in the configuration.
        options: scheduling settings.
        discover: called every ``discover_seconds`` for the tables to follow now (discovered ones);
            tables already followed (by name) are left as they are.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        state_root: StateRoot,
        tables: Iterable[TableSource],
        options: ServiceOptions | None = None,
        *,
        discover: Callable[[], list[TableSource]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state_root = state_root
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
        for source in tables:
            self._add(source)

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

    # -- running --------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask every table to stop after its step in hand, then checkpoint and return (signal-safe)."""
        self._stopping.set()
        self._watcher.wake()

    def run(self) -> None:
        """Follow the tables until :meth:`stop`; each is checkpointed and closed on the way out."""
        workers = [
            threading.Thread(target=self._work, name=f"deltatail-serve-{i}", daemon=True)
            for i in range(self.options.workers)
        ]
        for w in workers:
            w.start()
        try:
            while not self._stopping.is_set():
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
        finally:
            for _ in workers:
                self._ready.put(None)
            for w in workers:
                w.join()
            self._close_all()
            self._watcher.close()

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
                if table.done or table.busy or table.queued:
                    continue
                if table.due <= now:
                    table.queued = True
                    self._ready.put(table)
                else:
                    wait = min(wait, table.due - now)
        return max(wait, 0.0)

    def _work(self) -> None:
        while (table := self._ready.get()) is not None:
            with self._lock:
                table.queued = False
                table.busy = True
            try:
                if not self._stopping.is_set():
                    self._step(table)
            finally:
                with self._lock:
                    table.busy = False
                self._record(table)
                self._watcher.wake()  # the dispatcher looks again: this table may be due at once

    def _step(self, table: _Table) -> None:
        now = self._clock()
        try:
            if table.tailer is None:
                table.tailer = self._open(table)
            tailer = table.tailer
            delivered = tailer.step(self.options.step_versions)
            table.failures = 0
            if delivered >= self.options.step_versions:
                table.due = 0.0  # more to do: its turn again after the others
                return
            tailer.rest()
            table.due = self._clock() + tailer.idle_timeout(self.options.safety_poll_seconds if table.watched else None)
        except (SinkUnavailableError, StorageError) as e:
            if isinstance(e, StorageError) and not e.transient:
                self._fail(table, e)
                return
            self._close(table, checkpoint=False)
            table.failures += 1
            table.stats.retries += 1
            delay = min(self.options.max_backoff, 0.5 * 2 ** (table.failures - 1))
            table.stats.set_state(TableState.UNAVAILABLE, str(e))
            status(
                "table_unavailable",
                f"{table.source.name}: {e.message}; holding its cursor, retrying in {delay:.1f}s",
                level=logging.WARNING,
                table=table.source.name,
                retry_in_seconds=delay,
            )
            table.due = now + delay
        except DeltaTailError as e:
            self._fail(table, e)

    def _open(self, table: _Table) -> Tailer | LanceTailer:
        if table.source.table_format == "lance":
            return self._open_lance(table)
        config = table.source.config
        feed = ChangeFeed(config.table, storage_for(config.table, config.storage_options or None), config.options)
        tid = table_id(feed.log)
        entry = self.state_root.register(tid, feed.log.table, table.source.name)
        config = replace(config, state_dir=str(entry.directory), status_lines=False)
        tailer = Tailer(config, table.source.make_sink(tid), feed=feed, stats=table.stats)
        tailer.open()
        if config.watch and not feed.storage.remote:
            table.watched = self._watcher.add(table.source.name, feed.log.log_dir)
        return tailer

    def _open_lance(self, table: _Table) -> LanceTailer:
        config = table.source.config
        o = config.options
        feed = LanceFeed(
            config.table,
            options=LanceOptions(o.allow_non_additive, o.batch_size, o.filter, o.external_roots),
            storage_options=config.storage_options or None,
        )
        tid = lance_state_id(feed.table)
        entry = self.state_root.register(tid, feed.table, table.source.name)
        config = replace(config, state_dir=str(entry.directory), status_lines=False)
        table.stats.table_id = tid
        tailer = LanceTailer(config, table.source.make_sink(tid), feed=feed, stats=table.stats)
        tailer.open()
        if config.watch and not feed.storage.remote:
            table.watched = self._watcher.add(table.source.name, feed.dataset.versions_dir)
        return tailer

    def _fail(self, table: _Table, error: DeltaTailError) -> None:
        table.done = True
        if table.stats.state is not TableState.FAILED:  # the tailer counts the errors it raises itself
            table.stats.errors[type(error).__name__] += 1
        table.stats.set_state(TableState.FAILED, str(error))
        log.error("table %s stopped: %s", table.source.name, error)
        self._close(table, checkpoint=False)

    def _close(self, table: _Table, *, checkpoint: bool) -> None:
        tailer, table.tailer = table.tailer, None
        self._watcher.remove(table.source.name)
        table.watched = False
        if tailer is None:
            return
        try:
            if checkpoint:
                tailer.checkpoint()
        except DeltaTailError as e:
            log.error("table %s: the last checkpoint failed: %s", table.source.name, e)
        finally:
            tailer.close()

    def _close_all(self) -> None:
        for table in list(self._tables.values()):
            self._close(table, checkpoint=not table.done)
            if not table.done:
                table.stats.set_state(TableState.STOPPED)
            self._record(table)

    # -- reporting ------------------------------------------------------------------------------

    def _record(self, table: _Table) -> None:
        """Write the table's status file when its state or versions changed."""
        s = table.stats
        key = (s.state, s.error, s.delivered_version, s.newest_version)
        if key == table.reported or s.table_id == "":
            return
        table.reported = key
        try:
            write_status(self.state_root.root / s.table_id, s)
        except OSError as e:
            log.warning("cannot write the status of table %s: %s", table.source.name, e)

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
