"""Positions in the change feed: ordering and their JSON form.

A position is (version, snapshot row or change row, index). Rows of an initial snapshot taken at
version v come before the change rows of v; versions are ordered numerically; within one kind of
row of one version, by index.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deltatail.state.cursor import Position, version_range
from deltatail.state.errors import ConfigError, StateError, VersionNotFoundError

_positions = st.builds(
    lambda version, snapshot, index: (
        Position.in_snapshot(version, index) if snapshot else Position.change(version, index)
    ),
    st.integers(0, 10**12),
    st.booleans(),
    st.integers(0, 10**9),
)


def test_snapshot_rows_come_before_change_rows_of_the_same_version() -> None:
    assert Position.in_snapshot(5, 10**6) < Position.change(5, 0)
    assert Position.in_snapshot(5, 0).snapshot
    assert not Position.change(5, 0).snapshot


def test_versions_are_ordered_numerically() -> None:
    assert Position.change(9, 10**6) < Position.change(10, 0)
    assert Position.change(10, 0) < Position.in_snapshot(11, 0)
    assert Position.in_snapshot(2, 5) < Position.in_snapshot(10, 0)


def test_rows_of_one_version_are_ordered_by_index() -> None:
    assert Position.change(3, 1) < Position.change(3, 2)
    assert Position.in_snapshot(3, 1) < Position.in_snapshot(3, 2)
    assert sorted([Position.change(3, 2), Position.in_snapshot(3, 7), Position.change(3, 0)]) == [
        Position.in_snapshot(3, 7),
        Position.change(3, 0),
        Position.change(3, 2),
    ]


@given(_positions, _positions)
def test_order_is_version_then_snapshot_first_then_index(a: Position, b: Position) -> None:
    def rank(p: Position) -> tuple[int, int, int]:
        return (p.version, 0 if p.snapshot else 1, p.index)

    assert (a < b) == (rank(a) < rank(b))
    assert (a == b) == (rank(a) == rank(b))


def test_json_form() -> None:
    assert Position.change(7, 3).to_json() == {"version": 7, "index": 3, "snapshot": False}
    assert Position.in_snapshot(7, 3).to_json() == {"version": 7, "index": 3, "snapshot": True}


@given(_positions)
def test_json_round_trip(position: Position) -> None:
    text = json.dumps(position.to_json())
    assert Position.from_json(json.loads(text)) == position


@pytest.mark.parametrize(
    "raw",
    [
        None,
        42,
        "version 3",
        [7, 3, False],
        {},
        {"version": 7, "index": 3},
        {"version": 7, "snapshot": False},
        {"index": 3, "snapshot": False},
        {"version": "7", "index": 3, "snapshot": False},
        {"version": 7, "index": 3.0, "snapshot": False},
        {"version": 7, "index": 3, "snapshot": "false"},
        {"version": 7, "index": 3, "snapshot": 0},
        {"version": None, "index": 3, "snapshot": False},
        # JSON true/false are not integers (Python's bool is an int subclass)
        pytest.param({"version": True, "index": 3, "snapshot": False}, id="version-is-a-boolean"),
        pytest.param({"version": 7, "index": False, "snapshot": False}, id="index-is-a-boolean"),
    ],
)
def test_invalid_json_is_a_state_error(raw: Any) -> None:
    with pytest.raises(StateError):
        Position.from_json(raw)


def test_version_range_defaults_to_the_latest_and_checks_both_ends() -> None:
    assert version_range("t", 2, None, 7) == 7
    assert version_range("t", 2, 5, 7) == 5
    assert version_range("t", 7, 7, 7) == 7
    with pytest.raises(VersionNotFoundError, match="starting version 8 is after the latest version 7"):
        version_range("t", 8, None, 7)
    with pytest.raises(VersionNotFoundError, match="ending version 9 is after the latest version 7"):
        version_range("t", 2, 9, 7)
    with pytest.raises(ConfigError, match="ending version 1 is before starting version 2"):
        version_range("t", 2, 1, 7)
