"""The audit event of one commit, its parts, and its dict form (:meth:`AuditEvent.to_json`). Pure: no IO.

What each field holds and where it comes from is told in :mod:`state.audit`; the builder is
:func:`state.audit.builder.build_audit_event`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from deltatail.state.errors import InvalidLogError
from deltatail.state.schema_diff import SchemaDiff

#: The ``format`` tag of an event's dict form; bumped when a field changes meaning or is removed.
AUDIT_FORMAT = "deltatail.audit.commit/1"

#: Where a row figure came from (see :mod:`state.audit`).
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
    """The audit record of one commit, built by :func:`~state.audit.builder.build_audit_event`."""

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
