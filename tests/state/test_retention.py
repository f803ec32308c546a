"""How long a version stays readable: hand-computed against the retention properties and commit times."""

from __future__ import annotations

import pytest

from deltatail.state.errors import InvalidLogError
from deltatail.state.retention import Retention, retention

DAY_MS = 86_400_000


def test_defaults_are_the_protocols_30_days_of_log_and_1_week_of_files() -> None:
    r = retention({})
    assert r == Retention(log_ms=30 * DAY_MS, file_ms=7 * DAY_MS)
    # Committed 2 days ago: the files removed by it may be vacuumed 5 days from now.
    now = 1_800_000_000_000
    assert r.readable_seconds(now - 2 * DAY_MS, now) == 5 * 86_400


def test_the_shorter_of_the_two_periods_bounds_it() -> None:
    r = retention(
        {"delta.logRetentionDuration": "interval 2 days", "delta.deletedFileRetentionDuration": "interval 1 week"}
    )
    assert r.readable_ms == 2 * DAY_MS
    # committed at 10:00, now 11:30 the next day: 2 days - 25.5 hours = 22.5 hours left
    commit = 1_700_000_000_000
    now = commit + 25 * 3_600_000 + 1_800_000
    assert r.readable_seconds(commit, now) == 22.5 * 3600
    r = retention({"delta.deletedFileRetentionDuration": "interval 36 hours"})
    assert r.readable_ms == 36 * 3_600_000
    assert r.readable_until_ms(commit) == commit + 129_600_000


def test_a_version_past_its_retention_has_negative_time_left() -> None:
    r = retention({"delta.deletedFileRetentionDuration": "interval 1 hour"})
    assert r.readable_seconds(0, 5_400_000) == -1800.0


@pytest.mark.parametrize("value", ["a week", "interval", "interval 1 fortnight", "interval -1 day"])
def test_a_retention_property_that_is_not_an_interval_is_named(value: str) -> None:
    with pytest.raises(InvalidLogError, match=r"delta.deletedFileRetentionDuration = .* \[table /t\]"):
        retention({"delta.deletedFileRetentionDuration": value}, "/t")
