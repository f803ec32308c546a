"""state/iceberg/ancestry.py, pure: where a follower stands on ``main`` and which versions it has still to follow.

Both followers (``run``: tailer/iceberg/follow.py, ``audit --follow``: tailer/iceberg/audit_follow.py) use these.
Oracle: ancestries written out by hand (ids, parents, sequence numbers, timestamps).
"""

from __future__ import annotations

from deltatail.state.iceberg.ancestry import Ancestry, Lost, find_base, main_ancestry, versions_after
from deltatail.state.iceberg.model import SnapshotInfo, TableState


def snap(sid: int, parent: int | None, seq: int, ts: int | None = None) -> SnapshotInfo:
    return SnapshotInfo(sid, parent, seq, 1000 + sid if ts is None else ts, "append", (), 0, f"list-{sid}")


def ancestry(*snaps: SnapshotInfo, head: int | None) -> Ancestry:
    return main_ancestry(TableState("u", 2, "/t", {s.snapshot_id: s for s in snaps}, head, frozenset({0}), 0))


# main: 1 -> 2 -> 4 (versions 1, 3, 7); snapshot 3 (version 5) is on another branch off 2
A, B, C, D = snap(1, None, 1), snap(2, 1, 3), snap(3, 2, 5), snap(4, 2, 7)
MAIN = ancestry(A, B, C, D, head=4)


def test_the_base_is_the_snapshot_its_version_and_timestamp_name_on_main() -> None:
    assert MAIN.versions == (1, 3, 7)
    assert find_base(MAIN, 3, 1002) == B
    assert find_base(MAIN, 7, 1004) == D


def test_a_base_that_left_main_or_was_replaced_is_lost() -> None:
    assert find_base(MAIN, 5, 1003) is Lost.LEFT_MAIN  # on the other branch: a rollback or reset
    assert find_base(MAIN, 3, 9999) is Lost.LEFT_MAIN  # the version now names another snapshot
    assert find_base(MAIN, 9, 1009) is Lost.LEFT_MAIN  # newer than the head: the head was reset back
    assert find_base(ancestry(head=None), 3, 1002) is Lost.LEFT_MAIN  # no snapshot at all


def test_a_base_older_than_an_expired_history_is_expired() -> None:
    # snapshots 1 and 2 expired: main starts at 4, whose parent is gone
    expired = ancestry(snap(4, 2, 7), snap(5, 4, 8), head=5)
    assert not expired.complete
    assert find_base(expired, 3, 1002) is Lost.EXPIRED
    # the whole history still there: an older version that is not on it left main
    assert find_base(MAIN, 0, 1000) is Lost.LEFT_MAIN


def test_versions_after_the_base_or_from_the_cursor() -> None:
    assert versions_after(MAIN, A, 2) == (3, 7)
    assert versions_after(MAIN, D, 8) == ()
    assert versions_after(MAIN, None, 1) == (1, 3, 7)  # nothing delivered yet
    assert versions_after(MAIN, None, 2) == (3, 7)  # a start between versions
    assert versions_after(MAIN, None, 8) == ()  # a start past the newest waits for newer ones
    assert versions_after(MAIN, A, 5) == (7,)  # none below the cursor, even after the base
