"""The change loop of formats whose state directory keeps the cursor alone (Lance, Iceberg).

A Lance dataset or an Iceberg table can be opened at any version it still holds, so their tailers
keep no snapshot file: a checkpoint is "flush the sink, then save the cursor with the version it is
planned against and that version's timestamp" (the timestamp tells the table the state belongs to
from one deleted and recreated at the same place). A checkpoint is due every
``checkpoint_commits`` delivered versions or ``checkpoint_seconds`` seconds after the last one.

:class:`PlanLoop` holds that, and the delivery of one planned version (its rows through
:meth:`~tailer.follow.change_loop.ChangeLoop._write_batches`, framed by the sink's
``commit_started`` and ``commit_event``); a format's tailer says how a version is planned
(:meth:`PlanLoop._deliver_version`), what a plan's commit event is (:meth:`PlanLoop._commit_of`)
and what the cursor is planned against (:meth:`PlanLoop._saved_base`).
"""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from deltatail.state.feed import ChangeBatch, CommitEvent
from deltatail.tailer.follow.change_loop import ChangeLoop
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.state_store import SavedState, StateStore
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.log.watch import Watcher
from deltatail.tailer.runtime.faults import crash_point
from deltatail.tailer.sink import Sink

PlanT = TypeVar("PlanT")


class PlanLoop(ChangeLoop, Generic[PlanT]):
    """A :class:`~tailer.follow.change_loop.ChangeLoop` that checkpoints its cursor alone (arguments as there)."""

    #: The table's root, as errors and state files name it.
    table: str

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
        status_file: bool = True,
    ) -> None:
        super().__init__(
            config,
            sink,
            table,
            store=store,
            watcher=watcher,
            clock=clock,
            wall_clock=wall_clock,
            stats=stats,
            status_file=status_file,
        )
        self._since = 0  # versions delivered since the last checkpoint
        self._last_checkpoint = clock()

    # -- what a format says --------------------------------------------------------------------

    @property
    @abstractmethod
    def table_id(self) -> str:
        """The table's id, kept in the state directory and checked on resume."""

    @abstractmethod
    def _deliver_version(self, version: int, remaining: int) -> bool:
        """Plan and deliver ``version`` (``remaining`` versions follow it in this look); ``False`` if stopped in it."""

    @abstractmethod
    def _plan_batches(self, plan: PlanT) -> Iterator[ChangeBatch]:
        """The change rows of ``plan`` the filter keeps, at their unfiltered positions."""

    @abstractmethod
    def _commit_of(self, plan: PlanT) -> tuple[int, str | None, int, dict[str, str]] | None:
        """``(version, operation, timestamp_ms, summary)`` of a plan's commit; ``None`` for an initial snapshot."""

    @abstractmethod
    def _saved_base(self) -> tuple[int, int | None]:
        """The version the cursor is planned against and its timestamp (ms; ``None`` before the first version)."""

    # -- delivery ------------------------------------------------------------------------------

    def _deliver_versions(self, versions: list[int]) -> None:
        """Deliver ``versions`` in order, checkpointing when due, until stopped."""
        for i, version in enumerate(versions):
            if self._stop.is_set() or not self._deliver_version(version, remaining=len(versions) - 1 - i):
                break
            if self._checkpoint_due():
                self._checkpoint()

    def _deliver(self, plan: PlanT) -> bool:
        """Write a plan's rows (skipping delivered ones) between its commit's start and event; ``False`` if stopped."""
        counts: dict[str, int] = {}
        commit = self._commit_of(plan)
        if commit is not None:
            self.sink.commit_started(commit[0], commit[1])
        if not self._write_batches(self._plan_batches(plan), counts):
            return False
        if commit is not None:
            version, operation, timestamp_ms, summary = commit
            self.sink.commit_event(CommitEvent(version, timestamp_ms, operation, summary, counts))
        return True

    # -- checkpoints ---------------------------------------------------------------------------

    def _checkpoint_due(self) -> bool:
        by_time = self._clock() - self._last_checkpoint >= self.config.checkpoint_seconds
        return self._since >= self.config.checkpoint_commits or (by_time and self._since > 0)

    def _checkpoint(self) -> None:
        """Flush the sink, then save the cursor (with the version it is planned against and its timestamp)."""
        self.sink.flush()
        crash_point("after_flush")
        self._unflushed = False
        base_version, stamp = self._saved_base()
        self.store.save(SavedState(self.table, self.table_id, self._cursor, base_version, "", stamp, self._rows_end))
        crash_point("after_save")
        self._since = 0
        self._last_checkpoint = self._clock()
        self.stats.last_checkpoint = self._wall_clock()

    def _seconds_until_due(self) -> float | None:
        if not self._since:
            return None
        return max(self._last_checkpoint + self.config.checkpoint_seconds - self._clock(), 0.0)
