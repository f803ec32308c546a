"""Crash points for crash tests: die by SIGKILL at a named point of the run loop.

``DELTATAIL_CRASH_AT=<point>:<n>`` kills the process the ``n``-th time it
reaches ``<point>`` (1-based). Points: ``after_write`` (a batch handed to the
sink), ``after_flush`` (sink flushed, cursor not yet saved), ``after_save``
(cursor saved), ``after_snapshot`` (snapshot file written, cursor not yet
saved). Unset in normal use; reading it costs one dict lookup per point.

The variable is read at the first crash point a process reaches, not at import: a process forked
from one that imported this module (the test suite's launcher, tests/launcher.py) gets its own
environment's setting.
"""

from __future__ import annotations

import os
import signal

_counts: dict[str, int] = {}
_target: list[tuple[str, int] | None] = []  # empty until the environment was read; then [target or None]


def _read_target() -> tuple[str, int] | None:
    """``DELTATAIL_CRASH_AT`` as ``(point, n)``, read once per process."""
    if not _target:
        spec = os.environ.get("DELTATAIL_CRASH_AT")
        name, _, count = (spec or "").partition(":")
        _target.append((name, int(count or "1")) if spec else None)
    return _target[0]


def crash_point(name: str) -> None:
    """Die here if ``DELTATAIL_CRASH_AT`` names this point and its count is reached."""
    target = _read_target()
    if target is None or target[0] != name:
        return
    _counts[name] = _counts.get(name, 0) + 1
    if _counts[name] >= target[1]:
        os.kill(os.getpid(), signal.SIGKILL)
