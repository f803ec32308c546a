"""Change rows of an Iceberg table for a range of versions, as Arrow record batches.

The Iceberg counterpart of :class:`tailer.read.feed.ChangeFeed`, with the same values: every row
carries ``_change_type``, ``_commit_version`` (the snapshot's version, :mod:`state.iceberg.ancestry`),
``_commit_timestamp`` (the snapshot's ``timestamp-ms``, UTC) and ``_snapshot_id``, and sits at a
:class:`~state.cursor.Position` ``(version, index)``. The rules are :mod:`state.iceberg.planning`'s;
then, in a snapshot that both deletes and inserts rows, identical rows cancel (copy-on-write rewrites
carry unchanged rows over) and a deleted and an inserted row with the same key become
``update_preimage`` and ``update_postimage`` (the key: ``--key``, else the table's identifier fields),
as :func:`tailer.read.net_changes.net_changes` does for Delta.

Snapshots are those of the ``main`` branch's ancestry, in order. Reading a snapshot needs its
parent's files: a range starting at a snapshot whose parent was expired is refused with a recovery
hint, never read inexactly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, DeltaTailError, SchemaChangeError, VersionGapError, VersionNotFoundError
from deltatail.state.feed import ChangeBatch
from deltatail.state.filters import ChangeFilter
from deltatail.state.iceberg.ancestry import EXPIRED_HINT, Ancestry, first_files_say_first, main_ancestry
from deltatail.state.iceberg.model import ContentFile, SnapshotInfo, TableState
from deltatail.state.iceberg.planning import IcebergPlan, plan_initial, plan_snapshot
from deltatail.tailer.iceberg.metadata import IcebergTable, arrow_schema
from deltatail.tailer.iceberg.rows import IcebergRows, output_schema
from deltatail.tailer.read.net_changes import net_changes
from deltatail.tailer.read.plan_feed import PlanFeed
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import table_storage

#: Type promotions the spec allows ("Schema Evolution": int to long, float to double, decimal widening).
_PROMOTIONS = {("int", "long"), ("float", "double")}


@dataclass(frozen=True, slots=True)
class IcebergOptions:
    """How Iceberg change rows are produced.

    Attributes:
        allow_non_additive: read across non-additive schema changes (a dropped, renamed or retyped column).
        batch_size: the most rows in one batch.
        filter: what to deliver (:mod:`state.filters`; ``skip_operations`` names Iceberg operations:
            ``append``, ``overwrite``, ``delete``, ``replace``). Rows keep their unfiltered positions.
        external_roots: roots outside the table whose files its metadata may name.
        key_columns: the columns pairing updates (default: the schema's identifier fields).
    """

    allow_non_additive: bool = False
    batch_size: int = 65536
    filter: ChangeFilter = field(default_factory=ChangeFilter)
    external_roots: tuple[str, ...] = ()
    key_columns: tuple[str, ...] = ()


class IcebergFeed(PlanFeed[IcebergPlan]):
    """Change rows of an Iceberg table for a range of versions.

    Args:
        location: a metadata file or the table's directory (:class:`~tailer.iceberg.metadata.IcebergTable`).
        storage: where it is; by default :func:`~tailer.storage.factory.storage_for` the location.
        options: how rows are produced.
        storage_options: object-store options.
        pointer: the catalog's pointer to the current metadata file, for a table found through a catalog.

    Raises:
        ConfigError: if pyiceberg is not installed.

    Example:
        >>> feed = IcebergFeed("/warehouse/db.db/orders")                     # doctest: +SKIP
        >>> for batch in feed.batches(starting_version=3, ending_version=5):  # doctest: +SKIP
        ...     print(batch.start, batch.rows.num_rows)
    """

    options: IcebergOptions

    def __init__(
        self,
        location: str,
        storage: Storage | None = None,
        options: IcebergOptions | None = None,
        *,
        storage_options: Mapping[str, str] | None = None,
        pointer: Callable[[], str] | None = None,
    ) -> None:
        super().__init__()
        self.options = options or IcebergOptions()
        self.storage = storage if storage is not None else table_storage(location, storage_options)
        self.iceberg = IcebergTable(location, self.storage, pointer=pointer, external_roots=self.options.external_roots)
        self.table = self.iceberg.root
        self.rows = IcebergRows(self.iceberg)
        self._live: OrderedDict[int, list[ContentFile]] = OrderedDict()

    # -- metadata ------------------------------------------------------------------------------

    def current(self, location: str | None = None) -> tuple[TableState, Ancestry, str]:
        """The table's newest state (or the one at ``location``), its ``main`` ancestry, and the metadata location.

        Raises:
            TableNotFoundError, InvalidLogError, UnsupportedFeatureError: as :meth:`IcebergTable.state`.
        """
        where = location or self.iceberg.metadata_location()
        state = self.iceberg.state(where)
        return state, main_ancestry(state, self.table), where

    def schema(self, snapshot: SnapshotInfo | None, location: str | None = None) -> pa.Schema:
        """The Arrow schema (with field ids) ``snapshot``'s rows are read in."""
        return arrow_schema(self.iceberg.schema(snapshot, location))

    def change_schema(self, snapshot: SnapshotInfo | None, location: str | None = None) -> pa.Schema:
        """The change rows' schema at ``snapshot``: its columns and the four change columns."""
        return output_schema(self.schema(snapshot, location))

    def check_filter(self) -> None:
        """Check the filter's columns against the newest schema (a no-op without columns or predicate).

        Raises:
            ConfigError: naming a column the table does not have, or a predicate that does not parse.
        """
        f = self.options.filter
        if f.columns is not None or f.where is not None:
            f.compile(self.change_schema(None).names)

    def _files(self, snapshot: SnapshotInfo, version: int) -> list[ContentFile]:
        found = self._live.get(snapshot.snapshot_id)
        if found is None:
            found = self._live[snapshot.snapshot_id] = self.iceberg.live_files(snapshot, version)
            while len(self._live) > 2:
                self._live.popitem(last=False)
        return found

    # -- planning ------------------------------------------------------------------------------

    def plan(self, state: TableState, ancestry: Ancestry, index: int, location: str | None = None) -> IcebergPlan:
        """Plan the snapshot at ``index`` of ``ancestry`` against its parent.

        Raises:
            VersionGapError: if its parent was expired.
            SchemaChangeError: if the schema changes non-additively (unless allowed).
            UnsupportedFeatureError: for a file kind deltatail does not read.
            MissingFileError, InvalidLogError, UnsafePathError: for a manifest list or manifest.
        """
        snap, version = ancestry.snapshots[index], ancestry.versions[index]
        try:
            parent: SnapshotInfo | None = ancestry.snapshots[index - 1] if index else None
            if parent is None and not ancestry.complete:
                raise VersionGapError(
                    f"snapshot {snap.snapshot_id} cannot be read exactly: its parent {snap.parent_id} is gone; "
                    + EXPIRED_HINT,
                    version=version,
                )
            if parent is not None:
                self._check_schema(parent, snap, version, location)
            before = None if parent is None else self._files(parent, ancestry.versions[index - 1])
            after = self._files(snap, version)
            if (
                parent is None
                and state.format_version > 1
                and not first_files_say_first(snap, (f.data_sequence for f in after))
            ):
                raise VersionGapError(
                    f"snapshot {snap.snapshot_id} names no parent but holds files of earlier snapshots: its parent "
                    "was expired; " + EXPIRED_HINT,
                    version=version,
                )
            return plan_snapshot(before, after, snap, version, state.unpartitioned_specs, table=self.table)
        except DeltaTailError as e:
            raise e.at(table=self.table, version=version) from None

    def plan_initial(self, state: TableState, ancestry: Ancestry, index: int) -> IcebergPlan:
        """Every live row of the snapshot at ``index`` as an ``insert`` (an initial snapshot)."""
        snap, version = ancestry.snapshots[index], ancestry.versions[index]
        try:
            return plan_initial(self._files(snap, version), snap, version, state.unpartitioned_specs, table=self.table)
        except DeltaTailError as e:
            raise e.at(table=self.table, version=version) from None

    def _check_schema(self, parent: SnapshotInfo, snap: SnapshotInfo, version: int, location: str | None) -> None:
        if self.options.allow_non_additive or parent.schema_id == snap.schema_id:
            return
        old, new = self.iceberg.schema(parent, location), self.iceberg.schema(snap, location)
        problem = schema_problem(old, new)
        if problem is not None:
            raise SchemaChangeError(
                f"non-additive schema change: {problem}; read the versions before and after it separately, "
                "or allow non-additive changes explicitly",
                version=version,
            )

    def range_indexes(
        self,
        ancestry: Ancestry,
        starting_version: int | None,
        ending_version: int | None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
    ) -> tuple[int, int]:
        """``(first, last)`` indexes into ``ancestry`` of a range (``last`` exclusive).

        Raises:
            VersionNotFoundError: if the range starts after the newest version, or at a time after the newest snapshot.
            ConfigError: if ``ending_version`` is before the starting version.
        """
        versions = ancestry.versions
        if starting_timestamp_ms is not None:
            first = next((i for i, s in enumerate(ancestry.snapshots) if s.timestamp_ms >= starting_timestamp_ms), None)
            if first is None:
                raise VersionNotFoundError(
                    f"no snapshot was committed at or after {starting_timestamp_ms} ms", table=self.table
                )
        elif starting_version is None:
            first = len(versions) - 1 if initial_snapshot else 0
        else:
            if starting_version > ancestry.latest:
                raise VersionNotFoundError(
                    f"starting version {starting_version} is after the latest version {ancestry.latest}",
                    table=self.table,
                )
            first = ancestry.index_of_version(starting_version)
        if ending_version is None:
            return max(first, 0), len(versions)
        if ending_version > ancestry.latest:
            raise VersionNotFoundError(
                f"ending version {ending_version} is after the latest version {ancestry.latest}", table=self.table
            )
        start = starting_version if starting_version is not None else versions[first] if first < len(versions) else 0
        if ending_version < start:
            raise ConfigError(f"ending version {ending_version} is before starting version {start}", table=self.table)
        last = ancestry.index_of_version(ending_version + 1)
        return max(first, 0), last

    def plans(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
    ) -> Iterator[IcebergPlan]:
        """Plans for the snapshots of a range, in order (an initial snapshot first if asked).

        Args:
            starting_version: first version (inclusive; the first snapshot at or after it); default the
                first snapshot, or the newest with ``initial_snapshot``.
            ending_version: last version (inclusive); default the newest now.
            starting_timestamp_ms: start at the first snapshot committed at or after this time instead.
            initial_snapshot: emit the live rows at the starting snapshot as ``insert`` rows (positions
                flagged as snapshot), then the changes after it.

        Raises:
            TableNotFoundError: if there is no Iceberg table.
            VersionNotFoundError: if the range starts after the newest version.
            VersionGapError: if the range needs a snapshot that was expired.
            ConfigError: if ``ending_version`` is before the starting version.
        """
        state, ancestry, where = self.current()
        first, last = self.range_indexes(
            ancestry,
            starting_version,
            ending_version,
            starting_timestamp_ms=starting_timestamp_ms,
            initial_snapshot=initial_snapshot,
        )
        if initial_snapshot and first < len(ancestry.versions):
            yield self.plan_initial(state, ancestry, first)
            first += 1
        for index in range(first, last):
            yield self.plan(state, ancestry, index, where)

    # -- reading -------------------------------------------------------------------------------

    def key_columns(self, snapshot: SnapshotInfo) -> tuple[str, ...]:
        """The columns pairing updates in ``snapshot``: ``--key``, else the schema's identifier fields."""
        if self.options.key_columns:
            return self.options.key_columns
        schema = self.iceberg.schema(snapshot)
        return tuple(schema.find_column_name(i) for i in schema.identifier_field_ids)

    def plan_table(self, plan: IcebergPlan) -> pa.Table:
        """Every change row of one planned snapshot, unfiltered, in position order.

        Raises:
            MissingFileError, DataFileError, UnsupportedFeatureError: as :meth:`IcebergRows.task_rows`.
            ConfigError: if a ``--key`` column is not a column of the table.
        """
        try:
            rows = self.rows.plan_table(plan, self.schema(plan.snapshot))
            if plan.net:
                rows = net_changes(rows, self.key_columns(plan.snapshot))
            return rows
        except DeltaTailError as e:
            raise e.at(table=self.table, version=plan.version) from None

    def plan_batches(self, plan: IcebergPlan) -> Iterator[ChangeBatch]:
        """Every change row of one planned snapshot the filter keeps, at their unfiltered positions."""
        f = self.options.filter
        if f.skips_operation(plan.operation) or not plan.tasks:
            return
        make = Position.in_snapshot if plan.initial else Position.change
        rows = self.plan_table(plan)
        size = max(1, self.options.batch_size)
        for start in range(0, rows.num_rows, size):
            chunk = rows.slice(start, size).combine_chunks()
            batch = chunk.to_batches()[0] if chunk.num_rows else None
            if batch is None:
                continue
            yield from self.kept(ChangeBatch(make(plan.version, start), batch))

    def plan_schema(self, plan: IcebergPlan) -> pa.Schema:
        """The schema of ``plan``'s change rows (its snapshot's columns and the change columns)."""
        return self.change_schema(plan.snapshot)

    def end_schema(self, ending_version: int | None) -> pa.Schema:
        """The schema of change rows of the newest snapshot (a range with no snapshot in it has nothing older)."""
        return self.change_schema(None)


def schema_problem(old: Any, new: Any) -> str | None:
    """``None`` if ``new`` (a pyiceberg schema) only adds columns to ``old``; otherwise what breaks it.

    Columns are matched by field id: a dropped id, a new name for an id, or a type change other than
    the spec's promotions (int to long, float to double, a wider decimal) is non-additive.
    """
    new_by_id = {f.field_id: f for f in new.fields}
    for f in old.fields:
        g = new_by_id.get(f.field_id)
        if g is None:
            return f"column {f.name!r} was dropped"
        if g.name != f.name:
            return f"column {f.name!r} was renamed to {g.name!r}"
        if g.field_type != f.field_type and not _promotion(f.field_type, g.field_type):
            return f"column {f.name!r} changed type from {f.field_type} to {g.field_type}"
    return None


def _promotion(old: Any, new: Any) -> bool:
    a, b = str(old), str(new)
    if (a, b) in _PROMOTIONS:
        return True
    if a.startswith("decimal(") and b.startswith("decimal("):
        (p1, s1), (p2, s2) = (tuple(int(x) for x in t[8:-1].split(",")) for t in (a, b))
        return s1 == s2 and p2 >= p1
    return False
