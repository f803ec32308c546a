"""The on-demand snapshot request and its rule (state/signals.py): bounds, positions, the version a restart rebuilds."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, StateError
from deltatail.state.signals import (
    MAX_CHUNK_ROWS,
    ChangedKeys,
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
        "after": -1,
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


def test_a_keyed_request_goes_on_after_each_chunk_at_the_commit_it_followed() -> None:
    request = SnapshotRequest("k", key=("id",), chunk_rows=4).taken_at(5, Position.in_snapshot(6, 3))
    assert request.position_after(5) == Position.in_snapshot(6, 3)  # after an earlier snapshot's 3 rows
    request = request.chunk_done(4, 2, 5).chunk_done(4, 4, 8)
    assert (request.read, request.sent, request.after) == (8, 6, 8)
    assert request.position_after(8) == Position.in_snapshot(9, 9)
    assert SnapshotRequest.from_json(request.to_json()) == request
    # a restart rebuilds the state of the commit the cursor follows, inside a chunk or between two
    assert resume_version(Position.in_snapshot(9, 9), request) == 8
    assert resume_version(Position.change(9, 0), request) == 8
    assert resume_version(Position.in_snapshot(6, 0), request) == 5


@pytest.mark.parametrize(
    "field", [{"key": "id"}, {"key": [1]}, {"key": ["c"] * 33}, {"read": -1}, {"sent": "2"}, {"after": -2}]
)
def test_a_keyed_request_with_a_bad_field_is_refused(field: dict[str, object]) -> None:
    raw = {**SnapshotRequest("k", key=("id",)).taken_at(1, None).to_json(), **field}
    with pytest.raises(StateError, match="invalid snapshot request"):
        SnapshotRequest.from_json(raw)


def test_changed_keys_drop_the_chunk_rows_of_keys_changed_since_the_snapshot() -> None:
    changed = ChangedKeys(("a", "b"), limit=3)
    chunk = pa.record_batch({"a": [1, 1, 2, None], "b": ["x", "y", "x", "x"], "v": [10, 11, 12, 13]})
    assert changed.unchanged(chunk).equals(chunk)
    changed.add(pa.record_batch({"a": [1, None], "b": ["y", "x"], "_change_type": ["delete", "insert"]}))
    assert not changed.full() and len(changed) == 2
    assert changed.unchanged(chunk).column("v").to_pylist() == [10, 12]
    changed.add(pa.record_batch({"a": [7], "b": ["z"], "_change_type": ["update_postimage"]}))
    assert changed.full()


def test_changed_keys_need_the_key_columns() -> None:
    changed = ChangedKeys(("id",))
    with pytest.raises(ConfigError, match="no key column id"):
        changed.add(pa.record_batch({"v": [1]}))
    with pytest.raises(ConfigError, match="no key column id"):
        changed.unchanged(pa.record_batch({"v": [1]}))


def test_nested_and_dictionary_keys_are_compared_by_value() -> None:
    changed = ChangedKeys(("k",))
    nested = pa.array([{"x": 1}, {"x": 2}])
    changed.add(pa.record_batch({"k": nested}))
    assert changed.unchanged(pa.record_batch({"k": pa.array([{"x": 2}, {"x": 3}])})).num_rows == 1
    words = ChangedKeys(("w",))
    words.add(pa.record_batch({"w": pa.array(["a", "b"]).dictionary_encode()}))
    assert words.unchanged(pa.record_batch({"w": pa.array(["b", "c"])})).column("w").to_pylist() == ["c"]
