"""Reader processes: small files decoded outside the interpreter that plans them.

What it buys: catching up over thousands of small commits is bound by the
interpreter (pyarrow's set-up of a small file holds the GIL, so threads do not
help); two processes roughly halve it on two cores (``python -m
benchmarks.changes``, see ``benchmarks/README.md``).

:class:`ReaderPool` keeps a few child processes
(:mod:`tailer.read.reader_worker`) that each take a *run* of file tasks, read
them exactly as :func:`tailer.read.tasks.read_task` does, and answer with one
Arrow IPC record batch holding the run's rows plus the length of every batch
``read_task`` yielded. The parent slices that batch back into those batches,
so a consumer sees the same rows, in the same order and the same batch
boundaries, as in-process reading.

Contract:

- A run's rows are handed out only in plan order, and only after everything
  before them (the caller consumes runs in submission order).
- Errors are never translated across the process boundary: a worker stops a
  run at the first task it cannot read and says which; the parent reads that
  task (and the rest of the run) itself, so the genuine error, naming the
  table, version and file, is raised on the consumer's thread after every
  row before it.
- A worker that dies or answers garbage loses nothing: the runs it held are
  read in-process, a warning is logged, and the pool replaces the worker on
  its next run (after :data:`MAX_FAILURES` failures it stays off for the life
  of the process).
- Workers hold no state between runs and write nothing. A worker reads on while
  the parent has not received its answers, within a bounded outbox. They exit
  when their standard input closes, which includes the parent dying (even by SIGKILL);
  they ignore SIGINT and SIGTERM, so Ctrl-C or a stop sent to the whole process
  group reaches only the parent, which stops gracefully (and they follow).
- One consumer at a time: a ``ChangeFeed.batches`` generator holds the pool
  from :meth:`ReaderPool.acquire` to :meth:`ReaderPool.release`; a second
  concurrent consumer reads in-process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from deltatail.state.changes import FileTask
from deltatail.state.errors import ConfigError
from deltatail.state.planning import ReadContext
from deltatail.tailer.read.reader_worker import read_frame, wire, write_frame
from deltatail.tailer.storage import Storage

log = logging.getLogger("deltatail")


@dataclass(frozen=True, slots=True)
class RunLimits:
    """How small file tasks are grouped into runs for the processes.

    Attributes:
        files: file tasks per run: enough to amortise a round trip (~0.1 ms), few enough to keep
            both sides busy.
        bytes: a run ends once its files hold this many bytes. This bounds what a worker holds
            (its outbox, the answer it sends and the one it reads) and how long the consumer waits
            for its first rows.
        min_files: fewer small files than this in one planning burst are read in-process (the
            live-tail path: no round trip).
    """

    files: int = 32
    bytes: int = 1 << 20
    min_files: int = 8


#: Worker failures after which a pool stops starting workers, for the life of the process.
MAX_FAILURES = 3

_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True, slots=True)
class _Answer:
    """A worker's answer for one run: batch lengths per task read, where it stopped, and the rows."""

    lengths: list[list[int]]
    failed: int | None
    rows: pa.RecordBatch | None


class RemoteRun:
    """A run of file tasks submitted to one worker; its rows are handed out task by task, in order."""

    def __init__(self, worker: _Worker | None, items: Sequence[tuple[ReadContext, FileTask]]) -> None:
        self._worker = worker
        self.items = list(items)
        self._answer: _Answer | None = None
        self._done = False
        self._offsets: list[int] = []

    def _settle(self, answer: _Answer | None) -> None:
        self._answer = answer
        self._done = True
        if answer is not None:
            offset = 0
            for lengths in answer.lengths:
                self._offsets.append(offset)
                offset += sum(lengths)

    def answer(self) -> _Answer | None:
        """The worker's answer, waiting for it if need be; ``None`` if the worker failed (read in-process)."""
        if not self._done:
            assert self._worker is not None  # a run without a worker is settled when made
            self._worker.receive_until(self)
        return self._answer

    def remote_batches(self, index: int) -> list[pa.RecordBatch] | None:
        """The batches of task ``index`` as the worker read them, or ``None``: read that task in-process.

        ``None`` means the worker failed, or stopped at this task or before it
        (reading it here raises the genuine error, or gives its rows if the
        failure was transient).
        """
        answer = self.answer()
        if answer is None or (answer.failed is not None and index >= answer.failed):
            return None
        if answer.rows is None:
            return []
        out = []
        offset = self._offsets[index]
        for length in answer.lengths[index]:
            out.append(answer.rows.slice(offset, length))
            offset += length
        return out


class _Worker:
    """One child process and the runs it was given and has not answered, oldest first."""

    def __init__(self, pool: ReaderPool, command: Sequence[str] | None = None) -> None:
        """Start ``command`` (by default ``python -m tailer.read.reader_worker``) as the pool's worker."""
        self._pool = pool
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deltatail.tailer.read.reader_worker"] if command is None else list(command),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            close_fds=True,
        )
        self.outstanding: deque[RemoteRun] = deque()
        self.answered = False
        self.broken = False

    def submit(self, storage: Storage, items: Sequence[tuple[ReadContext, FileTask]], batch_size: int) -> RemoteRun:
        run = RemoteRun(self, items)
        try:
            assert self.proc.stdin is not None
            write_frame(self.proc.stdin, wire(storage, batch_size, run.items))
        except (OSError, ValueError, pickle.PicklingError, AttributeError, TypeError) as e:
            run._settle(None)
            self.fail(f"could not send it a run: {e}")
            return run
        self.outstanding.append(run)
        return run

    def receive_until(self, run: RemoteRun) -> None:
        """Receive answers in order until ``run`` has its own (or the worker failed)."""
        while not run._done:
            if not self.outstanding:
                run._settle(None)
                return
            head = self.outstanding.popleft()
            try:
                answer = self._receive(len(head.items))
            except (OSError, EOFError, ValueError, pickle.UnpicklingError, pa.ArrowException) as e:
                head._settle(None)
                self.fail(f"its answer could not be read: {e}")
                continue
            self.answered = True
            head._settle(answer)

    def _receive(self, tasks: int) -> _Answer:
        """The next answer, checked against a run of ``tasks`` tasks.

        Raises:
            ValueError: if the answer does not add up (task count, row count, more than one batch).
        """
        assert self.proc.stdout is not None
        lengths, failed = pickle.loads(read_frame(self.proc.stdout))
        payload = read_frame(self.proc.stdout)
        rows = None
        if payload:
            stream = pa.ipc.open_stream(pa.py_buffer(payload))
            rows = stream.read_next_batch()
            try:
                stream.read_next_batch()
                raise ValueError("the answer holds more than one record batch")
            except StopIteration:
                pass
        read = tasks if failed is None else failed
        total = sum(sum(n) for n in lengths)
        if len(lengths) != read or not 0 <= read <= tasks or total != (0 if rows is None else rows.num_rows):
            raise ValueError(f"the answer does not add up: {len(lengths)} of {tasks} tasks, {total} rows")
        return _Answer(lengths, failed, rows)

    def fail(self, why: str) -> None:
        """Give up on this worker: its unanswered runs are read in-process; the pool starts another."""
        if not self.broken:
            self.broken = True
            log.warning("reader process %d failed (%s); its files are read in-process", self.proc.pid, why)
            self._pool.note_failure(self)
        while self.outstanding:
            self.outstanding.popleft()._settle(None)
        self.stop(kill=True)

    def drain(self) -> None:
        """Receive and drop the answers of runs nobody consumed (a consumer that stopped early)."""
        while self.outstanding:
            self.receive_until(self.outstanding[-1])

    def stop(self, kill: bool = False) -> None:
        """End the process: close its input (it exits), or kill it."""
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class ReaderPool:
    """Child processes that read runs of small file tasks (see the module docstring for the contract).

    Workers start on the first :meth:`submit` and live until :meth:`close` (or
    the end of the process).

    Example:
        >>> pool = ReaderPool(2)                               # doctest: +SKIP
        >>> if pool.acquire():                                 # doctest: +SKIP
        ...     run = pool.submit(storage, [(ctx, task)], 65536)
        ...     batches = run.remote_batches(0)  # None: read the task in-process
        ...     pool.release()
    """

    def __init__(self, processes: int, limits: RunLimits | None = None, command: Sequence[str] | None = None) -> None:
        """A pool of ``processes`` workers (at least 1), none started yet, taking runs within ``limits``.

        ``command`` starts a worker (by default ``python -m tailer.read.reader_worker``).

        Raises:
            ConfigError: if ``processes`` is less than 1.
        """
        if processes < 1:
            raise ConfigError(f"a reader pool needs at least one process, not {processes}")
        self.processes = processes
        self.limits = limits or RunLimits()
        self.command = None if command is None else list(command)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._next = 0
        self._failures = 0
        #: Files sent to the processes (a file a process then fails on is read again in-process).
        self.files_sent = 0
        self.runs_sent = 0

    @property
    def usable(self) -> bool:
        """Whether runs can be submitted (false once workers failed :data:`MAX_FAILURES` times)."""
        return self._failures < MAX_FAILURES

    def acquire(self) -> bool:
        """Take the pool for one consumer; ``False`` if another consumer holds it or it is off."""
        if not self.usable:
            return False
        return self._lock.acquire(blocking=False)

    def release(self) -> None:
        """Give the pool back, first receiving (and dropping) answers nobody consumed."""
        try:
            for worker in self._workers:
                worker.drain()
        finally:
            self._lock.release()

    def submit(self, storage: Storage, items: Sequence[tuple[ReadContext, FileTask]], batch_size: int) -> RemoteRun:
        """Send a run to the next worker (starting it if need be); the caller must hold the pool.

        Every task must share one schema string (their rows become one batch). The
        returned run may answer ``None`` for any task: read it in-process then.
        """
        worker = self._worker()
        run = worker.submit(storage, items, batch_size) if worker is not None else _unread(items)
        self.files_sent += len(items)
        self.runs_sent += 1
        return run

    def _worker(self) -> _Worker | None:
        if not self.usable:
            return None
        self._workers = [w for w in self._workers if not w.broken]
        if len(self._workers) < self.processes:
            try:
                self._workers.append(_Worker(self, self.command))
            except OSError as e:
                self._failures += 1
                log.warning("could not start a reader process (%s); files are read in-process", e)
                if not self._workers:
                    return None
        worker = self._workers[self._next % len(self._workers)]
        self._next += 1
        return worker

    def note_failure(self, worker: _Worker) -> None:
        """Count a worker's failure (a worker that never answered counts as many: it cannot start)."""
        self._failures += 1 if worker.answered else MAX_FAILURES

    def close(self) -> None:
        """Stop every worker (they exit when their input closes)."""
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop()


def _unread(items: Sequence[tuple[ReadContext, FileTask]]) -> RemoteRun:
    """A run no worker took: every task reads in-process."""
    run = RemoteRun(None, items)
    run._settle(None)
    return run


_SHARED: dict[int, ReaderPool] = {}
_SHARED_LOCK = threading.Lock()


def shared_pool(processes: int) -> ReaderPool:
    """The process-wide pool of ``processes`` workers (created on first use, closed at exit)."""
    with _SHARED_LOCK:
        pool = _SHARED.get(processes)
        if pool is None:
            pool = _SHARED[processes] = ReaderPool(processes)
        return pool


def shared_pools() -> list[ReaderPool]:
    """The process-wide pools made so far (for metrics)."""
    with _SHARED_LOCK:
        return list(_SHARED.values())


@atexit.register
def _close_shared() -> None:
    for pool in list(_SHARED.values()):
        pool.close()
