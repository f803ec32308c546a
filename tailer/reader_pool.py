"""Reader processes: small files decoded outside the interpreter that plans them.

Catching up over thousands of small commits is bound by the interpreter: for
an 80-row file pyarrow's open and decode take ~50 µs, and deltatail's Python
around them (deletion vectors, column plan, change columns) about as much
again. Threads do not help: ``ParquetFile``'s set-up holds the GIL, and two
threads reading small files were measured no faster than one. So
:class:`ReaderPool` keeps a few child processes (``python -m
tailer.reader_pool``) that each take a *run* of file tasks, read them exactly
as :func:`tailer.changes.read_task` does, and answer with one Arrow IPC
record batch holding the run's rows plus the length of every batch
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
  the parent has not received its answers, holding at most
  :data:`OUTBOX_ANSWERS` of them (and :data:`OUTBOX_BYTES`) besides the one it
  is sending. They exit when their
  standard input closes, which includes the parent dying (even by SIGKILL);
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
import queue
import signal
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING

import pyarrow as pa

from state.errors import ConfigError

if TYPE_CHECKING:
    from state.changes import FileTask
    from tailer.changes import ReadContext
    from tailer.storage import Storage

log = logging.getLogger("deltatail")

#: File tasks per run: enough to amortise a round trip (~0.1 ms), few enough to keep both sides busy.
RUN_FILES = 32
#: A run ends once its files hold this many bytes. This bounds what a worker holds (its outbox, the answer it
#: sends and the one it reads) and how long the consumer waits for the first rows: a backlog of 200 KiB files
#: came back in one run of 20 at 4 MiB (first rows after 26 ms), in runs of 5 at 1 MiB (15 ms).
RUN_BYTES = 1 << 20
#: Fewer small files than this in one planning burst are read in-process (the live-tail path: no round trip).
MIN_FILES = 8
#: Worker failures after which a pool stops starting workers, for the life of the process.
MAX_FAILURES = 3

_FRAME = struct.Struct("<Q")
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)


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
        """Start ``command`` (by default ``python -m tailer.reader_pool``) as the pool's worker."""
        self._pool = pool
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tailer.reader_pool"] if command is None else list(command),
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
            _write_frame(self.proc.stdin, _wire(storage, batch_size, run.items))
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
        lengths, failed = pickle.loads(_read_frame(self.proc.stdout))
        payload = _read_frame(self.proc.stdout)
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

    def __init__(self, processes: int) -> None:
        """A pool of ``processes`` workers (at least 1), none started yet.

        Raises:
            ConfigError: if ``processes`` is less than 1.
        """
        if processes < 1:
            raise ConfigError(f"a reader pool needs at least one process, not {processes}")
        self.processes = processes
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
                self._workers.append(_Worker(self))
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


def _wire(storage: Storage, batch_size: int, items: Sequence[tuple[ReadContext, FileTask]]) -> bytes:
    """A run as plain tuples (pickling frozen dataclasses field by field costs more than reading a small file)."""
    contexts: dict[int, int] = {}
    context_fields: list[tuple[object, ...]] = []
    tasks = []
    for ctx, task in items:
        index = contexts.get(id(ctx))
        if index is None:
            index = contexts[id(ctx)] = len(context_fields)
            context_fields.append(
                (
                    ctx.table_root,
                    ctx.schema_string,
                    ctx.partition_columns,
                    ctx.column_mapping_mode,
                    ctx.version,
                    ctx.timestamp_ms,
                )
            )
        selection = task.selection
        tasks.append(
            (index, task.path, task.partition_values, task.change_type, selection.within, selection.minus, task.size)
        )
    return pickle.dumps((storage, batch_size, context_fields, tasks), pickle.HIGHEST_PROTOCOL)


def _unwire(request: bytes | bytearray) -> tuple[Storage, int, list[tuple[ReadContext, FileTask]]]:
    """The inverse of :func:`_wire`."""
    from state.changes import FileTask, RowSelection
    from tailer.changes import ReadContext

    storage, batch_size, context_fields, tasks = pickle.loads(request)
    contexts = [ReadContext(*fields) for fields in context_fields]
    items = [
        (contexts[c], FileTask(path, values, change_type, RowSelection(within, minus), size))
        for c, path, values, change_type, within, minus, size in tasks
    ]
    return storage, batch_size, items


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


@atexit.register
def _close_shared() -> None:
    for pool in list(_SHARED.values()):
        pool.close()


# -- framing ---------------------------------------------------------------------------------------


def _write_frame(stream: IO[bytes], payload: bytes | memoryview) -> None:
    stream.write(_FRAME.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def _read_exactly(stream: IO[bytes], n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        chunk = stream.readinto(view[got:])  # type: ignore[attr-defined]
        if not chunk:
            raise EOFError(f"stream ended after {got} of {n} bytes")
        got += chunk
    return buf


def _read_frame(stream: IO[bytes]) -> bytearray:
    (n,) = _FRAME.unpack(_read_exactly(stream, _FRAME.size))
    return _read_exactly(stream, n)


# -- the worker ------------------------------------------------------------------------------------


#: A worker's answer to a run: the pickled header (batch lengths, where it stopped) and the IPC payload.
_Reply = tuple[bytes, bytes | memoryview]


def _answer(storage: Storage, batch_size: int, items: list[tuple[ReadContext, FileTask]]) -> _Reply:
    """Read a run as ``read_task`` would (:func:`tailer.changes.read_run`); returns the header and the IPC payload.

    The payload is empty when the run has no rows, or when they could not be
    packed (e.g. a string column past 2 GiB): then the header says the run
    stopped at its first task, and the parent reads it all.
    """
    from tailer.changes import read_run

    try:
        lengths, failed, rows = read_run(storage, items, batch_size)
        payload: bytes | memoryview = b"" if rows is None else _ipc(rows)
    except (pa.ArrowException, MemoryError):
        lengths, failed, payload = [], 0, b""
    return pickle.dumps((lengths, failed), pickle.HIGHEST_PROTOCOL), payload


def _ipc(rows: pa.RecordBatch) -> memoryview:
    """One record batch as an Arrow IPC stream (a view of Arrow's buffer: not copied into ``bytes``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_batch(rows)
    return memoryview(sink.getvalue())


#: Answers a worker may hold while the parent has not read them (it goes on reading the next runs meanwhile),
#: and the most bytes they may hold together (an answer larger than that is still sent, alone). The parent
#: receives answers in plan order, alternating between workers: while it waits for one worker, the other
#: reads on into its outbox. At two answers it soon stopped (500 mixed commits: one core idle for ~10 of
#: 109 ms); at eight the commits took 8-10% less time.
OUTBOX_ANSWERS = 8
OUTBOX_BYTES = 64 << 20


class _Outbox:
    """The answers a worker's writer thread has yet to send.

    At most :data:`OUTBOX_ANSWERS` of them and :data:`OUTBOX_BYTES` of payload, except that an
    empty outbox takes any one answer. ``None`` marks the end.
    """

    def __init__(self) -> None:
        self._items: deque[_Reply | None] = deque()
        self._bytes = 0
        self._changed = threading.Condition()

    @staticmethod
    def _size(item: _Reply | None) -> int:
        return 0 if item is None else len(item[0]) + len(item[1])

    def put(self, item: _Reply | None) -> None:
        """Add an answer (or the end), waiting while the outbox is full."""
        size = self._size(item)
        with self._changed:
            while self._items and (len(self._items) >= OUTBOX_ANSWERS or self._bytes + size > OUTBOX_BYTES):
                self._changed.wait()
            self._items.append(item)
            self._bytes += size
            self._changed.notify_all()

    def get(self) -> _Reply | None:
        """The oldest answer (``None``: the end), waiting for one."""
        with self._changed:
            while not self._items:
                self._changed.wait()
            item = self._items.popleft()
            self._bytes -= self._size(item)
            self._changed.notify_all()
            return item


def _serve(requests: IO[bytes], answers: IO[bytes]) -> int:
    """The worker's loop: a reader thread queues requests, a writer thread sends answers.

    The reader thread means the parent never blocks sending a request. The writer thread
    means the worker never blocks on a full pipe while the parent is busy elsewhere (planning
    the next commits, or waiting for the other worker): it reads on, holding at most
    :data:`OUTBOX_ANSWERS` answers (and :data:`OUTBOX_BYTES`) besides the one being written.
    Before it, a worker whose answer did not fit the pipe waited for the parent, and both
    workers sat idle for most of every planning burst (500 mixed commits: no worker busy for
    28 of 159 ms; with it, 5 of 130 ms, the planning of the first run).
    """
    inbox: queue.Queue[bytearray | None] = queue.Queue()
    outbox = _Outbox()
    parent_gone = threading.Event()

    def read_requests() -> None:
        try:
            while True:
                inbox.put(_read_frame(requests))
        except (EOFError, OSError):
            inbox.put(None)

    def write_answers() -> None:
        while (answer := outbox.get()) is not None:
            try:
                _write_frame(answers, answer[0])
                _write_frame(answers, answer[1])
            except (BrokenPipeError, OSError):
                parent_gone.set()
                inbox.put(None)  # stop reading runs nobody will receive
                while outbox.get() is not None:  # unblock the loop until it stops
                    pass
                return

    threading.Thread(target=read_requests, name="deltatail-requests", daemon=True).start()
    writer = threading.Thread(target=write_answers, name="deltatail-answers", daemon=True)
    writer.start()
    while not parent_gone.is_set() and (request := inbox.get()) is not None:
        storage, batch_size, items = _unwire(request)
        outbox.put(_answer(storage, batch_size, items))
    outbox.put(None)
    writer.join()
    return 0


def main() -> int:
    """Entry point of a worker process (``python -m tailer.reader_pool``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the answers
    sys.stdout = sys.stderr
    return _serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    sys.exit(main())
