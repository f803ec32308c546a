"""Parsing of every log action (protocol "Actions"), checked against real commit lines from the corpus.

Expected values are either literal facts of the corpus files (read here at test time) or what the
protocol text says; where a value is compared with "the raw JSON", the raw JSON is read with the
standard library, independently of the parser under test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote

import pytest
from core_corpus import corpus_root

from deltatail.state.actions import (
    Action,
    Add,
    AddCDCFile,
    CheckpointMetadata,
    CommitInfo,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Sidecar,
    Txn,
    parse_json_actions,
)
from deltatail.state.errors import DeltaTailError, InvalidLogError


@pytest.fixture
def corpus() -> Path:
    return corpus_root()


def _commit_file(table: Path, version: int) -> Path:
    return table / "_delta_log" / f"{version:020d}.json"


def _actions(table: Path, version: int) -> list[Action]:
    return parse_json_actions(_commit_file(table, version).read_bytes())


def _raw(table: Path, version: int, kind: str) -> list[dict[str, Any]]:
    """The bodies of every ``kind`` action of a commit, read with the standard json module."""
    bodies = []
    for line in _commit_file(table, version).read_text(encoding="utf-8").splitlines():
        if line.strip():
            obj = json.loads(line)
            if obj.get(kind) is not None:
                bodies.append(obj[kind])
    return bodies


def _one(line: dict[str, Any]) -> Action:
    actions = parse_json_actions(json.dumps(line).encode())
    assert len(actions) == 1
    return actions[0]


_T = TypeVar("_T")


def _only(actions: list[Action], kind: type[_T]) -> list[_T]:
    return [a for a in actions if isinstance(a, kind)]


_ADD = {
    "path": "part-0.parquet",
    "partitionValues": {},
    "size": 10,
    "modificationTime": 1,
    "dataChange": True,
}


# -- protocol -------------------------------------------------------------------------------------


def test_protocol_with_reader_and_writer_features(corpus: Path) -> None:
    actions = _actions(corpus / "delta-rs/table_with_liquid_clustering", 0)
    [protocol] = _only(actions, Protocol)
    assert protocol == Protocol(
        min_reader_version=3,
        min_writer_version=7,
        reader_features=frozenset({"deletionVectors"}),
        writer_features=frozenset({"domainMetadata", "deletionVectors", "rowTracking", "liquid"}),
    )


def test_legacy_protocol_has_no_feature_lists(corpus: Path) -> None:
    [protocol] = _only(_actions(corpus / "kernel-rs/cdf-column-mapping-id-mode", 0), Protocol)
    assert protocol == Protocol(min_reader_version=2, min_writer_version=5)
    assert protocol.reader_features is None
    assert protocol.writer_features is None


def test_protocol_with_writer_features_only() -> None:
    protocol = _one({"protocol": {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["appendOnly"]}})
    assert protocol == Protocol(1, 7, None, frozenset({"appendOnly"}))


# -- metaData -------------------------------------------------------------------------------------


def test_metadata_with_schema_partition_columns_and_configuration(corpus: Path) -> None:
    table = corpus / "kernel-rs/cdf-table"
    [metadata] = _only(_actions(table, 0), Metadata)
    [raw] = _raw(table, 0, "metaData")
    assert metadata.id == "d38a7090-96be-4b1b-b20f-b85ad8ae1a38"
    assert metadata.schema_string == raw["schemaString"]
    assert metadata.partition_columns == ("birthday",)
    assert metadata.configuration == {"delta.enableChangeDataFeed": "true"}
    assert metadata.created_time == 1703265016759
    assert metadata.format.provider == "parquet"
    assert metadata.format.options == {}
    assert metadata.column_mapping_mode == "none"
    assert metadata.schema().names == ["id", "name", "birthday"]


def test_metadata_column_mapping_mode_comes_from_configuration(corpus: Path) -> None:
    [metadata] = _only(_actions(corpus / "kernel-rs/cdf-column-mapping-id-mode", 0), Metadata)
    assert metadata.column_mapping_mode == "id"
    assert metadata.configuration["delta.columnMapping.maxColumnId"] == "3"


def test_metadata_name_and_description() -> None:
    metadata = _one(
        {
            "metaData": {
                "id": "t",
                "name": "events",
                "description": "all events",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": '{"type":"struct","fields":[]}',
                "partitionColumns": [],
                "configuration": {"delta.appendOnly": "true"},
            }
        }
    )
    assert isinstance(metadata, Metadata)
    assert (metadata.name, metadata.description) == ("events", "all events")
    assert metadata.configuration == {"delta.appendOnly": "true"}
    assert metadata.created_time is None


# -- add / remove ---------------------------------------------------------------------------------


def test_add_with_relative_deletion_vector_and_raw_stats(corpus: Path) -> None:
    table = corpus / "kernel-rs/table-with-dv-small"
    [add] = _only(_actions(table, 1), Add)
    [raw] = _raw(table, 1, "add")
    assert add.path == "part-00000-fae5310a-a37d-4e51-827b-c3d5516560ca-c000.snappy.parquet"
    assert add.partition_values == {}
    assert add.size == 635
    assert add.modification_time == 1677811178336
    assert add.data_change is True
    # stats are kept as the raw JSON string, byte for byte
    assert add.stats == raw["stats"]
    assert isinstance(add.stats, str)
    assert add.tags is not None
    assert add.tags["OPTIMIZE_TARGET_SIZE"] == "268435456"
    dv = add.deletion_vector
    assert dv is not None
    assert (dv.storage_type, dv.path_or_inline_dv, dv.offset, dv.size_in_bytes, dv.cardinality) == (
        "u",
        "vBn[lx{q8@P<9BNH/isA",
        1,
        36,
        2,
    )
    assert add.dv_id == "uvBn[lx{q8@P<9BNH/isA@1"
    assert add.base_row_id is None
    assert add.default_row_commit_version is None


def test_remove_with_extended_file_metadata(corpus: Path) -> None:
    [remove] = _only(_actions(corpus / "kernel-rs/table-with-dv-small", 1), Remove)
    assert remove.path == "part-00000-fae5310a-a37d-4e51-827b-c3d5516560ca-c000.snappy.parquet"
    assert remove.deletion_timestamp == 1677811194426
    assert remove.data_change is True
    assert remove.extended_file_metadata is True
    assert remove.partition_values == {}
    assert remove.size == 635
    assert remove.deletion_vector is None
    assert remove.dv_id is None


def test_remove_with_inline_deletion_vector(corpus: Path) -> None:
    [remove] = _only(_actions(corpus / "kernel-rs/cdf-table-with-dv", 5), Remove)
    dv = remove.deletion_vector
    assert dv is not None
    assert (dv.storage_type, dv.offset, dv.size_in_bytes, dv.cardinality) == ("i", None, 36, 2)
    # offset is JSON null here: the unique id has no "@offset" suffix
    assert remove.dv_id == "i^Bg9^0rr910000000000iXQKl0rr91000315c8Xg000f5"


def test_remove_without_optional_fields(corpus: Path) -> None:
    # Delta 0.1.0 wrote removes without deletionTimestamp (it is an Option in the protocol).
    removes = _only(_actions(corpus / "delta-spark/delta-0.1.0", 1), Remove)
    assert removes
    for remove in removes:
        assert remove.deletion_timestamp is None
        assert remove.size is None
        assert remove.partition_values is None


def test_add_with_row_tracking_fields(corpus: Path) -> None:
    table = corpus / "delta-rs/table_with_liquid_clustering"
    adds = _only(_actions(table, 0), Add)
    assert [a.base_row_id for a in adds] == list(range(10))
    assert {a.default_row_commit_version for a in adds} == {0}
    assert [a.base_row_id for a in adds] == [r["baseRowId"] for r in _raw(table, 0, "add")]


def test_cdc_file(corpus: Path) -> None:
    cdcs = _only(_actions(corpus / "kernel-rs/cdf-table", 1), AddCDCFile)
    assert cdcs[0] == AddCDCFile(
        path="_change_data/birthday=2023-12-22/cdc-00000-59fa51a4-edbb-4fc0-a497-6969cdf3966c.c000.snappy.parquet",
        partition_values={"birthday": "2023-12-22"},
        size=1028,
        data_change=False,
    )
    for cdc in cdcs:
        assert (corpus / "kernel-rs/cdf-table" / cdc.path).is_file()


def test_txn_with_and_without_last_updated(corpus: Path) -> None:
    table = corpus / "kernel-rs/app-txn-with-last-updated"
    assert _only(_actions(table, 0), Txn) == [Txn(app_id="new_app_0", version=1, last_updated=None)]
    assert _only(_actions(table, 1), Txn) == [Txn(app_id="new_app_1", version=1, last_updated=1000)]


def test_commit_info_with_in_commit_timestamp(corpus: Path) -> None:
    [info] = _only(_actions(corpus / "delta-rs/cdc_ict_table", 1), CommitInfo)
    assert info.in_commit_timestamp == 1683874206883
    assert info.timestamp == 1783874206883
    assert info.operation == "WRITE"
    assert info.operation_metrics["numFiles"] == "4"


def test_commit_info_without_in_commit_timestamp(corpus: Path) -> None:
    [info] = _only(_actions(corpus / "kernel-rs/table-with-dv-small", 1), CommitInfo)
    assert info.in_commit_timestamp is None
    assert info.timestamp == 1677811194429
    assert info.operation == "DELETE"


def test_domain_metadata(corpus: Path) -> None:
    table = corpus / "delta-rs/table_with_liquid_clustering"
    domains = _only(_actions(table, 0), DomainMetadata)
    raw = _raw(table, 0, "domainMetadata")
    assert [d.domain for d in domains] == ["delta.liquid", "delta.rowTracking"]
    assert [d.configuration for d in domains] == [r["configuration"] for r in raw]
    assert not any(d.removed for d in domains)


def test_domain_metadata_tombstone() -> None:
    action = _one({"domainMetadata": {"domain": "app.x", "configuration": "{}", "removed": True}})
    assert action == DomainMetadata(domain="app.x", configuration="{}", removed=True)


def test_sidecar_and_checkpoint_metadata(corpus: Path) -> None:
    log = corpus / "delta-rs/checkpoint-v2-table/_delta_log"
    [checkpoint] = sorted(log.glob("00000000000000000006.checkpoint.*.json"))
    actions = parse_json_actions(checkpoint.read_bytes())
    [meta] = _only(actions, CheckpointMetadata)
    assert meta.version == 6
    assert meta.tags is not None
    assert meta.tags["numOfAddFiles"] == "5"
    [sidecar] = _only(actions, Sidecar)
    assert (
        sidecar.path
        == "00000000000000000006.checkpoint.0000000001.0000000001.1a1516f4-8a39-48f0-9ccd-cc3790d824c7.parquet"
    )
    assert sidecar.size_in_bytes == 14740
    assert sidecar.modification_time == 1754751124000
    assert (log / "_sidecars" / sidecar.path).is_file()
    assert _only(actions, Protocol)
    assert _only(actions, Metadata)


# -- unknown actions and fields -------------------------------------------------------------------


def test_unknown_actions_are_ignored() -> None:
    data = b"\n".join(
        [
            b'{"someFutureAction":{"x":1}}',
            json.dumps({"add": _ADD}).encode(),
            b'{"anotherOne":[1,2,3]}',
        ]
    )
    actions = parse_json_actions(data)
    assert len(actions) == 1
    assert isinstance(actions[0], Add)


def test_unknown_fields_are_ignored() -> None:
    plain = _one({"add": _ADD})
    extended = _one({"add": {**_ADD, "futureField": {"nested": [1]}, "clusteringProvider": "liquid"}})
    assert isinstance(plain, Add)
    assert isinstance(extended, Add)
    assert extended.path == plain.path
    assert extended.clustering_provider == "liquid"
    protocol = _one({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2, "futureField": True}})
    assert protocol == Protocol(1, 2)


def test_blank_lines_are_ignored() -> None:
    data = b"\n" + json.dumps({"add": _ADD}).encode() + b"\n\n   \n"
    assert len(parse_json_actions(data)) == 1


# -- percent-decoding of paths --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "decoded"),
    [
        ("test%25file%25prefix-part-0.parquet", "test%file%prefix-part-0.parquet"),
        ("a%20b=1/x.parquet", "a b=1/x.parquet"),
        # decoded exactly once; "+" is not a space in an RFC 2396 path
        ("_2=bar+%252521/part-0.parquet", "_2=bar+%2521/part-0.parquet"),
        ("x=A%252FA/part-0.parquet", "x=A%2FA/part-0.parquet"),
        ("plain/part-0.parquet", "plain/part-0.parquet"),
    ],
)
def test_file_action_paths_are_percent_decoded(stored: str, decoded: str) -> None:
    add = _one({"add": {**_ADD, "path": stored}})
    remove = _one({"remove": {"path": stored, "deletionTimestamp": 1, "dataChange": True}})
    cdc = _one({"cdc": {"path": stored, "partitionValues": {}, "size": 1, "dataChange": False}})
    assert isinstance(add, Add)
    assert isinstance(remove, Remove)
    assert isinstance(cdc, AddCDCFile)
    assert add.path == remove.path == cdc.path == decoded


@pytest.mark.parametrize(
    ("table", "version"),
    [("kernel-rs/cdf-table-backtick-column-names", 0), ("delta-rs/delta-0.8.0-special-partition", 0)],
)
def test_decoded_paths_name_the_files_on_disk(corpus: Path, table: str, version: int) -> None:
    raw_paths = [r["path"] for r in _raw(corpus / table, version, "add")]
    assert any("%25" in p for p in raw_paths)
    adds = _only(_actions(corpus / table, version), Add)
    assert [a.path for a in adds] == [unquote(p) for p in raw_paths]
    for add in adds:
        assert (corpus / table / add.path).is_file(), add.path


@pytest.mark.parametrize(
    ("stored", "decoded"),
    [
        ("file:/some/with%20space/p@%23h", "/some/with space/p@#h"),
        ("file:///some/with%20space/p@%23h", "/some/with space/p@#h"),
        ("/some/with%20space/p@%23h", "/some/with space/p@#h"),
    ],
)
def test_local_file_uris_name_the_same_file_as_plain_absolute_paths(stored: str, decoded: str) -> None:
    # delta-golden/canonicalized-paths-*: Delta Spark treats these forms as one file
    add = _one({"add": {**_ADD, "path": stored}})
    assert isinstance(add, Add)
    assert add.path == decoded


def test_file_uri_with_an_authority_does_not_become_a_relative_path() -> None:
    # RFC 8089: "file://localhost/a/b" is the local file "/a/b"; the authority is not a path segment,
    # so the result must not be the table-relative path "localhost/a/b.parquet".
    add = _one({"add": {**_ADD, "path": "file://localhost/a/b.parquet"}})
    assert isinstance(add, Add)
    assert add.path in {"/a/b.parquet", "file://localhost/a/b.parquet"}


def test_sidecar_path_is_percent_decoded() -> None:
    # Newer protocol, "Sidecar File Information": path is the "URI-encoded path to the sidecar file".
    sidecar = _one({"sidecar": {"path": "a%20b%25c.parquet", "sizeInBytes": 1, "modificationTime": 1}})
    assert isinstance(sidecar, Sidecar)
    assert sidecar.path == "a b%c.parquet"


# -- malformed input ------------------------------------------------------------------------------


def test_truncated_commit_names_the_line(corpus: Path) -> None:
    data = _commit_file(corpus / "kernel-rs/table-with-dv-small", 1).read_bytes()
    lines = data.splitlines()
    assert len(lines) == 3
    truncated = b"\n".join([*lines[:2], lines[2][: len(lines[2]) // 2]])
    with pytest.raises(InvalidLogError, match=r"\bline 3\b"):
        parse_json_actions(truncated)


def test_invalid_json_line_names_the_line() -> None:
    data = json.dumps({"add": _ADD}).encode() + b'\n{"add": {"path": "x",}\n'
    with pytest.raises(InvalidLogError, match=r"\bline 2\b") as info:
        parse_json_actions(data)
    assert isinstance(info.value, DeltaTailError)


@pytest.mark.parametrize("line", [b"[1, 2]", b'"add"', b"42", b"null"])
def test_line_that_is_not_an_object_names_the_line(line: bytes) -> None:
    with pytest.raises(InvalidLogError, match=r"\bline 2\b"):
        parse_json_actions(b'{"commitInfo":{}}\n' + line)


def _without(body: dict[str, Any], field: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != field}


_REMOVE = {"path": "p", "deletionTimestamp": 1, "dataChange": True}
_CDC = {"path": "p", "partitionValues": {}, "size": 1, "dataChange": False}
_DV = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4, "sizeInBytes": 40, "cardinality": 6}
# Fields the protocol's action schemas list as required (not ``Option``). A reader that fills in a
# default instead (``dataChange`` true, ``partitionValues`` empty, ``size`` 0) turns a broken log
# into silently wrong change rows, so a missing required field must be an InvalidLogError.
_REQUIRED: list[tuple[str, dict[str, Any], str]] = [
    ("add", _ADD, "path"),
    ("add", _ADD, "partitionValues"),
    ("add", _ADD, "size"),
    ("add", _ADD, "modificationTime"),
    ("add", _ADD, "dataChange"),
    ("remove", _REMOVE, "path"),
    ("remove", _REMOVE, "dataChange"),
    ("cdc", _CDC, "path"),
    ("cdc", _CDC, "partitionValues"),
    ("cdc", _CDC, "size"),
    ("metaData", {"id": "t", "schemaString": '{"type":"struct","fields":[]}', "partitionColumns": []}, "id"),
    ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}, "minReaderVersion"),
    ("protocol", {"minReaderVersion": 1, "minWriterVersion": 2}, "minWriterVersion"),
    ("txn", {"appId": "a", "version": 1}, "appId"),
    ("txn", {"appId": "a", "version": 1}, "version"),
    ("domainMetadata", {"domain": "d", "configuration": "{}", "removed": False}, "domain"),
    ("sidecar", {"path": "s.parquet", "sizeInBytes": 1, "modificationTime": 1}, "path"),
    ("checkpointMetadata", {"version": 1}, "version"),
]


@pytest.mark.parametrize(
    ("kind", "body", "missing"), _REQUIRED, ids=[f"{kind}-{missing}" for kind, _, missing in _REQUIRED]
)
def test_missing_required_field_is_an_invalid_log(kind: str, body: dict[str, Any], missing: str) -> None:
    data = b'{"commitInfo":{}}\n' + json.dumps({kind: _without(body, missing)}).encode()
    with pytest.raises(InvalidLogError, match=r"\bline 2\b"):
        parse_json_actions(data)


@pytest.mark.parametrize("missing", ["storageType", "pathOrInlineDv", "sizeInBytes", "cardinality"])
def test_deletion_vector_missing_required_field_is_an_invalid_log(missing: str) -> None:
    data = json.dumps({"add": {**_ADD, "deletionVector": _without(_DV, missing)}}).encode()
    with pytest.raises(InvalidLogError, match=r"\bline 1\b"):
        parse_json_actions(data)


def test_unknown_deletion_vector_storage_type_is_an_invalid_log() -> None:
    data = json.dumps({"add": {**_ADD, "deletionVector": {**_DV, "storageType": "x"}}}).encode()
    with pytest.raises(InvalidLogError, match="storageType"):
        parse_json_actions(data)


@pytest.mark.parametrize(
    "line",
    [
        {"add": "not an object"},
        {"add": {**_ADD, "size": "ten"}},
        {"txn": {"appId": "a", "version": "one"}},
        {"protocol": {"minReaderVersion": [1], "minWriterVersion": 2}},
    ],
)
def test_field_of_the_wrong_type_is_an_invalid_log(line: dict[str, Any]) -> None:
    with pytest.raises(InvalidLogError, match=r"\bline 1\b"):
        parse_json_actions(json.dumps(line).encode())
