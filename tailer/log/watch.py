"""Wake the tailer when ``_delta_log`` changes: inotify (through watchdog) events as hints, polling as the floor.

Events are only a hint to look: the tailer always looks for new commits
itself (by name, see :mod:`tailer.log.follower`), so a lost, duplicated or
spurious event changes nothing but latency. Without events (``watch=False``, or a file
system that cannot be watched) the tailer looks every ``poll_interval`` seconds.

On Linux the run loop's own thread waits on the inotify descriptor (watchdog's
inotify bindings; no thread in between), so a new commit wakes it directly. An
``Observer`` thread hands the run loop each change as a hint where inotify is not
available (other platforms).

Only events that announce a commit are asked for: a commit appears by a rename
(``IN_MOVED_TO``), a hard link or an exclusive create (``IN_CREATE``), and is
complete when its writer closes it (``IN_CLOSE_WRITE``); deletions and writes are
news too. Opens, reads and closes without writing are not: the tailer's own reads
of the log would otherwise signal it (and, through an observer, wake watchdog's
threads to compete with the run loop for the GIL).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import sys
import threading
from typing import Protocol

from watchdog.events import (
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.utils import UnsupportedLibcError

log = logging.getLogger("deltatail")

#: The watchdog event types asked for where an observer is used (see the module docstring).
_WATCHED: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileMovedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileDeletedEvent,
]


def _write_byte(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):  # a full pipe is already a signal
        os.write(fd, b"\0")


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        while os.read(fd, 65536):
            pass


class _Handler(FileSystemEventHandler):
    def __init__(self, signal_fd: int) -> None:
        self._fd = signal_fd

    def on_any_event(self, event: FileSystemEvent) -> None:
        _write_byte(self._fd)


def _open_inotify(log_dir: str) -> int:
    """A non-blocking inotify descriptor watching ``log_dir`` for news.

    Raises:
        OSError: if inotify is unavailable here or the directory cannot be watched.
    """
    from watchdog.observers.inotify_c import InotifyConstants as C
    from watchdog.observers.inotify_c import inotify_add_watch, inotify_init

    fd = inotify_init()
    if fd < 0:
        raise OSError(f"inotify_init failed: {os.strerror(ctypes.get_errno())}")
    mask = C.IN_CREATE | C.IN_MOVED_TO | C.IN_CLOSE_WRITE | C.IN_MODIFY | C.IN_DELETE | C.IN_DELETE_SELF
    if inotify_add_watch(fd, os.fsencode(log_dir), mask) < 0:
        error = ctypes.get_errno()
        os.close(fd)
        raise OSError(f"inotify_add_watch failed: {os.strerror(error)}")
    os.set_blocking(fd, False)
    return fd


class Watcher(Protocol):
    """What the run loop waits on between looks at the log."""

    def wait(self, timeout: float) -> bool:
        """Block until a change is signalled or ``timeout`` seconds pass; returns whether one was signalled."""
        ...

    def wake(self) -> None:
        """End a :meth:`wait` in progress, or the next one, at once (thread- and signal-safe)."""
        ...

    def close(self) -> None:
        """Release what the watcher holds."""
        ...


class LogWatcher:
    """Signals when something in ``log_dir`` changes; :meth:`wait` returns on a signal or after ``timeout``.

    Attributes:
        watching: whether changes are signalled (``False``: only the timeout ends a wait, i.e. polling).
    """

    def __init__(self, log_dir: str, *, watch: bool = True) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._inotify: int | None = None
        self._observer: BaseObserver | None = None
        # poll(), not select(): select refuses descriptor numbers past 1024, which a busy process reaches.
        self._poller = select.poll()
        self._poller.register(self._wake_r, select.POLLIN)
        self.watching = False
        if not watch:
            return
        if sys.platform.startswith("linux"):
            try:
                self._inotify = _open_inotify(log_dir)
                self._poller.register(self._inotify, select.POLLIN)
                self.watching = True
                return
            except (OSError, ImportError, UnsupportedLibcError) as e:
                log.warning("cannot watch %s with inotify (%s); trying watchdog's observer", log_dir, e)
        try:
            observer = Observer()
            observer.schedule(_Handler(self._wake_w), log_dir, recursive=False, event_filter=_WATCHED)
            observer.start()
            self._observer = observer
            self.watching = True
        except OSError as e:
            log.warning("cannot watch %s (%s); polling instead", log_dir, e)

    def wait(self, timeout: float) -> bool:
        """Block until a change is signalled or ``timeout`` seconds pass; returns whether a change was signalled.

        Signals that arrived since the last wait count: they end this one at once.
        """
        ready = [fd for fd, _ in self._poller.poll(max(timeout, 0.0) * 1000)]
        for fd in ready:
            _drain(fd)
        return bool(ready)

    def wake(self) -> None:
        """Wake a waiting :meth:`wait` (used on shutdown); safe from any thread or a signal handler.

        After :meth:`close` (or while it runs) it does nothing: the pipe's descriptor
        numbers may already belong to other files.
        """
        if not self._lock.acquire(blocking=False):
            return  # closing (a signal handler must not wait for the thread it interrupted)
        try:
            if not self._closed:
                _write_byte(self._wake_w)
        finally:
            self._lock.release()

    def close(self) -> None:
        """Stop watching and release the descriptors (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
        if self._inotify is not None:
            os.close(self._inotify)
            self._inotify = None
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
