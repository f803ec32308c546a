"""The loop of the tailers that deliver change rows into a sink (Delta and Lance): what their guarantees rest on.

A :class:`ChangeLoop` is a :class:`~tailer.follow.loop.FollowLoop` whose output is a
:class:`~tailer.sink.Sink`. It adds what change rows need and audit events do not: rows at
or before the position a sink reports it holds are skipped (:meth:`ChangeLoop._write_batches`), a
sink holding fewer rows than were delivered to it is a gap (:meth:`ChangeLoop._open_sink`), the
cursor moves with every batch written, and rows and bytes are counted by change type.

Memory is bounded by ``flush_rows``, not by the size of a commit: rows are read and handed to the
sink in batches as the files of a commit are read, and once ``flush_rows`` rows were written since
the last flush a checkpoint is taken where the cursor stands, inside a commit too (the sink
flushed, then the cursor saved: the position addresses a row inside its commit, so a restart
resumes there).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

import pyarrow as pa

from deltatail.state.cursor import Position
from deltatail.state.errors import SinkError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.loop import FollowLoop
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.log.watch import Watcher
from deltatail.tailer.runtime.faults import crash_point
from deltatail.tailer.runtime.status import count_change_types, status
from deltatail.tailer.sink import Sink

log = logging.getLogger("deltatail")


class ChangeLoop(FollowLoop[Sink]):
    """Follows one table's change rows into one sink (arguments as :class:`~tailer.follow.loop.FollowLoop`)."""

    config: TailerConfig

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
        self._resume: Position | None = None
        #: The position after the last row delivered (set from the saved state on resume).
        self._rows_end: Position | None = None
        #: The cursor when the sink was opened: rows skipped after it are rows the sink held.
        self._opened_at = self._cursor
        #: Rows written since the last checkpoint taken for ``config.flush_rows`` (at least those since the last flush).
        self._rows_unflushed = 0

    def _open_sink(self, info: TableInfo) -> None:
        """Open the sink; rows up to the position it reports holding (beyond the cursor) are skipped.

        A sink that :attr:`~tailer.sink.Sink.reports_holdings` and holds less than the
        saved state says was delivered to it (the position after the last delivered row), or
        nothing at all, lost rows: a file truncated, deleted or moved away (logrotate). With
        ``on_sink_gap = "fail"`` (the default) that is a :class:`SinkError` naming the gap and the
        ways out; with ``"accept"`` a warning, counted in :attr:`TableStats.sink_gaps`, and the
        tailer goes on at its cursor.

        Raises:
            SinkError: what the sink's ``open`` raises, or a gap with ``on_sink_gap = "fail"``.
        """
        self._opened_at = self._cursor
        held = self.sink.open(info)
        end = self._rows_end
        if self.sink.reports_holdings and end is not None and (held is None or held < end):
            self._sink_gap(info, held, end)
        if held is not None and held > self._cursor:
            log.info("sink already holds rows up to %s; skipping them", held)
            self._resume = held

    def _sink_gap(self, info: TableInfo, held: Position | None, end: Position) -> None:
        """Report rows delivered to the sink that it no longer holds (see :meth:`_open_sink`)."""
        self.stats.sink_gaps += 1
        where = self.sink.location or "the sink"
        has = "no row" if held is None else f"rows only up to {_row(_before(held))}"
        first = Position(0, 0, 0) if held is None else held
        what = (
            f"{where} holds {has} of {info.path}, but rows up to {_row(_before(end))} (version:index) were "
            f"delivered to it: rows {'from the start' if held is None else 'from ' + _row(first)} to "
            f"{_row(_before(end))} are missing from it (truncated, deleted or moved away?)"
        )
        if self.config.on_sink_gap == "accept":
            log.warning("%s; going on at %s (on_sink_gap = accept)", what, _row(self._cursor))
            self._rows_end = held  # accepted: the next checkpoint records what the sink really holds
            return
        raise SinkError(
            f"{what}. To deliver them again, run `deltatail seek {self.config.state_dir} "
            f"--to-version {first.version}`{'' if held is not None else ' (or from the version it started at)'} "
            "(rows the sink still holds are skipped); to go on without them, "
            "set on_sink_gap = accept (--on-sink-gap accept)",
            table=info.path,
            file=self.sink.location,
        )

    def _write_batches(self, batches: Iterable[ChangeBatch], counts: dict[str, int]) -> bool:
        """Write batches, skipping rows already delivered; ``False`` if stopped inside them.

        Each written batch is counted into ``counts`` by change type, and the cursor moves to its
        end (the next row) as soon as it is written. Once ``config.flush_rows`` rows were written
        since the last flush, a checkpoint is taken at the cursor (see the module docstring).
        """
        for given in batches:
            batch = self._skip_delivered(given)
            held = self._held_in(given, batch)
            if len(batch):
                before = self.sink.rows_held
                self.sink.write(batch)
                self._unflushed = True
                crash_point("after_write")
                skipped = self.sink.rows_held - before  # rows the sink itself found it held
                held += skipped
                self.progress.rows += len(batch) - skipped
                self._account(batch.rows.slice(skipped), counts)
            if len(given):
                self._rows_end = given.end
            if held:
                self.progress.held += held
                self.stats.rows_held += held
            self._cursor = batch.end
            self._rows_unflushed += len(batch)
            if self._rows_unflushed >= self.config.flush_rows:
                self._checkpoint()
                self._rows_unflushed = 0
            if self._stop.is_set():
                return False
        return True

    def _delivered(self, version: int, timestamp_ms: int, remaining: int) -> None:
        """Count a delivered version; every 100 while catching up, a status line."""
        self.progress.versions += 1
        self.stats.delivered(version, timestamp_ms, self._commit_time_ms(version + 1))
        self.stats.commits += 1
        self._write_status()
        if remaining > 0 and self.progress.versions % 100 == 0:
            rate = self.progress.rows / max(self._clock() - self.progress.started, 1e-9)
            status(
                "catching_up",
                f"{self.stats.name}: catching up: version {version}, {remaining} versions remaining, "
                f"{self.progress.versions} versions and {self.progress.rows} rows done"
                f"{self.progress.held_text()}, {rate:,.0f} rows/s",
                table=self.stats.name,
                version=version,
                versions_remaining=remaining,
                versions_done=self.progress.versions,
                rows_done=self.progress.rows,
                rows_already_held=self.progress.held,
                rows_per_second=round(rate),
            )

    def _account(self, rows: pa.RecordBatch, counts: dict[str, int]) -> None:
        """Count delivered rows (and bytes, shared out by rows) by change type.

        Of a batch the sink partly held (:attr:`~tailer.sink.Sink.rows_held`), its last
        rows count as delivered: exact in number, by change type as near as the sink tells.
        """
        if not rows.num_rows:
            return
        here: dict[str, int] = {}
        count_change_types(rows.column("_change_type"), here)
        size = rows.nbytes
        for kind, n in here.items():
            counts[kind] = counts.get(kind, 0) + n
            self.stats.rows[kind] += n
            self.stats.bytes[kind] += size * n // rows.num_rows

    def _skip_delivered(self, batch: ChangeBatch) -> ChangeBatch:
        """The part of ``batch`` after the position the sink holds (all of it once that is passed)."""
        if self._resume is None:
            return batch
        if batch.end <= self._resume:
            return batch.slice_from(batch.end)
        out = batch.slice_from(self._resume)
        self._resume = None
        return out

    def _held_in(self, given: ChangeBatch, kept: ChangeBatch) -> int:
        """Rows of ``given`` not in ``kept`` because the sink held them (not because they were before the cursor)."""
        first = max(given.start, self._opened_at)
        return kept.start.index - first.index if first < kept.start else 0


def _before(p: Position) -> Position:
    """The position of the row before ``p`` in the same version (``p`` follows at least one row)."""
    return Position(p.version, p.snapshot_rank, max(p.index - 1, 0))


def _row(p: Position) -> str:
    """A row's position as users write it: ``version:index`` (``snapshot version:index`` for snapshot rows)."""
    return f"{'snapshot ' if p.snapshot else ''}{p.version}:{p.index}"
