"""The on-demand snapshot request and its rule (state/signals.py): bounds, positions, the version a restart rebuilds."""

from __future__ import annotations

import pytest

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, StateError
from deltatail.state.signals import (
    MAX_CHUNK_ROWS,
    SnapshotRequest,
    both,
    checked,
    debezium_snapshots,
    resume_version,
    snapshot_position,
)


def test_a_request_round_trips_through_json() -> None:
    request = SnapshotRequest("s-1", "id > 3", 10).taken_at(7, None)
    assert SnapshotRequest.from_json(request.to_json()) == request
    assert request.to_json() == {
        "id": "s-1",
        "where": "id > 3",
        "chunk_rows": 10,
        "version": 7,
        "first": 0,
        "key": [],
        "read": 0,
        "sent": 0,
    }


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"where": None},
        {"id": "x", "chunk_rows": 0},
        {"id": "x", "chunk_rows": MAX_CHUNK_ROWS + 1},
        {"id": "x", "chunk_rows": "5"},
        {"id": "a b"},
        {"id": "x" * 129},
        {"id": "x", "where": "a" * 65537},
        {"id": "x", "version": -1},
        {"id": "x", "version": "3"},
        {"id": "x", "first": -2},
    ],
)
def test_a_request_out_of_bounds_is_a_state_error(raw: object) -> None:
    with pytest.raises(StateError, match="invalid snapshot request"):
        SnapshotRequest.from_json(raw)


def test_checked_names_the_value_out_of_bounds() -> None:
    with pytest.raises(ConfigError, match="chunk is 1 to 1000000 rows, not 0"):
        checked(SnapshotRequest("x", None, 0))
    with pytest.raises(ConfigError, match="signal id"):
        checked(SnapshotRequest("../../etc", None))
    assert checked(SnapshotRequest("ok:1@a.b-c")) == SnapshotRequest("ok:1@a.b-c")


def test_both_predicates_must_hold() -> None:
    assert both(None, None) is None
    assert both("a > 1", None) == "a > 1"
    assert both(None, "b = 2") == "b = 2"
    assert both("a > 1 OR c", "b = 2") == "(a > 1 OR c) AND (b = 2)"


def test_snapshot_rows_sit_after_the_version_and_before_the_next() -> None:
    """Rule 2: row i of a snapshot taken at V is at V+1:s<i>, between V's last change row and V+1's first."""
    request = SnapshotRequest("s").taken_at(4, Position.change(5, 0))
    assert request.position(0) == snapshot_position(4, 0) == Position.in_snapshot(5, 0)
    assert Position.change(4, 10**9) < request.position(0) < request.position(10**9) < Position.change(5, 0)


def test_a_second_snapshot_at_a_version_starts_after_the_first() -> None:
    first = SnapshotRequest("a").taken_at(4, Position.change(5, 0))
    second = SnapshotRequest("b").taken_at(4, first.position(12))  # the first one's rows ended before 5:s12
    assert second.first == 12 and second.position(0) == Position.in_snapshot(5, 12)
    assert SnapshotRequest("c").taken_at(5, first.position(12)).first == 0  # another version: its own slot


def test_a_request_not_taken_has_no_position() -> None:
    with pytest.raises(StateError, match="not taken"):
        SnapshotRequest("s").position(0)


def test_a_restart_inside_a_snapshot_rebuilds_its_version_not_the_cursors() -> None:
    request = SnapshotRequest("s").taken_at(4, None)
    assert resume_version(Position.in_snapshot(5, 3), request) == 4
    assert resume_version(Position.in_snapshot(5, 3), None) == 5  # an initial snapshot at 5
    assert resume_version(Position.change(5, 0), None) == 4
    with pytest.raises(StateError, match="not inside snapshot request s"):
        resume_version(Position.change(9, 0), request)


def test_a_debezium_signal_asks_for_each_collection_with_its_condition() -> None:
    value = {
        "type": "execute-snapshot",
        "data": {
            "data-collections": ["orders", "items", "orders"],
            "type": "incremental",
            "additional-conditions": [{"data-collection": "orders", "filter": "amount > 10"}],
        },
    }
    assert debezium_snapshots(value, "k-0-5") == [
        ("orders", SnapshotRequest("k-0-5", "amount > 10")),
        ("items", SnapshotRequest("k-0-5")),
    ]
    assert debezium_snapshots({"type": "log", "data": {"message": "hi"}}, "x") == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], "a JSON object"),
        ({"type": "execute-snapshot"}, "data-collections"),
        ({"type": "execute-snapshot", "data": {"data-collections": []}}, "data-collections"),
        ({"type": "execute-snapshot", "data": {"data-collections": [1]}}, "data-collections"),
        ({"type": "execute-snapshot", "data": {"data-collections": ["t"] * 1001}}, "at most 1000"),
        (
            {"type": "execute-snapshot", "data": {"data-collections": ["t"], "additional-conditions": [{"f": 1}]}},
            "additional condition",
        ),
    ],
)
def test_a_signal_that_is_not_one_is_a_config_error(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        debezium_snapshots(value, "x")
