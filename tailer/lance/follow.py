"""Following a Lance dataset into a sink: ``deltatail run`` on a Lance dataset.

The same life cycle and guarantees as the Delta tailer (:mod:`tailer.follow.tailer`), with a lighter
state: a Lance dataset can be opened at any version it still holds, so the state directory keeps the
cursor alone (``cursor.json``, written by :class:`~tailer.follow.state_store.StateStore`; its
``snapshot_version`` is the version the cursor's version is planned against, and its
``previous_timestamp_ms`` that version's manifest timestamp, which tells a dataset deleted and
recreated at the same path from the one the state belongs to; no snapshot file).

1. Lock the state directory; resume from the saved cursor, or start new (``starting_version``,
   ``starting_timestamp_ms``, ``initial_snapshot``). A state directory of another dataset is refused.
2. Open the sink; if it reports the position it holds, rows before it are skipped.
3. Loop: look for the next version by its manifest's name (one request each); plan and deliver each
   version in order; checkpoint every ``checkpoint_commits`` versions or ``checkpoint_seconds``
   seconds. Checkpoint = flush the sink, then save the cursor (the position of the next row): a
   crash repeats at most the rows after the saved cursor, and none with a sink that reports what
   it holds. Between looks, wait for a change in ``_versions/`` (inotify, locally) or the poll interval.
4. SIGINT/SIGTERM (:meth:`LanceTailer.stop`): finish the batch in hand, checkpoint, return.

:meth:`LanceTailer.run` is :meth:`~LanceTailer.open`, then :meth:`~LanceTailer.step` (look once, deliver
what is new) and :meth:`~LanceTailer.rest` (caught up: flush, report) until done, then a checkpoint and
:meth:`~LanceTailer.close`: the interface of the Delta :class:`~tailer.follow.tailer.Tailer`, so
``deltatail serve`` (:mod:`tailer.serve.service`) steps Lance datasets and Delta tables alike. The
tailer keeps a :class:`~tailer.follow.stats.TableStats` up to date as the Delta tailer does.

Errors that stop it: the version after the cursor cleaned up while newer ones exist
(``VersionGapError``, with a recovery hint), the dataset recreated (``StateError``), an unsupported
feature or a non-additive schema change (after delivering and checkpointing everything before it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable

from state.cursor import Position
from state.errors import (
    DeltaTailError,
    SchemaChangeError,
    StateError,
    UnsupportedFeatureError,
    VersionGapError,
    VersionNotFoundError,
)
from state.feed import ChangeBatch, CommitEvent, FollowStatus, TableInfo
from state.lance.manifest import Manifest
from state.lance.planning import LancePlan, plan_snapshot
from tailer.follow.faults import crash_point
from tailer.follow.sink import Sink
from tailer.follow.state_store import SavedState, StateStore
from tailer.follow.stats import TableState, TableStats
from tailer.follow.status import Progress, count_change_types, status
from tailer.follow.tailer import STATUS_SECONDS, TailerConfig, table_name
from tailer.lance.dataset import CLEANED_UP_HINT
from tailer.lance.feed import LanceFeed, LanceOptions
from tailer.log.watch import LogWatcher, Watcher

log = logging.getLogger("deltatail")

#: The most versions found by name in one look (the loop looks again once they are delivered).
DISCOVER_AHEAD = 64


def lance_table_id(root: str) -> str:
    """The id a Lance dataset goes by in state directories, sinks and Spark offsets (Lance manifests carry none).

    ``lance-`` and a hash of the dataset's URI (or absolute path, when local): the same path always
    gets the same id, and the id is a valid Kafka topic name and file name (``{table_id}`` in a sink
    URI, a service's state root). A dataset recreated at the path is told apart by the tailer itself
    (its state records the timestamp of the version it delivered up to).
    """
    where = root if "://" in root else os.path.abspath(root)
    return "lance-" + hashlib.sha256(f"lance:{where}".encode()).hexdigest()[:32]


#: A service's state directory of a Lance dataset is named by its table id.
lance_state_id = lance_table_id


class LanceTailer:
    """Follows one Lance dataset into one sink. Not reusable: construct one per run.

    Args:
        config: the settings (those of the Delta tailer; ``options.allow_non_additive`` and
            ``options.batch_size`` apply, ``snapshot_commits`` and the reader settings do not).
        sink: where rows go (not yet opened).
        feed: plans and reads rows; by default a :class:`~tailer.lance.feed.LanceFeed` of ``config.table``.
        store: the state directory; by default ``StateStore(config.state_dir)``.
        watcher: makes the watcher of ``_versions/`` (the directory, whether to watch).
        clock: monotonic seconds; wall_clock: epoch seconds.
        stats: the figures the tailer keeps up to date (a new one by default).
    """

    def __init__(
        self,
        config: TailerConfig,
        sink: Sink,
        *,
        feed: LanceFeed | None = None,
        store: StateStore | None = None,
        watcher: Callable[[str, bool], Watcher] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        stats: TableStats | None = None,
    ) -> None:
        self.config = config
        self.sink = sink
        options = LanceOptions(config.options.allow_non_additive, config.options.batch_size, config.options.filter)
        self.feed = (
            feed
            if feed is not None
            else LanceFeed(config.table, options=options, storage_options=config.storage_options or None)
        )
        self.dataset = self.feed.dataset
        self.table = self.feed.table
        self.table_id = lance_table_id(self.table)
        self.store = store if store is not None else StateStore(config.state_dir)
        self._make_watcher = watcher if watcher is not None else _watcher
        self._clock = clock
        self._wall_clock = wall_clock
        self.progress = Progress()
        self._stop = threading.Event()
        self._watcher: Watcher | None = None
        self._cursor = Position.change(1, 0)
        self._resume: Position | None = None
        self._base: Manifest | None = None  # the manifest the next version is planned against
        self._since = 0
        self._last_checkpoint = clock()
        self._unflushed = False
        self._last_gap_check = -float("inf")
        self._idle_polls = 0
        self._status = (-2, 0.0)
        self._open = False
        self.stats = stats if stats is not None else TableStats(self.table, table_name(self.table))

    def stop(self) -> None:
        """Ask the loop to finish the batch in hand, checkpoint and return (thread- and signal-safe)."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.wake()

    # -- start ---------------------------------------------------------------------------------

    def _base_version(self, cursor: Position) -> int:
        return cursor.version if cursor.snapshot else cursor.version - 1

    def _load_base(self, version: int) -> Manifest | None:
        if version < 1:
            return None
        try:
            return self.dataset.manifest(version)
        except VersionNotFoundError as e:
            raise VersionGapError(
                f"the tailer's position needs version {version}, which the dataset no longer holds; " + CLEANED_UP_HINT,
                table=self.table,
                version=version,
                file=e.file,
            ) from e

    def _start(self) -> None:
        saved = self.store.load()
        if saved is not None:
            if saved.table_id != self.table_id:
                raise StateError(
                    f"this state directory belongs to {saved.table_id}, not {self.table_id}; use a new --state-dir",
                    table=self.table,
                    file=self.config.state_dir,
                )
            self._cursor = saved.cursor
            self._base = self._load_base(self._base_version(saved.cursor))
            stamp = None if self._base is None else self._base.timestamp_us // 1000
            if stamp != saved.previous_timestamp_ms:
                raise StateError(
                    f"version {saved.snapshot_version} of {self.table} is not the one this state directory "
                    "delivered (the dataset was deleted and recreated, or restored from elsewhere); "
                    "use a new --state-dir to follow it",
                    table=self.table,
                    version=saved.snapshot_version,
                    file=self.config.state_dir,
                )
            self._resume = saved.cursor
            log.info("resuming %s at %s", self.table, saved.cursor)
        else:
            self._start_new()
        self.stats.delivered_version = self._base_version(self._cursor)
        self.stats.newest_version = max(self.stats.newest_version, self.stats.delivered_version)
        if self._base is not None:
            self.stats.delivered_commit_ms = self._base.timestamp_us // 1000
        held = self.sink.open(TableInfo(self.table, self.table_id, table_name(self.table)))
        if held is not None and held > self._cursor:
            log.info("sink already holds rows up to %s; skipping them", held)
            self._resume = held
        if saved is None and self._cursor.snapshot:
            self._checkpoint()  # fix the snapshot's version now, so a restart resumes the same snapshot

    def _start_new(self) -> None:
        c = self.config
        start = c.starting_version
        if c.starting_timestamp_ms is not None:
            start = self.dataset.timestamp_version(c.starting_timestamp_ms * 1000)
        if c.initial_snapshot:
            version = self.dataset.latest_version() if start is None else start
            self._cursor = Position.in_snapshot(version, 0)
        else:
            self._cursor = Position.change(max(1, 1 if start is None else start), 0)
        self._base = self._load_base(self._base_version(self._cursor))

    # -- loop ----------------------------------------------------------------------------------

    def run(self) -> Progress:
        """Run until caught up (``until_caught_up``), stopped, or an error.

        Raises:
            StateError: the state directory is locked, damaged, or belongs to another dataset (or the
                dataset was recreated).
            VersionGapError: the version after the cursor was cleaned up.
            UnsupportedFeatureError: a version needs an unsupported feature (cursor saved before it).
            SchemaChangeError: a non-additive schema change (cursor saved before it).
            SinkError: the sink failed; the cursor stays at the last successful checkpoint.
        """
        self.open()
        remote = self.dataset.storage.remote
        watcher = self._make_watcher(self.dataset.versions_dir, self.config.watch and not remote)
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
            if self._cursor.snapshot:
                self._deliver_snapshot()
        except BaseException as e:
            if isinstance(e, DeltaTailError):
                self.stats.errors[type(e).__name__] += 1
                self.stats.set_state(TableState.FAILED, str(e))
            if self._open:
                self.sink.close()
                self._open = False
            self.store.unlock()
            raise

    def step(self, max_versions: int | None = None) -> int:
        """Look for new versions once and deliver them (at most ``max_versions``); returns how many were found.

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
            for version in versions:
                if self._stop.is_set() or not self._deliver_version(version, remaining=versions[-1] - version):
                    break
                if self._due():
                    self._checkpoint()
        except DeltaTailError as e:
            self.stats.errors[type(e).__name__] += 1
            self.stats.set_state(TableState.FAILED, str(e))
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
        self.sink.heartbeat(self._follow_status())

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

    def _new_versions(self, limit: int | None = None) -> list[int]:
        """The versions after the cursor's base that are there now (at most ``limit``), by name; a gap is an error.

        Raises:
            VersionGapError: if the next version is gone while newer ones exist (cleaned up).
            StateError: if the dataset's newest version is older than the base (recreated or truncated).
        """
        base = self._base_version(self._cursor)
        found: list[int] = []
        nxt = base + 1
        ahead = DISCOVER_AHEAD if limit is None else limit
        while len(found) < ahead and self.dataset.exists(nxt):
            found.append(nxt)
            nxt += 1
        if found:
            newest = found[-1] if len(found) < ahead else self.dataset.latest_version()
            self.stats.newest_version = max(self.stats.newest_version, newest)
        now = self._clock()
        if found or (not self.config.until_caught_up and now - self._last_gap_check < self.config.gap_check_seconds):
            return found
        self._last_gap_check = now
        latest = self.dataset.latest_version()
        if latest > base and not self.dataset.exists(base + 1):
            raise VersionGapError(
                f"version {base + 1} is gone but the dataset has newer versions (up to {latest}); {CLEANED_UP_HINT}",
                table=self.table,
                version=base + 1,
                file=self.dataset.manifest_path(base + 1),
            )
        if latest < base:
            raise StateError(
                f"the dataset's newest version is {latest}, older than version {base} already delivered "
                "(deleted and recreated?); use a new --state-dir to follow it",
                table=self.table,
                file=self.config.state_dir,
            )
        return [base + 1] if latest > base else []

    def _deliver_snapshot(self) -> None:
        base = self._base
        if base is None:
            raise RuntimeError("an initial snapshot needs its version's manifest")  # _start loads it
        if not self._deliver(plan_snapshot(base, table=self.table)):
            return
        self._cursor = Position.change(base.version + 1, 0)
        self._checkpoint()

    def _deliver_version(self, version: int, remaining: int) -> bool:
        try:
            plan = self.feed.plan(self._base, version)
            after = self.dataset.manifest(version)
        except (UnsupportedFeatureError, SchemaChangeError) as e:
            log.error("stopping before version %s; everything before it is delivered and checkpointed", e.version)
            self._checkpoint()
            raise
        if not self._deliver(plan):
            return False
        self._base = after
        self._cursor = Position.change(version + 1, 0)
        self._since += 1
        self.progress.versions += 1
        self.stats.delivered_version = version
        self.stats.delivered_commit_ms = plan.timestamp_us // 1000
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
        return True

    def _deliver(self, plan: LancePlan) -> bool:
        """Write a plan's rows (skipping delivered ones); ``False`` if stopped inside it."""
        counts: dict[str, int] = {}
        if not plan.snapshot:
            self.sink.commit_started(plan.version, plan.operation)
        for batch in self.feed.plan_batches(plan):
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
        if not plan.snapshot:
            self.sink.commit_event(CommitEvent(plan.version, plan.timestamp_us // 1000, plan.operation, {}, counts))
        return True

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
        if self._resume is None:
            return batch
        if batch.end <= self._resume:
            return batch.slice_from(batch.end)
        out = batch.slice_from(self._resume)
        self._resume = None
        return out

    # -- checkpoints ---------------------------------------------------------------------------

    def _due(self) -> bool:
        by_time = self._clock() - self._last_checkpoint >= self.config.checkpoint_seconds
        return self._since >= self.config.checkpoint_commits or (by_time and self._since > 0)

    def _checkpoint(self) -> None:
        """Flush the sink, then save the cursor (with its base version and that version's timestamp)."""
        self.sink.flush()
        crash_point("after_flush")
        self._unflushed = False
        base_version = self._base_version(self._cursor)
        stamp = None if self._base is None else self._base.timestamp_us // 1000
        self.store.save(SavedState(self.table, self.table_id, self._cursor, base_version, "", stamp))
        crash_point("after_save")
        self._since = 0
        self._last_checkpoint = self._clock()
        self.stats.last_checkpoint = self._wall_clock()

    def _flush_idle(self) -> None:
        if self._unflushed:
            self.sink.flush()
            self._unflushed = False
        if self._due():
            self._checkpoint()

    def idle_timeout(self, poll: float | None = None) -> float:
        """How long to wait for news: ``poll`` (default the poll interval), but no later than a checkpoint due.

        On an object store (polled) the default interval doubles with every idle poll, up to
        ``max_poll_interval``, and is back to ``poll_interval`` once a version is found.
        """
        c = self.config
        timeout = c.poll_interval if poll is None else poll
        if poll is None and self.dataset.storage.remote:
            backoff = c.poll_interval * 2 ** max(self._idle_polls - 1, 0)
            timeout = min(backoff, max(c.max_poll_interval, c.poll_interval))
        if self._since:
            timeout = min(timeout, max(self._last_checkpoint + c.checkpoint_seconds - self._clock(), 0.0))
        return timeout

    def _seconds_behind(self) -> float:
        if self._base is None:
            return 0.0
        return max(self._wall_clock() - self._base.timestamp_us / 1e6, 0.0)

    def _follow_status(self) -> FollowStatus:
        version = -1 if self._base is None else self._base.version
        return FollowStatus(self.table_id, version, version, self._seconds_behind())

    def _report_following(self) -> None:
        version = -1 if self._base is None else self._base.version
        now = self._clock()
        if version == self._status[0] and now - self._status[1] < STATUS_SECONDS:
            return
        self._status = (version, now)
        behind = self._seconds_behind()
        status(
            "following",
            f"{self.stats.name}: following: at version {version}, 0 versions behind, newest version {behind:.1f}s ago",
            table=self.stats.name,
            version=version,
            versions_behind=0,
            seconds_behind=round(behind, 3),
        )


def _watcher(directory: str, watch: bool) -> Watcher:
    return LogWatcher(directory, watch=watch)
