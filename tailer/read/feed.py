"""Change rows for a range of versions, as Arrow record batches: the library's reading API.

Planning is pure (:mod:`state.planning`); the log is followed by a
:class:`~tailer.log.follower.LogFollower`; rows are read by a
:class:`~tailer.read.readers.PlanReader` (reading ahead by default, see
:mod:`tailer.read.read_ahead`). Every row carries ``_change_type``,
``_commit_version`` and ``_commit_timestamp``.

``_commit_timestamp`` (UTC): the commit's ``inCommitTimestamp`` where in-commit
timestamps are enabled, otherwise the commit file's modification time made
monotonic across versions (Delta Spark's rule: a time not greater than the
previous commit's becomes the previous commit's plus one millisecond). This is
why it differs from delta-rs, which reports ``commitInfo.timestamp``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TypedDict, Unpack

import pyarrow as pa

from deltatail.state.changes import FileTask
from deltatail.state.cursor import Position, version_range
from deltatail.state.errors import SchemaChangeError, StateError, VersionGapError
from deltatail.state.feed import ChangeBatch, change_schema
from deltatail.state.filters import ChangeFilter
from deltatail.state.planning import ReadContext, VersionPlan, plan_snapshot
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import PREFETCH_COMMITS, LogFollower
from deltatail.tailer.log.starts import snapshot_before, snapshot_time, version_at_or_after
from deltatail.tailer.read.conform import nulls
from deltatail.tailer.read.net_changes import (
    KEY_HASH_ORDERS,
    PASS_BYTES_OF_ORDER,
    ROW_ORDER,
    net_batches,
    net_passes,
    pass_ids,
)
from deltatail.tailer.read.pass_rows import SlimRows
from deltatail.tailer.read.pruning import prune
from deltatail.tailer.read.read_ahead import ReadAheadReader
from deltatail.tailer.read.reader_pool import ReaderPool, shared_pool
from deltatail.tailer.read.readers import PlanReader, PlanRows, SequentialReader
from deltatail.tailer.read.spill import PassSpill
from deltatail.tailer.read.tasks import count_task_rows, read_task
from deltatail.tailer.read.update_pairs import check_key, pair_batches
from deltatail.tailer.storage import Storage

#: The key-hash pass of each row of a batch: ``f(batch, passes=N)``, an array of ``0 .. N - 1``.
_PassIds = Callable[..., pa.Array]


@dataclass(frozen=True, slots=True)
class ChangeOptions:
    """How change rows are produced and read.

    Attributes:
        net_changes: cancel rows identical in a commit's removed and added files
            (copy-on-write rewrites) and, with ``key_columns``, turn a delete and an
            insert of one key into ``update_preimage``/``update_postimage``. Only for
            commits without cdc files.
        key_columns: the key for ``net_changes`` update pairing.
        require_cdf: refuse versions where ``delta.enableChangeDataFeed`` is off
            (Delta CDF semantics); off by default, the add/remove fallback works on any table.
        allow_non_additive: read across non-additive schema changes (drop, rename, type change).
        batch_size: the largest number of rows in one output batch.
        read_ahead: how many file tasks are planned ahead of the consumer (0: plan and read each
            file when its turn comes, on the calling thread; see :mod:`tailer.read.read_ahead`).
            The window holds plans, not rows.
        read_ahead_min_bytes: files at least this large are decoded by worker threads ahead of
            their turn, into bounded buffers.
        reader_processes: child processes that read small files while catching up (see
            :mod:`tailer.read.reader_pool`); they start on first use and are shared by every feed
            in the process. 0 reads everything in-process.
        filter: what of the feed to deliver (columns, a row predicate, change types, skipped
            operations; :mod:`state.filters`). Rows keep their unfiltered positions.
        external_roots: absolute paths or URIs outside the table whose files its log may name
            (shallow clones); every other path outside the table root is refused before it is
            opened (:mod:`state.paths`). A listed root is read with the table's store options.
        pair_key: the key columns of a sink that makes one event of an update's two images
            (:attr:`tailer.sink.Sink.update_pair_key`); a commit with cdc files is then read so
            that both images of a key are side by side in one batch (:mod:`tailer.read.update_pairs`).
            Empty (the default): the writer's order.
    """

    net_changes: bool = False
    key_columns: tuple[str, ...] = ()
    require_cdf: bool = False
    allow_non_additive: bool = False
    batch_size: int = 65536
    read_ahead: int = 512
    read_ahead_min_bytes: int = 512 << 10
    reader_processes: int = 2
    filter: ChangeFilter = field(default_factory=ChangeFilter)
    external_roots: tuple[str, ...] = ()
    pair_key: tuple[str, ...] = ()


class RangeStart(TypedDict, total=False):
    """Where a range starts besides a version (see :meth:`ChangeFeed.plans`)."""

    starting_timestamp_ms: int | None
    initial_snapshot: bool


class ChangeFeed:
    """Change rows of a table for a range of versions.

    Args:
        table_root: the table's root (a path or URI).
        storage: where the table is; a local file system by default.
        options: how rows are produced and read.
        pool: the reader processes to read small files with, unless ``options.reader_processes`` is 0
            (then none); by default the process-wide pool of ``options.reader_processes`` processes.

    Example:
        >>> feed = ChangeFeed("/data/events")                               # doctest: +SKIP
        >>> for batch in feed.batches(starting_version=3, ending_version=5):  # doctest: +SKIP
        ...     print(batch.start, batch.rows.num_rows)
    """

    def __init__(
        self,
        table_root: str,
        storage: Storage | None = None,
        options: ChangeOptions | None = None,
        *,
        pool: ReaderPool | None = None,
    ) -> None:
        self.log = DeltaLog(table_root, storage)
        self.storage = self.log.storage
        self.table = self.log.table
        self.options = options or ChangeOptions()
        self._pool = pool
        self._filters: dict[str, ChangeFilter] = {}
        #: (version, row order) of the commit a resumed cursor of an earlier row order is inside.
        self._adopted: tuple[int, int] | None = None

    def reader(self) -> PlanReader:
        """The reader of this feed's rows: reading ahead, unless ``options.read_ahead`` is 0."""
        o = self.options
        if o.read_ahead <= 0:
            return SequentialReader(self.storage, o.batch_size)
        pool = None
        if o.reader_processes > 0:
            pool = self._pool if self._pool is not None else shared_pool(o.reader_processes)
        return ReadAheadReader(
            self.storage, batch_size=o.batch_size, read_ahead=o.read_ahead, min_bytes=o.read_ahead_min_bytes, pool=pool
        )

    def follower(self, head: Snapshot, previous_ms: int | None = None) -> LogFollower:
        """A log follower from ``head`` that plans as this feed's options say."""
        return LogFollower(
            self.log,
            head,
            previous_ms=previous_ms,
            allow_non_additive=self.options.allow_non_additive,
            require_cdf=self.options.require_cdf,
            external_roots=self.options.external_roots,
        )

    # -- planning ------------------------------------------------------------------------------

    def plans(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        **start: Unpack[RangeStart],
    ) -> Iterator[VersionPlan]:
        """Plans for the versions of a range, in order (an initial snapshot first if asked).

        Args:
            starting_version: first version (inclusive); default 0, or the latest with ``initial_snapshot``.
            ending_version: last version (inclusive); default the latest now.
            start: :class:`RangeStart`: ``starting_timestamp_ms`` starts at the first commit at or
                after this time instead; ``initial_snapshot`` emits the live rows at the starting
                version as ``insert`` rows (positions flagged as snapshot), then the changes after it.

        Raises:
            VersionNotFoundError: if the range starts after the latest version, or before what the log still holds.
            ConfigError: if ``ending_version`` is before the starting version.
            VersionGapError: if a version inside the range is missing (log cleaned up or gap).
        """
        starting_timestamp_ms = start.get("starting_timestamp_ms")
        initial_snapshot = start.get("initial_snapshot", False)
        latest = self.log.latest_version()
        if starting_timestamp_ms is not None:
            starting_version = version_at_or_after(self.log, starting_timestamp_ms)
        if starting_version is None:
            starting_version = latest if initial_snapshot else 0
        end = version_range(self.table, starting_version, ending_version, latest)
        listing = self.log.list_log(max(starting_version - 1, 0))
        if initial_snapshot:
            snap = self.log.snapshot(starting_version)
            at = snapshot_time(self.log, snap, listing)
            yield plan_snapshot(snap, at, self.options.external_roots)
            follower = self.follower(snap, at)
            first = starting_version + 1
        else:
            snap = snapshot_before(self.log, starting_version)
            at_ms = snapshot_time(self.log, snap, listing) if starting_version > 0 else None
            follower = self.follower(snap, at_ms)
            first = starting_version
        if listing.commits:
            follower.know_commits_up_to(max(listing.commits))
        for v in range(first, end + 1):
            if (v - first) % (PREFETCH_COMMITS // 2) == 0:
                follower.prefetch(range(v, min(v + PREFETCH_COMMITS, end + 1)), listing.commits)
            info = listing.commits.get(v)
            if info is None:
                raise VersionGapError(
                    f"commit {v} is missing from the log (cleaned up, or a gap); the range cannot be read exactly",
                    table=self.table,
                    version=v,
                    file=self.log.commit_path(v),
                )
            yield self.filtered(follower.plan(v, info).plan)

    # -- reading -------------------------------------------------------------------------------

    def plan_batches(
        self, plan: VersionPlan, task_batches: Iterable[Iterable[pa.RecordBatch]] | None = None
    ) -> Iterator[ChangeBatch]:
        """Every change row of one planned version, in batches with consecutive positions.

        ``task_batches`` are the rows of each of the plan's tasks when a
        :class:`~tailer.read.readers.PlanReader` read them; by default each task is read here, in order.
        """
        if task_batches is None:
            task_batches = (read_task(self.storage, plan.context_of(t), t, self.options.batch_size) for t in plan.tasks)
        start = (
            Position.in_snapshot(plan.context.version, 0) if plan.snapshot else Position.change(plan.context.version, 0)
        )
        index = 0
        if self._nets(plan):
            netted = self._netted(plan, task_batches)
            runs: Iterable[tuple[FileTask | None, Iterable[pa.RecordBatch]]] = [(None, netted)]
        elif self._pairs(plan):
            runs = [(None, self._paired(plan, task_batches))]
        else:
            runs = zip(plan.tasks, task_batches, strict=True)
        for task, batches in runs:
            if task is not None and task.pruned:
                for _ in batches:  # nothing: a pruned task is not read
                    pass
                index += count_task_rows(self.storage, plan.context_of(task), task)
                continue
            change_filter = self._compiled_filter(plan.context if task is None else plan.context_of(task))
            for batch in batches:
                if batch.num_rows == 0:
                    continue
                unfiltered = ChangeBatch(Position(start.version, start.snapshot_rank, index), batch)
                index += batch.num_rows
                if change_filter is None:
                    yield unfiltered
                else:
                    yield from change_filter.apply(unfiltered)

    def _netted(self, plan: VersionPlan, task_batches: Iterable[Iterable[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
        """The net changes of ``plan``'s rows, in key-hash partitioned passes (:mod:`tailer.read.net_changes`)."""
        o = self.options
        rows = self._slim_rows(plan)
        pass_of = functools.partial(pass_ids, key_columns=o.key_columns)
        for merged in self._in_passes(plan, task_batches, pass_of, rows):
            yield from map(rows.restore, net_batches(merged, o.key_columns, o.batch_size))
            del merged  # before the next pass is read back: one pass in memory at a time

    def _paired(self, plan: VersionPlan, task_batches: Iterable[Iterable[pa.RecordBatch]]) -> Iterator[pa.RecordBatch]:
        """``plan``'s rows with both images of every update side by side, in key-hash passes as :meth:`_netted`."""
        o = self.options
        check_key(change_schema(plan.context.schema()), o.pair_key, where=self.table, version=plan.context.version)
        rows = self._slim_rows(plan)
        pass_of = functools.partial(pass_ids, key_columns=o.pair_key)
        for merged in self._in_passes(plan, task_batches, pass_of, rows):
            yield from map(rows.restore, pair_batches(merged, o.pair_key, o.batch_size))
            del merged  # before the next pass is read back: one pass in memory at a time

    def _in_passes(
        self,
        plan: VersionPlan,
        task_batches: Iterable[Iterable[pa.RecordBatch]],
        pass_of: _PassIds,
        slim: SlimRows,
    ) -> Iterator[pa.Table]:
        """``plan``'s rows in :func:`net_passes` passes, each one table of the rows ``pass_of`` gives it.

        The passes are those of :func:`net_passes`, or those of the earlier row order the commit is
        read in (:meth:`adopt_row_order`).

        The rows are held as ``slim`` holds them (:meth:`_slim_rows`). One pass is the rows as read; with more,
        ``task_batches`` are read once and spilled by pass (:class:`~tailer.read.spill.PassSpill`),
        and the passes read back in turn.
        """
        earlier = self.earlier_order(plan.context.version)
        passes = net_passes(plan.tasks, None if earlier is None else PASS_BYTES_OF_ORDER[earlier[1]])
        rows = (slim.slim(b) for batches in task_batches for b in batches)
        if passes == 1:
            yield pa.Table.from_batches(list(rows), schema=slim.slim_schema)
            return
        with PassSpill(slim.slim_schema, passes, table=self.table, version=plan.context.version) as spill:
            for batch in rows:
                spill.add(batch, pass_of(batch, passes=passes))
            for which in range(passes):
                yield spill.rows(which)

    @staticmethod
    def _slim_rows(plan: VersionPlan) -> SlimRows:
        """How ``plan``'s rows are held in its passes and made whole as delivered (:mod:`tailer.read.pass_rows`)."""
        context = plan.context
        return SlimRows(change_schema(context.schema()), context.version, context.timestamp_ms)

    def _pairs(self, plan: VersionPlan) -> bool:
        """Whether ``plan``'s rows are read for a sink that pairs update images (a commit with cdc files)."""
        return bool(self.options.pair_key) and plan.commit is not None and bool(plan.commit.cdcs)

    def pair_updates(self, key_columns: tuple[str, ...]) -> None:
        """From now on, read commits with cdc files for a sink that pairs update images by ``key_columns``."""
        self.options = replace(self.options, pair_key=key_columns)

    def _nets(self, plan: VersionPlan) -> bool:
        """Whether ``plan``'s rows go through net changes (then positions count the netted rows)."""
        return self.options.net_changes and plan.commit is not None and not plan.commit.cdcs

    def filtered(self, plan: VersionPlan) -> VersionPlan:
        """``plan`` as the filter reads it.

        No tasks when the filter skips the commit's operation; the tasks it drops whole
        marked pruned (:mod:`tailer.read.pruning`), except under net changes and update pairing,
        whose positions count netted or reordered rows.

        Raises:
            InvalidLogError: if a partition value the predicate reads does not parse.
            ConfigError: if the predicate cannot be evaluated on the partition columns' types.
        """
        if self.options.filter.skips(plan.commit):
            return replace(plan, tasks=())
        if self._nets(plan) and plan.before is not None:
            plan = replace(plan, before=None)  # netting compares removed and added rows in one schema: the commit's
        change_filter = self._compiled_filter(plan.context)
        if change_filter is None or self._nets(plan) or self._pairs(plan):
            return plan
        return prune(plan, change_filter)

    def adopt_row_order(self, position: Position, row_order: int, earlier: tuple[int, int] | None = None) -> None:
        """Read the commit ``position`` is inside in the row order of its cursor, so it resumes at the same row.

        ``row_order`` is the order of the deltatail that saved the cursor; ``earlier`` the
        ``(version, order)`` it saved for a commit it was itself reading in an earlier order
        (:meth:`earlier_order`), which applies only to a position inside that version.

        Only the rows of a commit read in key-hash passes (:mod:`tailer.read.net_changes`) move
        between row orders. A cursor of an earlier order that kept the pass hash (2, 3) reads its commit
        in that order's passes (:data:`~tailer.read.net_changes.PASS_BYTES_OF_ORDER`), and
        :meth:`earlier_order` reports it for that version, so a cursor saved there again keeps it.
        Order 1 hashed keys differently under net changes and in pairs of update images by a key
        that is not an integer, date or timestamp (:func:`~tailer.read.net_changes.pass_ids`).

        Raises:
            StateError: if ``position`` is inside a commit read in several passes whose rows
                ``row_order`` placed differently (order 1 as above, or an order this deltatail does
                not know): resuming would deliver some of its rows twice and skip others.
        """
        if row_order == ROW_ORDER:
            if earlier is None or earlier[0] != position.version:
                return
            row_order = earlier[1]
        if row_order == ROW_ORDER or position.snapshot or position.index == 0:
            return
        plan = next(self.plans(position.version, position.version))
        if not (self._nets(plan) or self._pairs(plan)):
            return
        pass_bytes = PASS_BYTES_OF_ORDER.get(row_order)
        passes = net_passes(plan.tasks, pass_bytes)
        keys = change_schema(plan.context.schema())
        hashed = [keys.field(k).type for k in self.options.pair_key if k in keys.names]
        arrow = all(pa.types.is_integer(t) or pa.types.is_temporal(t) for t in hashed)
        same_hash = row_order in KEY_HASH_ORDERS or (row_order == 1 and self._pairs(plan) and arrow)
        if pass_bytes is None or (passes > 1 and not same_hash):
            why = (
                "a row order this deltatail does not know"
                if pass_bytes is None
                else f"rows this deltatail orders differently ({passes} key-hash passes)"
            )
            raise StateError(
                f"the cursor {position} was saved by another deltatail (row order {row_order}) inside version "
                f"{position.version}, with {why}; finish the version with the deltatail that saved the cursor, "
                f"or start a new state directory with --starting-version {position.version} (its rows delivered "
                f"again) or {position.version + 1}",
                permanent=True,
                table=self.table,
                version=position.version,
            )
        self._adopted = (position.version, row_order)

    def earlier_order(self, version: int) -> tuple[int, int] | None:
        """``(version, row order)`` if ``version`` is read in an earlier row order (see :meth:`adopt_row_order`)."""
        adopted = self._adopted
        return adopted if adopted is not None and adopted[0] == version else None

    def check_filter(self) -> None:
        """Check the filter's columns against the table's latest schema (a no-op without columns or predicate).

        Raises:
            ConfigError: naming a column the table does not have, or a predicate that does not parse.
        """
        f = self.options.filter
        if f.columns is not None or f.where is not None:
            f.compile(self.log.snapshot().schema.names)

    def _compiled_filter(self, context: ReadContext) -> ChangeFilter | None:
        f = self.options.filter
        if f.is_empty or (f.columns is None and f.where is None and f.change_types is None):
            return None
        key = context.schema_string
        compiled = self._filters.get(key)
        if compiled is None:
            compiled = self._filters[key] = f.compile(context.schema().names)
        return compiled

    def read_plans(self, plans: Iterator[VersionPlan]) -> Generator[PlanRows, None, None]:
        """Each plan of ``plans`` with the rows of its tasks, read by :meth:`reader` (for :meth:`plan_batches`).

        Close the generator (or exhaust it) to stop the read-ahead workers and give the reader processes back.
        """
        return self.reader().read(plans)

    def batches(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        **start: Unpack[RangeStart],
    ) -> Generator[ChangeBatch, None, None]:
        """Every change row of the range, as batches; arguments and errors as :meth:`plans`.

        Closing the generator early (``close()``, or dropping it) stops the read-ahead workers.

        Also raises what reading rows raises: ``MissingFileError`` for a missing
        data/cdc/DV file, ``DeletionVectorError`` for a bad DV.
        """
        plans = self.plans(starting_version, ending_version, **start)
        reading = self.read_plans(plans)
        try:
            for plan, task_batches in reading:
                yield from self.plan_batches(plan, task_batches)
        finally:
            reading.close()

    def read_table(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        **start: Unpack[RangeStart],
    ) -> pa.Table:
        """All change rows of a range in one Arrow table (for small ranges); arguments and errors as :meth:`batches`.

        The table's schema is the newest schema of the range; rows from before an
        additive schema change have nulls in the added columns.

        Raises:
            SchemaChangeError: if (with ``allow_non_additive``) a column's values cannot be
                cast to its type at the end of the range.
        """
        tables: list[pa.Table] = []
        schema: pa.Schema | None = None
        plans = self.plans(starting_version, ending_version, **start)
        for plan in plans:
            schema = self.options.filter.output_schema(change_schema(plan.context.schema()))
            tables += [pa.Table.from_batches([b.rows]) for b in self.plan_batches(plan)]
        if schema is None:
            schema = self.options.filter.output_schema(change_schema(self.log.snapshot(ending_version).schema))
        if not tables:
            return schema.empty_table()
        return pa.concat_tables([_conform(t, schema, self.table) for t in tables])


def _conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """``table`` in ``schema``: missing columns as nulls, types cast safely.

    Raises:
        SchemaChangeError: if a column cannot be cast (a type change across the range).
    """
    columns = []
    for column in schema:
        if column.name not in table.column_names:
            columns.append(nulls(table.num_rows, column.type))
            continue
        try:
            columns.append(table.column(column.name).cast(column.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            version = table.column("_commit_version")[0].as_py() if table.num_rows else None
            raise SchemaChangeError(
                f"column {column.name!r} of type {table.schema.field(column.name).type} cannot be read as "
                f"{column.type}, the type at the end of the range: read the versions on each side separately",
                table=where,
                version=version,
            ) from e
    return pa.Table.from_arrays(columns, schema=schema)
