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

:class:`LanceTailer` is a :class:`~tailer.follow.plan_loop.PlanLoop` (a change loop), as the Delta
:class:`~tailer.follow.tailer.Tailer` is: the same ``run``/``open``/``step``/``rest``/``close``, so
``deltatail serve`` (:mod:`tailer.serve.service`) steps Lance datasets and Delta tables alike, and the
same :class:`~tailer.follow.stats.TableStats` kept up to date.

Errors that stop it: the version after the cursor cleaned up while newer ones exist
(``VersionGapError``, with a recovery hint), the dataset recreated (``StateError``), an unsupported
feature or a non-additive schema change (after delivering and checkpointing everything before it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator

from deltatail.state.cursor import Position
from deltatail.state.errors import (
    SchemaChangeError,
    StateError,
    UnsupportedFeatureError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.state.lance.manifest import Manifest
from deltatail.state.lance.planning import LancePlan, plan_snapshot
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.loop import table_name
from deltatail.tailer.follow.plan_loop import PlanLoop
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.lance.dataset import CLEANED_UP_HINT
from deltatail.tailer.lance.feed import LanceFeed, LanceOptions
from deltatail.tailer.log.watch import Watcher
from deltatail.tailer.sink import Sink

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


class LanceTailer(PlanLoop[LancePlan]):
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
        status_file: whether it keeps ``status.json`` in its state directory (not for ``deltatail serve``).
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
        status_file: bool = True,
    ) -> None:
        o = config.options
        options = LanceOptions(o.allow_non_additive, o.batch_size, o.filter, o.external_roots)
        if feed is None:
            feed = LanceFeed(config.table, options=options, storage_options=config.storage_options or None)
        super().__init__(
            config,
            sink,
            feed.table,
            store=store,
            watcher=watcher,
            clock=clock,
            wall_clock=wall_clock,
            stats=stats,
            status_file=status_file,
        )
        self.feed = feed
        self.dataset = self.feed.dataset
        self.table = self.feed.table
        self._table_id = lance_table_id(self.table)
        self._cursor = Position.change(1, 0)
        self._base: Manifest | None = None  # the manifest the next version is planned against
        self._last_gap_check = -float("inf")
        self._found_ms: dict[int, int] = {}  # the last look's versions' manifest modification times

    @property
    def table_id(self) -> str:
        """The dataset's id (:func:`lance_table_id`)."""
        return self._table_id

    # -- start ---------------------------------------------------------------------------------

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
            self._base = self._load_base(saved.cursor.base_version)
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
            self._rows_end = saved.rows_end
            log.info("resuming %s at %s", self.table, saved.cursor)
        else:
            self._start_new()
        self.stats.delivered_version = self._cursor.base_version
        self.stats.newest_version = max(self.stats.newest_version, self.stats.delivered_version)
        if self._base is not None:
            self.stats.delivered_commit_ms = self._base.timestamp_us // 1000
        self._open_sink(TableInfo(self.table, self.table_id, table_name(self.table)))
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
        self._base = self._load_base(self._cursor.base_version)

    # -- loop ----------------------------------------------------------------------------------

    @property
    def _watch_dir(self) -> str:
        return self.dataset.versions_dir

    @property
    def _remote(self) -> bool:
        return self.dataset.storage.remote

    def _new_versions(self, limit: int | None = None) -> list[int]:
        """The versions after the cursor's base that are there now (at most ``limit``), by name; a gap is an error.

        Raises:
            VersionGapError: if the next version is gone while newer ones exist (cleaned up).
            StateError: if the dataset's newest version is older than the base (recreated or truncated).
        """
        base = self._cursor.base_version
        found: list[int] = []
        nxt = base + 1
        ahead = DISCOVER_AHEAD if limit is None else limit
        self._found_ms = {}
        while len(found) < ahead and (info := self.dataset.manifest_file(nxt)) is not None:
            found.append(nxt)
            self._found_ms[nxt] = info.modification_time
            nxt += 1
        if found:
            newest = found[-1] if len(found) < ahead else self.dataset.latest_version()
            self.stats.found(newest, self._found_ms[found[0]])
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

    def _commit_time_ms(self, version: int) -> int | None:
        return self._found_ms.get(version)

    def _deliver_initial_snapshot(self) -> None:
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
        self._delivered(version, plan.timestamp_us // 1000, remaining)
        return True

    def _plan_batches(self, plan: LancePlan) -> Iterator[ChangeBatch]:
        return self.feed.plan_batches(plan)

    def _commit_of(self, plan: LancePlan) -> tuple[int, str | None, int, dict[str, str]] | None:
        return None if plan.snapshot else (plan.version, plan.operation, plan.timestamp_us // 1000, {})

    def _saved_base(self) -> tuple[int, int | None]:
        return self._cursor.base_version, None if self._base is None else self._base.timestamp_us // 1000

    def _head(self) -> tuple[int, float | None]:
        if self._base is None:
            return -1, None
        return self._base.version, self._base.timestamp_us / 1e6
