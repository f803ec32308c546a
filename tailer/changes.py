"""Change rows for a range of versions, as Arrow record batches.

Planning is :mod:`state.changes` (pure); this module does the IO: it lists
and reads commits, keeps the snapshot moving one commit at a time, reads each
planned file with :func:`tailer.rows.read_file_rows` (deletion vectors
applied) and adds ``_change_type``, ``_commit_version`` and
``_commit_timestamp``.

``_commit_timestamp`` (UTC): the commit's ``inCommitTimestamp`` where in-commit
timestamps are enabled, otherwise the commit file's modification time made
monotonic across versions (Delta Spark's rule: a time not greater than the
previous commit's becomes the previous commit's plus one millisecond). This is
why it differs from delta-rs, which reports ``commitInfo.timestamp``.
"""

from __future__ import annotations

import bisect
import functools
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa
from pyroaring import BitMap64

from sinks.base import ChangeBatch
from state.actions import DeletionVector
from state.changes import (
    FileTask,
    PreparedCommit,
    RowSelection,
    cdf_enabled,
    check_schema_change,
    commit_timestamp,
    prepare,
)
from state.commit import Commit
from state.cursor import Position
from state.errors import (
    ConfigError,
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    VersionGapError,
    VersionNotFoundError,
)
from state.files import FileTable
from state.schema import StructType, parse_schema
from state.snapshot import Snapshot
from tailer.deletion_vectors import read_deletion_vector
from tailer.log import DeltaLog, LogListing
from tailer.netchanges import net_changes
from tailer.reader_pool import MIN_FILES, RUN_BYTES, RUN_FILES, ReaderPool, RemoteRun, shared_pool
from tailer.rows import FileBatch, RowFilter, read_file_batches
from tailer.storage import Storage

TIMESTAMP = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True, slots=True)
class ChangeOptions:
    """How change rows are produced.

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
        read_ahead: how many file tasks :meth:`ChangeFeed.batches` plans ahead of the
            consumer (0: plan and read each file when its turn comes, on the calling thread).
            Planning resumes only once half of them are consumed, so commits are planned in
            runs rather than one between every two files (on thousands of one-file commits
            alternating costs a quarter more time). The window holds plans, not rows: small
            files are read when their turn comes or by a reader process (which holds at most
            :data:`~tailer.reader_pool.OUTBOX_ANSWERS` answers, of at most ``RUN_BYTES`` of files
            each, and :data:`~tailer.reader_pool.OUTBOX_BYTES` in all), large ones into bounded
            buffers. It is wide enough that the reader processes still have runs queued while
            the consumer plans the next burst: at 128 they ran dry at every burst (500 mixed
            commits: 0.19 s, at 512 0.15 s).
        read_ahead_min_bytes: files at least this large are read by worker threads ahead of
            their turn, into a bounded buffer of :data:`READ_AHEAD_BATCHES` batches each (their
            decoding releases the GIL, so two files decode at once). Smaller files are read
            when their turn comes: for them Python set-up dominates and threads only contend
            for the GIL.
        reader_processes: child processes that read small files during catch-up (see
            :mod:`tailer.reader_pool`): when one planning burst holds at least
            :data:`~tailer.reader_pool.MIN_FILES` small files, they go to the processes in runs of
            :data:`~tailer.reader_pool.RUN_FILES`, which roughly halves the time of thousands of
            small commits on two cores. Fewer (the live tail) are read in-process. The processes
            start on first use and are shared by every feed in the process (one consumer at a
            time; another reads in-process). 0 reads everything in-process.
    """

    net_changes: bool = False
    key_columns: tuple[str, ...] = ()
    require_cdf: bool = False
    allow_non_additive: bool = False
    batch_size: int = 65536
    read_ahead: int = 512
    read_ahead_min_bytes: int = 512 << 10
    reader_processes: int = 2


@dataclass(frozen=True, slots=True)
class ReadContext:
    """What reading one file task needs besides the task: small and picklable (Spark ships it to executors)."""

    table_root: str
    schema_string: str
    partition_columns: tuple[str, ...]
    column_mapping_mode: str
    version: int
    timestamp_ms: int

    def schema(self) -> StructType:
        """The table schema at this version (parsed once per distinct schema string)."""
        return _parsed_schema(self.schema_string)


@dataclass(frozen=True, slots=True)
class VersionPlan:
    """The planned changes of one version: its context, commit (``None`` for an initial snapshot) and tasks."""

    context: ReadContext
    commit: Commit | None
    tasks: tuple[FileTask, ...]
    snapshot: bool = False


@functools.lru_cache(maxsize=64)
def _parsed_schema(schema_string: str) -> StructType:
    return parse_schema(schema_string)


@functools.lru_cache(maxsize=64)
def change_schema(schema: StructType) -> pa.Schema:
    """The output schema: the table's logical columns plus the three change columns."""
    base = schema.to_arrow()
    return (
        base.append(pa.field("_change_type", pa.string()))
        .append(pa.field("_commit_version", pa.int64()))
        .append(pa.field("_commit_timestamp", TIMESTAMP))
    )


def _bitmap(storage: Storage, ctx: ReadContext, dv: DeletionVector | None, data_file: str) -> BitMap64 | None:
    if dv is None:
        return None
    return read_deletion_vector(storage, ctx.table_root, dv, data_file=data_file, version=ctx.version)


def _row_filter(storage: Storage, ctx: ReadContext, task: FileTask) -> RowFilter | None:
    if task.selection.within is None and task.selection.minus is None:
        return None  # the common case: no deletion vector to read
    within = _bitmap(storage, ctx, task.selection.within, task.path)
    minus = _bitmap(storage, ctx, task.selection.minus, task.path)
    if within is None:
        return None if minus is None else RowFilter(minus, keep=False)
    return RowFilter(within - minus if minus is not None else within, keep=True)


def read_task(storage: Storage, ctx: ReadContext, task: FileTask, batch_size: int = 65536) -> Iterator[pa.RecordBatch]:
    """The change rows of one file task, with the three change columns.

    Raises:
        MissingFileError: if the data, cdc or DV file is missing.
        DeletionVectorError: if a DV fails its checksum or does not decode.
        InvalidLogError: if a partition value or a file column does not fit the schema.
    """
    for file_batch in _task_file_batches(storage, ctx, task, batch_size):
        yield _finish(ctx, task, file_batch)


def _task_file_batches(
    storage: Storage, ctx: ReadContext, task: FileTask, batch_size: int
) -> Generator[FileBatch, None, None]:
    """Stage one of :func:`read_task` (DVs, open, decode, filter): what a worker thread does ahead of time."""
    schema = ctx.schema()
    row_filter = _row_filter(storage, ctx, task)
    if row_filter is not None and row_filter.keep and len(row_filter.rows) == 0:
        return
    yield from read_file_batches(
        storage,
        ctx.table_root,
        task.path,
        schema=schema,
        partition_columns=ctx.partition_columns,
        partition_values=task.partition_values,
        column_mapping_mode=ctx.column_mapping_mode,
        row_filter=row_filter,
        keep_change_type=task.is_cdc,
        batch_size=batch_size,
        table=ctx.table_root,
        version=ctx.version,
    )


def _row_columns(task: FileTask, file_batch: FileBatch) -> list[pa.Array]:
    """The batch's output columns, with ``_change_type`` for a task that has one (not from a cdc file)."""
    columns = file_batch.columns()
    if task.change_type is not None:
        columns.append(_change_types(task.change_type, len(columns[0])))
    return columns


def _finish(ctx: ReadContext, task: FileTask, file_batch: FileBatch) -> pa.RecordBatch:
    """Stage two of :func:`read_task`: the batch's output columns plus the three change columns."""
    columns = _row_columns(task, file_batch)
    n = len(columns[0])
    columns.append(_constant_int64s(pa.int64(), ctx.version, n))
    columns.append(_constant_int64s(TIMESTAMP, ctx.timestamp_ms * 1000, n))
    return pa.RecordBatch.from_arrays(columns, schema=change_schema(ctx.schema()))


#: What :func:`read_run` returns: per task read, the lengths of its batches; the index of the task that
#: failed (``None``: none did); the rows of every task read, in one record batch (``None``: no rows).
RunRows = tuple[list[list[int]], int | None, pa.RecordBatch | None]


def read_run(storage: Storage, items: Sequence[tuple[ReadContext, FileTask]], batch_size: int = 65536) -> RunRows:
    """The rows of several file tasks, as :func:`read_task` gives them, packed into one record batch.

    What a reader process does with a run (:mod:`tailer.reader_pool`). Every
    task must share one schema string. The rows are those of ``read_task``, task
    after task, batch after batch: slicing the batch by the returned lengths
    gives exactly its batches. The change columns are built once for the run
    rather than once per batch. The first task that raises ends the run (its
    rows are dropped, whatever the error): the caller reads it itself, to raise
    the genuine error where it belongs. Packing is left to pyarrow: a column
    that outgrows 32-bit offsets (over 2 GiB in one run) fails there, with
    pyarrow's own error, which the reader processes answer by handing the whole
    run back.
    """
    columns: list[list[pa.Array]] = []
    lengths: list[list[int]] = []
    commits: list[tuple[int, int, int]] = []  # (version, timestamp in µs, rows) of each batch
    failed: int | None = None
    for index, (ctx, task) in enumerate(items):
        mark = len(commits)
        read: list[int] = []
        try:
            for file_batch in _task_file_batches(storage, ctx, task, batch_size):
                arrays = _row_columns(task, file_batch)
                n = len(arrays[0])
                columns = columns or [[] for _ in arrays]
                for column, array in zip(columns, arrays, strict=True):
                    column.append(array)
                commits.append((ctx.version, ctx.timestamp_ms * 1000, n))
                read.append(n)
        except Exception:  # the caller reads this task itself and raises the genuine error
            for column in columns:
                del column[mark:]
            del commits[mark:]
            failed = index
            break
        lengths.append(read)
    if not commits:
        return lengths, failed, None
    arrays = [pa.concat_arrays(column) for column in columns]
    arrays.append(_int64s(pa.int64(), [(version, n) for version, _, n in commits]))
    arrays.append(_int64s(TIMESTAMP, [(micros, n) for _, micros, n in commits]))
    return lengths, failed, pa.RecordBatch.from_arrays(arrays, schema=change_schema(items[0][0].schema()))


def _int64s(dtype: pa.DataType, runs: list[tuple[int, int]]) -> pa.Array:
    """64-bit values (int64 or timestamp) given as ``(value, count)`` runs, straight from one buffer (no boxing)."""
    data = b"".join(value.to_bytes(8, sys.byteorder, signed=True) * n for value, n in runs)
    return pa.Array.from_buffers(dtype, len(data) // 8, [None, pa.py_buffer(data)])


@functools.lru_cache(maxsize=4)
def _constant_int64s(dtype: pa.DataType, value: int, n: int) -> pa.Array:
    """``n`` copies of ``value``, shared by the batches of one commit (a large file's batches have one length).

    Arrays are immutable, so sharing is safe; building a fresh 512 KiB buffer per batch
    cost ~90 µs on the consumer (page faults of a new allocation), 17 ms for 3,000,000 rows.
    The cache holds the last two commits' version and timestamp columns.
    """
    return _int64s(dtype, [(value, n)])


#: Batches up to this many rows share their ``_change_type`` column (small files repeat a few sizes).
SHARED_CHANGE_TYPE_ROWS = 4096


def _change_types(change_type: str, n: int) -> pa.Array:
    if n <= SHARED_CHANGE_TYPE_ROWS:
        return _shared_change_types(change_type, n)
    return pa.repeat(pa.scalar(change_type, pa.string()), n)


@functools.lru_cache(maxsize=1024)
def _shared_change_types(change_type: str, n: int) -> pa.Array:
    return pa.repeat(pa.scalar(change_type, pa.string()), n)


#: Worker threads reading large files ahead (pyarrow decodes without holding the GIL).
READ_THREADS = 2
#: Batches one worker may hold ahead of the consumer, per file (bounds the memory of reading ahead).
READ_AHEAD_BATCHES = 16


class _EndOfPlans(DeltaTailError):
    """Marks the end of the plans in :meth:`ChangeFeed._read_ahead` (never raised)."""


_END = _EndOfPlans("end of plans")


class _Prefetch:
    """One file task decoded on a worker thread into a bounded queue, consumed in order by one reader.

    The worker does stage one (open, decode, DV filter: pyarrow releases the GIL);
    the consumer finishes each batch (:func:`_finish`) while the worker decodes the next.

    The worker stops early when the consumer goes away (:meth:`cancel`). An
    exception in the worker is handed over in the queue and raised to the
    consumer after every batch before it.
    """

    _DONE = object()

    def __init__(self, pool: ThreadPoolExecutor, read: Callable[[], Generator[FileBatch, None, None]]) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=READ_AHEAD_BATCHES)
        self._cancelled = threading.Event()
        self._future = pool.submit(self._run, read)

    def _put(self, item: object) -> bool:
        while not self._cancelled.is_set():
            try:
                self._queue.put(item, timeout=0.05)
            except queue.Full:
                continue
            return True
        return False

    def _run(self, read: Callable[[], Generator[FileBatch, None, None]]) -> None:
        batches = read()
        try:
            for batch in batches:
                if not self._put(batch):
                    return
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)
            return
        finally:
            batches.close()  # a cancelled read closes its file now, on this thread
        self._put(self._DONE)

    def batches(self) -> Iterator[FileBatch]:
        """The task's decoded batches, in order; raises what reading raised."""
        try:
            while True:
                item = self._queue.get()
                if item is self._DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, FileBatch)
                yield item
        finally:
            self.cancel()

    @property
    def finished(self) -> bool:
        """Whether the worker is done (read everything, failed, or was cancelled)."""
        return self._future.done()

    def cancel(self) -> None:
        """Stop the worker (if still reading) and drop what it buffered."""
        self._cancelled.set()
        self._future.cancel()


#: How a read-ahead task is read: in-process when its turn comes (``None``), on a worker thread
#: (large files), or by a reader process (a run and the task's index in it).
_Fetch = _Prefetch | tuple[RemoteRun, int] | None


def _in_order(
    storage: Storage, plan: VersionPlan, fetches: list[_Fetch], batch_size: int
) -> Iterator[Iterable[pa.RecordBatch]]:
    for task, fetch in zip(plan.tasks, fetches, strict=True):
        if fetch is None:
            yield read_task(storage, plan.context, task, batch_size)
        elif isinstance(fetch, _Prefetch):
            yield (_finish(plan.context, task, b) for b in fetch.batches())
        else:
            run, index = fetch
            remote = run.remote_batches(index)
            yield read_task(storage, plan.context, task, batch_size) if remote is None else remote


_Small = list[tuple[list[_Fetch], int, VersionPlan]]


def _submit_runs(pool: ReaderPool, storage: Storage, batch_size: int, small: _Small, *, whole: bool) -> _Small:
    """Send small tasks to the reader processes in runs of one schema, at most RUN_FILES files and RUN_BYTES.

    With ``whole`` every task goes (the last run may be short); otherwise only full
    runs go and the rest is returned, to be sent with the tasks planned after it.
    """
    run: _Small = []
    size = 0

    def send() -> None:
        nonlocal size
        remote = pool.submit(storage, [(plan.context, plan.tasks[i]) for _, i, plan in run], batch_size)
        for j, (fetches, i, _) in enumerate(run):
            fetches[i] = (remote, j)
        run.clear()
        size = 0

    for entry in small:
        if run and run[0][2].context.schema_string != entry[2].context.schema_string:
            send()
        run.append(entry)
        size += entry[2].tasks[entry[1]].size or 0
        if len(run) >= RUN_FILES or size >= RUN_BYTES:
            send()
    if run and whole:
        send()
    return run


class ChangeFeed:
    """Change rows of a table for a range of versions.

    Example:
        >>> feed = ChangeFeed("/data/events")                               # doctest: +SKIP
        >>> for batch in feed.batches(starting_version=3, ending_version=5):  # doctest: +SKIP
        ...     print(batch.start, batch.rows.num_rows)
    """

    def __init__(self, table_root: str, storage: Storage | None = None, options: ChangeOptions | None = None) -> None:
        self.log = DeltaLog(table_root, storage)
        self.storage = self.log.storage
        self.table = self.log.table
        self.options = options or ChangeOptions()

    # -- starting points -----------------------------------------------------------------------

    def version_at_or_after(self, timestamp_ms: int) -> int:
        """The first version whose commit timestamp is at or after ``timestamp_ms`` (binary search).

        A commit's time here is its ``inCommitTimestamp`` when present, else its file's
        modification time.

        Raises:
            VersionNotFoundError: if every commit is older than ``timestamp_ms``.
        """
        listing = self.log.list_log(0)
        versions = sorted(listing.commits)

        def time_of(i: int) -> int:
            v = versions[i]
            ict = self.log.read_commit(v).in_commit_timestamp
            return ict if ict is not None else listing.commits[v].modification_time

        index = bisect.bisect_left(range(len(versions)), timestamp_ms, key=time_of)
        if index >= len(versions):
            raise VersionNotFoundError(
                f"no commit at or after timestamp {timestamp_ms} ms; the newest is version {versions[-1]}",
                table=self.table,
            )
        return versions[index]

    # -- planning ------------------------------------------------------------------------------

    def _context(self, snap: Snapshot, timestamp_ms: int) -> ReadContext:
        snap.require_valid()
        m = snap.metadata
        assert m is not None
        schema_string = m.schema_string
        if schema_string is None:
            raise InvalidLogError("metaData has no schemaString", table=self.table, version=snap.version)
        return ReadContext(
            self.table, schema_string, m.partition_columns, m.column_mapping_mode, snap.version, timestamp_ms
        )

    def plan_commit(
        self, snap: Snapshot, commit: Commit, file_mtime_ms: int, previous_ms: int | None
    ) -> tuple[Snapshot, VersionPlan]:
        """Phase one and two for one commit; returns the snapshot after it and the plan.

        Raises:
            SchemaChangeError: if the commit changes the schema non-additively (unless allowed).
            InvalidLogError: if the commit is invalid for change planning, or CDF is required and off.
            UnsupportedFeatureError: if the commit needs unsupported reader features.
        """
        partitioned = bool(snap.metadata and snap.metadata.partition_columns)
        try:
            prepared: PreparedCommit = prepare(commit, snap.files.get, partitioned=partitioned)
        except DeltaTailError as e:
            raise e.at(table=self.table, file=self.log.commit_path(commit.version)) from None
        if commit.metadata is not None and snap.metadata is not None:
            # Checked before apply(), which hands the file tables on: a refused commit leaves `snap` usable.
            try:
                new_schema = commit.metadata.schema()
                check_schema_change(
                    snap.schema, new_schema, version=commit.version, allow=self.options.allow_non_additive
                )
            except DeltaTailError as e:
                raise e.at(
                    table=self.table, version=commit.version, file=self.log.commit_path(commit.version)
                ) from None
        metadata = commit.metadata or snap.metadata
        if self.options.require_cdf and (metadata is None or not cdf_enabled(metadata)):
            raise InvalidLogError(
                "change data feed is not enabled (delta.enableChangeDataFeed) at this version",
                table=self.table,
                version=commit.version,
            )
        try:
            after, _ = snap.apply(commit)
        except DeltaTailError as e:
            raise e.at(table=self.table, file=self.log.commit_path(commit.version)) from None
        assert after.metadata is not None
        ts = commit_timestamp(commit, after.metadata, file_mtime_ms, previous_ms)
        return after, VersionPlan(self._context(after, ts), commit, tuple(prepared.tasks()))

    def plan_snapshot(self, snap: Snapshot, timestamp_ms: int) -> VersionPlan:
        """The initial-snapshot plan: every live row of ``snap`` as an ``insert``."""
        tasks = [
            FileTask(f.path, f.partition_values or {}, "insert", RowSelection(None, f.deletion_vector), f.size)
            for f in sorted(snap.live_files(), key=lambda f: (f.path, f.key.dv_id or ""))
        ]
        return VersionPlan(self._context(snap, timestamp_ms), None, tuple(tasks), snapshot=True)

    # -- reading -------------------------------------------------------------------------------

    def plan_batches(
        self, plan: VersionPlan, task_batches: Iterable[Iterable[pa.RecordBatch]] | None = None
    ) -> Iterator[ChangeBatch]:
        """Every change row of one planned version, in batches with consecutive positions.

        ``task_batches`` are the rows of each of the plan's tasks when they were read
        ahead (see :meth:`batches`); by default each task is read here, in order.
        """
        if task_batches is None:
            task_batches = (read_task(self.storage, plan.context, t, self.options.batch_size) for t in plan.tasks)
        start = (
            Position.in_snapshot(plan.context.version, 0) if plan.snapshot else Position.change(plan.context.version, 0)
        )
        index = 0
        rows: Iterable[pa.RecordBatch] = (b for batches in task_batches for b in batches)
        if self.options.net_changes and plan.commit is not None and not plan.commit.cdcs:
            merged = pa.Table.from_batches(list(rows), schema=change_schema(plan.context.schema()))
            rows = net_changes(merged, self.options.key_columns).to_batches(self.options.batch_size)
        for batch in rows:
            if batch.num_rows == 0:
                continue
            yield ChangeBatch(Position(start.version, start.snapshot_rank, index), batch)
            index += batch.num_rows

    def plans(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
    ) -> Iterator[VersionPlan]:
        """Plans for the versions of a range, in order (an initial snapshot first if asked).

        Args:
            starting_version: first version (inclusive); default 0, or the latest with ``initial_snapshot``.
            ending_version: last version (inclusive); default the latest now.
            starting_timestamp_ms: start at the first commit at or after this time instead.
            initial_snapshot: emit the live rows at the starting version as ``insert`` rows
                (positions flagged as snapshot), then the changes after it.

        Raises:
            VersionNotFoundError: if the range starts after the latest version, or before what the log still holds.
            ConfigError: if ``ending_version`` is before the starting version.
            VersionGapError: if a version inside the range is missing (log cleaned up or gap).
        """
        latest = self.log.latest_version()
        if starting_timestamp_ms is not None:
            starting_version = self.version_at_or_after(starting_timestamp_ms)
        if starting_version is None:
            starting_version = latest if initial_snapshot else 0
        end = latest if ending_version is None else ending_version
        if starting_version > latest:
            raise VersionNotFoundError(
                f"starting version {starting_version} is after the latest version {latest}", table=self.table
            )
        if end < starting_version:
            raise ConfigError(f"ending version {end} is before starting version {starting_version}", table=self.table)
        if end > latest:
            raise VersionNotFoundError(f"ending version {end} is after the latest version {latest}", table=self.table)
        listing = self.log.list_log(max(starting_version - 1, 0))
        if initial_snapshot:
            snap = self.log.snapshot(starting_version)
            snapshot_time = self.snapshot_time(snap, listing)
            previous: int | None = snapshot_time
            yield self.plan_snapshot(snap, snapshot_time)
            first = starting_version + 1
        else:
            snap = self._snapshot_before(starting_version)
            previous = self.snapshot_time(snap, listing) if starting_version > 0 else None
            first = starting_version
        for v in range(first, end + 1):
            info = listing.commits.get(v)
            if info is None:
                raise VersionGapError(
                    f"commit {v} is missing from the log (cleaned up, or a gap); the range cannot be read exactly",
                    table=self.table,
                    version=v,
                    file=self.log.commit_path(v),
                )
            snap, plan = self.plan_commit(snap, self.log.read_commit(v), info.modification_time, previous)
            previous = plan.context.timestamp_ms
            yield plan

    def _snapshot_before(self, version: int) -> Snapshot:
        """The snapshot just before ``version``.

        When the log starts at a checkpoint at ``version`` (older commits cleaned
        up), the state before it is rebuilt from the snapshot at ``version`` by
        undoing that commit's file actions: its adds leave, its removes return.
        """
        if version == 0:
            return Snapshot.empty(self.table)
        try:
            return self.log.snapshot(version - 1)
        except VersionNotFoundError:
            if self.log.earliest_version() != version:
                raise
        after = self.log.snapshot(version)
        commit = self.log.read_commit(version)
        files = FileTable(after.files.pool)
        added = {(a.path, a.dv_id) for a in commit.adds}
        for f in after.live_files():
            if (f.path, f.key.dv_id) not in added:
                files.put(f.path, f.deletion_vector, f.size, f.timestamp, f.partition_values)
        for r in commit.removes:
            files.put(r.path, r.deletion_vector, r.size, r.deletion_timestamp, r.partition_values)
        return Snapshot(
            self.table, version - 1, after.protocol, after.metadata, None, dict(after.txns),
            dict(after.domains), files, FileTable(after.files.pool),
        )  # fmt: skip

    def snapshot_time(self, snap: Snapshot, listing: LogListing | None = None) -> int:
        """The ``_commit_timestamp`` of the version ``snap`` is at (epoch ms), for an initial snapshot's rows.

        The commit's in-commit timestamp where enabled, else its file's modification
        time; a version whose commit was cleaned up falls back to the last commit
        timestamp the snapshot recorded.
        """
        if listing is None:
            listing = self.log.list_log(snap.version)
        info = listing.commits.get(snap.version)
        if info is not None:
            try:
                commit = self.log.read_commit(snap.version)
            except MissingFileError:
                return int(info.modification_time)
            assert snap.metadata is not None
            return commit_timestamp(commit, snap.metadata, info.modification_time, None)
        try:
            return self.storage.stat(self.log.commit_path(snap.version)).modification_time
        except MissingFileError:
            return snap.last_commit_timestamp or 0

    def batches(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
    ) -> Generator[ChangeBatch, None, None]:
        """Every change row of the range, as batches; arguments and errors as :meth:`plans`.

        Closing the generator early (``close()``, or dropping it) stops the read-ahead workers.

        Also raises what reading rows raises: ``MissingFileError`` for a missing
        data/cdc/DV file, ``DeletionVectorError`` for a bad DV.
        """
        plans = self.plans(
            starting_version,
            ending_version,
            starting_timestamp_ms=starting_timestamp_ms,
            initial_snapshot=initial_snapshot,
        )
        for plan, task_batches in self.read_plans(plans):
            yield from self.plan_batches(plan, task_batches)

    def read_plans(
        self, plans: Iterator[VersionPlan]
    ) -> Generator[tuple[VersionPlan, Iterable[Iterable[pa.RecordBatch]] | None], None, None]:
        """Each plan of ``plans`` with the rows of its tasks, read ahead (for :meth:`plan_batches`).

        ``plans`` is consumed up to ``read_ahead`` file tasks ahead of the caller;
        large files are decoded on worker threads and small ones (while catching up)
        by the reader processes, as :meth:`batches` describes. An error raised by
        ``plans`` is raised here only after every plan before it was yielded, so
        the caller sees it exactly where sequential planning would have raised it.
        Close the generator (or exhaust it) to stop the workers and give the reader
        processes back; the second element is ``None`` when reading ahead is off.
        """
        if self.options.read_ahead <= 0:
            for plan in plans:
                yield plan, None
            return
        pool = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="deltatail-read")
        started: list[_Prefetch] = []
        processes = shared_pool(self.options.reader_processes) if self.options.reader_processes > 0 else None
        if processes is not None and not processes.acquire():
            processes = None  # another consumer holds them: read in-process
        try:
            yield from self._read_ahead(plans, pool, started, processes)
        finally:
            # Every worker still reading stops, including one whose file the consumer never reached.
            for fetch in started:
                fetch.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            if processes is not None:
                processes.release()

    def _read_ahead(
        self,
        plans: Iterator[VersionPlan],
        pool: ThreadPoolExecutor,
        started: list[_Prefetch],
        processes: ReaderPool | None = None,
    ) -> Iterator[tuple[VersionPlan, Iterator[Iterable[pa.RecordBatch]]]]:
        """Plan up to ``read_ahead`` tasks ahead and start reading their large files on workers.

        Planning runs in bursts: the window is refilled only once at most half of it
        is left, which keeps the interpreter on one kind of work for longer.

        Files of at least ``read_ahead_min_bytes`` are read on a worker into a
        bounded queue (at most :data:`READ_THREADS` of them ahead at once, so memory
        stays bounded); the rest are read when their turn comes. Rows come out in
        exactly the order of sequential reading, and an error is raised only after
        every row before it. ``started`` receives every read started on a worker and
        not known to be finished (the caller cancels them if the consumer stops early).

        With ``processes`` (held by the caller), the small files of a planning burst
        go to the reader processes when there are at least
        :data:`~tailer.reader_pool.MIN_FILES` of them.
        """
        pending: deque[tuple[VersionPlan, list[_Fetch]]] = deque()
        small: _Small = []
        sent_in_burst = False
        ahead = 0
        large_ahead = 0
        failure: DeltaTailError | None = None
        bs = self.options.batch_size
        refill = True
        while True:
            refill = refill or ahead <= self.options.read_ahead // 2
            if failure is None and refill and ahead < self.options.read_ahead and large_ahead < READ_THREADS:
                try:
                    plan = next(plans)
                except StopIteration:
                    failure = _END
                except DeltaTailError as e:
                    failure = e
                else:
                    prefetches = [self._prefetch(pool, plan, t) for t in plan.tasks]
                    started[:] = [f for f in started if not f.finished]
                    started.extend(f for f in prefetches if f is not None)
                    fetches: list[_Fetch] = list(prefetches)
                    # Only files of known size: one without (a remove may omit it) is streamed in-process.
                    small += [
                        (fetches, i, plan)
                        for i, f in enumerate(prefetches)
                        if f is None and plan.tasks[i].size is not None
                    ]
                    pending.append((plan, fetches))
                    ahead += len(plan.tasks) or 1
                    large_ahead += sum(f is not None for f in prefetches)
                    if processes is not None and len(small) >= RUN_FILES:
                        sent_in_burst = True  # a full run goes now: the processes start while planning goes on
                        small = _submit_runs(processes, self.storage, bs, small, whole=False)
                    continue
            if processes is not None and (sent_in_burst or len(small) >= MIN_FILES):
                _submit_runs(processes, self.storage, bs, small, whole=True)
            small = []
            sent_in_burst = False
            refill = False
            if not pending:
                break
            plan, fetches = pending.popleft()
            ahead -= len(plan.tasks) or 1
            large_ahead -= sum(isinstance(f, _Prefetch) for f in fetches)
            yield plan, _in_order(self.storage, plan, fetches, bs)
        if failure is not None and failure is not _END:
            raise failure

    def _prefetch(self, pool: ThreadPoolExecutor, plan: VersionPlan, task: FileTask) -> _Prefetch | None:
        if task.size is None or task.size < self.options.read_ahead_min_bytes:
            return None
        read = functools.partial(_task_file_batches, self.storage, plan.context, task, self.options.batch_size)
        return _Prefetch(pool, read)

    def read_table(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
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
        plans = self.plans(
            starting_version,
            ending_version,
            starting_timestamp_ms=starting_timestamp_ms,
            initial_snapshot=initial_snapshot,
        )
        for plan in plans:
            schema = change_schema(plan.context.schema())
            tables += [pa.Table.from_batches([b.rows]) for b in self.plan_batches(plan)]
        if schema is None:
            schema = change_schema(self.log.snapshot(ending_version).schema)
        if not tables:
            return schema.empty_table()
        return pa.concat_tables([_conform(t, schema, self.table) for t in tables])


def _conform(table: pa.Table, schema: pa.Schema, where: str) -> pa.Table:
    """``table`` in ``schema``: missing columns as nulls, types cast safely.

    Raises:
        SchemaChangeError: if a column cannot be cast (a type change across the range).
    """
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        try:
            columns.append(table.column(field.name).cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            version = table.column("_commit_version")[0].as_py() if table.num_rows else None
            raise SchemaChangeError(
                f"column {field.name!r} of type {table.schema.field(field.name).type} cannot be read as "
                f"{field.type}, the type at the end of the range: read the versions on each side separately",
                table=where,
                version=version,
            ) from e
    return pa.Table.from_arrays(columns, schema=schema)
