"""Build an :class:`~state.audit.event.AuditEvent` from a commit and the snapshot before it. Pure: no IO.

Where each fact comes from is told in :mod:`state.audit`. The commit's row figures (and the
table's row count after it) are worked out in :mod:`state.audit.row_figures`; this module maps
``commitInfo`` (operation, actor, transaction) and the differences in schema, protocol,
properties, metadata and domains.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import orjson

from deltatail.state.actions import DomainMetadata, Metadata, Protocol
from deltatail.state.audit.event import Actor, AppTransaction, AuditEvent, ProtocolChange, TransactionInfo, ValueChange
from deltatail.state.audit.row_figures import RowCount, _counts, _FileRows, _int, _settle_unknown
from deltatail.state.changes import commit_timestamp, is_noop_merge
from deltatail.state.commit import Commit
from deltatail.state.errors import InvalidLogError, VersionGapError
from deltatail.state.schema_diff import SchemaDiff, diff_schemas
from deltatail.state.snapshot import Snapshot

#: commitInfo keys mapped to typed fields; the rest go to ``commit_info_extra``.
_MAPPED_KEYS = frozenset(
    {
        "timestamp",
        "inCommitTimestamp",
        "operation",
        "operationParameters",
        "operationMetrics",
        "userId",
        "userName",
        "engineInfo",
        "clientVersion",
        "job",
        "notebook",
        "clusterId",
        "userMetadata",
        "isolationLevel",
        "isBlindAppend",
        "readVersion",
        "txnId",
    }
)


def build_audit_event(
    commit: Commit,
    before: Snapshot,
    *,
    file_mtime_ms: int,
    previous_timestamp_ms: int | None,
    table_rows_before: int | None = None,
    row_count: RowCount | None = None,
) -> AuditEvent:
    """The audit event of ``commit``, applied to ``before`` (the snapshot at ``commit.version - 1``).

    Args:
        commit: the commit (one version; not a compacted range).
        before: the snapshot just before it. Its files are used only to find the
            size of a removed file whose ``remove`` omits it; a snapshot already
            handed on by ``apply`` leaves such sizes unknown (``bytes_removed`` ``None``).
        file_mtime_ms: the commit file's modification time (epoch ms).
        previous_timestamp_ms: the ``_commit_timestamp`` of the previous version, if known.
        table_rows_before: the table's live rows before the commit, if the caller tracks them.
        row_count: the physical rows of a data file, by its (decoded, table-relative)
            path, for file actions without ``numRecords`` statistics; called only
            when a figure needs it. Returns ``None`` if it cannot tell.

    Raises:
        VersionGapError: if ``commit`` does not follow ``before``.
        InvalidLogError: if there is no metadata after the commit, or a schema string does not parse.
    """
    if commit.version != before.version + 1:
        raise VersionGapError(
            f"commit {commit.version} does not follow version {before.version}",
            table=before.table,
            version=commit.version,
        )
    metadata = commit.metadata or before.metadata
    if metadata is None:
        raise InvalidLogError("no metaData action found in the log", table=before.table, version=commit.version)
    protocol = commit.protocol or before.protocol
    info = commit.commit_info
    raw: Mapping[str, Any] = {} if info is None else info.raw
    operation = _str(raw.get("operation"))
    parameters = _dict(raw.get("operationParameters"))
    metrics = _dict(raw.get("operationMetrics"))
    schema_change = _schema_change(before, commit.metadata, commit.version)
    protocol_change = _protocol_change(before.protocol, protocol) if commit.protocol is not None else None
    property_changes, metadata_changes = (
        _metadata_changes(before.metadata, commit.metadata) if commit.metadata is not None else ((), ())
    )
    domain_changes = _domain_changes(before.domains, commit.domain_metadata) if commit.domain_metadata else ()
    data_adds = data_removes = 0
    for a in commit.adds:
        if a.data_change:
            data_adds += 1
    for r in commit.removes:
        if r.data_change:
            data_removes += 1
    has_changes = bool(data_adds or data_removes or commit.cdcs)
    data_change = has_changes and not is_noop_merge(commit)
    rows = _FileRows(commit, row_count)
    counts = _counts(
        commit, before, operation, metrics, rows, (data_adds, data_removes), has_changes, table_rows_before
    )
    if not data_change and has_changes:  # a MERGE whose metrics report no change: nothing else was moved either
        counts = _settle_unknown(counts)
    no_op = not (
        commit.adds
        or commit.removes
        or commit.cdcs
        or schema_change
        or protocol_change
        or property_changes
        or metadata_changes
        or domain_changes
    )
    return AuditEvent(
        table_path=before.table,
        table_id=metadata.id,
        version=commit.version,
        timestamp_ms=commit_timestamp(commit, metadata, file_mtime_ms, previous_timestamp_ms),
        commit_info_timestamp_ms=None if info is None else info.timestamp,
        in_commit_timestamp_ms=commit.in_commit_timestamp,
        operation=operation,
        operation_parameters=parameters,
        predicate=_predicate(parameters),
        actor=_actor(raw),
        transaction=_transaction(raw, commit),
        operation_metrics=metrics,
        counts=counts,
        schema_change=schema_change,
        protocol_change=protocol_change,
        property_changes=property_changes,
        metadata_changes=metadata_changes,
        domain_changes=domain_changes,
        table_created=before.metadata is None,
        data_change=data_change,
        no_op=no_op,
        commit_info_extra={} if raw.keys() <= _MAPPED_KEYS else {k: v for k, v in raw.items() if k not in _MAPPED_KEYS},
    )


def _str(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    return orjson.dumps(value).decode()


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _dict(value: Any) -> Mapping[str, Any]:
    """A JSON object of ``commitInfo`` as it is (shared with the commit; neither changes it), else empty."""
    return value if type(value) is dict else _EMPTY


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _predicate(parameters: Mapping[str, Any]) -> str | None:
    """``predicate``, or delta-rs's ``mergePredicate``; Delta Spark's JSON list of conjuncts is joined with AND."""
    for key in ("predicate", "mergePredicate"):
        value = parameters.get(key)
        if value is None:
            continue
        if isinstance(value, str) and value.startswith("["):
            try:
                parts = orjson.loads(value)
            except orjson.JSONDecodeError:
                return value
            if isinstance(parts, list) and all(isinstance(p, str) for p in parts):
                return " AND ".join(parts) if parts else None
        return _str(value)
    return None


#: A commit without transaction facts (delta-rs appends, Kernel commits): one shared value.
_NO_TRANSACTION = TransactionInfo()


def _transaction(raw: Mapping[str, Any], commit: Commit) -> TransactionInfo:
    get = raw.get
    isolation, blind, read, txn_id = get("isolationLevel"), get("isBlindAppend"), get("readVersion"), get("txnId")
    if isolation is None and blind is None and read is None and txn_id is None and not commit.txns:
        return _NO_TRANSACTION
    return TransactionInfo(
        isolation_level=_str(isolation),
        is_blind_append=_bool(blind),
        read_version=_int(read),
        txn_id=_str(txn_id),
        app_transactions=tuple(AppTransaction(t.app_id, t.version, t.last_updated) for t in commit.txns),
    )


#: Actors built lately, by their fields: a writer's commits share one value (at most this many kept).
_ACTOR_CACHE_SIZE = 256
_actors: dict[tuple[Any, ...], Actor] = {}


def _actor(raw: Mapping[str, Any]) -> Actor:
    """The commit's actor; an equal one built before is reused (a value: sharing it is safe)."""
    get = raw.get
    if get("job") is None and get("notebook") is None:  # most writers: the key is the flat fields alone
        key = (
            get("userId"),
            get("userName"),
            get("engineInfo"),
            get("clientVersion"),
            get("clusterId"),
            get("userMetadata"),
        )
        try:
            actor = _actors.get(key)  # only keys of strings are kept: no other value can equal one
        except TypeError:  # a JSON structure among them: not a key
            actor = None
        if actor is None:
            fields = [_str(v) for v in key]
            actor = Actor(fields[0], fields[1], fields[2], fields[3], cluster_id=fields[4], user_metadata=fields[5])
            if all(v is None or type(v) is str for v in key):
                if len(_actors) >= _ACTOR_CACHE_SIZE:
                    _actors.clear()
                _actors[key] = actor
        return actor
    return _full_actor(raw)


def _full_actor(raw: Mapping[str, Any]) -> Actor:
    get = raw.get
    job = get("job")
    notebook = get("notebook")
    job_id = job_name = job_run_id = job_owner_id = job_trigger_type = None
    if isinstance(job, dict):
        job_id, job_name, job_run_id = _str(job.get("jobId")), _str(job.get("jobName")), _str(job.get("runId"))
        job_owner_id, job_trigger_type = _str(job.get("jobOwnerId")), _str(job.get("triggerType"))
    notebook_id = notebook_path = None
    if isinstance(notebook, dict):
        notebook_id, notebook_path = _str(notebook.get("notebookId")), _str(notebook.get("notebookPath"))
    return Actor(
        _str(get("userId")),
        _str(get("userName")),
        _str(get("engineInfo")),
        _str(get("clientVersion")),
        job_id,
        job_name,
        job_run_id,
        job_owner_id,
        job_trigger_type,
        notebook_id,
        notebook_path,
        _str(get("clusterId")),
        _str(get("userMetadata")),
    )


# -- state differences --------------------------------------------------------------------------


def _schema_change(before: Snapshot, new: Metadata | None, version: int) -> SchemaDiff | None:
    if new is None:
        return None
    if before.metadata is not None and before.metadata.schema_string == new.schema_string:
        return None
    try:
        new_schema = new.schema()
    except InvalidLogError as e:
        raise e.at(table=before.table, version=version) from None
    old_schema = None if before.metadata is None else before.schema
    diff = diff_schemas(old_schema, new_schema)
    return diff if diff else None


def _features(protocol: Protocol | None, reader: bool) -> frozenset[str]:
    if protocol is None:
        return frozenset()
    features = protocol.reader_features if reader else protocol.writer_features
    return features or frozenset()


def _protocol_change(old: Protocol | None, new: Protocol | None) -> ProtocolChange | None:
    if new is None or old == new:
        return None
    old_r, new_r = _features(old, True), _features(new, True)
    old_w, new_w = _features(old, False), _features(new, False)
    return ProtocolChange(
        old_min_reader_version=None if old is None else old.min_reader_version,
        old_min_writer_version=None if old is None else old.min_writer_version,
        new_min_reader_version=new.min_reader_version,
        new_min_writer_version=new.min_writer_version,
        reader_features_added=tuple(sorted(new_r - old_r)),
        reader_features_removed=tuple(sorted(old_r - new_r)),
        writer_features_added=tuple(sorted(new_w - old_w)),
        writer_features_removed=tuple(sorted(old_w - new_w)),
    )


def _map_changes(old: Mapping[str, str | None], new: Mapping[str, str | None]) -> tuple[ValueChange, ...]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a != b:
            changes.append(ValueChange(key, a, b))
    return tuple(changes)


def _metadata_fields(m: Metadata | None) -> dict[str, str | None]:
    if m is None:
        return {}
    return {
        "id": m.id,
        "name": m.name,
        "description": m.description,
        "partition_columns": orjson.dumps(list(m.partition_columns)).decode(),
        "format": m.format.provider,
        "format_options": orjson.dumps(m.format.options, option=orjson.OPT_SORT_KEYS).decode()
        if m.format.options
        else None,
    }


def _metadata_changes(old: Metadata | None, new: Metadata) -> tuple[tuple[ValueChange, ...], tuple[ValueChange, ...]]:
    old_config: Mapping[str, str | None] = {} if old is None else old.configuration
    properties = _map_changes(old_config, new.configuration)
    fields = _map_changes(_metadata_fields(old), _metadata_fields(new))
    return properties, fields


def _domain_changes(old: Mapping[str, DomainMetadata], actions: Iterable[DomainMetadata]) -> tuple[ValueChange, ...]:
    changes = []
    for d in actions:
        before = old.get(d.domain)
        a = None if before is None else before.configuration
        b = None if d.removed else d.configuration
        if a != b:
            changes.append(ValueChange(d.domain, a, b))
    return tuple(changes)
