"""One watcher for many log directories: a service following many tables waits on one descriptor.

:class:`DirectoryWatcher` keeps one inotify descriptor (Linux) with a watch per
``_delta_log`` directory and tells which of them changed; events are only
hints to look (see :mod:`tailer.log.watch`). Where inotify is unavailable, or a
directory cannot be watched (an object store), :meth:`DirectoryWatcher.add`
says so and the table is polled instead. A process has a limited number of
inotify instances (``fs.inotify.max_user_instances``, often 128) but many
watches per instance, which is why a service does not use one
:class:`~tailer.log.watch.LogWatcher` per table.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import struct
import sys
import threading

log = logging.getLogger("deltatail")

_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)
_IN_IGNORED = 0x8000
#: The kernel's queue of events for the descriptor filled up (``fs.inotify.max_queued_events``) and
#: events were dropped: any directory may have changed unseen.
_IN_Q_OVERFLOW = 0x4000


class DirectoryWatcher:
    """Watches many directories, each under a key (see the module docstring). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[int, str] = {}
        self._notified: set[str] = set()
        self._watches: dict[str, int] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._poller = select.poll()
        self._poller.register(self._wake_r, select.POLLIN)
        self._fd: int | None = None
        self._closed = False
        self.overflows = 0  # times the kernel dropped events (see wait)
        if sys.platform.startswith("linux"):
            try:
                from watchdog.observers.inotify_c import inotify_init

                fd = inotify_init()
                if fd < 0:
                    raise OSError(os.strerror(ctypes.get_errno()))
                os.set_blocking(fd, False)
                self._fd = fd
                self._poller.register(fd, select.POLLIN)
            except (OSError, ImportError) as e:
                log.warning("cannot watch log directories with inotify (%s); polling instead", e)

    def add(self, key: str, log_dir: str) -> bool:
        """Watch ``log_dir`` under ``key``; returns whether it is watched (else: poll it)."""
        if self._fd is None:
            return False
        from watchdog.observers.inotify_c import InotifyConstants as C
        from watchdog.observers.inotify_c import inotify_add_watch

        mask = C.IN_CREATE | C.IN_MOVED_TO | C.IN_CLOSE_WRITE | C.IN_MODIFY | C.IN_DELETE | C.IN_DELETE_SELF
        with self._lock:
            wd = inotify_add_watch(self._fd, os.fsencode(log_dir), mask)
            if wd < 0:
                log.debug("cannot watch %s (%s); polling it", log_dir, os.strerror(ctypes.get_errno()))
                return False
            self._keys[wd] = key
            self._watches[key] = wd
        return True

    def remove(self, key: str) -> None:
        """Stop watching ``key``'s directory (if it was watched)."""
        if self._fd is None:
            return
        from watchdog.observers.inotify_c import inotify_rm_watch

        with self._lock:
            wd = self._watches.pop(key, None)
            if wd is not None:
                self._keys.pop(wd, None)
                inotify_rm_watch(self._fd, wd)  # type: ignore[arg-type]

    def notify(self, key: str) -> None:
        """Report ``key``'s directory changed (a notification from elsewhere): the next :meth:`wait` returns it."""
        with self._lock:
            self._notified.add(key)
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"\0")

    def wait(self, timeout: float) -> set[str]:
        """Block until a watched directory changes, :meth:`wake` is called, or ``timeout`` seconds pass.

        Returns the keys of the directories that changed (empty on a timeout or a wake). When the
        kernel dropped events (its queue overflowed), every watched key is returned: which
        directories changed is no longer known, and a table not looked at now would wait for its
        safety poll. Each overflow is counted (:attr:`overflows`); the 1st, 2nd, 4th, 8th... are logged.
        """
        changed: set[str] = set()
        for fd, _ in self._poller.poll(max(timeout, 0.0) * 1000):
            if fd == self._fd:
                changed |= self._read_events()
            else:
                with contextlib.suppress(BlockingIOError):
                    while os.read(fd, 4096):
                        pass
        with self._lock:
            changed |= self._notified
            self._notified = set()
        return changed

    def _read_events(self) -> set[str]:
        keys: set[str] = set()
        fd = self._fd
        if fd is None:
            return keys
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                return keys
            offset = 0
            with self._lock:
                while offset + _EVENT.size <= len(data):
                    wd, mask, _, length = _EVENT.unpack_from(data, offset)
                    offset += _EVENT.size + length
                    if mask & _IN_Q_OVERFLOW:
                        self.overflows += 1
                        if self.overflows & (self.overflows - 1) == 0:  # the 1st, 2nd, 4th, 8th...: no flood
                            log.warning(
                                "the kernel dropped file events (inotify queue overflow, %d so far): looking at "
                                "all %d watched tables; raise fs.inotify.max_queued_events if this recurs",
                                self.overflows,
                                len(self._watches),
                            )
                        keys.update(self._watches)
                        continue
                    key = self._keys.get(wd)
                    if key is not None:
                        keys.add(key)
                    if mask & _IN_IGNORED and key is not None:  # the directory went away: the watch is gone
                        del self._keys[wd]
                        self._watches.pop(key, None)

    def wake(self) -> None:
        """End a :meth:`wait` in progress (or the next one) at once; safe from any thread."""
        if not self._closed:
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"\0")

    def close(self) -> None:
        """Stop watching and release the descriptors (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self._fd, self._wake_r, self._wake_w):
                if fd is not None:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self._fd = None
