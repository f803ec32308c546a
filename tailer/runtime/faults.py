"""Crash points for crash tests: die by SIGKILL at a named point of the run loop.

``DELTATAIL_CRASH_AT=<point>:<n>`` kills the process the ``n``-th time it
reaches ``<point>`` (1-based). Points: ``after_write`` (a batch handed to the
sink), ``after_flush`` (sink flushed, cursor not yet saved), ``after_save``
(cursor saved), ``after_snapshot`` (snapshot file written, cursor not yet
saved). Unset in normal use; reading it costs one dict lookup per point.
"""

from __future__ import annotations

import os
import signal

_counts: dict[str, int] = {}
_target: tuple[str, int] | None = None
_spec = os.environ.get("DELTATAIL_CRASH_AT")
if _spec:
    name, _, count = _spec.partition(":")
    _target = (name, int(count or "1"))


def crash_point(name: str) -> None:
    """Die here if ``DELTATAIL_CRASH_AT`` names this point and its count is reached."""
    if _target is None or _target[0] != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] >= _target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
