"""Snapshot.apply semantics (protocol, "Action Reconciliation").

"The latest protocol action seen wins", "the latest metaData action seen wins", "for transaction
identifiers, the latest version seen for a given appId wins", logical files are keyed by
``(path, deletionVector.uniqueId)`` and replay "keep[s] only the newest reference for each logical
file"; a remove is a tombstone; a later add of the same key drops the tombstone. Real logs from the
corpus are replayed and compared with what their files say and with deltalake, an independent reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import deltalake
import pyarrow as pa
import pytest
from core_corpus import corpus_root

from deltatail.state.actions import Protocol, parse_json_actions
from deltatail.state.commit import Commit
from deltatail.state.errors import InvalidLogError, StateError, UnsupportedFeatureError, VersionGapError
from deltatail.state.files import FileKey
from deltatail.state.snapshot import Snapshot, parse_interval_ms


@pytest.fixture
def corpus() -> Path:
    return corpus_root()


_SCHEMA_A = '{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{}}]}'
_SCHEMA_B = (
    '{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{}},'
    '{"name":"y","type":"string","nullable":true,"metadata":{}}]}'
)
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
_DV1_ID = "uab^-aqEH.-t@S}K{vb[*k^@4"
_DV2_ID = "uab^-aqEH.-t@S}K{vb[*k^@45"


def add(
    path: str, dv: dict[str, Any] | None = None, *, size: int = 1, pv: dict[str, str] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "path": path,
        "partitionValues": pv or {},
        "size": size,
        "modificationTime": 100 + size,
        "dataChange": True,
    }
    if dv is not None:
        body["deletionVector"] = dv
    return {"add": body}


def remove(path: str, dv: dict[str, Any] | None = None, *, at: int = 2) -> dict[str, Any]:
    body: dict[str, Any] = {"path": path, "deletionTimestamp": at, "dataChange": True}
    if dv is not None:
        body["deletionVector"] = dv
    return {"remove": body}


def metadata(schema: str = _SCHEMA_A, **configuration: str) -> dict[str, Any]:
    return {
        "metaData": {
            "id": "t",
            "format": {"provider": "parquet"},
            "schemaString": schema,
            "partitionColumns": [],
            "configuration": configuration,
        }
    }


def protocol(reader: int = 1, writer: int = 2, readers: list[str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"minReaderVersion": reader, "minWriterVersion": writer}
    if readers is not None:
        body["readerFeatures"] = readers
        body["writerFeatures"] = readers
    return {"protocol": body}


def txn(app_id: str, version: int) -> dict[str, Any]:
    return {"txn": {"appId": app_id, "version": version}}


def domain(name: str, configuration: str = "{}", *, removed: bool = False) -> dict[str, Any]:
    return {"domainMetadata": {"domain": name, "configuration": configuration, "removed": removed}}


def commit(version: int, *lines: dict[str, Any]) -> Commit:
    data = "\n".join(json.dumps(line) for line in lines).encode()
    return Commit.from_actions(version, parse_json_actions(data))


def replay(*commits: Commit) -> Snapshot:
    return Snapshot.empty("tbl").apply_all(commits)


def keys(*pairs: tuple[str, str | None]) -> set[FileKey]:
    return {FileKey(path, dv) for path, dv in pairs}


def tombstone_keys(snapshot: Snapshot) -> set[FileKey]:
    return set(snapshot.tombstones.keys())


_V0 = commit(0, protocol(), metadata())


def _commit_files(table: Path) -> list[Path]:
    return sorted(p for p in (table / "_delta_log").iterdir() if re.fullmatch(r"\d{20}\.json", p.name))


def _replay_table(table: Path) -> Snapshot:
    snapshot = Snapshot.empty(str(table))
    for path in _commit_files(table):
        snapshot, _ = snapshot.apply(Commit.from_actions(int(path.name[:20]), parse_json_actions(path.read_bytes())))
    return snapshot


# -- versions -------------------------------------------------------------------------------------


def test_first_commit_must_be_version_zero() -> None:
    with pytest.raises(VersionGapError) as info:
        Snapshot.empty("tbl").apply(commit(1, protocol(), metadata()))
    assert info.value.version == 1
    assert "tbl" in str(info.value)


def test_version_gap() -> None:
    snapshot, _ = Snapshot.empty("tbl").apply(_V0)
    with pytest.raises(VersionGapError, match="version 2"):
        snapshot.apply(commit(2, add("a")))


def test_same_version_twice_is_a_gap() -> None:
    snapshot, _ = Snapshot.empty("tbl").apply(_V0)
    with pytest.raises(VersionGapError):
        snapshot.apply(commit(0, add("a")))


def test_version_gap_in_the_corpus(corpus: Path) -> None:
    table = corpus / "delta-golden/versions-not-contiguous/delta"
    assert [int(p.name[:20]) for p in _commit_files(table)] == [0, 2]
    with pytest.raises(VersionGapError):
        _replay_table(table)


def test_compacted_range_is_applied_with_its_first_version() -> None:
    snapshot = replay(_V0, commit(1, add("a")))
    compacted = Commit.from_actions(
        4, parse_json_actions(b"\n".join(json.dumps(x).encode() for x in (add("b"), add("c")))), check_duplicates=False
    )
    after, _ = snapshot.apply(compacted, first_version=2)
    assert after.version == 4
    assert after.live_keys() == keys(("a", None), ("b", None), ("c", None))


def test_compacted_range_must_start_after_the_snapshot() -> None:
    snapshot = replay(_V0, commit(1, add("a")))
    with pytest.raises(VersionGapError):
        snapshot.apply(commit(4, add("b")), first_version=3)


# -- protocol, metadata, schema -------------------------------------------------------------------


def test_latest_protocol_and_metadata_win() -> None:
    snapshot = replay(
        _V0,
        commit(1, protocol(3, 7, ["deletionVectors"])),
        commit(2, add("a")),
        commit(3, metadata(_SCHEMA_B, **{"delta.enableChangeDataFeed": "true"})),
    )
    assert snapshot.protocol == Protocol(3, 7, frozenset({"deletionVectors"}), frozenset({"deletionVectors"}))
    assert snapshot.metadata is not None
    assert snapshot.metadata.configuration == {"delta.enableChangeDataFeed": "true"}
    assert snapshot.schema.names == ["x", "y"]


def test_schema_changes_are_parsed() -> None:
    first, _ = Snapshot.empty("tbl").apply(_V0)
    assert first.schema.names == ["x"]
    second, applied = first.apply(commit(1, metadata(_SCHEMA_B)))
    assert applied.metadata_changed
    assert not applied.protocol_changed
    assert second.schema.names == ["x", "y"]
    assert first.schema.names == ["x"]


def test_invalid_schema_is_an_invalid_log_naming_the_version() -> None:
    snapshot = replay(_V0, commit(1, metadata('{"type":"struct","fields":[{"name":"x","type":"interval"}]}')))
    with pytest.raises(InvalidLogError) as info:
        _ = snapshot.schema
    assert info.value.version == 1


def test_metadata_without_schema_string_has_no_schema(corpus: Path) -> None:
    # delta-golden "Manual Update" tables carry a metaData without schemaString
    table = corpus / "delta-golden/deltalog-state-reconstruction-from-checkpoint-missing-metadata/delta"
    path = table / "_delta_log" / f"{0:020d}.json"
    snapshot, _ = Snapshot.empty(str(table)).apply(Commit.from_actions(0, parse_json_actions(path.read_bytes())))
    assert snapshot.require_valid() == (snapshot.protocol, snapshot.metadata)
    with pytest.raises(InvalidLogError, match="schemaString"):
        _ = snapshot.schema


def test_unsupported_protocol_in_a_later_commit_is_refused() -> None:
    snapshot = replay(_V0)
    with pytest.raises(UnsupportedFeatureError) as info:
        snapshot.apply(commit(1, protocol(3, 7, ["catalogManaged"])))
    assert info.value.features == frozenset({"catalogManaged"})
    assert info.value.version == 1


def test_replay_without_protocol_or_metadata_is_not_valid() -> None:
    with pytest.raises(InvalidLogError, match="protocol"):
        replay(commit(0, metadata(), add("a"))).require_valid()
    with pytest.raises(InvalidLogError, match="metaData"):
        replay(commit(0, protocol(), add("a"))).require_valid()
    with pytest.raises(InvalidLogError):
        Snapshot.empty("tbl").require_valid()


def test_an_empty_first_commit_is_an_invalid_log_naming_table_and_version() -> None:
    # A version-0 commit file that is empty (or holds only commitInfo) leaves no protocol and no metaData:
    # apply() refuses it, so no caller ever holds a snapshot at version >= 0 without them.
    empty = Snapshot.empty("tbl")
    for lines in ((), ({"commitInfo": {"timestamp": 1}},)):
        with pytest.raises(InvalidLogError, match="protocol") as info:
            empty.apply(commit(0, *lines))
        assert (info.value.table, info.value.version) == ("tbl", 0)
        assert "version 0" in str(info.value)
    # the refused commit left the snapshot usable
    assert empty.files is not None
    snapshot, _ = empty.apply(_V0)
    assert snapshot.version == 0


def test_a_later_commit_keeps_the_protocol_and_metadata_it_does_not_repeat() -> None:
    snapshot = replay(_V0, commit(1, add("a")), commit(2))
    assert snapshot.protocol is not None
    assert snapshot.metadata is not None
    snapshot.require_valid()


@pytest.mark.parametrize("text", ["interval inf weeks", "interval 1e400 days", "interval nan hours", "soon", ""])
def test_unparsable_retention_interval_is_an_invalid_log(text: str) -> None:
    with pytest.raises(InvalidLogError, match="interval"):
        parse_interval_ms(text)


@pytest.mark.parametrize(
    ("table", "missing"),
    [
        ("delta-golden/deltalog-state-reconstruction-without-metadata/delta", "metaData"),
        ("delta-golden/deltalog-state-reconstruction-without-protocol/delta", "protocol"),
    ],
)
def test_corpus_replay_without_protocol_or_metadata_is_not_valid(corpus: Path, table: str, missing: str) -> None:
    # apply() refuses the first version that leaves the snapshot without it, naming table and version
    with pytest.raises(InvalidLogError, match=missing) as info:
        _replay_table(corpus / table)
    assert info.value.version == 0
    assert info.value.table == str(corpus / table)


def test_checkpoint_without_protocol_or_metadata_is_refused() -> None:
    c = commit(0, protocol(), metadata())
    empty = Snapshot.empty("tbl")
    with pytest.raises(InvalidLogError):
        Snapshot.from_checkpoint("tbl", 5, None, c.metadata, {}, {}, empty.files, empty.tombstones)
    with pytest.raises(InvalidLogError):
        Snapshot.from_checkpoint("tbl", 5, c.protocol, None, {}, {}, empty.files, empty.tombstones)


# -- txns and domains -----------------------------------------------------------------------------


def test_latest_txn_version_per_app_id() -> None:
    snapshot = replay(
        commit(0, protocol(), metadata(), txn("app-1", 1)),
        commit(1, txn("app-2", 5)),
        commit(2, txn("app-1", 3), add("a")),
    )
    assert snapshot.txns == {"app-1": 3, "app-2": 5}


def test_txns_of_a_corpus_table(corpus: Path) -> None:
    snapshot = _replay_table(corpus / "kernel-rs/app-txn-with-last-updated")
    assert snapshot.txns == {"new_app_0": 1, "new_app_1": 1, "new_app_2": 1, "old_app": 1}


def test_domain_metadata_set_replace_and_remove() -> None:
    s1 = replay(_V0, commit(1, domain("app.a", '{"v":1}'), domain("app.b")))
    assert {name: d.configuration for name, d in s1.domains.items()} == {"app.a": '{"v":1}', "app.b": "{}"}
    s2, _ = s1.apply(commit(2, domain("app.a", '{"v":2}')))
    assert s2.domains["app.a"].configuration == '{"v":2}'
    s3, _ = s2.apply(commit(3, domain("app.a", '{"v":2}', removed=True)))
    assert set(s3.domains) == {"app.b"}
    s4, _ = s3.apply(commit(4, domain("app.a", '{"v":3}')))
    assert s4.domains["app.a"].configuration == '{"v":3}'
    # earlier snapshots keep their own view
    assert s1.domains["app.a"].configuration == '{"v":1}'
    assert "app.a" not in s3.domains


def test_domains_of_a_corpus_table(corpus: Path) -> None:
    snapshot = _replay_table(corpus / "delta-rs/table_with_liquid_clustering")
    assert set(snapshot.domains) == {"delta.liquid", "delta.rowTracking"}


# -- files ----------------------------------------------------------------------------------------


def test_remove_makes_a_tombstone_and_a_re_add_drops_it() -> None:
    s1 = replay(_V0, commit(1, add("a"), add("b")))
    s2, _ = s1.apply(commit(2, remove("a", at=77)))
    assert s2.live_keys() == keys(("b", None))
    assert tombstone_keys(s2) == keys(("a", None))
    entry = s2.tombstones.get(FileKey("a"))
    assert entry is not None
    assert entry.timestamp == 77
    s3, _ = s2.apply(commit(3, add("a", size=9)))
    assert s3.live_keys() == keys(("a", None), ("b", None))
    assert tombstone_keys(s3) == set()


def test_dv_update_in_one_commit() -> None:
    s1 = replay(_V0, commit(1, add("p")))
    s2, applied = s1.apply(commit(2, remove("p"), add("p", _DV1)))
    assert s2.live_keys() == keys(("p", _DV1_ID))
    assert tombstone_keys(s2) == keys(("p", None))
    assert [(r.path, r.dv_id) for r in applied.removes] == [("p", None)]
    assert [(a.path, a.dv_id) for a in applied.adds] == [("p", _DV1_ID)]
    # add before remove in the file: the result does not depend on the order of actions
    s3, _ = s2.apply(commit(3, add("p", _DV2), remove("p", _DV1)))
    assert s3.live_keys() == keys(("p", _DV2_ID))
    assert tombstone_keys(s3) == keys(("p", None), ("p", _DV1_ID))
    entry = s3.files.get(FileKey("p", _DV2_ID))
    assert entry is not None
    assert entry.deletion_vector is not None
    assert entry.deletion_vector.cardinality == 7


def test_newest_add_replaces_the_information_of_a_live_file() -> None:
    # "statistics and other information from the latest version should replace that from any previous version"
    snapshot = replay(_V0, commit(1, add("a", size=1, pv={"k": "1"})), commit(2, add("a", size=5, pv={"k": "2"})))
    assert snapshot.live_keys() == keys(("a", None))
    entry = snapshot.files.get(FileKey("a"))
    assert entry is not None
    assert (entry.size, entry.timestamp, entry.partition_values) == (5, 105, {"k": "2"})


def test_remove_of_an_unknown_file_still_leaves_a_tombstone() -> None:
    snapshot = replay(_V0, commit(1, remove("ghost", _DV1)))
    assert snapshot.live_keys() == set()
    assert tombstone_keys(snapshot) == keys(("ghost", _DV1_ID))


def test_remove_with_a_different_dv_does_not_remove_the_live_file() -> None:
    snapshot = replay(_V0, commit(1, add("p", _DV1)), commit(2, remove("p", _DV2)))
    assert snapshot.live_keys() == keys(("p", _DV1_ID))
    assert tombstone_keys(snapshot) == keys(("p", _DV2_ID))


def test_apply_moves_the_file_tables_on() -> None:
    old = replay(_V0, commit(1, add("a")))
    assert not old.handed_on
    new, _ = old.apply(commit(2, add("b")))
    assert old.handed_on and not new.handed_on
    with pytest.raises(StateError):
        _ = old.files
    with pytest.raises(StateError):
        _ = old.tombstones
    with pytest.raises(StateError):
        old.live_keys()
    with pytest.raises(StateError):
        old.apply(commit(2, add("c")))
    # the old snapshot keeps its own scalar state
    assert old.version == 1
    assert old.protocol == new.protocol
    assert new.live_keys() == keys(("a", None), ("b", None))


def test_last_commit_timestamp_prefers_in_commit_timestamp(corpus: Path) -> None:
    table = corpus / "delta-rs/cdc_ict_table"
    snapshot = Snapshot.empty(str(table))
    for path in _commit_files(table)[:2]:
        snapshot, _ = snapshot.apply(Commit.from_actions(int(path.name[:20]), parse_json_actions(path.read_bytes())))
    # version 1: inCommitTimestamp 1683874206883, timestamp 1783874206883
    assert snapshot.last_commit_timestamp == 1683874206883


# -- corpus replays -------------------------------------------------------------------------------


def test_dv_key_cases_from_the_corpus(corpus: Path) -> None:
    table = corpus / "delta-golden/log-replay-dv-key-cases/delta"
    # the DV ids each version adds, read from the raw log with the protocol's uniqueId formula
    added: list[str | None] = []
    for path in _commit_files(table):
        for line in path.read_text(encoding="utf-8").splitlines():
            obj = json.loads(line)
            if "add" in obj:
                dv = obj["add"].get("deletionVector")
                added.append(None if dv is None else f"u{dv['pathOrInlineDv']}@{dv['offset']}")
    assert len(added) == 4
    snapshot = _replay_table(table)
    name = "part-00000-90177277-75c2-48db-92a2-20dcba39fd06-c000.snappy.parquet"
    assert snapshot.live_keys() == {FileKey(name, added[-1])}
    assert tombstone_keys(snapshot) == {FileKey(name, dv) for dv in added[:-1]}


def test_inline_dv_updates_from_the_corpus(corpus: Path) -> None:
    table = corpus / "kernel-rs/cdf-table-with-dv"
    commits = [Commit.from_actions(int(p.name[:20]), parse_json_actions(p.read_bytes())) for p in _commit_files(table)]
    assert len(commits) == 7
    at5 = Snapshot.empty(str(table)).apply_all(commits[:6])
    [entry] = list(at5.live_files())
    assert entry.deletion_vector is not None
    assert entry.deletion_vector.storage_type == "i"
    assert entry.deletion_vector.path_or_inline_dv.endswith("5c8Xg##093")
    assert entry.deletion_vector.cardinality == 1
    # version 6 removes that DV again and re-adds the bare file, whose tombstone (version 1) goes away
    at6, _ = at5.apply(commits[6])
    [entry] = list(at6.live_files())
    assert entry.deletion_vector is None
    dv_ids = set()
    for path in _commit_files(table):
        for line in path.read_text(encoding="utf-8").splitlines():
            body = next(iter(json.loads(line).values()))
            dv = body.get("deletionVector") if isinstance(body, dict) else None
            if dv:
                offset = dv.get("offset")
                dv_ids.add(f"{dv['storageType']}{dv['pathOrInlineDv']}" + ("" if offset is None else f"@{offset}"))
    assert len(dv_ids) == 4
    assert tombstone_keys(at6) == {FileKey(entry.path, dv_id) for dv_id in dv_ids}


@pytest.mark.parametrize("variant", ["normal-a", "normal-b", "special-a", "special-b"])
def test_remove_with_a_qualified_path_cancels_the_add(corpus: Path, variant: str) -> None:
    # The add names "/some/...", the remove "file:/some/..." or "file:///some/..."; Delta Spark's
    # expected result for these golden tables (manifest notes) is version 1 with no live file.
    table = corpus / f"delta-golden/canonicalized-paths-{variant}/delta"
    snapshot = _replay_table(table)
    assert snapshot.version == 1
    assert snapshot.live_keys() == set()
    [tombstone] = list(snapshot.tombstones)
    assert tombstone.path.startswith("/some/unqualified/")
    if variant.startswith("special"):
        assert tombstone.path == "/some/unqualified/with space/p@#h"


@pytest.mark.parametrize(
    "table",
    [
        "kernel-rs/cdf-table-with-dv",
        "kernel-rs/cdf-table-with-cdc-and-dvs",
        "kernel-rs/cdf-table",
        "kernel-rs/cdf-table-backtick-column-names",
        "kernel-rs/cdf-column-mapping-id-mode",
        "delta-golden/log-replay-dv-key-cases/delta",
        "delta-rs/delta-0.8.0-special-partition",
        "delta-rs/cdc_ict_table",
        "delta-kernel-java/basic-dv-no-checkpoint",
    ],
)
def test_live_files_agree_with_deltalake(corpus: Path, table: str) -> None:
    snapshot = _replay_table(corpus / table)
    snapshot.require_valid()
    adds = pa.table(deltalake.DeltaTable(str(corpus / table)).get_add_actions(flatten=True))
    # deltalake reports the paths as stored in the log (percent-encoded)
    expected = sorted(unquote(p) for p in adds.column("path").to_pylist())
    assert sorted(entry.path for entry in snapshot.live_files()) == expected
