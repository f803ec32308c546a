"""Strict validation of every typed action field (protocol "Actions", and the newer revision's actions).

The field tables here are written out by hand from the protocol texts (delta-protocol.txt "Actions",
delta-protocol-newer-zh.md: row tracking, clustering, domainMetadata, sidecar, checkpointMetadata,
In-Commit Timestamps), not taken from the parser's own schema tables, so that a field the parser
forgets to check fails here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from deltatail.state.actions import (
    Add,
    AddCDCFile,
    CheckpointMetadata,
    CommitInfo,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Sidecar,
    Txn,
    parse_action,
    parse_json_actions,
)
from deltatail.state.errors import InvalidLogError

_DV = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4, "sizeInBytes": 40, "cardinality": 6}

#: A valid body of every action, with every optional field the protocol types filled in.
VALID: dict[str, dict[str, Any]] = {
    "add": {
        "path": "a=1/part-0.parquet",
        "partitionValues": {"a": "1", "b": None},
        "size": 10,
        "modificationTime": 1,
        "dataChange": True,
        "stats": '{"numRecords":1}',
        "tags": {"INSERTION_TIME": "1"},
        "deletionVector": _DV,
        "baseRowId": 4071,
        "defaultRowCommitVersion": 41,
        "clusteringProvider": "liquid",
    },
    "remove": {
        "path": "part-0.parquet",
        "deletionTimestamp": 1,
        "dataChange": True,
        "extendedFileMetadata": True,
        "partitionValues": {},
        "size": 10,
        "stats": "{}",
        "tags": {},
        "deletionVector": _DV,
        "baseRowId": 1,
        "defaultRowCommitVersion": 1,
    },
    "cdc": {"path": "_change_data/c.parquet", "partitionValues": {}, "size": 1, "dataChange": False, "tags": {}},
    "metaData": {
        "id": "t",
        "name": "n",
        "description": "d",
        "format": {"provider": "parquet", "options": {"k": "v"}},
        "schemaString": '{"type":"struct","fields":[]}',
        "partitionColumns": ["a"],
        "createdTime": 1,
        "configuration": {"delta.appendOnly": "true"},
    },
    "protocol": {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["deletionVectors"],
    },
    "txn": {"appId": "app", "version": 3, "lastUpdated": 1},
    "domainMetadata": {"domain": "delta.rowTracking", "configuration": "{}", "removed": False},
    "sidecar": {"path": "s.parquet", "sizeInBytes": 10, "modificationTime": 1, "tags": {}},
    "checkpointMetadata": {"version": 1, "tags": {}},
    "commitInfo": {"timestamp": 1, "inCommitTimestamp": 2, "operation": "WRITE"},
}

# Field kinds, each with values of the wrong JSON type.
_NOT_LONG = ["10", 10.0, 1.5, True, [1], {"v": 1}, 2**63, -(2**63) - 1]
_NOT_INT = ["1", 1.0, False, [1], 2**31, -(2**31) - 1]
_NOT_BOOL = [1, 0, "true", "false", [True], {}]
_NOT_STRING = [1, 1.5, True, ["a"], {"a": "b"}]
_NOT_MAP = ["a=1", ["a", "1"], 1, True]
_BAD_MAP_VALUE = [{"a": 1}, {"a": True}, {"a": ["x"]}, {"a": {"b": "c"}}, {"a": 1.5}]
_NOT_STRINGS = ["a", {"a": 1}, 1, [1], ["a", None], [["a"]]]
_NOT_OBJECT = ["x", 1, [], True]

#: (action, field, its kind, required) for every field the protocol types; nested fields dotted.
FIELDS: list[tuple[str, str, str, bool]] = [
    ("add", "path", "string", True),
    ("add", "partitionValues", "map", True),
    ("add", "size", "long", True),
    ("add", "modificationTime", "long", True),
    ("add", "dataChange", "boolean", True),
    ("add", "stats", "string", False),
    ("add", "tags", "map", False),
    ("add", "deletionVector", "object", False),
    ("add", "deletionVector.storageType", "string", True),
    ("add", "deletionVector.pathOrInlineDv", "string", True),
    ("add", "deletionVector.offset", "int", False),
    ("add", "deletionVector.sizeInBytes", "int", True),
    ("add", "deletionVector.cardinality", "long", True),
    ("add", "baseRowId", "long", False),
    ("add", "defaultRowCommitVersion", "long", False),
    ("add", "clusteringProvider", "string", False),
    ("remove", "path", "string", True),
    ("remove", "deletionTimestamp", "long", False),
    ("remove", "dataChange", "boolean", True),
    ("remove", "extendedFileMetadata", "boolean", False),
    ("remove", "partitionValues", "map", False),
    ("remove", "size", "long", False),
    ("remove", "stats", "string", False),
    ("remove", "tags", "map", False),
    ("remove", "deletionVector", "object", False),
    ("remove", "deletionVector.storageType", "string", True),
    ("remove", "deletionVector.pathOrInlineDv", "string", True),
    ("remove", "deletionVector.offset", "int", False),
    ("remove", "deletionVector.sizeInBytes", "int", True),
    ("remove", "deletionVector.cardinality", "long", True),
    ("remove", "baseRowId", "long", False),
    ("remove", "defaultRowCommitVersion", "long", False),
    ("cdc", "path", "string", True),
    ("cdc", "partitionValues", "map", True),
    ("cdc", "size", "long", True),
    ("cdc", "dataChange", "boolean", True),
    ("cdc", "tags", "map", False),
    ("metaData", "id", "string", True),
    ("metaData", "name", "string", False),
    ("metaData", "description", "string", False),
    ("metaData", "format", "object", True),
    ("metaData", "format.provider", "string", True),
    ("metaData", "format.options", "map", False),
    ("metaData", "schemaString", "string", False),
    ("metaData", "partitionColumns", "strings", True),
    ("metaData", "createdTime", "long", False),
    ("metaData", "configuration", "map", True),
    ("protocol", "minReaderVersion", "int", True),
    ("protocol", "minWriterVersion", "int", True),
    ("protocol", "readerFeatures", "strings", False),
    ("protocol", "writerFeatures", "strings", False),
    ("txn", "appId", "string", True),
    ("txn", "version", "long", True),
    ("txn", "lastUpdated", "long", False),
    ("domainMetadata", "domain", "string", True),
    ("domainMetadata", "configuration", "string", True),
    ("domainMetadata", "removed", "boolean", True),
    ("sidecar", "path", "string", True),
    ("sidecar", "sizeInBytes", "long", True),
    ("sidecar", "modificationTime", "long", True),
    ("sidecar", "tags", "map", False),
    ("checkpointMetadata", "version", "long", True),
    ("checkpointMetadata", "tags", "map", False),
    ("commitInfo", "inCommitTimestamp", "long", False),
]

_WRONG: dict[str, list[Any]] = {
    "long": _NOT_LONG,
    "int": _NOT_INT,
    "boolean": _NOT_BOOL,
    "string": _NOT_STRING,
    "map": _NOT_MAP + _BAD_MAP_VALUE,
    "strings": _NOT_STRINGS,
    "object": _NOT_OBJECT,
}


def _with(body: dict[str, Any], dotted: str, value: Any, *, drop: bool = False) -> dict[str, Any]:
    """A deep copy of ``body`` with the (dotted) field set to ``value``, or removed."""
    copy: dict[str, Any] = json.loads(json.dumps(body))
    *parents, name = dotted.split(".")
    target = copy
    for parent in parents:
        target = target[parent]
    if drop:
        del target[name]
    else:
        target[name] = value
    return copy


def _line(action: str, body: Any) -> bytes:
    return json.dumps({action: body}).encode()


def _cases() -> list[tuple[str, str, Any]]:
    return [(action, name, bad) for action, name, kind, _ in FIELDS for bad in _WRONG[kind]]


def test_every_valid_body_parses_to_its_action() -> None:
    kinds = {
        "add": Add,
        "remove": Remove,
        "cdc": AddCDCFile,
        "metaData": Metadata,
        "protocol": Protocol,
        "txn": Txn,
        "domainMetadata": DomainMetadata,
        "sidecar": Sidecar,
        "checkpointMetadata": CheckpointMetadata,
        "commitInfo": CommitInfo,
    }
    for action, body in VALID.items():
        [parsed] = parse_json_actions(_line(action, body))
        assert isinstance(parsed, kinds[action]), action


@pytest.mark.parametrize(("action", "field", "bad"), _cases(), ids=repr)
def test_a_field_of_the_wrong_json_type_is_an_invalid_log_naming_action_and_field(
    action: str, field: str, bad: Any
) -> None:
    data = b'{"commitInfo":{}}\n' + _line(action, _with(VALID[action], field, bad))
    with pytest.raises(InvalidLogError) as info:
        parse_json_actions(data)
    message = str(info.value)
    assert message.startswith(f"line 2: {action} action")
    assert repr(field) in message


@pytest.mark.parametrize(("action", "field"), [(a, f) for a, f, _, required in FIELDS if required], ids="{}".format)
@pytest.mark.parametrize("how", ["missing", "null"])
def test_a_required_field_missing_or_null_is_an_invalid_log(action: str, field: str, how: str) -> None:
    body = _with(VALID[action], field, None, drop=how == "missing")
    with pytest.raises(InvalidLogError, match=f"{action} action: field '{field}' is required but {how}"):
        parse_json_actions(_line(action, body))


@pytest.mark.parametrize(("action", "field"), [(a, f) for a, f, _, required in FIELDS if not required], ids="{}".format)
@pytest.mark.parametrize("how", ["missing", "null"])
def test_an_optional_field_may_be_missing_or_null(action: str, field: str, how: str) -> None:
    body = _with(VALID[action], field, None, drop=how == "missing")
    assert len(parse_json_actions(_line(action, body))) == 1


@pytest.mark.parametrize("action", sorted(VALID))
@pytest.mark.parametrize("body", ["x", 1, 1.5, True, [], [{"path": "p"}]])
def test_an_action_that_is_not_an_object_is_an_invalid_log(action: str, body: Any) -> None:
    with pytest.raises(InvalidLogError, match=f"{action} action must be a JSON object"):
        parse_json_actions(_line(action, body))


def test_a_null_action_is_no_action() -> None:
    # Parquet checkpoints hold a null in every action column but one; JSON checkpoints written from
    # them may do the same.
    assert parse_json_actions(b'{"add": null, "txn": {"appId": "a", "version": 1}}') == [Txn("a", 1)]


# -- the values that pass -------------------------------------------------------------------------


def test_longs_at_the_edges_of_the_64_bit_range_are_accepted() -> None:
    for value in (-(2**63), 2**63 - 1, 0):
        [add] = parse_json_actions(_line("add", _with(VALID["add"], "size", value)))
        assert isinstance(add, Add)
        assert add.size == value


def test_ints_at_the_edges_of_the_32_bit_range_are_accepted() -> None:
    [protocol] = parse_json_actions(_line("protocol", _with(VALID["protocol"], "minWriterVersion", 2**31 - 1)))
    assert isinstance(protocol, Protocol)
    assert protocol.min_writer_version == 2**31 - 1


def test_parsed_values_are_the_json_values() -> None:
    [add] = parse_json_actions(_line("add", VALID["add"]))
    assert add == Add(
        path="a=1/part-0.parquet",
        partition_values={"a": "1", "b": None},
        size=10,
        modification_time=1,
        data_change=True,
        stats='{"numRecords":1}',
        tags={"INSERTION_TIME": "1"},
        deletion_vector=DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 6, 4),
        base_row_id=4071,
        default_row_commit_version=41,
        clustering_provider="liquid",
    )
    distinct = {"deletionTimestamp": 7, "size": 11, "baseRowId": 4072, "defaultRowCommitVersion": 42}
    body = dict(VALID["remove"], partitionValues={"a": "2"}, stats='{"numRecords":3}', tags={"T": "9"}, **distinct)
    [remove] = parse_json_actions(_line("remove", body))
    assert remove == Remove(
        path="part-0.parquet",
        deletion_timestamp=7,
        data_change=True,
        extended_file_metadata=True,
        partition_values={"a": "2"},
        size=11,
        stats='{"numRecords":3}',
        tags={"T": "9"},
        deletion_vector=DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 6, 4),
        base_row_id=4072,
        default_row_commit_version=42,
    )
    [metadata] = parse_json_actions(_line("metaData", VALID["metaData"]))
    assert isinstance(metadata, Metadata)
    assert (metadata.format.provider, metadata.format.options) == ("parquet", {"k": "v"})
    assert metadata.partition_columns == ("a",)
    [domain] = parse_json_actions(_line("domainMetadata", VALID["domainMetadata"]))
    assert domain == DomainMetadata("delta.rowTracking", "{}", False)


def test_format_options_may_be_absent() -> None:
    [metadata] = parse_json_actions(_line("metaData", _with(VALID["metaData"], "format.options", None, drop=True)))
    assert isinstance(metadata, Metadata)
    assert metadata.format.options == {}


def test_configuration_and_format_options_hold_no_nulls() -> None:
    # Map[String, String]: a null setting would reach code that reads it as a string.
    for field in ("configuration", "format.options"):
        with pytest.raises(InvalidLogError, match=f"field '{field}' must map strings to strings, but maps 'k' to null"):
            parse_json_actions(_line("metaData", _with(VALID["metaData"], field, {"k": None})))


def test_partition_values_and_tags_may_hold_nulls() -> None:
    # A null partition value is how the protocol writes a null partition.
    [remove] = parse_json_actions(
        _line("remove", _with(_with(VALID["remove"], "partitionValues", {"p": None}), "tags", {"t": None}))
    )
    assert isinstance(remove, Remove)
    assert remove.partition_values == {"p": None}
    assert remove.tags == {"t": None}


@pytest.mark.parametrize("storage_type", ["x", "U", "", "up"])
def test_unknown_deletion_vector_storage_type_is_an_invalid_log(storage_type: str) -> None:
    body = _with(VALID["add"], "deletionVector.storageType", storage_type)
    with pytest.raises(InvalidLogError, match=r"field 'deletionVector\.storageType' must be 'u', 'i' or 'p'"):
        parse_json_actions(_line("add", body))


def test_inline_deletion_vector_without_offset() -> None:
    dv = {"storageType": "i", "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", "sizeInBytes": 40}
    dv["cardinality"] = 6
    [add] = parse_json_actions(_line("add", _with(VALID["add"], "deletionVector", dv)))
    assert isinstance(add, Add)
    assert add.deletion_vector is not None
    assert add.deletion_vector.offset is None


def test_deletion_vector_parse_names_the_field() -> None:
    # DeletionVector.parse is also how Parquet checkpoint rows' descriptors are read.
    assert DeletionVector.parse(None) is None
    assert DeletionVector.parse(_DV) == DeletionVector("u", "ab^-aqEH.-t@S}K{vb[*k^", 40, 6, 4)
    with pytest.raises(InvalidLogError, match=r"field 'deletionVector\.sizeInBytes' must be an int"):
        DeletionVector.parse({**_DV, "sizeInBytes": "40"})
    with pytest.raises(InvalidLogError, match=r"field 'deletionVector\.cardinality' is required but missing"):
        DeletionVector.parse({k: v for k, v in _DV.items() if k != "cardinality"})
    with pytest.raises(InvalidLogError, match="deletionVector must be a JSON object"):
        DeletionVector.parse("uab^-aqEH.-t@S}K{vb[*k^@4")
    with pytest.raises(InvalidLogError, match="deletionVector must be a JSON object"):
        DeletionVector.parse([])
    with pytest.raises(InvalidLogError, match=r"field 'deletionVector\.storageType' is required but missing"):
        DeletionVector.parse({})


def test_an_empty_deletion_vector_object_is_not_an_absent_one() -> None:
    with pytest.raises(InvalidLogError, match=r"field 'deletionVector\.storageType' is required but missing"):
        parse_json_actions(_line("add", _with(VALID["add"], "deletionVector", {})))


# -- commitInfo is free-form ----------------------------------------------------------------------


@pytest.mark.parametrize("timestamp", ["1700000000000", 1.5, True, None, {"ms": 1}])
def test_commit_info_timestamp_of_another_type_is_treated_as_absent(timestamp: Any) -> None:
    [info] = parse_json_actions(_line("commitInfo", {"timestamp": timestamp, "operation": 5, "anything": [1]}))
    assert isinstance(info, CommitInfo)
    assert info.timestamp is None
    assert info.operation is None


# -- unknown actions and fields -------------------------------------------------------------------


@pytest.mark.parametrize("action", sorted(VALID))
def test_unknown_fields_of_any_type_are_ignored(action: str) -> None:
    body = {**VALID[action], "futureField": 1.5, "stats_parsed": {"numRecords": [1]}, "other": None}
    [with_extras] = parse_json_actions(_line(action, body))
    [plain] = parse_json_actions(_line(action, VALID[action]))
    if isinstance(plain, CommitInfo):
        assert isinstance(with_extras, CommitInfo)
        assert with_extras.in_commit_timestamp == plain.in_commit_timestamp
    else:
        assert with_extras == plain


def test_unknown_actions_of_any_shape_are_ignored() -> None:
    lines = [b'{"futureAction": 1}', b'{"futureAction": [1, {"a": null}]}', b'{"x": {"path": 5}}']
    assert parse_json_actions(b"\n".join(lines)) == []


def test_parse_action_takes_parquet_rows_with_nulls_for_absent_fields() -> None:
    # What tailer.log.checkpoint hands over for a Parquet checkpoint's metaData, protocol and txn rows.
    metadata = {**VALID["metaData"], "name": None, "description": None, "createdTime": None}
    metadata["format"] = {"provider": "parquet", "options": None}
    assert isinstance(parse_action({"metaData": metadata}), Metadata)
    protocol = {"minReaderVersion": 1, "minWriterVersion": 2, "readerFeatures": None, "writerFeatures": None}
    assert parse_action({"protocol": protocol}) == Protocol(1, 2)
    assert parse_action({"txn": {"appId": "a", "version": 1, "lastUpdated": None}}) == Txn("a", 1)
