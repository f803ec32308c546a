"""Keeping a tailer going while its sink or store is unavailable: the cursor is held, nothing is lost."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from deltatail.state.errors import DeltaTailError, StateError, StorageError
from deltatail.tailer.follow.signalled import SignalledTailer
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.follow.tailer import TailerConfig, table_name
from deltatail.tailer.runtime.backoff import retry_delay
from deltatail.tailer.runtime.status import Progress, status
from deltatail.tailer.runtime.transient import as_deltatail_error, describe, fault_of, is_transient
from deltatail.tailer.sink import Sink


class Runner(Protocol):
    """What the service runs: a :class:`~tailer.follow.tailer.Tailer`, or another table format's tailer."""

    progress: Progress

    def run(self) -> Progress:
        """Follow the table until done, stopped or failed."""
        ...

    def stop(self) -> None:
        """Finish the batch in hand, checkpoint and return from :meth:`run`."""
        ...


class TailerService:
    """Runs tailers one after another while the sink or the table's store is unavailable.

    A :class:`~state.errors.SinkUnavailableError` (broker down, delivery not
    acknowledged in time), a transient :class:`~state.errors.StorageError`
    (an object store that cannot be reached, throttles or fails), or an
    ``OSError`` of the sink, the state directory or the table's files (too many
    open files, disk full, a file too large, a read-only or replaced path: the
    rule of :mod:`tailer.runtime.transient`) ends a tailer
    run with its cursor at the last checkpoint whose flush succeeded. The service waits (exponential backoff,
    capped at ``max_backoff`` seconds), reports it in the status line, and starts
    a new tailer from the saved state, which resends everything after the cursor:
    the sink acknowledges nothing its destination did not accept. Other errors
    end the service at once.

    Args:
        config: the tailer's settings.
        make_sink: makes a new, unopened sink for each run.
        retries: restarts allowed in a row on an unavailable sink (``None``: no limit).
        max_backoff: the longest wait between two runs, in seconds.
        make_tailer: makes each run's tailer (tests pass collaborators through it); by default a
            :class:`Tailer` reporting to ``stats``.
        stats: the figures every run's tailer updates (a new one by default).
    """

    def __init__(
        self,
        config: TailerConfig,
        make_sink: Callable[[], Sink],
        *,
        retries: int | None = None,
        max_backoff: float = 60.0,
        make_tailer: Callable[[TailerConfig, Sink], Runner] | None = None,
        stats: TableStats | None = None,
    ) -> None:
        self.config = config
        self.make_sink = make_sink
        self.retries = retries
        self.max_backoff = max_backoff
        self.stats = stats if stats is not None else TableStats(config.table, table_name(config.table))
        self.make_tailer = make_tailer or (lambda c, sink: SignalledTailer(c, sink, stats=self.stats))
        self._stopping = threading.Event()
        self._current: Runner | None = None

    def stop(self) -> None:
        """Stop the running tailer (after its batch in hand) or the wait before the next one."""
        self._stopping.set()
        if self._current is not None:
            self._current.stop()

    def run(self) -> Progress:
        """Run tailers until one finishes, is stopped, or fails with something other than an unavailable sink or store.

        Raises:
            SinkUnavailableError: when ``retries`` runs in a row have failed on an unavailable sink.
            StorageError: when ``retries`` runs in a row have failed on an unreachable store (or at once
                when the store refuses access: that does not pass by waiting).
            StateError: at once when the state directory cannot be made, locked or read before the first
                tailer starts (a file in its place, a read-only file system): a mistake to fix, not to wait
                out; or when a tailer finds its saved state damaged.
            DeltaTailError: when ``retries`` runs in a row have failed on an ``OSError`` (its errno,
                text and file, as a deltatail error); whatever else stops a tailer (see :meth:`Tailer.run`).
        """
        self._check_state_dir()
        total = Progress()
        failures = 0
        while not self._stopping.is_set():
            tailer: Runner | None = None
            try:
                tailer = self.make_tailer(self.config, self.make_sink())  # may look at the store itself
                self._current = tailer
                done = tailer.run()
                total.versions += done.versions
                total.rows += done.rows
                total.held += done.held
                return total
            except Exception as e:
                if not is_transient(e):
                    raise
                delivered = tailer.progress.versions if tailer is not None else 0
                total.versions += delivered
                total.rows += tailer.progress.rows if tailer is not None else 0
                total.held += tailer.progress.held if tailer is not None else 0
                failures = 1 if delivered else failures + 1
                if self.retries is not None and failures > self.retries:
                    if isinstance(e, DeltaTailError):
                        raise
                    raise as_deltatail_error(e) from e
                self.stats.retries += 1
                self.stats.set_state(TableState.UNAVAILABLE, describe(e))
                self._wait_before_retry(e, failures)
            finally:
                self._current = None
        return total

    def _check_state_dir(self) -> None:
        """Lock and read the state directory once before the first tailer starts, retrying nothing.

        A state directory that cannot be made, locked or read when ``run`` starts (a file in its
        place, a read-only file system, a directory where ``cursor.json`` should be) is a mistake for
        the operator who just started it, reported at once; the same faults after the start are
        retried like any other (the state directory may come back).

        Raises:
            StateError: naming the state directory or file.
        """
        store = StateStore(self.config.state_dir)
        try:
            store.lock()
        except OSError as e:
            raise StateError(f"cannot use the state directory: {e.strerror or e}", file=self.config.state_dir) from e
        try:
            store.load()
        finally:
            store.unlock()

    def _wait_before_retry(self, error: Exception, failures: int) -> None:
        """Report the failure in a status line and wait (exponential backoff) before the next run."""
        delay = retry_delay(failures, self.max_backoff)
        what = fault_of(error)
        event = f"{what.replace(' ', '_')}_unavailable"
        text = describe(error)  # a deltatail error with its table and file
        status(
            event,
            f"{what} unavailable: {text}; holding the cursor at the last checkpoint, "
            f"retrying in {delay:.1f}s (attempt {failures})",
            level=logging.WARNING,
            retry_in_seconds=delay,
            attempt=failures,
        )
        if isinstance(error, StorageError) and error.detail:
            logging.getLogger("deltatail").debug("the store's failure: %s", error.detail)
        self._stopping.wait(delay)
