"""Stream offsets: the next file task to read, as Spark stores them in its offset log.

The same for every format: a Delta plan's tasks are file tasks, a Lance plan's are row tasks
(:class:`~state.lance.planning.RowTask`: rows of one fragment), an Iceberg plan's row tasks.

An Iceberg offset also names the snapshot it reads on from (``baseSnapshotId``: the snapshot of
:attr:`Offset.base_version`), since a version (a sequence number, or an ordinal on a format v1
table) does not say which snapshot it was once ``main`` was rolled back or reset: a restarted query
checks that this snapshot is still the one ``main`` holds there (:mod:`sinks.spark.iceberg`).
Offsets of Delta tables and Lance datasets, and Iceberg offsets written before it was kept, have none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from deltatail.state.errors import StateError
from deltatail.state.iceberg.planning import IcebergPlan
from deltatail.state.lance.planning import LancePlan
from deltatail.state.planning import VersionPlan

#: ``(version, rank)``: rank 0 for an initial snapshot taken at ``version``, 1 for commit ``version``.
Key = tuple[int, int]
#: A planned version of any format: a Delta commit, a Lance version or an Iceberg snapshot (or an initial snapshot).
AnyPlan = VersionPlan | LancePlan | IcebergPlan


@dataclass(frozen=True, slots=True)
class Offset:
    """A stream offset: the next file task to read (see the module docstring)."""

    table_id: str
    version: int
    index: int
    snapshot: bool = False
    #: The id of the Iceberg snapshot the offset reads on from (``None``: not an Iceberg offset, or not known).
    base_snapshot: int | None = field(default=None, compare=False)

    @property
    def base_version(self) -> int:
        """The version whose snapshot the offset reads on from: its own for snapshot rows, else the one before."""
        return self.version if self.snapshot else self.version - 1

    @property
    def key(self) -> Key:
        """The ``(version, rank)`` of the plan this offset points into."""
        return (self.version, 0 if self.snapshot else 1)

    @property
    def position(self) -> tuple[int, int, int]:
        """A total order of offsets: ``(version, rank, index)``."""
        return (*self.key, self.index)

    def to_json(self) -> dict[str, Any]:
        """The JSON object Spark stores in its offset log (``baseSnapshotId`` only when known)."""
        out: dict[str, Any] = {
            "tableId": self.table_id,
            "version": self.version,
            "index": self.index,
            "snapshot": self.snapshot,
        }
        if self.base_snapshot is not None:
            out["baseSnapshotId"] = self.base_snapshot
        return out

    @staticmethod
    def from_json(raw: Any) -> Offset:
        """Parse :meth:`to_json` output.

        Raises:
            StateError: if ``raw`` is not such an object.
        """
        try:
            table_id, version, index, snap = raw["tableId"], raw["version"], raw["index"], raw["snapshot"]
        except (KeyError, TypeError) as e:
            raise StateError(f"invalid deltatail offset {raw!r}: missing {e}") from e
        ints = type(version) is int and type(index) is int and version >= 0 and index >= 0
        base = raw.get("baseSnapshotId")
        base_ok = base is None or (type(base) is int and -(2**63) <= base < 2**63)
        if not (isinstance(table_id, str) and ints and isinstance(snap, bool) and base_ok):
            raise StateError(f"invalid deltatail offset {raw!r}")
        return Offset(table_id, version, index, snap, base)


def plan_version(plan: AnyPlan) -> int:
    """The version a plan is of (its commit, or the version its snapshot is taken at)."""
    return plan.context.version if isinstance(plan, VersionPlan) else plan.version


def is_snapshot(plan: AnyPlan) -> bool:
    """Whether a plan is an initial snapshot's (an Iceberg plan says so in ``initial``)."""
    return plan.initial if isinstance(plan, IcebergPlan) else plan.snapshot


def plan_key(plan: AnyPlan) -> Key:
    """The ``(version, rank)`` of a plan."""
    return (plan_version(plan), 0 if is_snapshot(plan) else 1)


def after(plan: AnyPlan, table_id: str) -> Offset:
    """The offset just after every task of ``plan`` (reading on from an Iceberg plan's snapshot)."""
    base = plan.snapshot.snapshot_id if isinstance(plan, IcebergPlan) else None
    return Offset(table_id, plan_version(plan) + 1, 0, False, base)
