"""The shared runtime's waits and status-line throttle (tailer/runtime), with figures worked out by hand."""

from __future__ import annotations

import random
import statistics
from collections import Counter
from pathlib import Path

import pytest

from deltatail.tailer.runtime.backoff import idle_poll_interval, next_poll, retry_delay
from deltatail.tailer.runtime.files import atomic_write
from deltatail.tailer.runtime.status import StatusThrottle


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(1, 0.5), (2, 1.0), (3, 2.0), (7, 32.0), (8, 60.0), (9, 60.0), (5000, 60.0)],
)
def test_retries_wait_half_a_second_doubling_up_to_the_cap(failures: int, expected: float) -> None:
    assert retry_delay(failures, 60.0) == expected


@pytest.mark.parametrize(
    ("idle_polls", "expected"),
    [(0, 0.25), (1, 0.25), (2, 0.5), (3, 1.0), (4, 2.0), (5, 3.0), (1100, 3.0)],
)
def test_idle_polls_double_up_to_the_longest_interval(idle_polls: int, expected: float) -> None:
    # 1,100 idle polls: 0.25 * 2**1099 would overflow a float; the wait stays at the maximum.
    assert idle_poll_interval(0.25, 3.0, idle_polls) == expected


def test_a_longest_interval_below_the_poll_interval_waits_the_poll_interval() -> None:
    assert idle_poll_interval(2.0, 0.5, 10) == 2.0


def test_the_polls_of_many_tables_are_spread_over_the_interval_not_synchronised() -> None:
    """1,000 tables polling every 5 s: their next polls are distinct and cover 4 s to 6 s evenly (seeded)."""
    rng = random.Random(31)
    polls = [next_poll(5.0, rng) for _ in range(1000)]
    assert len(set(polls)) == 1000
    assert all(4.0 <= p <= 6.0 for p in polls)
    tenths = Counter(int((p - 4.0) * 10) for p in polls)  # twenty slices of 0.1 s
    assert set(tenths) == set(range(20)), sorted(tenths)  # every slice of the window is used
    assert max(tenths.values()) <= 100, tenths  # none holds a burst (50 each on average)
    assert 4.95 <= statistics.fmean(polls) <= 5.05  # the cost (polls a minute) is the interval's
    again = random.Random(31)
    assert [next_poll(5.0, again) for _ in range(1000)] == polls  # seeded: the schedule is reproducible
    assert next_poll(5.0, rng, jitter=0.0) == 5.0


def test_a_status_line_is_due_on_a_new_version_else_every_thirty_seconds() -> None:
    now = [100.0]
    throttle = StatusThrottle(lambda: now[0])
    assert throttle.due(-1)  # the first line, even before any version
    now[0] = 110.0
    assert not throttle.due(-1)
    assert throttle.due(0)  # a new version: at once
    now[0] = 139.9
    assert not throttle.due(0)
    now[0] = 140.0
    assert throttle.due(0)  # 30 s after the last line
    assert not throttle.due(0)


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "cursor.json"
    target.write_bytes(b"old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cursor.json"]


def test_a_failed_atomic_write_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    target = tmp_path / "missing-dir" / "cursor.json"
    with pytest.raises(OSError):
        atomic_write(target, b"new")
    assert not (tmp_path / "missing-dir").exists()
