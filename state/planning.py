"""Planning a version's change rows: which files to read, in which context. Pure: no IO.

A version is planned in two steps that :mod:`state.changes` defines (prepare,
then emit file tasks); this module wraps them with what a reader needs around
the tasks: the snapshot after the version, the table schema and column mapping
at that version, and the commit's ``_commit_timestamp``. The result is a
:class:`VersionPlan`, small enough to ship to another process or a Spark
executor.

Rules applied here, besides those of :mod:`state.changes`:

- A non-additive schema change (drop, rename, type change) is refused with a
  :class:`~state.errors.SchemaChangeError` unless allowed, *before* the commit
  is applied, so a refused commit leaves the snapshot in hand usable.
- With ``require_cdf``, a version where ``delta.enableChangeDataFeed`` is off
  is refused (Delta CDF semantics).
- ``_commit_timestamp``: see :func:`state.changes.commit_timestamp`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

from deltatail.state.changes import (
    FileTask,
    RowSelection,
    cdf_enabled,
    check_schema_change,
    commit_timestamp,
    prepare,
)
from deltatail.state.commit import Commit
from deltatail.state.errors import DeltaTailError, InvalidLogError, UnsafePathError
from deltatail.state.paths import resolve_logged_path
from deltatail.state.schema import StructType, parse_schema
from deltatail.state.snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class ReadContext:
    """What reading one file task needs besides the task: small and picklable (Spark ships it to executors)."""

    table_root: str
    schema_string: str
    partition_columns: tuple[str, ...]
    column_mapping_mode: str
    version: int
    timestamp_ms: int
    #: Roots outside the table whose files the log may name (:mod:`state.paths`); none by default.
    external_roots: tuple[str, ...] = ()

    def location(self, path: str) -> str:
        """The location to read for a logged (decoded) data or cdc ``path``.

        Raises:
            UnsafePathError: if ``path`` is outside the table root and every external root.
        """
        try:
            return resolve_logged_path(self.table_root, path, self.external_roots)
        except UnsafePathError as e:
            raise e.at(version=self.version) from None

    def schema(self) -> StructType:
        """The table schema at this version (parsed once per distinct schema string)."""
        return _parsed_schema(self.schema_string)


@dataclass(frozen=True, slots=True)
class VersionPlan:
    """The planned changes of one version: its context, commit (``None`` for an initial snapshot) and tasks."""

    context: ReadContext
    commit: Commit | None
    tasks: tuple[FileTask, ...]
    snapshot: bool = False
    #: The context just before the commit, when the commit changes the table's schema, partition
    #: columns or column mapping: the rows it removes (non-cdc ``delete`` tasks) were written and
    #: last visible under that schema and are read in it (:meth:`context_of`). ``None`` otherwise.
    before: ReadContext | None = None

    def context_of(self, task: FileTask) -> ReadContext:
        """The context to read ``task`` in: a removed row as it was before the commit, every other row after it.

        Delta reads an old file in the current schema, which is right for the rows a version
        keeps or adds. A row a version *removes* was last visible before it: read in the new
        schema, a commit that drops or renames a column and deletes rows at once (an overwrite
        with a new schema) would deliver deleted rows without the values that identified them
        and with nulls for columns they never had. Cdc files are written by the commit itself,
        in its schema, so they are always read in :attr:`context`.
        """
        if self.before is not None and task.change_type == "delete":
            return self.before
        return self.context


@functools.lru_cache(maxsize=64)
def _parsed_schema(schema_string: str) -> StructType:
    return parse_schema(schema_string)


def read_context(snap: Snapshot, timestamp_ms: int, external_roots: tuple[str, ...] = ()) -> ReadContext:
    """The reading context of ``snap``'s version (``external_roots``: see :class:`ReadContext`).

    Raises:
        InvalidLogError: if the snapshot has no protocol or metadata, or the metadata no ``schemaString``.
    """
    snap.require_valid()
    m = snap.metadata
    if m is None or m.schema_string is None:
        raise InvalidLogError("metaData has no schemaString", table=snap.table, version=snap.version)
    return ReadContext(
        snap.table,
        m.schema_string,
        m.partition_columns,
        m.column_mapping_mode,
        snap.version,
        timestamp_ms,
        external_roots,
    )


def plan_commit(
    snap: Snapshot,
    commit: Commit,
    file_mtime_ms: int,
    previous_ms: int | None,
    *,
    allow_non_additive: bool = False,
    require_cdf: bool = False,
    external_roots: tuple[str, ...] = (),
) -> tuple[Snapshot, VersionPlan]:
    """Plan commit ``snap.version + 1``; returns the snapshot after it and the plan.

    ``snap`` is handed on to the returned snapshot (:meth:`Snapshot.apply`): after a
    successful call only the returned one is exact. A refused commit leaves ``snap``
    as it was.

    Args:
        snap: the snapshot just before the commit.
        commit: the commit.
        file_mtime_ms: the commit file's modification time (epoch ms).
        previous_ms: the previous version's ``_commit_timestamp``, if known.
        allow_non_additive: read across non-additive schema changes.
        require_cdf: refuse versions where the change data feed is off.
        external_roots: roots outside the table its files may be read from (:class:`ReadContext`).

    Raises:
        SchemaChangeError: if the commit changes the schema non-additively (unless allowed).
        InvalidLogError: if the commit is invalid for change planning, or CDF is required and off.
        UnsupportedFeatureError: if the commit needs unsupported reader features.
    """
    partitioned = bool(snap.metadata and snap.metadata.partition_columns)
    try:
        prepared = prepare(commit, snap.files.get, partitioned=partitioned)
        if commit.metadata is not None and snap.metadata is not None:
            check_schema_change(snap.schema, commit.metadata.schema(), version=commit.version, allow=allow_non_additive)
    except DeltaTailError as e:
        raise e.at(table=snap.table, version=commit.version) from None
    metadata = commit.metadata or snap.metadata
    if require_cdf and (metadata is None or not cdf_enabled(metadata)):
        raise InvalidLogError(
            "change data feed is not enabled (delta.enableChangeDataFeed) at this version",
            table=snap.table,
            version=commit.version,
        )
    before = _context_before(snap, commit, external_roots)
    after, _ = snap.apply(commit)
    if after.metadata is None:
        raise InvalidLogError("no metaData action found in the log", table=snap.table, version=commit.version)
    ts = commit_timestamp(commit, after.metadata, file_mtime_ms, previous_ms)
    context = read_context(after, ts, external_roots)
    if before is not None:
        before = replace(before, version=commit.version, timestamp_ms=ts)
        if _same_layout(before, context):
            before = None
    return after, VersionPlan(context, commit, tuple(prepared.tasks()), before=before)


def _context_before(snap: Snapshot, commit: Commit, external_roots: tuple[str, ...]) -> ReadContext | None:
    """Reading context of ``snap`` if ``commit`` carries a ``metaData`` (it may change the schema); else ``None``."""
    if commit.metadata is None or snap.metadata is None or snap.metadata.schema_string is None:
        return None
    return read_context(snap, 0, external_roots)


def _same_layout(a: ReadContext, b: ReadContext) -> bool:
    """Whether rows read in ``a`` and in ``b`` come out alike: same schema, partition columns and column mapping."""
    return (a.schema_string, a.partition_columns, a.column_mapping_mode) == (
        b.schema_string,
        b.partition_columns,
        b.column_mapping_mode,
    )


def plan_snapshot(snap: Snapshot, timestamp_ms: int, external_roots: tuple[str, ...] = ()) -> VersionPlan:
    """The initial-snapshot plan: every live row of ``snap`` as an ``insert``, files in path order.

    Raises:
        InvalidLogError: as :func:`read_context`.
    """
    tasks = [
        FileTask(f.path, f.partition_values or {}, "insert", RowSelection(None, f.deletion_vector), f.size)
        for f in sorted(snap.live_files(), key=lambda f: (f.path, f.key.dv_id or ""))
    ]
    return VersionPlan(read_context(snap, timestamp_ms, external_roots), None, tuple(tasks), snapshot=True)
