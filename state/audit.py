"""The audit event of one commit: who changed what, when, and how much. Pure: no IO.

:func:`build_audit_event` turns a :class:`~state.commit.Commit` and the
snapshot *before* it into an :class:`AuditEvent`. The state after the commit
(protocol, metadata, domains) is derived from the two exactly as
:meth:`Snapshot.apply <state.snapshot.Snapshot.apply>` derives it, so the
caller may build the event before or after applying the commit; only sizes of
removed files the log omits are looked up in the snapshot's files, which
``apply`` hands on (after it they are unknown).

Where the facts come from
-------------------------

- ``timestamp_ms``: the ``_commit_timestamp`` rule of change rows
  (:func:`state.changes.commit_timestamp`): the in-commit timestamp where
  enabled, else the commit file's modification time made monotonic.
- ``commitInfo`` (free-form, written by the writer): operation, parameters,
  metrics, user, engine, job/notebook/cluster, isolation level, blind append,
  read version, transaction id. What each writer records differs: Delta Spark
  writes ``engineInfo``, ``txnId``, ``isolationLevel``, ``isBlindAppend``,
  ``readVersion`` and string-valued metrics (``numOutputRows``...);
  Databricks adds ``userId``, ``userName``, ``clusterId``, ``notebook``,
  ``job`` and ``tags``; delta-rs writes ``clientVersion`` (and from 1.x
  ``engineInfo``) and number-valued snake_case metrics (``num_added_rows``...);
  Delta Kernel (Java) writes ``engineInfo``, ``txnId``, ``isBlindAppend``. A
  field the writer did not record is ``None``. Keys not mapped to a field are
  kept in ``commit_info_extra``.
- File and byte counts: from the commit's ``add``/``remove``/``cdc`` actions.
- Row counts (``rows_inserted``, ``rows_deleted``, ``rows_updated``,
  ``rows_copied``), each with its source in ``row_sources``:

  ``counted``
      from the commit's change rows (:meth:`AuditEvent.with_counted`).
  ``metrics``
      from ``operationMetrics``: Delta Spark ``numOutputRows`` (writes),
      ``numDeletedRows``, ``numUpdatedRows``, ``numCopiedRows``,
      ``numTargetRowsInserted/Updated/Deleted/Copied`` (MERGE); delta-rs
      ``num_added_rows``, ``num_deleted_rows``, ``num_updated_rows``,
      ``num_copied_rows``, ``num_target_rows_inserted/updated/deleted/copied``.
  ``files``
      from the data-changing file actions, when the metrics lack a figure and
      the commit has no cdc files: rows of added files are inserted, rows of
      removed files deleted (a DELETE's deleted rows are the removed files'
      rows minus the added files' rows, which is exact for copy-on-write and
      for deletion vectors). A file's rows are ``numRecords`` of its
      statistics, or what the caller's ``row_count`` gives, minus its
      deletion vector's cardinality.
  ``operation``
      implied by the operation: a DELETE inserts and updates nothing, an UPDATE
      inserts and deletes nothing.
  ``no_data_change``
      the commit changes no rows (no ``dataChange`` file action, no cdc file).

  A figure none of these gives is ``None`` (source ``unknown``).
- ``table_rows_before``/``table_rows_after``: the caller's row count of the
  table before the commit, moved on by ``rows_inserted - rows_deleted`` (or,
  where one of those is unknown, by the rows of the data-changing file
  actions); ``None`` when not given or neither way tells.
- Schema, protocol, property, metadata and domain changes: the effective
  difference between the state before and after (an action that repeats the
  old value is no change). The schema difference resolves column mapping (see
  :mod:`state.schema_diff`).
- ``no_op``: the commit has no file actions and changes no protocol, metadata
  or domain (a commit of only ``commitInfo`` and ``txn``, for example).
  ``data_change``: the commit changes rows (a ``dataChange`` file action or a
  cdc file, and not a MERGE whose metrics report no changed rows).

The dict form (:meth:`AuditEvent.to_json`) is documented there; it is what an
audit log line and the Kafka commit topic carry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any, Final

import orjson

from state.actions import Add, DomainMetadata, Metadata, Protocol, Remove
from state.changes import commit_timestamp, is_noop_merge
from state.commit import Commit
from state.errors import InvalidLogError, VersionGapError
from state.files import FileKey
from state.schema_diff import SchemaDiff, diff_schemas
from state.snapshot import Snapshot

#: The ``format`` tag of an event's dict form; bumped when a field changes meaning or is removed.
AUDIT_FORMAT = "deltatail.audit.commit/1"

#: Where a row figure came from (see the module docstring).
ROW_SOURCES = ("counted", "metrics", "files", "operation", "no_data_change", "unknown")

#: The row figures, in order.
ROW_FIGURES = ("inserted", "deleted", "updated", "copied")


@dataclass(frozen=True, slots=True)
class Actor:
    """Who and what wrote the commit, as far as the writer recorded it."""

    user_id: str | None = None
    user_name: str | None = None
    engine_info: str | None = None
    client_version: str | None = None
    job_id: str | None = None
    job_name: str | None = None
    job_run_id: str | None = None
    job_owner_id: str | None = None
    job_trigger_type: str | None = None
    notebook_id: str | None = None
    notebook_path: str | None = None
    cluster_id: str | None = None
    user_metadata: str | None = None

    @property
    def user(self) -> str | None:
        """The user name, else the user id, else ``None``."""
        return self.user_name if self.user_name is not None else self.user_id


@dataclass(frozen=True, slots=True)
class AppTransaction:
    """A ``txn`` action of the commit: an application's progress marker."""

    app_id: str
    version: int
    last_updated: int | None = None


@dataclass(frozen=True, slots=True)
class TransactionInfo:
    """The commit's concurrency facts."""

    isolation_level: str | None = None
    is_blind_append: bool | None = None
    read_version: int | None = None
    txn_id: str | None = None
    app_transactions: tuple[AppTransaction, ...] = ()


@dataclass(slots=True, unsafe_hash=True)
class Counts:
    """Files, bytes and rows the commit moved. ``row_sources`` maps each row figure to its source."""

    files_added: Final[int] = 0
    files_removed: Final[int] = 0
    data_files_added: Final[int] = 0
    data_files_removed: Final[int] = 0
    cdc_files: Final[int] = 0
    bytes_added: Final[int] = 0
    bytes_removed: Final[int | None] = 0
    rows_inserted: Final[int | None] = None
    rows_deleted: Final[int | None] = None
    rows_updated: Final[int | None] = None
    rows_copied: Final[int | None] = None
    row_sources: Final[Mapping[str, str]] = field(default_factory=dict, hash=False)
    table_rows_before: Final[int | None] = None
    table_rows_after: Final[int | None] = None


@dataclass(frozen=True, slots=True)
class ValueChange:
    """One key whose value changed: ``old`` is ``None`` when it was absent before, ``new`` when absent after."""

    key: str
    old: str | None
    new: str | None

    @property
    def change(self) -> str:
        """``added``, ``removed`` or ``changed``."""
        if self.old is None:
            return "added"
        if self.new is None:
            return "removed"
        return "changed"


@dataclass(frozen=True, slots=True)
class ProtocolChange:
    """The protocol before and after (versions ``None`` before the first protocol) and the features that moved."""

    old_min_reader_version: int | None
    old_min_writer_version: int | None
    new_min_reader_version: int
    new_min_writer_version: int
    reader_features_added: tuple[str, ...] = ()
    reader_features_removed: tuple[str, ...] = ()
    writer_features_added: tuple[str, ...] = ()
    writer_features_removed: tuple[str, ...] = ()


@dataclass(slots=True, unsafe_hash=True)
class AuditEvent:
    """The audit record of one commit. Build with :func:`build_audit_event`; see the module docstring."""

    table_path: Final[str]
    table_id: Final[str | None]
    version: Final[int]
    timestamp_ms: Final[int]
    commit_info_timestamp_ms: Final[int | None]
    in_commit_timestamp_ms: Final[int | None]
    operation: Final[str | None]
    operation_parameters: Final[Mapping[str, Any]] = field(hash=False)
    predicate: Final[str | None]
    actor: Final[Actor]
    transaction: Final[TransactionInfo]
    operation_metrics: Final[Mapping[str, Any]] = field(hash=False)
    counts: Final[Counts]
    schema_change: Final[SchemaDiff | None]
    protocol_change: Final[ProtocolChange | None]
    property_changes: Final[tuple[ValueChange, ...]]
    metadata_changes: Final[tuple[ValueChange, ...]]
    domain_changes: Final[tuple[ValueChange, ...]]
    table_created: Final[bool]
    data_change: Final[bool]
    no_op: Final[bool]
    commit_info_extra: Final[Mapping[str, Any]] = field(hash=False)

    # -- views used by rules and reports ----------------------------------------------------------

    @property
    def user(self) -> str | None:
        """The user name, else the user id, else ``None``."""
        return self.actor.user

    @property
    def rows_deleted_pct(self) -> float | None:
        """Rows deleted as a percentage of the table's rows before the commit; ``None`` if either is unknown."""
        deleted, before = self.counts.rows_deleted, self.counts.table_rows_before
        if deleted is None or before is None:
            return None
        if before <= 0:
            return 0.0 if deleted == 0 else None
        return 100.0 * deleted / before

    @property
    def timestamp_iso(self) -> str:
        """``timestamp_ms`` as ISO-8601 UTC with milliseconds, e.g. ``2024-05-01T12:00:00.123Z``."""
        return iso_utc(self.timestamp_ms)

    def with_counted(self, counts: Mapping[str, int]) -> AuditEvent:
        """This event with its row figures counted from the commit's change rows.

        Args:
            counts: rows per ``_change_type`` (``insert``, ``delete``,
                ``update_preimage``, ``update_postimage``); absent types count 0.
                ``rows_updated`` is the number of ``update_postimage`` rows;
                ``rows_copied`` becomes ``None`` (change rows do not show copies).
        """
        c = self.counts
        sources = {"inserted": "counted", "deleted": "counted", "updated": "counted", "copied": "unknown"}
        counted = replace(
            c,
            rows_inserted=int(counts.get("insert", 0)),
            rows_deleted=int(counts.get("delete", 0)),
            rows_updated=int(counts.get("update_postimage", 0)),
            rows_copied=None,
            row_sources=sources,
        )
        return replace(self, counts=counted)

    # -- dict form -------------------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The event as a JSON-ready dict, of a stable shape.

        Fields are never renamed or removed without a new ``format`` tag; new ones may
        be added. The shape (``format`` ``deltatail.audit.commit/1``)::

            {
              "format": "deltatail.audit.commit/1",
              "table": {"path": str, "id": str | null},
              "version": int,
              "timestamp_ms": int,                 # the _commit_timestamp rule
              "timestamp": "2024-05-01T12:00:00.123Z",
              "commit_info_timestamp_ms": int | null,   # commitInfo.timestamp as written
              "in_commit_timestamp_ms": int | null,
              "operation": str | null,
              "operation_parameters": {...},       # as written
              "predicate": str | null,             # Spark's list of conjuncts joined with " AND "
              "actor": {"user_id", "user_name", "engine_info", "client_version", "job_id", "job_name",
                        "job_run_id", "job_owner_id", "job_trigger_type", "notebook_id", "notebook_path",
                        "cluster_id", "user_metadata"},             # each str | null
              "transaction": {"isolation_level": str | null, "is_blind_append": bool | null,
                              "read_version": int | null, "txn_id": str | null,
                              "app_transactions": [{"app_id": str, "version": int, "last_updated": int | null}]},
              "operation_metrics": {...},          # as written (strings in Delta Spark, numbers elsewhere)
              "counts": {"files_added": int, "files_removed": int, "data_files_added": int,
                         "data_files_removed": int, "cdc_files": int, "bytes_added": int,
                         "bytes_removed": int | null, "rows_inserted": int | null, "rows_deleted": int | null,
                         "rows_updated": int | null, "rows_copied": int | null,
                         "row_sources": {"inserted"|"deleted"|"updated"|"copied": source},
                         "table_rows_before": int | null, "table_rows_after": int | null},
              "schema_change": null | {"added": [path], "dropped": [path],
                                       "renamed": [{"old_path", "new_path"}],
                                       "type_changed": [{"path", "old_type", "new_type"}],
                                       "nullability_changed": [{"path", "old_nullable", "new_nullable"}],
                                       "metadata_changed": [path]},
              "protocol_change": null | {"old_min_reader_version": int | null, "old_min_writer_version": int | null,
                                         "new_min_reader_version": int, "new_min_writer_version": int,
                                         "reader_features_added": [str], "reader_features_removed": [str],
                                         "writer_features_added": [str], "writer_features_removed": [str]},
              "property_changes": [{"key": str, "old": str | null, "new": str | null,
                                    "change": "added" | "changed" | "removed"}],
              "metadata_changes": [...same shape; keys "id", "name", "description", "partition_columns",
                                   "format"...],
              "domain_changes": [...same shape; key = domain, values = its configuration],
              "table_created": bool, "data_change": bool, "no_op": bool,
              "commit_info_extra": {...}           # commitInfo keys not mapped above (e.g. "tags")
            }
        """
        c = self.counts
        return {
            "format": AUDIT_FORMAT,
            "table": {"path": self.table_path, "id": self.table_id},
            "version": self.version,
            "timestamp_ms": self.timestamp_ms,
            "timestamp": self.timestamp_iso,
            "commit_info_timestamp_ms": self.commit_info_timestamp_ms,
            "in_commit_timestamp_ms": self.in_commit_timestamp_ms,
            "operation": self.operation,
            "operation_parameters": dict(self.operation_parameters),
            "predicate": self.predicate,
            "actor": {name: getattr(self.actor, name) for name in _ACTOR_FIELDS},
            "transaction": {
                "isolation_level": self.transaction.isolation_level,
                "is_blind_append": self.transaction.is_blind_append,
                "read_version": self.transaction.read_version,
                "txn_id": self.transaction.txn_id,
                "app_transactions": [
                    {"app_id": t.app_id, "version": t.version, "last_updated": t.last_updated}
                    for t in self.transaction.app_transactions
                ],
            },
            "operation_metrics": dict(self.operation_metrics),
            "counts": {
                "files_added": c.files_added,
                "files_removed": c.files_removed,
                "data_files_added": c.data_files_added,
                "data_files_removed": c.data_files_removed,
                "cdc_files": c.cdc_files,
                "bytes_added": c.bytes_added,
                "bytes_removed": c.bytes_removed,
                "rows_inserted": c.rows_inserted,
                "rows_deleted": c.rows_deleted,
                "rows_updated": c.rows_updated,
                "rows_copied": c.rows_copied,
                "row_sources": dict(c.row_sources),
                "table_rows_before": c.table_rows_before,
                "table_rows_after": c.table_rows_after,
            },
            "schema_change": None if self.schema_change is None else self.schema_change.to_json(),
            "protocol_change": None if self.protocol_change is None else _protocol_json(self.protocol_change),
            "property_changes": [_change_json(v) for v in self.property_changes],
            "metadata_changes": [_change_json(v) for v in self.metadata_changes],
            "domain_changes": [_change_json(v) for v in self.domain_changes],
            "table_created": self.table_created,
            "data_change": self.data_change,
            "no_op": self.no_op,
            "commit_info_extra": dict(self.commit_info_extra),
        }

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> AuditEvent:
        """Read an event back from its dict form (an audit log line).

        Raises:
            InvalidLogError: if ``raw`` is not an event of format ``deltatail.audit.commit/1``.
        """
        if raw.get("format") != AUDIT_FORMAT:
            raise InvalidLogError(f"not an audit event of format {AUDIT_FORMAT!r} (format {raw.get('format')!r})")
        try:
            return _event_from_json(raw)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InvalidLogError(f"malformed audit event: {type(e).__name__}: {e}", version=raw.get("version")) from e


_ACTOR_FIELDS = (
    "user_id",
    "user_name",
    "engine_info",
    "client_version",
    "job_id",
    "job_name",
    "job_run_id",
    "job_owner_id",
    "job_trigger_type",
    "notebook_id",
    "notebook_path",
    "cluster_id",
    "user_metadata",
)


def iso_utc(ms: int) -> str:
    """Epoch milliseconds as ISO-8601 UTC with milliseconds (``2024-05-01T12:00:00.123Z``)."""
    moment = datetime.fromtimestamp(ms // 1000, UTC)
    return f"{moment:%Y-%m-%dT%H:%M:%S}.{ms % 1000:03d}Z"


def _change_json(v: ValueChange) -> dict[str, Any]:
    return {"key": v.key, "old": v.old, "new": v.new, "change": v.change}


def _protocol_json(p: ProtocolChange) -> dict[str, Any]:
    return {
        "old_min_reader_version": p.old_min_reader_version,
        "old_min_writer_version": p.old_min_writer_version,
        "new_min_reader_version": p.new_min_reader_version,
        "new_min_writer_version": p.new_min_writer_version,
        "reader_features_added": list(p.reader_features_added),
        "reader_features_removed": list(p.reader_features_removed),
        "writer_features_added": list(p.writer_features_added),
        "writer_features_removed": list(p.writer_features_removed),
    }


def _event_from_json(raw: Mapping[str, Any]) -> AuditEvent:
    t, c, tx = raw["transaction"], raw["counts"], raw["table"]
    p = raw["protocol_change"]
    s = raw["schema_change"]
    return AuditEvent(
        table_path=tx["path"],
        table_id=tx["id"],
        version=int(raw["version"]),
        timestamp_ms=int(raw["timestamp_ms"]),
        commit_info_timestamp_ms=raw["commit_info_timestamp_ms"],
        in_commit_timestamp_ms=raw["in_commit_timestamp_ms"],
        operation=raw["operation"],
        operation_parameters=dict(raw["operation_parameters"]),
        predicate=raw["predicate"],
        actor=Actor(**{name: raw["actor"][name] for name in _ACTOR_FIELDS}),
        transaction=TransactionInfo(
            isolation_level=t["isolation_level"],
            is_blind_append=t["is_blind_append"],
            read_version=t["read_version"],
            txn_id=t["txn_id"],
            app_transactions=tuple(
                AppTransaction(a["app_id"], int(a["version"]), a["last_updated"]) for a in t["app_transactions"]
            ),
        ),
        operation_metrics=dict(raw["operation_metrics"]),
        counts=Counts(
            files_added=c["files_added"],
            files_removed=c["files_removed"],
            data_files_added=c["data_files_added"],
            data_files_removed=c["data_files_removed"],
            cdc_files=c["cdc_files"],
            bytes_added=c["bytes_added"],
            bytes_removed=c["bytes_removed"],
            rows_inserted=c["rows_inserted"],
            rows_deleted=c["rows_deleted"],
            rows_updated=c["rows_updated"],
            rows_copied=c["rows_copied"],
            row_sources=dict(c["row_sources"]),
            table_rows_before=c["table_rows_before"],
            table_rows_after=c["table_rows_after"],
        ),
        schema_change=None if s is None else SchemaDiff.from_json(s),
        protocol_change=None
        if p is None
        else ProtocolChange(
            old_min_reader_version=p["old_min_reader_version"],
            old_min_writer_version=p["old_min_writer_version"],
            new_min_reader_version=p["new_min_reader_version"],
            new_min_writer_version=p["new_min_writer_version"],
            reader_features_added=tuple(p["reader_features_added"]),
            reader_features_removed=tuple(p["reader_features_removed"]),
            writer_features_added=tuple(p["writer_features_added"]),
            writer_features_removed=tuple(p["writer_features_removed"]),
        ),
        property_changes=tuple(ValueChange(v["key"], v["old"], v["new"]) for v in raw["property_changes"]),
        metadata_changes=tuple(ValueChange(v["key"], v["old"], v["new"]) for v in raw["metadata_changes"]),
        domain_changes=tuple(ValueChange(v["key"], v["old"], v["new"]) for v in raw["domain_changes"]),
        table_created=bool(raw["table_created"]),
        data_change=bool(raw["data_change"]),
        no_op=bool(raw["no_op"]),
        commit_info_extra=dict(raw["commit_info_extra"]),
    )


# -- building -----------------------------------------------------------------------------------

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

#: Row metrics by operation and figure: Delta Spark's camelCase names first, then delta-rs's snake_case ones.
_DELETED = ("numDeletedRows", "num_deleted_rows")
_UPDATED = ("numUpdatedRows", "num_updated_rows")
_COPIED = ("numCopiedRows", "num_copied_rows")
_Metrics = tuple[tuple[str, tuple[str, ...]], ...]
_MERGE_METRICS: _Metrics = (
    ("inserted", ("numTargetRowsInserted", "num_target_rows_inserted")),
    ("updated", ("numTargetRowsUpdated", "num_target_rows_updated")),
    ("deleted", ("numTargetRowsDeleted", "num_target_rows_deleted")),
    ("copied", ("numTargetRowsCopied", "num_target_rows_copied")),
)
_UPDATE_METRICS: _Metrics = (("updated", _UPDATED), ("copied", _COPIED))
_DELETE_METRICS: _Metrics = (("deleted", _DELETED), ("copied", _COPIED))
_WRITE_METRICS: _Metrics = (
    ("inserted", ("numOutputRows", "num_added_rows")),
    ("deleted", _DELETED),
    ("updated", _UPDATED),
    ("copied", _COPIED),
)

RowCount = Callable[[str], int | None]


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


def _int(value: Any) -> int | None:
    kind = type(value)
    if kind is int:
        return value  # type: ignore[no-any-return]
    if kind is not str:
        return None  # absent, a boolean, a float, a structure: not a count
    try:
        return int(value)
    except ValueError:
        return None


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


# -- counting -----------------------------------------------------------------------------------


def _num_records(stats: str | None) -> int | None:
    if not stats:
        return None
    try:
        value = orjson.loads(stats).get("numRecords")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _FileRows:
    """Live rows of the commit's data-changing file actions, each side worked out on first use.

    ``inserted()`` sums the added files, ``deleted()`` the removed ones; a remove and an add of one
    path with a deletion vector (a DV update) count only the rows whose DV membership changed.
    Each is ``None`` where one of its files' rows is unknown.
    """

    __slots__ = ("_commit", "_deleted", "_deleted_done", "_inserted", "_inserted_done", "_pairs", "_row_count")

    def __init__(self, commit: Commit, row_count: RowCount | None) -> None:
        self._commit = commit
        self._row_count = row_count
        self._pairs: dict[str, tuple[int, int]] | None = None
        self._inserted: int | None = None
        self._deleted: int | None = None
        self._inserted_done = self._deleted_done = False

    def _rows(self, action: Add | Remove) -> int | None:
        n = _num_records(action.stats)
        if n is None and self._row_count is not None:
            n = self._row_count(action.path)
        if n is None:
            return None
        dv = action.deletion_vector
        return n - (0 if dv is None else dv.cardinality)

    def _dv_pairs(self) -> dict[str, tuple[int, int]]:
        """Paths removed and added with a deletion vector on either side: (old, new) DV cardinalities."""
        if self._pairs is None:
            self._pairs = {}
            commit = self._commit
            if commit.adds and commit.removes:
                removes = {r.path: r for r in commit.removes if r.data_change}
                for a in commit.adds:
                    r = removes.get(a.path) if a.data_change else None
                    if r is not None and (a.deletion_vector is not None or r.deletion_vector is not None):
                        c_old = 0 if r.deletion_vector is None else r.deletion_vector.cardinality
                        c_new = 0 if a.deletion_vector is None else a.deletion_vector.cardinality
                        self._pairs[a.path] = (c_old, c_new)
        return self._pairs

    def _sum(self, actions: tuple[Add, ...] | tuple[Remove, ...], moved: int) -> int | None:
        pairs = self._dv_pairs()
        total = moved
        for action in actions:
            if not action.data_change or action.path in pairs:
                continue
            n = self._rows(action)
            if n is None:
                return None
            total += n
        return total

    def inserted(self) -> int | None:
        """Rows the added files bring (and rows a DV update restores)."""
        if not self._inserted_done:
            adds = self._commit.adds  # (no adds: no DV pairs either, and nothing inserted)
            restored = sum([max(0, old - new) for old, new in self._dv_pairs().values()]) if adds else 0
            self._inserted, self._inserted_done = self._sum(adds, restored), True
        return self._inserted

    def deleted(self) -> int | None:
        """Rows the removed files take away (and rows a DV update newly hides)."""
        if not self._deleted_done:
            removes = self._commit.removes  # (no removes: no DV pairs either, and nothing deleted)
            hidden = sum([max(0, new - old) for old, new in self._dv_pairs().values()]) if removes else 0
            self._deleted, self._deleted_done = self._sum(removes, hidden), True
        return self._deleted


def _counts(
    commit: Commit,
    before: Snapshot,
    operation: str | None,
    metrics: Mapping[str, Any],
    rows: _FileRows,
    data_files: tuple[int, int],
    has_changes: bool,
    table_rows_before: int | None,
) -> Counts:
    bytes_removed: int | None = 0
    lookup = None
    for r in commit.removes:
        size = r.size
        if size is None:
            if lookup is None and not before.handed_on:
                lookup = before.files.get
            entry = None if lookup is None else lookup(FileKey(r.path, r.dv_id))
            size = None if entry is None else entry.size
        if size is None or bytes_removed is None:
            bytes_removed = None
        else:
            bytes_removed += size
    if has_changes:
        figures, sources = _row_figures(commit, (operation or "").upper(), metrics, rows)
    else:
        figures, sources = dict(_NO_CHANGE_FIGURES), dict(_NO_CHANGE_SOURCES)
    table_rows_after = None
    if table_rows_before is not None:
        inserted, deleted = figures["inserted"], figures["deleted"]
        if inserted is None or deleted is None:
            inserted, deleted = rows.inserted(), rows.deleted()
        if inserted is not None and deleted is not None:
            table_rows_after = table_rows_before + inserted - deleted
    return Counts(
        files_added=len(commit.adds),
        files_removed=len(commit.removes),
        data_files_added=data_files[0],
        data_files_removed=data_files[1],
        cdc_files=len(commit.cdcs),
        bytes_added=sum([a.size for a in commit.adds]) if commit.adds else 0,
        bytes_removed=bytes_removed,
        rows_inserted=figures["inserted"],
        rows_deleted=figures["deleted"],
        rows_updated=figures["updated"],
        rows_copied=figures["copied"],
        row_sources=sources,
        table_rows_before=table_rows_before,
        table_rows_after=table_rows_after,
    )


_NO_CHANGE_FIGURES: dict[str, int | None] = dict.fromkeys(ROW_FIGURES, 0)
_NO_CHANGE_SOURCES = dict.fromkeys(ROW_FIGURES, "no_data_change")


def _settle_unknown(c: Counts) -> Counts:
    """A commit whose rows did not change: figures the metrics left unknown are 0, from ``no_data_change``."""
    values = {"rows_" + f: getattr(c, "rows_" + f) for f in ROW_FIGURES}
    sources = dict(c.row_sources)
    for f in ROW_FIGURES:
        if values["rows_" + f] is None:
            values["rows_" + f] = 0
            sources[f] = "no_data_change"
    return replace(c, row_sources=sources, **values)


def _row_figures(
    commit: Commit, op: str, metrics: Mapping[str, Any], rows: _FileRows
) -> tuple[dict[str, int | None], dict[str, str]]:
    """Row figures of a commit that changes rows, each with its source (see the module docstring)."""
    figures: dict[str, int | None] = {"inserted": None, "deleted": None, "updated": None, "copied": None}
    sources = {"inserted": "unknown", "deleted": "unknown", "updated": "unknown", "copied": "unknown"}
    if op == "MERGE":
        wanted = _MERGE_METRICS
    elif op == "UPDATE":
        wanted = _UPDATE_METRICS
        figures["inserted"] = figures["deleted"] = 0
        sources["inserted"] = sources["deleted"] = "operation"
    elif op == "DELETE":
        wanted = _DELETE_METRICS
        figures["inserted"] = figures["updated"] = 0
        sources["inserted"] = sources["updated"] = "operation"
    else:
        wanted = _WRITE_METRICS
    if metrics:
        get = metrics.get
        for figure, names in wanted:
            for name in names:
                raw_value = get(name)
                if raw_value is not None and (value := _int(raw_value)) is not None:
                    figures[figure] = value
                    sources[figure] = "metrics"
                    break
    if commit.cdcs or op == "MERGE" or op == "UPDATE":
        return figures, sources  # the file actions cannot tell these figures apart
    if op == "DELETE":
        if figures["deleted"] is None:
            removed, added = rows.deleted(), rows.inserted()
            if removed is not None and added is not None:
                figures["deleted"] = removed - added
                sources["deleted"] = "files"
        return figures, sources
    if figures["updated"] is None:
        figures["updated"] = 0
        sources["updated"] = "files"
    for figure in ("inserted", "deleted"):
        if figures[figure] is None:
            value = rows.inserted() if figure == "inserted" else rows.deleted()
            if value is not None:
                figures[figure] = value
                sources[figure] = "files"
    return figures, sources
