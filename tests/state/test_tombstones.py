"""Tombstone expiry: the protocol's retention rule, applied to the snapshot's remove tombstones."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from deltatail.state.actions import Action, Add, Metadata, Protocol, Remove
from deltatail.state.commit import Commit
from deltatail.state.errors import InvalidLogError
from deltatail.state.snapshot import Snapshot, parse_interval_ms

DAY = 86_400_000


def _commit(version: int, actions: Sequence[Action]) -> Commit:
    return Commit.from_actions(version, actions)


def _table(retention: str | None) -> Snapshot:
    config = {} if retention is None else {"delta.deletedFileRetentionDuration": retention}
    meta = Metadata(id="t", schema_string='{"type":"struct","fields":[]}', partition_columns=(), configuration=config)
    adds = [Add(path=f"f{i}", partition_values={}, size=1, modification_time=0, data_change=True) for i in range(3)]
    snap, _ = Snapshot.empty("t").apply(_commit(0, [Protocol(1, 2), meta, *adds]))
    removes = [
        Remove(path="f0", deletion_timestamp=1 * DAY, data_change=True),
        Remove(path="f1", deletion_timestamp=10 * DAY, data_change=True),
    ]
    snap, _ = snap.apply(_commit(1, removes))
    return snap


def test_default_retention_is_one_week() -> None:
    snap = _table(None)
    dropped = snap.expire_tombstones(now_ms=9 * DAY)
    assert dropped == 1
    assert {e.path for e in snap.tombstones} == {"f1"}
    assert {k.path for k in snap.live_keys()} == {"f2"}


def test_table_retention_setting_is_honoured() -> None:
    snap = _table("interval 2 days")
    assert snap.expire_tombstones(now_ms=11 * DAY) == 1
    assert {e.path for e in snap.tombstones} == {"f1"}
    assert snap.expire_tombstones(now_ms=13 * DAY) == 1
    assert len(snap.tombstones) == 0


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("interval 1 week", 7 * DAY),
        ("interval 168 hours", 7 * DAY),
        ("30 days", 30 * DAY),
        ("interval 90 seconds", 90_000),
    ],
)
def test_parse_interval(text: str, ms: int) -> None:
    assert parse_interval_ms(text) == ms


@pytest.mark.parametrize("text", ["", "interval", "interval one week", "interval 3 fortnights"])
def test_unparsable_interval_is_an_invalid_log(text: str) -> None:
    with pytest.raises(InvalidLogError, match="cannot parse interval"):
        parse_interval_ms(text)
