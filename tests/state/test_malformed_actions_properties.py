"""Property: malformed log input gives DeltaTailErrors and nothing else.

Commits built from valid actions, then damaged — a field set to any JSON value, a field dropped, a body
replaced by any JSON value or by another action's body, lines truncated, bytes flipped, random bytes —
go through ``parse_json_actions``, ``Commit.from_actions``, ``Snapshot.apply`` and the snapshot's
derived views (schema, tombstone expiry). Whatever happens must be a result or a ``DeltaTailError``:
never a ``KeyError``, ``TypeError``, ``OverflowError``, ``AssertionError`` or any other exception.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_action_validation import VALID

from deltatail.state.actions import parse_json_actions
from deltatail.state.commit import Commit
from deltatail.state.errors import DeltaTailError
from deltatail.state.snapshot import Snapshot

_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "tags", "type": {"type": "map", "keyType": "string", "valueType": "string"}, "metadata": {}},
    ],
}
_BASE_LINES = [
    {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
    {
        "metaData": {
            "id": "t",
            "format": {"provider": "parquet", "options": {}},
            "schemaString": json.dumps(_SCHEMA),
            "partitionColumns": [],
            "configuration": {"delta.deletedFileRetentionDuration": "interval 1 day"},
        }
    },
    {"add": {"path": "a", "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True}},
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def _nodes(tree: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every node of a JSON tree (the root is ``()``)."""
    found = [path]
    if isinstance(tree, dict):
        for key, child in tree.items():
            found += _nodes(child, (*path, key))
    elif isinstance(tree, list):
        for i, child in enumerate(tree):
            found += _nodes(child, (*path, i))
    return found


@st.composite
def damaged(draw: st.DrawFn, tree: Any) -> Any:
    """A copy of ``tree`` with one node replaced by any JSON value, or one object member dropped."""
    tree = json.loads(json.dumps(tree))
    path = draw(st.sampled_from(_nodes(tree)))
    if not path:
        return draw(json_values)
    parent = tree
    for step in path[:-1]:
        parent = parent[step]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return tree


@st.composite
def schema_strings(draw: st.DrawFn) -> str:
    """A schemaString: the valid one, one damaged at any node (maybe twice), or any JSON at all."""
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return json.dumps(_SCHEMA)
    if choice == 3:
        return json.dumps(draw(json_values))
    schema = draw(damaged(_SCHEMA))
    return json.dumps(draw(damaged(schema)) if choice == 2 else schema)


@st.composite
def damaged_action(draw: st.DrawFn) -> Any:
    """One action object: valid, damaged at any node, carrying another action's body, or any JSON value."""
    kind = draw(st.sampled_from(sorted(VALID)))
    body: Any = json.loads(json.dumps(VALID[kind]))
    how = draw(st.sampled_from(["valid", "damaged", "damaged twice", "swap", "schema", "retention", "json"]))
    if how == "damaged":
        body = draw(damaged(body))
    elif how == "damaged twice":
        body = draw(damaged(draw(damaged(body))))
    elif how == "swap":
        body = json.loads(json.dumps(VALID[draw(st.sampled_from(sorted(VALID)))]))
    elif how == "schema":
        kind, body = "metaData", {**VALID["metaData"], "schemaString": draw(schema_strings())}
    elif how == "retention":
        retention = {"delta.deletedFileRetentionDuration": draw(st.text(max_size=20))}
        kind, body = "metaData", {**VALID["metaData"], "configuration": retention}
    elif how == "json":
        return draw(json_values)
    return {kind: body}


@st.composite
def commit_bytes(draw: st.DrawFn) -> bytes:
    """A commit file's bytes: damaged actions, maybe truncated, maybe with flipped bytes, or random bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    actions = draw(st.lists(damaged_action(), max_size=6))
    data = b"\n".join(json.dumps(a).encode() for a in actions)
    if data and draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    if data and draw(st.integers(0, 3)) == 0:
        raw = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        data = bytes(raw)
    return data


def _base() -> Snapshot:
    data = b"\n".join(json.dumps(a).encode() for a in _BASE_LINES)
    snapshot, _ = Snapshot.empty("tbl").apply(Commit.from_actions(0, parse_json_actions(data)))
    return snapshot


def _exercise(snapshot: Snapshot) -> None:
    """Use the snapshot the way the tailer does once a commit is applied."""
    snapshot.require_valid()
    _ = snapshot.schema
    snapshot.expire_tombstones(10**13)
    list(snapshot.live_files())


def _feed(data: bytes, version: int, base: Snapshot) -> None:
    with contextlib.suppress(DeltaTailError):
        commit = Commit.from_actions(version, parse_json_actions(data))
        after, _ = base.apply(commit)
        _exercise(after)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commit_bytes())
def test_damaged_commit_on_a_table_gives_only_delta_tail_errors(data: bytes) -> None:
    _feed(data, 1, _base())


@pytest.mark.slow
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commit_bytes())
def test_damaged_first_commit_gives_only_delta_tail_errors(data: bytes) -> None:
    _feed(data, 0, Snapshot.empty("tbl"))


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(commit_bytes(), min_size=1, max_size=4))
def test_a_run_of_damaged_commits_gives_only_delta_tail_errors(commits: list[bytes]) -> None:
    snapshot = _base()
    for version, data in enumerate(commits, start=1):
        try:
            snapshot, _ = snapshot.apply(Commit.from_actions(version, parse_json_actions(data)))
            _exercise(snapshot)
        except DeltaTailError:
            return


@pytest.mark.slow
@settings(max_examples=1000, deadline=None)
@given(schema_strings())
def test_a_damaged_schema_string_gives_a_schema_or_a_delta_tail_error(schema_string: str) -> None:
    metadata = {**VALID["metaData"], "schemaString": schema_string}
    data = b"\n".join(json.dumps(a).encode() for a in (_BASE_LINES[0], {"metaData": metadata}))
    _feed(data, 0, Snapshot.empty("tbl"))


@pytest.mark.slow
@settings(max_examples=500, deadline=None)
@given(json_values)
def test_any_json_line_gives_actions_or_a_delta_tail_error(value: Any) -> None:
    with contextlib.suppress(DeltaTailError):
        parse_json_actions(json.dumps(value).encode())
