"""A reader process: reads runs of small file tasks for its parent (see :mod:`tailer.read.reader_pool`).

Started as ``python -m tailer.read.reader_worker``. Requests and answers are
length-prefixed frames on its standard input and output. A request is a run
of file tasks (:func:`wire`); the answer (:func:`answer`) is a header (the
lengths of the batches of every task read, and the task it stopped at, if
any) and one Arrow IPC record batch holding the rows of every task read,
exactly as :func:`tailer.read.tasks.read_run` gives them.

The worker never reports an error itself: it stops a run at the first task it
cannot read and says which; the parent reads that task and raises the genuine
error. A reader thread queues requests (the parent never blocks sending one),
and a writer thread sends answers, so the worker reads on while the parent is
busy elsewhere, holding at most :data:`OUTBOX_ANSWERS` answers and
:data:`OUTBOX_BYTES` bytes besides the one being written. It ignores SIGINT and
SIGTERM (a stop sent to the process group reaches only the parent) and exits
when its standard input closes, which includes the parent dying.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import struct
import sys
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import IO

import pyarrow as pa

from deltatail.state.changes import FileTask, RowSelection
from deltatail.state.planning import ReadContext
from deltatail.tailer.read.tasks import read_run
from deltatail.tailer.storage import Storage

_FRAME = struct.Struct("<Q")

#: Answers a worker may hold while the parent has not read them (it goes on reading the next runs meanwhile),
#: and the most bytes they may hold together (an answer larger than that is still sent, alone). The parent
#: receives answers in plan order, alternating between workers: while it waits for one, the other reads on
#: into its outbox (``python -m benchmarks.changes``: at two answers a core sat idle; eight is ~10% faster).
OUTBOX_ANSWERS = 8
OUTBOX_BYTES = 64 << 20

#: A worker's answer to a run: the pickled header (batch lengths, where it stopped) and the IPC payload.
Reply = tuple[bytes, bytes | memoryview]


def wire(storage: Storage, batch_size: int, items: Sequence[tuple[ReadContext, FileTask]]) -> bytes:
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
                    ctx.external_roots,
                )
            )
        selection = task.selection
        tasks.append(
            (index, task.path, task.partition_values, task.change_type, selection.within, selection.minus, task.size)
        )
    return pickle.dumps((storage, batch_size, context_fields, tasks), pickle.HIGHEST_PROTOCOL)


def unwire(request: bytes | bytearray) -> tuple[Storage, int, list[tuple[ReadContext, FileTask]]]:
    """The inverse of :func:`wire`."""
    storage, batch_size, context_fields, tasks = pickle.loads(request)
    contexts = [ReadContext(*fields) for fields in context_fields]
    items = [
        (contexts[c], FileTask(path, values, change_type, RowSelection(within, minus), size))
        for c, path, values, change_type, within, minus, size in tasks
    ]
    return storage, batch_size, items


def write_frame(stream: IO[bytes], payload: bytes | memoryview) -> None:
    """Write one frame: the payload's length (8 bytes, little-endian), then the payload; flushed."""
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


def read_frame(stream: IO[bytes]) -> bytearray:
    """Read one frame's payload.

    Raises:
        EOFError: if the stream ends inside the frame (or before it).
    """
    (n,) = _FRAME.unpack(_read_exactly(stream, _FRAME.size))
    return _read_exactly(stream, n)


def answer(
    storage: Storage,
    batch_size: int,
    items: list[tuple[ReadContext, FileTask]],
    ipc: Callable[[pa.RecordBatch], bytes | memoryview] | None = None,
) -> Reply:
    """Read a run as ``read_task`` would (:func:`tailer.read.tasks.read_run`); returns the header and the IPC payload.

    The payload is empty when the run has no rows, or when they could not be
    packed (e.g. a string column past 2 GiB): then the header says the run
    stopped at its first task, and the parent reads it all.
    """
    try:
        lengths, failed, rows = read_run(storage, items, batch_size)
        payload: bytes | memoryview = b"" if rows is None else (ipc or ipc_stream)(rows)
    except (pa.ArrowException, MemoryError):
        lengths, failed, payload = [], 0, b""
    return pickle.dumps((lengths, failed), pickle.HIGHEST_PROTOCOL), payload


def ipc_stream(rows: pa.RecordBatch) -> memoryview:
    """One record batch as an Arrow IPC stream (a view of Arrow's buffer: not copied into ``bytes``)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_batch(rows)
    return memoryview(sink.getvalue())


class Outbox:
    """The answers a worker's writer thread has yet to send.

    At most ``answers`` of them and ``size`` bytes of payload, except that an
    empty outbox takes any one answer. ``None`` marks the end.
    """

    def __init__(self, answers: int = OUTBOX_ANSWERS, size: int = OUTBOX_BYTES) -> None:
        self.answers, self.size = answers, size
        self._items: deque[Reply | None] = deque()
        self._bytes = 0
        self._changed = threading.Condition()

    @staticmethod
    def _size(item: Reply | None) -> int:
        return 0 if item is None else len(item[0]) + len(item[1])

    def put(self, item: Reply | None) -> None:
        """Add an answer (or the end), waiting while the outbox is full."""
        size = self._size(item)
        with self._changed:
            while self._items and (len(self._items) >= self.answers or self._bytes + size > self.size):
                self._changed.wait()
            self._items.append(item)
            self._bytes += size
            self._changed.notify_all()

    def get(self) -> Reply | None:
        """The oldest answer (``None``: the end), waiting for one."""
        with self._changed:
            while not self._items:
                self._changed.wait()
            item = self._items.popleft()
            self._bytes -= self._size(item)
            self._changed.notify_all()
            return item


def serve(
    requests: IO[bytes],
    answers: IO[bytes],
    *,
    read: Callable[[Storage, int, list[tuple[ReadContext, FileTask]]], Reply] = answer,
    outbox: Outbox | None = None,
) -> int:
    """The worker's loop (see the module docstring); returns the exit code when ``requests`` ends.

    Args:
        requests: where runs arrive.
        answers: where answers go.
        read: answers one run (:func:`answer`).
        outbox: holds answers the parent has not received yet (by default a new :class:`Outbox`).
    """
    inbox: queue.Queue[bytearray | None] = queue.Queue()
    outbox = outbox if outbox is not None else Outbox()
    parent_gone = threading.Event()

    def read_requests() -> None:
        try:
            while True:
                inbox.put(read_frame(requests))
        except (EOFError, OSError):
            inbox.put(None)

    def write_answers() -> None:
        while (answer := outbox.get()) is not None:
            try:
                write_frame(answers, answer[0])
                write_frame(answers, answer[1])
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
        storage, batch_size, items = unwire(request)
        outbox.put(read(storage, batch_size, items))
    outbox.put(None)
    writer.join()
    return 0


def main() -> int:
    """Entry point of a worker process (``python -m tailer.read.reader_worker``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints go to stderr, never into the answers
    sys.stdout = sys.stderr
    return serve(sys.stdin.buffer, answers)


if __name__ == "__main__":
    sys.exit(main())
