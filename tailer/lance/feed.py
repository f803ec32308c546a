"""Change rows of a Lance dataset for a range of versions, as Arrow record batches.

The Lance counterpart of :class:`tailer.read.feed.ChangeFeed`, with the same values: every row
carries ``_change_type``, ``_commit_version`` and ``_commit_timestamp`` (the manifest's timestamp,
UTC) and sits at a :class:`~state.cursor.Position` ``(version, index)``; rows of an initial snapshot
are flagged. The rules are :mod:`state.lance.planning`'s.

Lance versions start at 1; a range starting at 0 starts at 1 (version 0 is the empty dataset
before it). Reading version ``v`` needs the manifest of ``v - 1``: a range starting at a version
whose predecessor was cleaned up is refused with a recovery hint, never read inexactly.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa

from deltatail.state.changes import check_schema_change
from deltatail.state.cursor import Position, version_range
from deltatail.state.errors import DeltaTailError, VersionNotFoundError
from deltatail.state.feed import ChangeBatch
from deltatail.state.filters import ChangeFilter
from deltatail.state.lance.manifest import Manifest
from deltatail.state.lance.planning import LancePlan, diff_versions, plan_snapshot, plan_version
from deltatail.tailer.lance.dataset import CLEANED_UP_HINT, LanceDataset
from deltatail.tailer.lance.rows import LanceRows
from deltatail.tailer.read.plan_feed import PlanFeed
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import table_storage


@dataclass(frozen=True, slots=True)
class LanceOptions:
    """How Lance change rows are produced.

    Attributes:
        allow_non_additive: read across non-additive schema changes (drop, rename, type change).
        batch_size: the most rows in one batch.
        filter: what to deliver (:mod:`state.filters`; ``skip_operations`` names Lance operations:
            ``Rewrite``, ``Delete``, ...). Rows keep their unfiltered positions.
        external_roots: roots outside the dataset whose files its manifests may name; every other
            path outside the dataset is refused before anything is read (:mod:`state.paths`).
    """

    allow_non_additive: bool = False
    batch_size: int = 65536
    filter: ChangeFilter = field(default_factory=ChangeFilter)
    external_roots: tuple[str, ...] = ()


class LanceFeed(PlanFeed[LancePlan]):
    """Change rows of a Lance dataset for a range of versions.

    Args:
        root: the dataset's root (a path or URI).
        storage: where it is; by default :func:`~tailer.table.table_storage` the root.
        options: how rows are produced.
        storage_options: object-store options for pylance (rows are read through pylance).

    Example:
        >>> feed = LanceFeed("/data/embeddings.lance")                      # doctest: +SKIP
        >>> for batch in feed.batches(starting_version=3, ending_version=5):  # doctest: +SKIP
        ...     print(batch.start, batch.rows.num_rows)
    """

    options: LanceOptions

    def __init__(
        self,
        root: str,
        storage: Storage | None = None,
        options: LanceOptions | None = None,
        *,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.storage = storage if storage is not None else table_storage(root, storage_options)
        self.options = options or LanceOptions()
        self.dataset = LanceDataset(root, self.storage, external_roots=self.options.external_roots)
        self.table = self.dataset.root
        self._storage_options = dict(storage_options or {})
        self._rows: LanceRows | None = None

    @property
    def rows(self) -> LanceRows:
        """The row reader (pylance is loaded on first use).

        Raises:
            ConfigError: if pylance is not installed.
        """
        if self._rows is None:
            self._rows = LanceRows(
                self.table, self.storage, storage_options=self._storage_options, batch_size=self.options.batch_size
            )
        return self._rows

    def check_filter(self) -> None:
        """Check the filter's columns against the dataset's latest schema (a no-op without columns or predicate).

        Raises:
            ConfigError: naming a column the dataset does not have, or a predicate that does not parse.
            TableNotFoundError: if there is no Lance dataset at the root.
        """
        f = self.options.filter
        if f.columns is not None or f.where is not None:
            f.compile(self.dataset.manifest(self.dataset.latest_version()).schema().names)

    # -- planning ------------------------------------------------------------------------------

    def before(self, version: int) -> Manifest | None:
        """The manifest just before ``version`` (``None`` before version 1).

        Raises:
            VersionNotFoundError: if it was cleaned up (the message says how to recover).
        """
        if version <= 1:
            return None
        try:
            return self.dataset.manifest(version - 1)
        except VersionNotFoundError as e:
            raise VersionNotFoundError(
                f"version {version} cannot be read exactly: the version before it is gone; {CLEANED_UP_HINT}",
                table=self.table,
                version=version,
                file=e.file,
            ) from e

    def plan(self, before: Manifest | None, version: int) -> LancePlan:
        """Plan ``version`` against ``before`` (the manifest of ``version - 1``, or ``None`` for version 1).

        Raises:
            VersionNotFoundError: if the version is not there.
            SchemaChangeError: if the schema changes non-additively (unless allowed).
            UnsupportedFeatureError: if the version needs a feature deltatail does not read.
            InvalidLogError: if the manifest, transaction, a deletion file or the row ids disagree.
            MissingFileError: if a deletion or row-id file is missing.
        """
        after = self.dataset.manifest(version)
        try:
            if before is not None:
                check_schema_change(
                    before.schema(), after.schema(), version=version, allow=self.options.allow_non_additive
                )
            diff = diff_versions(before, after, self.dataset.transaction(version), table=self.table)
            return plan_version(diff, self.dataset.deletion_sets(diff), self.dataset.row_id_map(diff), table=self.table)
        except DeltaTailError as e:
            raise e.at(table=self.table, version=version) from None

    def plans(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
    ) -> Iterator[LancePlan]:
        """Plans for the versions of a range, in order (an initial snapshot first if asked).

        Args:
            starting_version: first version (inclusive); default 1, or the latest with ``initial_snapshot``.
            ending_version: last version (inclusive); default the latest now.
            starting_timestamp_ms: start at the first version made at or after this time instead.
            initial_snapshot: emit the live rows at the starting version as ``insert`` rows (positions
                flagged as snapshot), then the changes after it.

        Raises:
            TableNotFoundError: if there is no Lance dataset at the root.
            VersionNotFoundError: if the range starts after the latest version, or needs a version
                that was cleaned up.
            ConfigError: if ``ending_version`` is before the starting version.
        """
        latest = self.dataset.latest_version()
        if starting_timestamp_ms is not None:
            starting_version = self.dataset.timestamp_version(starting_timestamp_ms * 1000)
        if starting_version is None:
            starting_version = latest if initial_snapshot else 1
        starting_version = max(starting_version, 0 if initial_snapshot else 1)
        end = version_range(self.table, starting_version, ending_version, latest)
        before: Manifest | None
        if initial_snapshot:
            before = self.dataset.manifest(starting_version)
            yield plan_snapshot(before, table=self.table)
            first = starting_version + 1
        else:
            before = self.before(starting_version)
            first = starting_version
        for version in range(first, end + 1):
            plan = self.plan(before, version)
            yield plan
            before = self.dataset.manifest(version)

    # -- reading -------------------------------------------------------------------------------

    def plan_batches(self, plan: LancePlan) -> Iterator[ChangeBatch]:
        """Every change row of one planned version the filter keeps, at their unfiltered positions.

        Raises:
            MissingFileError, DataFileError, SchemaChangeError: as :meth:`LanceRows.batches`.
            ConfigError: if the filter names a column the version's rows do not have.
        """
        f = self.options.filter
        if f.skips_operation(plan.operation):
            return
        make = Position.in_snapshot if plan.snapshot else Position.change
        index = 0
        for batch in self.rows.batches(plan):
            unfiltered = ChangeBatch(make(plan.version, index), batch)
            index += batch.num_rows
            yield from self.kept(unfiltered)

    def plan_schema(self, plan: LancePlan) -> pa.Schema:
        """The schema of ``plan``'s change rows (its version's columns and the change columns)."""
        return self.rows.schema(plan.version)

    def end_schema(self, ending_version: int | None) -> pa.Schema:
        """The schema of change rows at ``ending_version`` (``None``: the latest version)."""
        return self.rows.schema(self.dataset.latest_version() if ending_version is None else ending_version)
