"""How long to wait: before retrying what failed on a transient fault, and between idle polls of an object store.

Both waits double: a retry waits 0.5 s, then 1 s, 2 s ... up to a cap; an idle poll of a table on an
object store (which cannot be watched) waits the poll interval, doubling with every poll that found
nothing, up to the longest poll interval. ``deltatail run``, ``deltatail serve`` and the auditor
wait by these two functions only. ``deltatail serve`` then spreads the polls of its object-store
tables over time (:func:`next_poll`).
"""

from __future__ import annotations

import random

#: The first wait before a retry, in seconds.
FIRST_RETRY_SECONDS = 0.5
#: The most doublings counted: 2**60 outgrows any wait, and 2**1024 overflows a float.
_MAX_DOUBLINGS = 60
#: An object-store table's next poll in ``serve`` is its idle interval times 1 +- this (uniformly
#: drawn): the polls of many tables spread over time instead of going out together.
POLL_JITTER = 0.2


def retry_delay(failures: int, max_backoff: float) -> float:
    """Seconds to wait after ``failures`` failures in a row (1 for the first).

    0.5 s, doubling with every failure, at most ``max_backoff``.
    """
    return min(max_backoff, FIRST_RETRY_SECONDS * 2.0 ** min(max(failures - 1, 0), _MAX_DOUBLINGS))


def idle_poll_interval(poll_interval: float, max_poll_interval: float, idle_polls: int) -> float:
    """Seconds to wait before the next poll after ``idle_polls`` polls in a row found nothing.

    The first idle poll waits ``poll_interval``; each further one doubles it, up to
    ``max_poll_interval`` (never below ``poll_interval``).
    """
    doublings = min(max(idle_polls - 1, 0), _MAX_DOUBLINGS)
    return min(poll_interval * 2.0**doublings, max(max_poll_interval, poll_interval))


def next_poll(interval: float, rng: random.Random, jitter: float = POLL_JITTER) -> float:
    """Seconds until an object-store table's next poll: ``interval`` times a factor drawn uniformly in 1 +- ``jitter``.

    Tables opened together (a ``serve`` starting) would otherwise poll together for ever, every
    interval a burst of one request per table; drawn afresh at every poll, their polls spread over
    ``2 * jitter * interval`` at once and drift further apart from there. The mean interval, and so
    the requests a table costs a minute, is unchanged.
    """
    return interval * (1.0 + rng.uniform(-jitter, jitter))
