"""Delta actions parsed from JSON objects and newline-delimited JSON, strictly (see :mod:`state.actions`). Pure.

A required field missing or null, or a field of the wrong JSON type, is an
:class:`~state.errors.InvalidLogError` naming the action and the field; unknown actions and
fields are ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from deltatail.state.actions.fields import (
    _ADD_SCHEMA,
    _CDC_SCHEMA,
    _CHECKPOINT_METADATA_SCHEMA,
    _COMMIT_INFO_SCHEMA,
    _DOMAIN_SCHEMA,
    _MAX_LONG,
    _METADATA_SCHEMA,
    _MIN_LONG,
    _PROTOCOL_SCHEMA,
    _REMOVE_SCHEMA,
    _SIDECAR_SCHEMA,
    _TXN_SCHEMA,
    _invalid,
    _nullable_strings,
    _validate,
    decode_path,
)
from deltatail.state.actions.model import (
    Action,
    Add,
    AddCDCFile,
    CheckpointMetadata,
    CommitInfo,
    DomainMetadata,
    Format,
    Metadata,
    Protocol,
    Remove,
    Sidecar,
    Txn,
    _deletion_vector,
)
from deltatail.state.errors import InvalidLogError


def parse_add(a: dict[str, Any]) -> Add:
    """Parse the body of an ``add`` action.

    Raises:
        InvalidLogError: if a required field (``path``, ``partitionValues``, ``size``,
            ``modificationTime``, ``dataChange``) is missing or null, or any typed field has the
            wrong JSON type; the message names the field.
    """
    if type(a) is not dict:
        raise _invalid("add", a, _ADD_SCHEMA)
    get = a.get
    path = get("path")
    partition_values = get("partitionValues")
    size = get("size")
    modification_time = get("modificationTime")
    data_change = get("dataChange")
    stats = get("stats")
    tags = get("tags")
    raw_dv = get("deletionVector")
    base_row_id = get("baseRowId")
    row_commit_version = get("defaultRowCommitVersion")
    clustering_provider = get("clusteringProvider")
    dv = None if raw_dv is None else _deletion_vector(raw_dv)
    if not (
        type(path) is str
        and type(partition_values) is dict
        and _nullable_strings(partition_values)
        and type(size) is int
        and _MIN_LONG <= size <= _MAX_LONG
        and type(modification_time) is int
        and _MIN_LONG <= modification_time <= _MAX_LONG
        and type(data_change) is bool
        and (stats is None or type(stats) is str)
        and (tags is None or (type(tags) is dict and _nullable_strings(tags)))
        and (dv is not None or raw_dv is None)
        and (base_row_id is None or (type(base_row_id) is int and _MIN_LONG <= base_row_id <= _MAX_LONG))
        and (
            row_commit_version is None
            or (type(row_commit_version) is int and _MIN_LONG <= row_commit_version <= _MAX_LONG)
        )
        and (clustering_provider is None or type(clustering_provider) is str)
    ):
        raise _invalid("add", a, _ADD_SCHEMA)
    return Add(  # positional, in field order: this runs once per add of a log
        decode_path(path),
        partition_values,
        size,
        modification_time,
        data_change,
        stats,
        tags,
        dv,
        base_row_id,
        row_commit_version,
        clustering_provider,
    )


def parse_remove(r: dict[str, Any]) -> Remove:
    """Parse the body of a ``remove`` action.

    Raises:
        InvalidLogError: if ``path`` or ``dataChange`` is missing or null, or any typed field has the
            wrong JSON type; the message names the field.
    """
    if type(r) is not dict:
        raise _invalid("remove", r, _REMOVE_SCHEMA)
    get = r.get
    path = get("path")
    deletion_timestamp = get("deletionTimestamp")
    data_change = get("dataChange")
    extended = get("extendedFileMetadata")
    partition_values = get("partitionValues")
    size = get("size")
    stats = get("stats")
    tags = get("tags")
    raw_dv = get("deletionVector")
    base_row_id = get("baseRowId")
    row_commit_version = get("defaultRowCommitVersion")
    dv = None if raw_dv is None else _deletion_vector(raw_dv)
    if not (
        type(path) is str
        and (
            deletion_timestamp is None
            or (type(deletion_timestamp) is int and _MIN_LONG <= deletion_timestamp <= _MAX_LONG)
        )
        and type(data_change) is bool
        and (extended is None or type(extended) is bool)
        and (partition_values is None or (type(partition_values) is dict and _nullable_strings(partition_values)))
        and (size is None or (type(size) is int and _MIN_LONG <= size <= _MAX_LONG))
        and (stats is None or type(stats) is str)
        and (tags is None or (type(tags) is dict and _nullable_strings(tags)))
        and (dv is not None or raw_dv is None)
        and (base_row_id is None or (type(base_row_id) is int and _MIN_LONG <= base_row_id <= _MAX_LONG))
        and (
            row_commit_version is None
            or (type(row_commit_version) is int and _MIN_LONG <= row_commit_version <= _MAX_LONG)
        )
    ):
        raise _invalid("remove", r, _REMOVE_SCHEMA)
    return Remove(  # positional, in field order: this runs once per remove of a log
        decode_path(path),
        deletion_timestamp,
        data_change,
        extended,
        partition_values,
        size,
        stats,
        tags,
        dv,
        base_row_id,
        row_commit_version,
    )


def parse_metadata(m: dict[str, Any]) -> Metadata:
    """Parse the body of a ``metaData`` action.

    Raises:
        InvalidLogError: if ``id``, ``format`` (with its ``provider``), ``partitionColumns`` or
            ``configuration`` is missing or null, or any typed field has the wrong JSON type.
    """
    _validate("metaData", m, _METADATA_SCHEMA)
    fmt = m["format"]
    return Metadata(
        id=m["id"],
        schema_string=m.get("schemaString"),
        partition_columns=tuple(m["partitionColumns"]),
        configuration=dict(m["configuration"]),
        name=m.get("name"),
        description=m.get("description"),
        format=Format(fmt["provider"], dict(fmt.get("options") or {})),
        created_time=m.get("createdTime"),
    )


def parse_protocol(p: dict[str, Any]) -> Protocol:
    """Parse the body of a ``protocol`` action.

    Raises:
        InvalidLogError: if a version is missing, null or not an Int, or a feature list is not an
            array of strings.
    """
    _validate("protocol", p, _PROTOCOL_SCHEMA)
    readers = p.get("readerFeatures")
    writers = p.get("writerFeatures")
    return Protocol(
        min_reader_version=p["minReaderVersion"],
        min_writer_version=p["minWriterVersion"],
        reader_features=None if readers is None else frozenset(readers),
        writer_features=None if writers is None else frozenset(writers),
    )


def _parse_cdc(c: dict[str, Any]) -> AddCDCFile:
    _validate("cdc", c, _CDC_SCHEMA)
    return AddCDCFile(
        path=decode_path(c["path"]),
        partition_values=c["partitionValues"],
        size=c["size"],
        data_change=c["dataChange"],
        tags=c.get("tags"),
    )


def _parse_txn(t: dict[str, Any]) -> Txn:
    _validate("txn", t, _TXN_SCHEMA)
    return Txn(app_id=t["appId"], version=t["version"], last_updated=t.get("lastUpdated"))


def _parse_domain(d: dict[str, Any]) -> DomainMetadata:
    _validate("domainMetadata", d, _DOMAIN_SCHEMA)
    return DomainMetadata(domain=d["domain"], configuration=d["configuration"], removed=d["removed"])


def _parse_sidecar(s: dict[str, Any]) -> Sidecar:
    _validate("sidecar", s, _SIDECAR_SCHEMA)
    return Sidecar(
        path=decode_path(s["path"]),
        size_in_bytes=s["sizeInBytes"],
        modification_time=s["modificationTime"],
        tags=s.get("tags"),
    )


def _parse_checkpoint_metadata(c: dict[str, Any]) -> CheckpointMetadata:
    _validate("checkpointMetadata", c, _CHECKPOINT_METADATA_SCHEMA)
    return CheckpointMetadata(version=c["version"], tags=c.get("tags"))


def _parse_commit_info(c: dict[str, Any]) -> CommitInfo:
    if type(c) is dict:
        ict = c.get("inCommitTimestamp")  # the one typed field (the schema's check, inline: once per commit)
        if ict is None or (type(ict) is int and _MIN_LONG <= ict <= _MAX_LONG):
            return CommitInfo(raw=c)
    raise _invalid("commitInfo", c, _COMMIT_INFO_SCHEMA)


_PARSERS: dict[str, Callable[[Any], Action]] = {
    "add": parse_add,
    "remove": parse_remove,
    "metaData": parse_metadata,
    "protocol": parse_protocol,
    "cdc": _parse_cdc,
    "txn": _parse_txn,
    "commitInfo": _parse_commit_info,
    "domainMetadata": _parse_domain,
    "sidecar": _parse_sidecar,
    "checkpointMetadata": _parse_checkpoint_metadata,
}


def parse_action(obj: dict[str, Any]) -> Action | None:
    """Parse one action object (``{"add": {...}}``); unknown actions, and known ones that are null, give ``None``.

    ``obj`` is a decoded JSON object (or a Parquet checkpoint row as Python values, where absent
    fields are null). Unknown fields of known actions are ignored.

    Raises:
        InvalidLogError: if a known action is not an object, lacks a required field, or has a field of
            the wrong JSON type; the message names the action and the field (nested fields dotted,
            e.g. ``deletionVector.sizeInBytes``).
    """
    for key, body in obj.items():
        parser = _PARSERS.get(key)
        if parser is None or body is None:
            continue
        return parser(body)
    return None


def parse_json_actions(data: bytes) -> list[Action]:
    """Parse newline-delimited JSON actions (a commit, a JSON checkpoint, a sidecar, a compaction file).

    Blank lines are ignored. Unknown actions and fields are ignored.

    Raises:
        InvalidLogError: if a line is not a JSON object (e.g. a truncated file) or an action is malformed;
            the message gives the 1-based line number.
    """
    actions: list[Action] = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            if line.isspace() or not line:
                continue
            raise InvalidLogError(f"line {number} is not valid JSON ({e})") from e
        if type(obj) is not dict:
            raise InvalidLogError(f"line {number} is not a JSON object")
        try:
            action = parse_action(obj)
        except InvalidLogError as e:
            raise InvalidLogError(f"line {number}: {e.message}") from e
        if action is not None:
            actions.append(action)
    return actions
