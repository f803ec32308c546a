"""Pausing Python's cyclic garbage collector around a loop that allocates many short-lived containers.

What it buys (``python -m benchmarks.kafka_tailer`` and ``python -m benchmarks.audit``, see
``benchmarks/README.md``): with kafka-python, half of the sink's time over 200,000 messages was
collections that rescanned the whole older heap (the tailer's snapshot, the producer's pending
futures); building audit events a run at a time, the same collections were a fifth of the time.
It changes a process-wide setting for the duration of one loop only, and restores it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration (reference counting goes on).

    A producer loop allocates container objects for every message (kafka-python: a future and its
    callback lists per message; both backends: a header list). Every few hundred of them trigger a
    collection, and every tenth of those scans the whole older heap again: the tailer's snapshot,
    its read-ahead, the producer's pending futures. Measured with kafka-python over 200,000 messages,
    that was half of the sink's time. The loop creates no cycles of its own that reference counting
    would not free, so pausing loses nothing: collection resumes at the end of the loop, and if the
    collector was already off, it stays off.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
