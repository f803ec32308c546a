"""The runtime every loop shares, below them all: ``follow``, ``audit``, ``lance`` and ``serve`` import it.

- :mod:`~tailer.runtime.files`: atomic, durable writes (``atomic_write``, ``fsync_dir``);
- :mod:`~tailer.runtime.faults`: crash points for the crash tests (``DELTATAIL_CRASH_AT``);
- :mod:`~tailer.runtime.status`: status lines, their throttle, and the progress counters;
- :mod:`~tailer.runtime.transient`: which errors pass by waiting (the one retry rule);
- :mod:`~tailer.runtime.backoff`: how long to wait, between retries and between idle polls.

It imports nothing of ``tailer`` but itself, so no two of the loops that use it import each other
for it.
"""
