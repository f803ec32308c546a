"""The ``main`` branch's snapshots in order, and the version each snapshot goes by. Pure.

deltatail numbers an Iceberg snapshot with a *version* so that positions, cursors and sinks work
as for Delta tables:

- format v2: the snapshot's ``sequence-number`` ("a monotonically increasing long that tracks the
  order of changes to a table"). Along one branch it increases, but not by one when other branches
  commit in between: versions may skip numbers.
- format v1 (no sequence numbers): the snapshot's ordinal along the ``main`` branch, the first
  snapshot being 1. This needs the whole ancestry: a v1 table whose oldest snapshots were expired
  cannot be numbered and is refused.

Errors follow the "never a silent skip" rule: a snapshot whose parent is gone cannot be read
exactly (its parent's files are the baseline), and a position that is no longer an ancestor of
``main`` (a branch reset or rollback) is refused rather than guessed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from deltatail.state.errors import InvalidLogError, VersionGapError
from deltatail.state.iceberg.model import SnapshotInfo, TableState

#: How to recover when snapshots a reader needs were expired.
EXPIRED_HINT = (
    "the snapshots before it were expired; start from a snapshot the table still holds "
    "(--starting-version), or with a new --state-dir and --initial-snapshot"
)


@dataclass(frozen=True, slots=True)
class Ancestry:
    """The ``main`` branch, oldest snapshot first, each with its version.

    Attributes:
        snapshots: the branch's snapshots the metadata holds, oldest first.
        versions: the version of each, in the same order (strictly increasing).
        complete: whether the oldest one is the table's first snapshot (no parent).
    """

    snapshots: tuple[SnapshotInfo, ...]
    versions: tuple[int, ...]
    complete: bool

    @property
    def latest(self) -> int:
        """The newest version (0 for a table with no snapshot yet)."""
        return self.versions[-1] if self.versions else 0

    def index_of_version(self, version: int) -> int:
        """The index of the first snapshot whose version is at least ``version`` (``len`` if none)."""
        lo, hi = 0, len(self.versions)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.versions[mid] < version:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def index_of_id(self, snapshot_id: int) -> int | None:
        """Where the snapshot ``snapshot_id`` is on the branch, ``None`` if it is not an ancestor of the head."""
        for i, s in enumerate(self.snapshots):
            if s.snapshot_id == snapshot_id:
                return i
        return None


def summary_says_first(snapshot: SnapshotInfo) -> bool:
    """Whether ``snapshot`` (with no parent) can be the table's first: its summary's totals are what it added.

    Writers drop the parent id of a snapshot whose parent was expired (pyiceberg does), so a missing
    parent does not prove a first snapshot. The summary's ``total-data-files`` and ``total-records``,
    where written, equal ``added-data-files`` and ``added-records`` only in a first snapshot (or one
    that replaced every row). Without totals the snapshot is taken as first.
    """
    summary = dict(snapshot.summary)
    for total, added in (("total-data-files", "added-data-files"), ("total-records", "added-records")):
        if total in summary and summary[total] != summary.get(added, "0"):
            return False
    return True


def first_files_say_first(snapshot: SnapshotInfo, data_sequences: Iterable[int]) -> bool:
    """Whether a parentless v2 snapshot's live files were all added by it (their data sequence number is its own).

    "the data sequence number of a file [added in a snapshot] is the snapshot's sequence number": a live
    file with a lower one came from an earlier snapshot, so the parent was there and is gone.
    """
    return all(seq >= snapshot.sequence_number for seq in data_sequences)


def main_ancestry(state: TableState, table: str | None = None) -> Ancestry:
    """The ``main`` branch of ``state``, oldest first, with versions (see the module docstring).

    Raises:
        InvalidLogError: if a parent chain loops, or sequence numbers do not increase along it (v2).
        VersionGapError: for a v1 table whose first snapshots were expired (it cannot be numbered).
    """
    chain: list[SnapshotInfo] = []
    seen: set[int] = set()
    at = state.main_head
    while at is not None and at in state.snapshots:
        if at in seen:
            raise InvalidLogError(f"snapshot {at}'s parent chain loops", table=table)
        seen.add(at)
        snap = state.snapshots[at]
        chain.append(snap)
        at = snap.parent_id
    if state.main_head is not None and not chain:
        raise InvalidLogError(f"the main branch's head snapshot {state.main_head} is not in the metadata", table=table)
    chain.reverse()
    complete = at is None and (not chain or summary_says_first(chain[0]))
    if state.format_version == 1:
        if not complete:
            raise VersionGapError(
                f"the format v1 table's snapshots before {chain[0].snapshot_id} were expired: without sequence "
                "numbers its snapshots cannot be numbered; upgrade the table to format v2",
                table=table,
            )
        versions = tuple(range(1, len(chain) + 1))
    else:
        versions = tuple(s.sequence_number for s in chain)
        for before, after, snap in zip(versions, versions[1:], chain[1:], strict=False):
            if after <= before:
                raise InvalidLogError(
                    f"snapshot {snap.snapshot_id} has sequence number {after}, not above its parent's {before}"
                    + (" (written before the table's upgrade to v2)" if after == 0 else ""),
                    table=table,
                    version=after,
                )
    return Ancestry(tuple(chain), versions, complete)


class Lost(Enum):
    """Why the snapshot a follower stands on is not on ``main`` (:func:`find_base`)."""

    #: it and the snapshots after it were expired: what came after it cannot be read exactly.
    EXPIRED = "expired"
    #: ``main`` no longer holds it: a rollback or a branch reset.
    LEFT_MAIN = "left main"


def find_base(ancestry: Ancestry, version: int, timestamp_ms: int) -> SnapshotInfo | Lost:
    """The snapshot a follower delivered (or audited) up to, named by its version and timestamp, on ``main``.

    A sequence number is never reused in a table, so a version and a timestamp name one snapshot.
    When ``main`` holds no such snapshot: :attr:`Lost.EXPIRED` if the branch's oldest snapshot left
    is newer and its parents were expired, else :attr:`Lost.LEFT_MAIN`.
    """
    index = ancestry.index_of_version(version)
    if index < len(ancestry.versions) and ancestry.versions[index] == version:
        found = ancestry.snapshots[index]
        if found.timestamp_ms == timestamp_ms:
            return found
        return Lost.LEFT_MAIN
    if ancestry.versions and ancestry.versions[0] > version and not ancestry.complete:
        return Lost.EXPIRED
    return Lost.LEFT_MAIN


def versions_after(ancestry: Ancestry, base: SnapshotInfo | None, next_version: int) -> tuple[int, ...]:
    """The versions on ``main`` still to follow: those after ``base`` (else from ``next_version`` on).

    ``base`` is the snapshot followed up to (on ``main``: :func:`find_base`); ``next_version`` the
    cursor's version, which no returned version is below (a start past the newest snapshot waits).
    """
    if base is not None:
        index = ancestry.index_of_id(base.snapshot_id)
        first = 0 if index is None else index + 1
    else:
        first = ancestry.index_of_version(next_version)
    return tuple(v for v in ancestry.versions[first:] if v >= next_version)
