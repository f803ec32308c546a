"""Stream offsets: the next file task to read, as Spark stores them in its offset log.

The same for both formats: a Delta plan's tasks are file tasks, a Lance plan's are row tasks
(:class:`~state.lance.planning.RowTask`: rows of one fragment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from state.errors import StateError
from state.iceberg.planning import IcebergPlan
from state.lance.planning import LancePlan
from state.planning import VersionPlan

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
        """The JSON object Spark stores in its offset log."""
        return {"tableId": self.table_id, "version": self.version, "index": self.index, "snapshot": self.snapshot}

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
        if not (isinstance(table_id, str) and ints and isinstance(snap, bool)):
            raise StateError(f"invalid deltatail offset {raw!r}")
        return Offset(table_id, version, index, snap)


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
    """The offset just after every task of ``plan``."""
    return Offset(table_id, plan_version(plan) + 1, 0, False)
