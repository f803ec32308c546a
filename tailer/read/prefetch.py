"""Large files decoded ahead on worker threads, into bounded queues.

What it buys: pyarrow decodes a large file's column chunks without holding
the GIL, so while the consumer converts the batch in hand, a worker decodes
the next one (and a second worker the next large file). For small files
Python's set-up of each file holds the GIL, and threads only contend: those
go to the reader processes (:mod:`tailer.read.reader_pool`) instead. Measured
by ``python -m benchmarks.changes`` (see ``benchmarks/README.md``).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor

from deltatail.tailer.read.rows import FileBatch

#: Worker threads reading large files ahead (pyarrow decodes without holding the GIL).
READ_THREADS = 2
#: Batches one worker may hold ahead of the consumer, per file.
READ_AHEAD_BATCHES = 16
#: Decoded bytes one worker may hold ahead of the consumer, per file (plus the one batch that crossed it):
#: what bounds the memory of reading ahead within a giant commit, whatever its rows' width. The worker
#: still has a batch ready when the consumer asks, which is all the overlap of decoding and converting
#: needs: more held ahead costs memory, not rows/s (``docs/experiments.md``).
READ_AHEAD_BYTES = 2 << 20
#: :data:`READ_AHEAD_BYTES` for a file in an object store, where the decoder fetches each row group's
#: column chunks when it reaches them: a few batches in hand cover the consumer while it waits on one.
REMOTE_READ_AHEAD_BYTES = 8 << 20


class Prefetch:
    """One file task decoded on a worker thread into a bounded queue, consumed in order by one reader.

    The worker does stage one (open, decode, DV filter: pyarrow releases the GIL);
    the consumer finishes each batch (:func:`~tailer.read.tasks.finish_batch`) while the worker decodes the next.

    The worker holds at most :data:`READ_AHEAD_BATCHES` batches, and puts no
    further batch once those it holds reach ``held_bytes`` (``nbytes`` of the
    decoded batches; :data:`READ_AHEAD_BYTES` if ``None``); one batch is always
    let through, however large.

    The worker stops early when the consumer goes away (:meth:`cancel`). An
    exception in the worker is handed over in the queue and raised to the
    consumer after every batch before it.

    Created with ``started=False``, the worker takes its thread but opens
    nothing until :meth:`start` (or the consumer's first :meth:`batches`): the
    reader decides when a file queued behind another may begin. Two signals
    tell it: :attr:`starved` (the consumer had to wait for a batch after the
    first: reading, not the consumer, is the limit) and :attr:`decoded` (the
    worker is done with its file and has closed it: read whole, or stopped by
    a failure or :meth:`cancel`).
    """

    _DONE = object()

    def __init__(
        self,
        pool: ThreadPoolExecutor,
        read: Callable[[], Generator[FileBatch, None, None]],
        *,
        started: bool = True,
        held_bytes: int | None = None,
    ) -> None:
        self._held_bytes = READ_AHEAD_BYTES if held_bytes is None else held_bytes
        self._items: deque[tuple[object, int]] = deque()
        self._held = 0  # bytes of the batches in _items
        self._changed = threading.Condition()
        self._cancelled = threading.Event()
        self._go = threading.Event()
        if started:
            self._go.set()
        self._taken = 0  # items the consumer has taken
        self.starved = False
        self.decoded = False
        self.most_held = 0  # the most bytes held at once (for tests and benchmarks)
        self._future = pool.submit(self._run, read)

    def start(self) -> None:
        """Let the worker begin reading (no effect once it has)."""
        self._go.set()

    def _put(self, item: object) -> bool:
        size = item.batch.nbytes if isinstance(item, FileBatch) else 0
        with self._changed:
            while self._items and (len(self._items) >= READ_AHEAD_BATCHES or self._held >= self._held_bytes):
                if self._cancelled.is_set():
                    return False
                self._changed.wait(timeout=0.05)
            if self._cancelled.is_set():
                return False
            self._items.append((item, size))
            self._held += size
            self.most_held = max(self.most_held, self._held)
            self._changed.notify_all()
        return True

    def _get(self) -> object:
        with self._changed:
            if not self._items and self._taken:
                self.starved = True
            while not self._items:
                self._changed.wait()
            self._taken += 1
            item, size = self._items.popleft()
            self._held -= size
            self._changed.notify_all()
        return item

    def _run(self, read: Callable[[], Generator[FileBatch, None, None]]) -> None:
        self._go.wait()
        if self._cancelled.is_set():
            return
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
            self.decoded = True
        self._put(self._DONE)

    def batches(self) -> Iterator[FileBatch]:
        """The task's decoded batches, in order; raises what reading raised. Starts the worker if not started."""
        self.start()
        try:
            while True:
                item = self._get()
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
        self._go.set()  # a worker waiting to start returns at once
        self._future.cancel()
        with self._changed:
            self._items.clear()
            self._held = 0
            self._changed.notify_all()
