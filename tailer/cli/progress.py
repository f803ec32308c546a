"""Progress bars while catching up, on a terminal (rich); elsewhere the status lines say the same.

One bar per table that is behind (versions delivered out of the versions seen),
with its rate and what is left, refreshed from the tables' figures
(:class:`~tailer.follow.stats.TableStats`) by a thread of its own. When stderr is
not a terminal nothing is drawn: the ``catching_up`` status lines (and, in
``serve``, ``table_status``) carry the same figures.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING

from deltatail.tailer.cli import logs
from deltatail.tailer.follow.stats import TableStats

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class ServiceProgress:
    """Bars for the tables that are catching up, as a context manager (a no-op off a terminal).

    Args:
        tables: the tables' figures, read on every refresh.
        interval: seconds between refreshes.
        force: draw even when stderr is not a terminal (tests).

    Never drawn with JSON logs (:func:`tailer.cli.logs.json_mode`): every line on stderr is JSON then.
    """

    def __init__(self, tables: Callable[[], list[TableStats]], interval: float = 0.5, *, force: bool = False) -> None:
        self._tables = tables
        self._interval = interval
        self._enabled = force or (sys.stderr.isatty() and not logs.json_mode())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._force = force
        self._tasks: dict[str, tuple[TaskID, int]] = {}
        self._bars: Progress | None = None

    @property
    def _progress(self) -> Progress:
        """The bars, built on first use: rich is imported only by a process that draws them."""
        if self._bars is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("versions"),
                TimeRemainingColumn(),
                console=Console(stderr=True, force_terminal=self._force or None),
                transient=True,
            )
        return self._bars

    def __enter__(self) -> ServiceProgress:
        if self._enabled:
            self._progress.start()
            self._thread = threading.Thread(target=self._loop, name="deltatail-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._progress.stop()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.refresh()

    def refresh(self) -> None:
        """Update the bars from the tables' figures (a table appears while behind, and goes when caught up)."""
        for s in self._tables():
            known = self._tasks.get(s.name)
            behind = s.versions_behind
            if known is None:
                if behind <= 1:
                    continue
                task = self._progress.add_task(s.name, total=behind)
                self._tasks[s.name] = (task, s.delivered_version)
                continue
            task, first = known
            done = s.delivered_version - first
            if behind == 0:
                self._progress.remove_task(task)
                del self._tasks[s.name]
            else:
                self._progress.update(task, completed=done, total=done + behind)
