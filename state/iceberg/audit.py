"""The audit event of one Iceberg snapshot, from its summary and the metadata around it. Pure: no IO.

The same :class:`~state.audit.AuditEvent` as a Delta commit's (``deltatail.audit.commit/1``), with
Iceberg's facts (spec, "Snapshots": "a summary [...] of the changes in the snapshot", keys as in
"Optional Snapshot Summary Fields"):

- ``operation``: the summary's ``operation`` (``append``, ``replace``, ``overwrite``, ``delete``);
  ``operation_metrics``: the rest of the summary, as written; ``actor.engine_info``:
  ``engine-name`` and ``engine-version`` where the writer records them (Spark does, pyiceberg 0.12
  does not);
- files and bytes: ``added-data-files`` + ``added-delete-files`` and ``deleted-data-files`` +
  ``removed-delete-files``; ``added-files-size`` and ``removed-files-size``;
- row figures (source ``metrics``): an ``append`` inserts ``added-records``; a ``delete`` deletes
  ``deleted-records`` less ``added-records`` (copy-on-write rewrites carry the other rows over, which
  are ``rows_copied``) plus ``added-position-deletes`` (one row each) less
  ``removed-position-deletes`` (a deletion vector that replaces one is counted whole, the old one
  as removed; a removed position delete file's rows were in ``deleted-records`` already, deleted
  before); unknown should that be negative; a ``replace`` changes no row
  (``no_data_change``). An ``overwrite``'s figures, and a ``delete`` with equality deletes, are
  unknown (``None``): the summary does not tell deleted from carried-over rows; ``--counted`` counts
  them from the change rows;
- ``table_rows_before``/``after``: the parent's and the snapshot's ``total-records`` less
  ``total-position-deletes``, when ``total-equality-deletes`` is 0 (else unknown);
- ``schema_change``: columns matched by field id between the parent's schema and the snapshot's
  (added, dropped, renamed, retyped, required-ness changed);
- ``property_changes``: table properties, and ``metadata_changes``: the default partition spec
  (key ``partition-spec``), as they changed between the metadata file that made the parent current
  and the one that made the snapshot current (changes committed without a snapshot show on the next
  snapshot); unknown, and not reported, when the metadata log no longer holds both files.

Every number read from a summary is checked to be a non-negative integer below 2**63.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from deltatail.state.audit import AuditEvent
from deltatail.state.audit.event import Actor, Counts, TransactionInfo, ValueChange
from deltatail.state.errors import InvalidLogError
from deltatail.state.iceberg.model import SnapshotInfo
from deltatail.state.schema_diff import ColumnRename, NullabilityChange, SchemaDiff, TypeChange

#: The largest number a summary field may hold.
MAX_SUMMARY_NUMBER = 2**63 - 1
#: The metadata change key of the default partition spec.
PARTITION_SPEC = "partition-spec"


@dataclass(frozen=True, slots=True)
class Column:
    """One field of an Iceberg schema, by its field id: its dotted path, type and whether it is required."""

    path: str
    type: str
    required: bool


@dataclass(frozen=True, slots=True)
class Settings:
    """What a metadata file says beside snapshots: table properties and the default partition spec (as text)."""

    properties: Mapping[str, str]
    partition_spec: str


@dataclass(frozen=True, slots=True)
class SnapshotFacts:
    """Everything an event is built from besides the snapshot itself.

    Attributes:
        table: the table's root; table_id: its id; version: the snapshot's version.
        parent: the parent snapshot on ``main`` (``None`` for the first, or when it was expired).
        first: whether the snapshot is the table's first.
        schema_change: the schema difference from the parent (``None`` if the same schema).
        before, after: the settings when the parent and the snapshot became current (``None``: unknown).
    """

    table: str
    table_id: str
    version: int
    parent: SnapshotInfo | None
    first: bool
    schema_change: SchemaDiff | None
    before: Settings | None
    after: Settings | None


def summary_number(snapshot: SnapshotInfo, key: str, *, table: str, version: int) -> int | None:
    """The summary's ``key`` as a number, ``None`` if absent.

    Raises:
        InvalidLogError: if it is not a non-negative integer up to :data:`MAX_SUMMARY_NUMBER`.
    """
    raw = dict(snapshot.summary).get(key)
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 19 or int(raw) > MAX_SUMMARY_NUMBER:
        raise InvalidLogError(
            f"snapshot {snapshot.snapshot_id}'s summary field {key}={raw!r} is not a count",
            table=table,
            version=version,
        )
    return int(raw)


def schema_diff(old: Mapping[int, Column], new: Mapping[int, Column]) -> SchemaDiff:
    """The difference of two schemas' columns, matched by field id (``Column.path`` names them)."""
    added = tuple(c.path for i, c in new.items() if i not in old)
    dropped = tuple(c.path for i, c in old.items() if i not in new)
    both = [(old[i], new[i]) for i in new if i in old]
    return SchemaDiff(
        added=added,
        dropped=dropped,
        renamed=tuple(ColumnRename(a.path, b.path) for a, b in both if a.path != b.path),
        type_changed=tuple(TypeChange(b.path, a.type, b.type) for a, b in both if a.type != b.type),
        nullability_changed=tuple(
            NullabilityChange(b.path, not a.required, not b.required) for a, b in both if a.required != b.required
        ),
    )


def value_changes(old: Mapping[str, str], new: Mapping[str, str]) -> tuple[ValueChange, ...]:
    """The keys whose value differs between ``old`` and ``new``, by key."""
    keys = sorted(set(old) | set(new))
    return tuple(ValueChange(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k))


def _table_rows(snapshot: SnapshotInfo | None, table: str, version: int) -> int | None:
    if snapshot is None:
        return None
    total = summary_number(snapshot, "total-records", table=table, version=version)
    positions = summary_number(snapshot, "total-position-deletes", table=table, version=version) or 0
    equality = summary_number(snapshot, "total-equality-deletes", table=table, version=version) or 0
    if total is None or equality or positions > total:
        return None
    return total - positions


def _rows(snapshot: SnapshotInfo, n: dict[str, int | None]) -> tuple[tuple[int | None, ...], str]:
    """``(inserted, deleted, updated, copied)`` and their source (see the module docstring)."""
    op, added, deleted = snapshot.operation, n["added-records"] or 0, n["deleted-records"] or 0
    if op == "replace":
        return (0, 0, 0, 0), "no_data_change"
    if op == "append":  # an append of no file (an empty commit) writes no record counts
        return (n["added-records"] if n["added-data-files"] else 0, 0, 0, 0), "metrics"
    positions = (n["added-position-deletes"] or 0) - (n["removed-position-deletes"] or 0)
    if op == "delete" and not n["added-equality-deletes"] and deleted >= added and deleted - added + positions >= 0:
        return (0, deleted - added + positions, 0, added), "metrics"
    return (None, None, None, None), "unknown"


def build_iceberg_event(snapshot: SnapshotInfo, facts: SnapshotFacts) -> AuditEvent:
    """The audit event of ``snapshot`` (see the module docstring).

    Raises:
        InvalidLogError: if a summary count is not a number (:func:`summary_number`).
    """
    table, version = facts.table, facts.version
    keys = (
        "added-data-files",
        "added-delete-files",
        "deleted-data-files",
        "removed-delete-files",
        "added-files-size",
        "removed-files-size",
        "added-records",
        "deleted-records",
        "added-position-deletes",
        "removed-position-deletes",
        "added-equality-deletes",
    )
    n = {k: summary_number(snapshot, k, table=table, version=version) for k in keys}
    (inserted, deleted, updated, copied), source = _rows(snapshot, n)
    files_added = (n["added-data-files"] or 0) + (n["added-delete-files"] or 0)
    files_removed = (n["deleted-data-files"] or 0) + (n["removed-delete-files"] or 0)
    counts = Counts(
        files_added=files_added,
        files_removed=files_removed,
        data_files_added=n["added-data-files"] or 0,
        data_files_removed=n["deleted-data-files"] or 0,
        bytes_added=n["added-files-size"] or 0,
        bytes_removed=n["removed-files-size"] if files_removed else 0,
        rows_inserted=inserted,
        rows_deleted=deleted,
        rows_updated=updated,
        rows_copied=copied,
        row_sources={k: source for k in ("inserted", "deleted", "updated", "copied")},
        table_rows_before=0 if facts.first else _table_rows(facts.parent, table, version),
        table_rows_after=_table_rows(snapshot, table, version),
    )
    summary = dict(snapshot.summary)
    engine = " ".join(v for v in (summary.get("engine-name"), summary.get("engine-version")) if v) or None
    known = facts.before is not None and facts.after is not None
    before = facts.before if facts.before is not None else Settings({}, "")
    after = facts.after if facts.after is not None else Settings({}, "")
    spec = value_changes({PARTITION_SPEC: before.partition_spec}, {PARTITION_SPEC: after.partition_spec})
    return AuditEvent(
        table_path=table,
        table_id=facts.table_id,
        version=version,
        timestamp_ms=snapshot.timestamp_ms,
        commit_info_timestamp_ms=None,
        in_commit_timestamp_ms=None,
        operation=snapshot.operation,
        operation_parameters={"snapshot-id": snapshot.snapshot_id, "parent-snapshot-id": snapshot.parent_id},
        predicate=None,
        actor=Actor(engine_info=engine),
        transaction=TransactionInfo(),
        operation_metrics=summary,
        counts=counts,
        schema_change=facts.schema_change or None,
        protocol_change=None,
        property_changes=value_changes(before.properties, after.properties) if known else (),
        metadata_changes=spec if known else (),
        domain_changes=(),
        table_created=facts.first,
        data_change=snapshot.operation != "replace",
        no_op=files_added == 0 and files_removed == 0,
        commit_info_extra={},
    )
