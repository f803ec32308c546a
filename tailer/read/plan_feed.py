"""What the change feeds of Lance and Iceberg share: ranges of planned versions read as filtered batches.

A format's feed plans each version of a range (:meth:`PlanFeed.plans`) and reads a plan's change
rows (:meth:`PlanFeed.plan_batches`); this class holds the rest, the same for both: a range's
batches in order, the filter applied to each batch while its rows keep their unfiltered positions
(so a cursor means the same with and without a filter), and a small range read into one table.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator
from typing import Generic, Protocol, TypeVar

import pyarrow as pa

from deltatail.state.feed import ChangeBatch
from deltatail.state.filters import ChangeFilter

PlanT = TypeVar("PlanT")


class FilteredOptions(Protocol):
    """The part of a feed's options this class reads."""

    @property
    def filter(self) -> ChangeFilter:
        """What to deliver (:mod:`state.filters`)."""
        ...


class PlanFeed(ABC, Generic[PlanT]):
    """Change rows of a table for ranges of versions, planned one version at a time by a subclass."""

    options: FilteredOptions

    def __init__(self) -> None:
        self._filters: dict[tuple[str, ...], ChangeFilter] = {}

    @abstractmethod
    def plans(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
    ) -> Iterator[PlanT]:
        """Plans for the versions of a range, in order (an initial snapshot first if asked)."""

    @abstractmethod
    def plan_batches(self, plan: PlanT) -> Iterator[ChangeBatch]:
        """Every change row of one planned version the filter keeps, at their unfiltered positions."""

    @abstractmethod
    def plan_schema(self, plan: PlanT) -> pa.Schema:
        """The schema of ``plan``'s change rows."""

    @abstractmethod
    def end_schema(self, ending_version: int | None) -> pa.Schema:
        """The schema of change rows at ``ending_version`` (``None``: the newest), for a range with no version."""

    def kept(self, unfiltered: ChangeBatch) -> Iterator[ChangeBatch]:
        """What the filter keeps of ``unfiltered`` (all of it without a filter), at the rows' own positions.

        Raises:
            ConfigError: if the filter names a column the batch does not have.
        """
        f = self.options.filter
        if f.columns is None and f.where is None and f.change_types is None:
            yield unfiltered
            return
        key = tuple(unfiltered.rows.schema.names)
        found = self._filters.get(key)
        if found is None:
            found = self._filters[key] = f.compile(list(key))
        yield from found.apply(unfiltered)

    def batches(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        initial_snapshot: bool = False,
    ) -> Generator[ChangeBatch, None, None]:
        """Every change row of the range, as batches; arguments and errors as :meth:`plans` and :meth:`plan_batches`."""
        for plan in self.plans(
            starting_version,
            ending_version,
            starting_timestamp_ms=starting_timestamp_ms,
            initial_snapshot=initial_snapshot,
        ):
            yield from self.plan_batches(plan)

    def read_table(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        initial_snapshot: bool = False,
    ) -> pa.Table:
        """All change rows of a range in one Arrow table, in the newest schema of the range (for small ranges).

        Rows from before an additive schema change have nulls in the added columns.

        Raises:
            SchemaChangeError: if a column cannot be cast to its type at the end of the range.
            Others: as :meth:`batches`.
        """
        tables: list[pa.Table] = []
        schema: pa.Schema | None = None
        for plan in self.plans(starting_version, ending_version, initial_snapshot=initial_snapshot):
            schema = self.plan_schema(plan)
            tables += [pa.Table.from_batches([b.rows]) for b in self.plan_batches(plan)]
        if schema is None:
            schema = self.end_schema(ending_version)
        if not tables:
            return schema.empty_table()
        return pa.concat_tables(tables, promote_options="default").select(schema.names)
