"""The plans a streaming query has not committed yet, shared by the Delta and the Lance planner.

Spark asks a source for the rows between two offsets more than once (a micro-batch is planned,
then read; a restarted query asks again from its last committed offset), so the driver keeps
every plan from the last committed offset to the newest planned version, in order of their keys,
and plans further versions lazily. What a planner adds is how it starts and moves on (a Delta
log follower, a Lance manifest), behind :meth:`PlanCache._rebuild` and :meth:`PlanCache._plan_new`.
"""

from __future__ import annotations

import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Generic, TypeVar

import pyarrow as pa

from deltatail.sinks.spark.offsets import Key, Offset, plan_key
from deltatail.sinks.spark.options import SourceOptions
from deltatail.state.errors import DeltaTailError, StateError
from deltatail.state.iceberg.planning import IcebergPlan
from deltatail.state.lance.planning import LancePlan
from deltatail.state.planning import VersionPlan

log = logging.getLogger("deltatail")

#: How often an idle stream lists the log (or ``_versions/``) to detect gaps and truncation (seconds).
CHECK_SECONDS = 5.0

P = TypeVar("P", VersionPlan, LancePlan, IcebergPlan)


class PlanCache(ABC, Generic[P]):
    """The driver's planning state of one query: the plans not yet committed, and a head to plan on from.

    Plans are cached in order of their keys; the newest is always that of the head. Any planning
    error is sticky (the head may be half moved on): it is raised again whenever planning reaches
    that version. ``jump`` is ``(position, offset)``: the state serves any start offset from
    ``position`` to ``offset`` (the start it was built for, and everything a data-loss skip jumped
    over).

    Args:
        options: the source's options.
        stream_schema: the query's fixed schema (Arrow).
    """

    def __init__(self, options: SourceOptions, stream_schema: pa.Schema) -> None:
        self.options = options
        self.stream_schema = stream_schema
        #: The last version a batch query (or ``availableNow``) plans; ``None``: no end.
        self.target: int | None = None
        #: How many times the state was built from the table (a restart, or an offset it did not serve).
        self.rebuilds = 0
        #: How many times the log no longer held what the stream needed and ``onDataLoss`` went on past it.
        self.data_losses = 0
        self.jump: tuple[tuple[int, int, int], Offset] | None = None
        #: The least time between two listings while idle (gap and truncation checks).
        self.check_seconds = CHECK_SECONDS
        self._plans: dict[Key, P] = {}
        self._failure: DeltaTailError | None = None
        self._last_check = -math.inf

    # -- what a planner says -------------------------------------------------------------------

    @property
    @abstractmethod
    def head_version(self) -> int:
        """The newest planned version."""

    @property
    @abstractmethod
    def built(self) -> bool:
        """Whether the state has been built (by :meth:`build`)."""

    @abstractmethod
    def _owner(self) -> str | None:
        """The table id the state belongs to (``None`` before it is known)."""

    @abstractmethod
    def _recreated(self, expected: str, found: str) -> StateError:
        """The error for offsets of table id ``expected`` read from a table that now has id ``found``."""

    @abstractmethod
    def _rebuild(self, start: Offset) -> None:
        """Build the planner's own state for ``start`` from the table (the cache is emptied already)."""

    @abstractmethod
    def _plan_new(self) -> P | None:
        """Plan the version after the head, moving the head on (``None``: nothing new now)."""

    # -- the cache -----------------------------------------------------------------------------

    def _covers(self, start: Offset) -> bool:
        if not self.built:
            return False
        if start.key in self._plans:
            return True
        if self.jump is not None and self.jump[0] <= start.position <= self.jump[1].position:
            return True
        return not start.snapshot and start.version == self.head_version + 1

    def ensure(self, start: Offset) -> None:
        """Make the state serve ``start``: reuse it, or rebuild it from the table (a restart).

        Raises:
            StateError: if the offset belongs to another table (deleted and recreated).
        """
        owner = self._owner()
        if start.table_id and owner and start.table_id != owner:
            raise self._recreated(start.table_id, owner)
        if not self._covers(start):
            self.build(start)

    def check_end(self, end: Offset) -> None:
        """Check that the table still holds what a micro-batch ending at ``end`` read (Spark replays batches).

        Nothing to check by default: a Delta or Lance version never changes. An Iceberg planner checks the
        snapshot the offset names (:meth:`sinks.spark.iceberg.IcebergStreamPlanner.check_end`).
        """

    def build(self, start: Offset) -> None:
        """Build the state for ``start`` from the table, dropping every cached plan and a sticky failure."""
        log.info("%s: building the stream's state for offset %s", self.options.path, start.to_json())
        self.rebuilds += 1
        self._plans.clear()
        self._failure = None
        self._rebuild(start)

    def plans_from(self, start: Offset, stop: Key | None = None) -> Iterator[P]:
        """Plans from ``start``'s on, in order, planning new versions lazily; none at or after ``stop``.

        Raises:
            StateError: if the table was deleted and recreated.
            DeltaTailError: what planning a new version raises (see the planner's docstring).
        """
        self.ensure(start)
        for key, plan in list(self._plans.items()):
            if key < start.key:
                continue
            if stop is not None and key >= stop:
                return
            yield plan
        while True:
            if stop is not None and (self.head_version + 1, 1) >= stop:
                return
            planned = self._plan_next()
            if planned is None:
                return
            yield planned

    def _plan_next(self) -> P | None:
        if self._failure is not None:
            raise self._failure
        if self.target is not None and self.head_version >= self.target:
            return None
        try:
            plan = self._plan_new()
        except DeltaTailError as e:
            self._failure = e
            raise
        if plan is not None:
            self._plans[plan_key(plan)] = plan
        return plan

    def forget_before(self, end: Offset) -> None:
        """Drop the cached plans wholly before ``end`` (Spark committed them; it never asks for them again)."""
        for key in [k for k in self._plans if k < end.key]:
            del self._plans[key]
        if self.jump is not None and end.position >= self.jump[1].position:
            self.jump = None

    @property
    def cached(self) -> int:
        """How many plans are cached."""
        return len(self._plans)
