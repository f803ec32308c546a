"""Large files decoded ahead on worker threads, into bounded queues.

What it buys: pyarrow decodes a large file's column chunks without holding
the GIL, so while the consumer converts the batch in hand, a worker decodes
the next one (and a second worker the next large file). For small files
Python's set-up of each file holds the GIL, and threads only contend: those
go to the reader processes (:mod:`tailer.read.reader_pool`) instead. Measured
by ``python -m benchmarks.changes`` (see ``benchmarks/README.md``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from concurrent.futures import ThreadPoolExecutor

from deltatail.tailer.read.rows import FileBatch

#: Worker threads reading large files ahead (pyarrow decodes without holding the GIL).
READ_THREADS = 2
#: Batches one worker may hold ahead of the consumer, per file (bounds the memory of reading ahead).
READ_AHEAD_BATCHES = 16


class Prefetch:
    """One file task decoded on a worker thread into a bounded queue, consumed in order by one reader.

    The worker does stage one (open, decode, DV filter: pyarrow releases the GIL);
    the consumer finishes each batch (:func:`~tailer.read.tasks.finish_batch`) while the worker decodes the next.

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
