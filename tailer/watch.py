"""Wake the tailer when ``_delta_log`` changes: watchdog (inotify on Linux) events as hints, polling as the floor.

Events are only a hint to look: the tailer always lists the log (starting
after its version) to find new commits, so a lost, duplicated or spurious
event changes nothing but latency. Without events (``watch=False``, or a file
system watchdog cannot watch) the tailer looks every ``poll_interval`` seconds.
"""

from __future__ import annotations

import logging
import threading

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

log = logging.getLogger("deltatail")

_NEWS = frozenset({"created", "moved", "modified", "closed", "deleted"})


class _Handler(FileSystemEventHandler):
    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def on_any_event(self, event: FileSystemEvent) -> None:
        # Reads (the tailer's own opens and closes) are not news; creations, renames and writes are.
        if event.event_type in _NEWS:
            self._event.set()


class LogWatcher:
    """Signals when something in ``log_dir`` changes; :meth:`wait` returns on a signal or after ``timeout``."""

    def __init__(self, log_dir: str, *, watch: bool = True) -> None:
        self._event = threading.Event()
        self._observer: BaseObserver | None = None
        self.watching = False
        if watch:
            try:
                observer = Observer()
                observer.schedule(_Handler(self._event), log_dir, recursive=False)
                observer.start()
                self._observer = observer
                self.watching = True
            except OSError as e:
                log.warning("cannot watch %s (%s); polling instead", log_dir, e)

    def wait(self, timeout: float) -> bool:
        """Block until a change is signalled or ``timeout`` seconds pass; returns whether a change was signalled."""
        fired = self._event.wait(timeout)
        self._event.clear()
        return fired

    def wake(self) -> None:
        """Wake a waiting :meth:`wait` (used on shutdown)."""
        self._event.set()

    def close(self) -> None:
        """Stop watching."""
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
            self._observer = None
