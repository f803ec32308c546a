"""Whole files fetched ahead of their turn, concurrently: for stores where every read is a request.

What it buys: catching up on an object store reads thousands of small files
(commits, small data and cdc files), each one request of a few milliseconds
on the network and microseconds of work. Fetched one after another, the
network is all the time; :class:`Prefetcher` keeps up to ``concurrency``
requests in flight (obstore releases the GIL while it waits) so that by the
time a reader asks for a file it is in memory (see ``benchmarks/README.md``,
the object-store rows).

A prefetch is a hint: a file that was not prefetched, that failed, or whose
entry was dropped is read on demand, and an error is raised where the read is
made, never by the prefetch. What is held is bounded by ``max_bytes`` (a
prefetch beyond it is not made); an entry nobody takes within
``stale_seconds`` is dropped.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

#: What a prefetch of a file of unknown size counts as (commit files are a few KiB).
UNKNOWN_SIZE = 64 << 10


class Prefetcher:
    """Fetches whole files with ``fetch`` on a thread pool, and hands each out once.

    Args:
        fetch: reads a whole file (``Storage.read`` of the underlying store).
        concurrency: fetches in flight.
        max_bytes: the most bytes held (fetched or in flight, not yet taken).
        stale_seconds: an entry not taken within this time is dropped.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        fetch: Callable[[str], bytes],
        *,
        concurrency: int = 16,
        max_bytes: int = 64 << 20,
        stale_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self.concurrency = concurrency
        self.max_bytes = max_bytes
        self.stale_seconds = stale_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[Future[bytes], int, float]] = OrderedDict()
        self._bytes = 0
        self._pool: ThreadPoolExecutor | None = None

    def prefetch(self, files: Sequence[tuple[str, int | None]]) -> None:
        """Start fetching ``(path, size)`` files not yet held, within the byte budget (``size`` may be unknown)."""
        now = self._clock()
        with self._lock:
            self._drop_stale(now)
            for path, size in files:
                if path in self._entries:
                    continue
                cost = UNKNOWN_SIZE if size is None else size
                if self._bytes + cost > self.max_bytes:
                    return
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="deltatail-fetch")
                self._entries[path] = (self._pool.submit(self._fetch, path), cost, now)
                self._bytes += cost

    def keep(self, path: str, data: bytes) -> None:
        """Hold ``data``, already read, as the prefetched contents of ``path`` (within the byte budget)."""
        now = self._clock()
        with self._lock:
            self._drop_stale(now)
            if path in self._entries or self._bytes + len(data) > self.max_bytes:
                return
            done: Future[bytes] = Future()
            done.set_result(data)
            self._entries[path] = (done, len(data), now)
            self._bytes += len(data)

    def take(self, path: str) -> bytes | None:
        """The file's bytes if it was prefetched (waiting for the fetch), else ``None``; a failed fetch is ``None``."""
        with self._lock:
            entry = self._entries.pop(path, None)
            if entry is None:
                return None
            self._bytes -= entry[1]
        try:
            return entry[0].result()
        except Exception:  # the caller reads it again and raises the genuine error where it belongs
            return None

    def _drop_stale(self, now: float) -> None:
        while self._entries:
            path, (future, cost, since) = next(iter(self._entries.items()))
            if now - since < self.stale_seconds:
                return
            future.cancel()
            del self._entries[path]
            self._bytes -= cost

    @property
    def held(self) -> int:
        """How many files are held or in flight."""
        with self._lock:
            return len(self._entries)

    def close(self) -> None:
        """Drop everything held and stop the threads."""
        with self._lock:
            for future, _, _ in self._entries.values():
                future.cancel()
            self._entries.clear()
            self._bytes = 0
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
