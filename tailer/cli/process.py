"""Process-wide settings, made only by the command line (library code never changes the process).

- **Stop signals**: SIGINT and SIGTERM ask the running tailer to finish the
  batch in hand, checkpoint and exit 0.
- **The GIL switch interval** (:func:`tune_for_latency`): where a commit is
  noticed by another thread (watchdog's observer, on platforms without
  inotify) or a sink works on its own thread (kafka-python's sender), a
  hand-over to the run loop with Python's default 5 ms interval often waits
  for a time slice to end; 0.5 ms keeps commit-to-row latency low (measured by
  ``python -m benchmarks.latency``, see ``benchmarks/README.md``).
- **Arrow's memory pool** (:func:`name_arrow_pool`, :func:`return_memory_promptly`):
  jemalloc (else the system allocator) instead of pyarrow's default mimalloc,
  which keeps memory a giant commit's batches freed: ~50 MiB more peak RSS
  delivering a 2,000,000-row commit (``python -m benchmarks.giant_commit``).
  ``ARROW_DEFAULT_MEMORY_POOL`` in the environment still chooses. The reading
  threads' jemalloc arenas return freed pages at once (see
  :func:`return_memory_promptly`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

#: The GIL switch interval of a following tailer process.
SWITCH_INTERVAL = 0.0005


def tune_for_latency() -> None:
    """Shorten the interpreter's thread switch interval for this process."""
    sys.setswitchinterval(SWITCH_INTERVAL)


#: The pool :func:`name_arrow_pool` names, on Linux, whose pyarrow wheels are built with it.
ARROW_POOL = "jemalloc"


def name_arrow_pool() -> None:
    """Name jemalloc in ``ARROW_DEFAULT_MEMORY_POOL`` before pyarrow is loaded, unless the environment names a pool.

    Arrow reads the variable once, when its C++ side first asks for its default pool, and that pool is
    what its C++ code allocates from where no pool is passed: the Parquet reader's page buffers among
    others. ``pyarrow.set_memory_pool`` (:func:`return_memory_promptly`) changes only the pool
    pyarrow's Python calls pass, so without this a process allocates from two allocators, and mimalloc
    keeps the pages its share freed: 2,000,000 change rows delivered to ``parquet:`` peaked at 156 MiB
    with both and 134 MiB with jemalloc alone (``python -m benchmarks.giant_commit``). Called by the
    command line's entry point, which imports no Arrow; where pyarrow is already loaded it changes
    nothing. Only on Linux, whose pyarrow wheels are built with jemalloc (elsewhere Arrow would warn
    of a pool it lacks and fall back to mimalloc; :func:`return_memory_promptly` still chooses
    there). The variable is inherited by the processes deltatail starts (its reader processes),
    which read Arrow too.
    """
    if "pyarrow" in sys.modules or not sys.platform.startswith("linux"):
        return
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", ARROW_POOL)


def return_memory_promptly() -> None:
    """Allocate Arrow memory from jemalloc, or the system allocator where pyarrow has no jemalloc.

    Unless ``ARROW_DEFAULT_MEMORY_POOL`` is set: then pyarrow already chose the pool it names.

    With jemalloc as the pool, jemalloc arenas made from here on return the pages freed in them at
    once (``pyarrow.jemalloc_set_decay_ms(0)``, which applies to arenas made after it; pyarrow's
    default is 1,000 ms). jemalloc gives each thread an arena while there are fewer threads than
    arenas, and the caller's own arena already exists, so this reaches the threads started later:
    the read-ahead threads that decode a giant commit's files, whose batches are freed by the
    delivering thread as they go. That lowers a giant commit's peak at the sinks' rows/s (they, not
    the decoding, set the pace; decoding alone is slower, as every batch's pages are faulted in
    anew; figures in ``benchmarks/README.md``). A ``JE_ARROW_MALLOC_CONF`` in the environment
    (jemalloc's own settings) is left to decide.
    """
    import pyarrow as pa  # here, not at the top: ``status`` and ``signal`` never load Arrow

    if not os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        try:
            pa.set_memory_pool(pa.jemalloc_memory_pool())
        except NotImplementedError:  # a pyarrow built without jemalloc
            pa.set_memory_pool(pa.system_memory_pool())
    if pa.default_memory_pool().backend_name == "jemalloc" and not os.environ.get("JE_ARROW_MALLOC_CONF"):
        pa.jemalloc_set_decay_ms(0)


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Make SIGINT and SIGTERM call ``stop`` (which must be signal-safe: set a flag, wake a waiter)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
