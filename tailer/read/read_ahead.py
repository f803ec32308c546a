"""Reading ahead of the consumer: large files on worker threads, small ones in reader processes.

What it buys (``python -m benchmarks.changes`` and ``benchmarks.latency``, see
``benchmarks/README.md``): on two cores, catching up over thousands of small
commits takes about half the time of :class:`~tailer.read.readers.SequentialReader`,
and large files decode while the consumer converts the batch in hand. A live
tail (a few files per commit) reads in-process and never waits on a round trip.

How: :class:`ReadAheadReader` plans up to ``read_ahead`` file tasks ahead of
the consumer, in bursts (the window is refilled only once at most half of it
is left, which keeps the interpreter on one kind of work for longer). Files of
at least ``min_bytes`` are decoded by a :class:`~tailer.read.prefetch.Prefetch`
on one of :data:`~tailer.read.prefetch.READ_THREADS` worker threads (so at most
that many are ahead at once, and memory stays bounded: within a commit of many
large files, the next large file is given a worker only when the consumer
reaches a file at most that many before it, never the whole commit at once).
A large file after the first (within a commit or in the commits read after
it) begins decoding only when the one before it has been decoded, or the
consumer has had to wait for that one's batches: a slow sink has one file's
decoder open at a time (a paused decoder holds its row group's column
chunks), a fast consumer two; when one planning
burst holds at least ``limits.min_files`` smaller files, they go to the reader
processes (:mod:`tailer.read.reader_pool`) in runs of one schema; the rest are
read when their turn comes. On a remote store (an object store) the small
files are instead fetched whole, concurrently, as soon as they are planned
(:meth:`~tailer.storage.base.Storage.prefetch`), and read in-process: there the
network, not the interpreter, is the limit. Rows come out exactly as the
sequential reader gives them.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from deltatail.state.changes import FileTask
from deltatail.state.errors import DeltaTailError, UnsafePathError
from deltatail.state.planning import ReadContext, VersionPlan
from deltatail.tailer.read.prefetch import READ_THREADS, REMOTE_READ_AHEAD_BYTES, Prefetch
from deltatail.tailer.read.reader_pool import ReaderPool, RemoteRun
from deltatail.tailer.read.readers import PlanRows
from deltatail.tailer.read.tasks import decode_task, finish_batch, read_task
from deltatail.tailer.storage import Storage


class _EndOfPlans(DeltaTailError):
    """Marks the end of the plans in :meth:`ReadAheadReader._read_ahead` (never raised)."""


_END = _EndOfPlans("end of plans")


class _Later:
    """Marks a large file of a commit whose worker starts when the consumer comes near it (:meth:`_in_order`)."""


_LATER = _Later()

#: How a read-ahead task is read: in-process when its turn comes (``None``), on a worker thread
#: (large files; ``_LATER`` until its worker starts), or by a reader process (a run and the task's index in it).
_Fetch = Prefetch | _Later | tuple[RemoteRun, int] | None

#: Small tasks waiting to be sent: the plan's fetch list, the task's index in it, the plan.
_Small = list[tuple[list[_Fetch], int, VersionPlan]]


class ReadAheadReader:
    """A :class:`~tailer.read.readers.PlanReader` that reads ahead (see the module docstring).

    Args:
        storage: where the files are.
        batch_size: the largest number of rows in one batch.
        read_ahead: how many file tasks to plan ahead of the consumer (at least 1).
        min_bytes: files at least this large are decoded ahead on worker threads.
        pool: the reader processes for small files; ``None`` reads them in-process. The pool is
            taken for the life of each :meth:`read` (a second concurrent read finds it taken and
            reads in-process).
    """

    def __init__(
        self,
        storage: Storage,
        *,
        batch_size: int = 65536,
        read_ahead: int = 512,
        min_bytes: int = 512 << 10,
        pool: ReaderPool | None = None,
    ) -> None:
        self.storage = storage
        self.batch_size = batch_size
        self.read_ahead = max(read_ahead, 1)
        self.min_bytes = min_bytes
        self.pool = pool

    def read(self, plans: Iterator[VersionPlan]) -> Generator[PlanRows, None, None]:
        """See :meth:`~tailer.read.readers.PlanReader.read`; closing the generator stops the workers."""
        threads = ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="deltatail-read")
        started: list[Prefetch] = []
        processes = self.pool if not self.storage.remote else None  # remote: fetched ahead, read here
        if processes is not None and not processes.acquire():
            processes = None  # another consumer holds them: read in-process
        try:
            yield from self._read_ahead(plans, threads, started, processes)
        finally:
            # Every worker still reading stops, including one whose file the consumer never reached.
            for fetch in started:
                fetch.cancel()
            threads.shutdown(wait=True, cancel_futures=True)
            if processes is not None:
                processes.release()

    def _read_ahead(
        self,
        plans: Iterator[VersionPlan],
        threads: ThreadPoolExecutor,
        started: list[Prefetch],
        processes: ReaderPool | None,
    ) -> Iterator[PlanRows]:
        """Plan ahead, start reading large files on workers and small ones in the processes, yield in order.

        ``started`` receives every read started on a worker and not known to be
        finished (the caller cancels them if the consumer stops early).
        """
        pending: deque[tuple[VersionPlan, list[_Fetch]]] = deque()
        small: _Small = []
        sent_in_burst = False
        ahead = 0
        large_ahead = 0
        failure: DeltaTailError | None = None
        refill = True
        limits = processes.limits if processes is not None else None
        while True:
            refill = refill or ahead <= self.read_ahead // 2
            if failure is None and refill and ahead < self.read_ahead and large_ahead < READ_THREADS:
                try:
                    plan = next(plans)
                except StopIteration:
                    failure = _END
                except DeltaTailError as e:
                    failure = e
                else:
                    if self.storage.remote:
                        self._fetch_ahead(plan)
                    # A plan's first large file decodes now only if no earlier one is still to be read.
                    prefetches = self._prefetches(threads, plan, first=large_ahead == 0)
                    started[:] = [f for f in started if not f.finished]
                    started.extend(f for f in prefetches if isinstance(f, Prefetch))
                    fetches: list[_Fetch] = list(prefetches)
                    # Only files of known size: one without (a remove may omit it) is streamed in-process.
                    small += [
                        (fetches, i, plan)
                        for i, f in enumerate(prefetches)
                        if f is None and plan.tasks[i].size is not None
                    ]
                    pending.append((plan, fetches))
                    ahead += len(plan.tasks) or 1
                    large_ahead += sum(isinstance(f, Prefetch) for f in prefetches)
                    if processes is not None and limits is not None and len(small) >= limits.files:
                        sent_in_burst = True  # a full run goes now: the processes start while planning goes on
                        small = self._submit_runs(processes, small, whole=False)
                    continue
            if processes is not None and limits is not None and (sent_in_burst or len(small) >= limits.min_files):
                self._submit_runs(processes, small, whole=True)
            small = []
            sent_in_burst = False
            refill = False
            if not pending:
                break
            plan, fetches = pending.popleft()
            ahead -= len(plan.tasks) or 1
            large_ahead -= sum(isinstance(f, Prefetch) for f in fetches)
            beyond = _first_prefetch(pending) if large_ahead else None  # none when no plan ahead has a large file
            yield plan, self._in_order(plan, fetches, threads, started, beyond)
        if failure is not None and failure is not _END:
            raise failure

    def _fetch_ahead(self, plan: VersionPlan) -> None:
        """On a remote store: start fetching the plan's small files whole, concurrently (large ones stream)."""
        self.storage.prefetch(
            [
                (location, t.size)
                for t in plan.tasks
                if t.size is not None
                and t.size < self.min_bytes
                and (location := _safe_location(plan.context_of(t), t.path)) is not None
            ]
        )

    def _prefetches(
        self, threads: ThreadPoolExecutor, plan: VersionPlan, *, first: bool
    ) -> list[Prefetch | _Later | None]:
        """The plan's large files: the first :data:`READ_THREADS` given workers, the rest ``_LATER``.

        With ``first`` the plan's first large file starts decoding at once; the others wait (:meth:`_in_order`).
        """
        out: list[Prefetch | _Later | None] = []
        large = 0
        for task in plan.tasks:
            if task.size is None or task.size < self.min_bytes:
                out.append(None)
                continue
            large += 1
            out.append(
                self._prefetch(threads, plan, task, started=first and large == 1) if large <= READ_THREADS else _LATER
            )
        return out

    def _prefetch(
        self, threads: ThreadPoolExecutor, plan: VersionPlan, task: FileTask, *, started: bool = False
    ) -> Prefetch:
        read = functools.partial(decode_task, self.storage, plan.context_of(task), task, self.batch_size)
        held = REMOTE_READ_AHEAD_BYTES if self.storage.remote else None
        return Prefetch(threads, read, started=started, held_bytes=held)

    def _start_near(
        self, threads: ThreadPoolExecutor, plan: VersionPlan, fetches: list[_Fetch], at: int, started: list[Prefetch]
    ) -> None:
        """Start the ``_LATER`` files from ``at`` on while at most :data:`READ_THREADS` started ones follow ``at``'s.

        So the file being consumed and up to :data:`READ_THREADS` after it are decoded at once.
        """
        ahead = 0
        for i in range(at, len(fetches)):
            if ahead > READ_THREADS:
                return
            fetch = fetches[i]
            if isinstance(fetch, _Later):
                fetch = fetches[i] = self._prefetch(threads, plan, plan.tasks[i])
                started.append(fetch)
            ahead += isinstance(fetch, Prefetch)

    def _in_order(
        self,
        plan: VersionPlan,
        fetches: list[_Fetch],
        threads: ThreadPoolExecutor,
        started: list[Prefetch],
        beyond: Prefetch | None,
    ) -> Iterator[Iterable[pa.RecordBatch]]:
        """The plan's tasks' batches, in order.

        ``beyond`` is the first large file of the plans read next: it starts after this plan's last
        large file as a following large file of this plan would (see the module docstring).
        """
        later = any(isinstance(f, _Later) for f in fetches)
        nearest = _nearest_large(fetches)
        for i, task in enumerate(plan.tasks):
            if later:
                self._start_near(threads, plan, fetches, i, started)
            fetch = fetches[i]
            if isinstance(fetch, _Later):  # not left by _start_near; for the type checker
                fetch = fetches[i] = self._prefetch(threads, plan, task)
                started.append(fetch)
            after = nearest[i + 1]
            following = fetches[after] if after is not None else beyond
            if not isinstance(following, Prefetch):
                following = None  # none, or not given a worker yet (_start_near gives it one)
            if isinstance(fetch, Prefetch):
                yield _finished(plan.context_of(task), task, fetch, following)
                continue
            if following is not None:
                following.start()  # the consumer is on smaller files: the next large one decodes meanwhile
            if fetch is None:
                yield read_task(self.storage, plan.context_of(task), task, self.batch_size)
            else:
                run, index = fetch
                remote = run.remote_batches(index)
                yield (
                    read_task(self.storage, plan.context_of(task), task, self.batch_size) if remote is None else remote
                )

    def _submit_runs(self, pool: ReaderPool, small: _Small, *, whole: bool) -> _Small:
        """Send small tasks to the reader processes in runs of one schema, within the pool's run limits.

        With ``whole`` every task goes (the last run may be short); otherwise only full
        runs go and the rest is returned, to be sent with the tasks planned after it.
        """
        run: _Small = []
        size = 0

        def send() -> None:
            nonlocal size
            items = [(plan.context_of(plan.tasks[i]), plan.tasks[i]) for _, i, plan in run]
            remote = pool.submit(self.storage, items, self.batch_size)
            for j, (fetches, i, _) in enumerate(run):
                fetches[i] = (remote, j)
            run.clear()
            size = 0

        for entry in small:
            if run and _schema_of(run[0]) != _schema_of(entry):
                send()
            run.append(entry)
            size += entry[2].tasks[entry[1]].size or 0
            if len(run) >= pool.limits.files or size >= pool.limits.bytes:
                send()
        if run and whole:
            send()
        return run


def _first_prefetch(pending: Iterable[tuple[VersionPlan, list[_Fetch]]]) -> Prefetch | None:
    """The first large file of the plans read next (only a plan's first large files have workers when planned)."""
    for _, fetches in pending:
        for fetch in fetches:
            if isinstance(fetch, Prefetch):
                return fetch
    return None


def _nearest_large(fetches: list[_Fetch]) -> list[int | None]:
    """For each position (and one past the end), the index of the first large file there or after it."""
    out: list[int | None] = [None] * (len(fetches) + 1)
    for i in range(len(fetches) - 1, -1, -1):
        out[i] = i if isinstance(fetches[i], Prefetch | _Later) else out[i + 1]
    return out


def _finished(
    ctx: ReadContext, task: FileTask, fetch: Prefetch, following: Prefetch | None
) -> Iterator[pa.RecordBatch]:
    """``fetch``'s batches finished; ``following`` starts once ``fetch`` is decoded or its consumer has waited."""
    for batch in fetch.batches():
        if following is not None and (fetch.starved or fetch.decoded):
            following.start()
            following = None
        yield finish_batch(ctx, task, batch)


def _schema_of(entry: tuple[list[_Fetch], int, VersionPlan]) -> str:
    """The schema a small task of a run is read in (a run holds tasks of one schema)."""
    _, index, plan = entry
    return plan.context_of(plan.tasks[index]).schema_string


def _safe_location(context: ReadContext, path: str) -> str | None:
    """``path``'s location to prefetch, or ``None`` if the containment rule refuses it (the read, in turn, raises)."""
    try:
        return context.location(path)
    except UnsafePathError:
        return None
