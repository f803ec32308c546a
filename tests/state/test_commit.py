"""One commit's duplicate-action rules.

Protocol, "Writer Requirements": "A single log entry MUST NOT include more than one action that
reconciles with each other": add / remove actions with the same (path, DV) tuple, more than one
metaData, more than one protocol, more than one txn with the same appId. "Reconciliation": "it is
required that there is at most one file action of the same type for any path (regardless of
dvId)"; "it is legal for the same path to occur in an add action and a remove action, but with two
different dvIds"; "it is legal for the same path to be added and/or removed and also occur in a cdc
action". The deletion-vectors design document lists the same legal and illegal cases.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from core_corpus import corpus_root

from deltatail.state.actions import parse_json_actions
from deltatail.state.commit import Commit
from deltatail.state.errors import DuplicateActionError, InvalidLogError


@pytest.fixture
def corpus() -> Path:
    return corpus_root()


_DV1 = {
    "storageType": "u",
    "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
    "offset": 4,
    "sizeInBytes": 40,
    "cardinality": 6,
}
_DV2 = {
    "storageType": "u",
    "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
    "offset": 45,
    "sizeInBytes": 40,
    "cardinality": 7,
}
_DV3 = {
    "storageType": "i",
    "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
    "sizeInBytes": 40,
    "cardinality": 6,
}
_SCHEMA = '{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{}}]}'


def add(path: str, dv: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"path": path, "partitionValues": {}, "size": 1, "modificationTime": 1, "dataChange": True}
    if dv is not None:
        body["deletionVector"] = dv
    return {"add": body}


def remove(path: str, dv: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"path": path, "deletionTimestamp": 2, "dataChange": True}
    if dv is not None:
        body["deletionVector"] = dv
    return {"remove": body}


def cdc(path: str) -> dict[str, Any]:
    return {"cdc": {"path": path, "partitionValues": {}, "size": 1, "dataChange": False}}


def metadata(table_id: str = "t") -> dict[str, Any]:
    return {
        "metaData": {
            "id": table_id,
            "format": {"provider": "parquet"},
            "schemaString": _SCHEMA,
            "partitionColumns": [],
            "configuration": {},
        }
    }


def protocol(reader: int = 1, writer: int = 2) -> dict[str, Any]:
    return {"protocol": {"minReaderVersion": reader, "minWriterVersion": writer}}


def txn(app_id: str, version: int) -> dict[str, Any]:
    return {"txn": {"appId": app_id, "version": version}}


def commit(version: int, *lines: dict[str, Any], check_duplicates: bool = True) -> Commit:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    return Commit.from_actions(version, parse_json_actions(data), check_duplicates=check_duplicates)


# -- illegal --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (add("a.parquet"), add("a.parquet")),
        (add("a.parquet", _DV1), add("a.parquet", _DV1)),
        (add("a.parquet", _DV1), add("a.parquet", _DV2)),
        (add("a.parquet"), add("a.parquet", _DV3)),
        (remove("a.parquet"), remove("a.parquet")),
        (remove("a.parquet", _DV1), remove("a.parquet", _DV2)),
        (remove("a.parquet", _DV3), remove("a.parquet")),
    ],
    ids=[
        "add-twice",
        "add-twice-same-dv",
        "add-twice-different-dvs",
        "add-with-and-without-dv",
        "remove-twice",
        "remove-twice-different-dvs",
        "remove-with-and-without-dv",
    ],
)
def test_same_path_twice_among_adds_or_among_removes(first: dict[str, Any], second: dict[str, Any]) -> None:
    with pytest.raises(DuplicateActionError) as info:
        commit(7, first, add("other.parquet"), second)
    assert info.value.version == 7
    assert "version 7" in str(info.value)
    assert "a.parquet" in str(info.value)


def test_duplicate_rule_applies_to_decoded_paths() -> None:
    # "a%20b.parquet" and "a b.parquet" name the same data file
    with pytest.raises(DuplicateActionError, match=r"a b\.parquet"):
        commit(3, add("a%20b.parquet"), add("a b.parquet"))


def test_two_metadata_actions() -> None:
    with pytest.raises(DuplicateActionError) as info:
        commit(4, metadata("t"), add("a.parquet"), metadata("t"))
    assert info.value.version == 4
    assert "metaData" in str(info.value)


def test_two_protocol_actions() -> None:
    with pytest.raises(DuplicateActionError) as info:
        commit(5, protocol(1, 2), protocol(1, 2))
    assert info.value.version == 5
    assert "protocol" in str(info.value)


def test_two_txns_for_one_app_id() -> None:
    with pytest.raises(DuplicateActionError) as info:
        commit(6, txn("app-1", 3), txn("app-2", 1), txn("app-1", 4))
    assert info.value.version == 6
    assert "app-1" in str(info.value)
    assert "app-2" not in str(info.value)


def test_add_and_remove_of_the_same_logical_file() -> None:
    # Writer Requirements: no "Add / Remove actions with the same (path, DV) tuple" in one entry;
    # the design document allows add + remove of one path only "with two different DVs".
    with pytest.raises(DuplicateActionError, match=r"a\.parquet"):
        commit(8, remove("a.parquet"), add("a.parquet"))
    with pytest.raises(DuplicateActionError, match=r"a\.parquet"):
        commit(8, add("a.parquet", _DV1), remove("a.parquet", _DV1))


def test_duplicate_action_error_is_an_invalid_log() -> None:
    with pytest.raises(InvalidLogError):
        commit(1, add("a.parquet"), add("a.parquet"))


# -- legal ----------------------------------------------------------------------------------------


def test_add_and_remove_of_one_path_with_different_dvs() -> None:
    c = commit(9, remove("a.parquet", _DV1), add("a.parquet", _DV2))
    assert [(r.path, r.dv_id) for r in c.removes] == [("a.parquet", "uab^-aqEH.-t@S}K{vb[*k^@4")]
    assert [(a.path, a.dv_id) for a in c.adds] == [("a.parquet", "uab^-aqEH.-t@S}K{vb[*k^@45")]


def test_add_and_remove_of_one_path_one_without_dv() -> None:
    c = commit(9, remove("a.parquet"), add("a.parquet", _DV3))
    assert len(c.removes) == 1
    assert len(c.adds) == 1


def test_cdc_file_with_the_same_path_as_an_add_or_a_remove() -> None:
    c = commit(10, add("a.parquet"), cdc("a.parquet"), remove("b.parquet", _DV1), cdc("b.parquet"))
    assert [x.path for x in c.cdcs] == ["a.parquet", "b.parquet"]
    assert len(c.adds) == 1
    assert len(c.removes) == 1


def test_txns_for_different_app_ids() -> None:
    c = commit(11, txn("app-1", 3), txn("app-2", 1))
    assert {(t.app_id, t.version) for t in c.txns} == {("app-1", 3), ("app-2", 1)}


def test_grouping_of_a_full_commit() -> None:
    c = commit(
        0,
        {"commitInfo": {"timestamp": 5, "inCommitTimestamp": 4}},
        protocol(),
        metadata(),
        add("a.parquet"),
        remove("b.parquet"),
        cdc("c.parquet"),
        txn("app", 1),
        {"domainMetadata": {"domain": "d", "configuration": "{}", "removed": False}},
    )
    assert c.version == 0
    assert c.protocol is not None
    assert c.metadata is not None
    assert c.metadata.id == "t"
    assert [a.path for a in c.adds] == ["a.parquet"]
    assert [r.path for r in c.removes] == ["b.parquet"]
    assert [x.path for x in c.cdcs] == ["c.parquet"]
    assert [t.app_id for t in c.txns] == ["app"]
    assert [d.domain for d in c.domain_metadata] == ["d"]
    assert c.in_commit_timestamp == 4


def test_duplicates_are_allowed_without_the_check() -> None:
    # log compaction files hold already reconciled actions
    c = commit(12, add("a.parquet", _DV1), add("a.parquet", _DV2), check_duplicates=False)
    assert len(c.adds) == 2


def test_every_commit_of_the_corpus_follows_the_rules(corpus: Path) -> None:
    checked = 0
    for path in sorted(corpus.glob("**/_delta_log/*.json")):
        if not re.fullmatch(r"\d{20}\.json", path.name):
            continue
        Commit.from_actions(int(path.name[:20]), parse_json_actions(path.read_bytes()))
        checked += 1
    assert checked > 500


@pytest.mark.parametrize("data", [b"", b"\n", b"  \r\n\n "])
def test_an_empty_commit_file_is_an_invalid_log(data: bytes) -> None:
    """No writer commits nothing: an empty file is a torn write, not a version without changes."""
    with pytest.raises(InvalidLogError, match="commit file is empty") as info:
        Commit.from_json(7, data)
    assert info.value.version == 7


def test_from_json_groups_the_parsed_actions() -> None:
    data = b'{"commitInfo":{"operation":"WRITE"}}\n\n{"txn":{"appId":"a","version":3}}\n'
    commit = Commit.from_json(4, data)
    assert commit.version == 4 and [t.app_id for t in commit.txns] == ["a"] and commit.commit_info is not None
    with pytest.raises(InvalidLogError):
        Commit.from_json(4, b"{not json\n")
    with pytest.raises(DuplicateActionError):
        Commit.from_json(4, data + b'{"txn":{"appId":"a","version":4}}\n')
    compacted = Commit.from_json(4, data + b'{"txn":{"appId":"a","version":4}}\n', check_duplicates=False)
    assert [t.version for t in compacted.txns] == [4]  # the later txn of an appId wins
