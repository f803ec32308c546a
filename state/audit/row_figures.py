"""A commit's counts: files, bytes, and row figures inferred with their sources. Pure: no IO.

The row figures (inserted, deleted, updated, copied) come from the operation's metrics, the
data-changing file actions, or the operation itself; the sources are described in
:mod:`state.audit`. ``counted`` figures are set later, by
:meth:`AuditEvent.with_counted <state.audit.event.AuditEvent.with_counted>`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import orjson

from deltatail.state.actions import Add, Remove
from deltatail.state.audit.event import ROW_FIGURES, Counts
from deltatail.state.commit import Commit
from deltatail.state.files import FileKey
from deltatail.state.snapshot import Snapshot

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
    """Row figures of a commit that changes rows, each with its source (see :mod:`state.audit`)."""
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
