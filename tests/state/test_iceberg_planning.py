"""state.iceberg, pure: ancestry numbering, which delete files apply, and the refusals (no IO)."""

from __future__ import annotations

import pytest

from deltatail.state.errors import InvalidLogError, UnsupportedFeatureError, VersionGapError
from deltatail.state.iceberg.ancestry import main_ancestry
from deltatail.state.iceberg.model import (
    DATA,
    EQUALITY_DELETES,
    POSITION_DELETES,
    ContentFile,
    SnapshotInfo,
    TableState,
)
from deltatail.state.iceberg.planning import DeleteIndex, check_files, plan_snapshot


def snap(sid: int, parent: int | None, seq: int, op: str = "append", **summary: str) -> SnapshotInfo:
    return SnapshotInfo(sid, parent, seq, 1000 + sid, op, tuple(sorted(summary.items())), 0, f"list-{sid}")


def state(*snaps: SnapshotInfo, head: int | None, version: int = 2) -> TableState:
    return TableState("u", version, "/t", {s.snapshot_id: s for s in snaps}, head, frozenset({0}), 0)


def f(
    path: str,
    content: int = DATA,
    seq: int = 1,
    spec: int = 1,
    part: tuple[object, ...] = (1,),
    file_format: str = "PARQUET",
    equality_ids: tuple[int, ...] = (),
    referenced_data_file: str | None = None,
) -> ContentFile:
    return ContentFile(path, content, spec, part, 3, 100, seq, file_format, equality_ids, referenced_data_file)


def test_versions_are_sequence_numbers_in_v2_and_ordinals_in_v1() -> None:
    a, b, c = snap(1, None, 1), snap(2, 1, 4), snap(3, 2, 9)
    assert main_ancestry(state(a, b, c, head=3)).versions == (1, 4, 9)
    assert main_ancestry(state(a, b, c, head=2)).versions == (1, 4)  # snapshot 3 is not on main
    assert main_ancestry(state(snap(1, None, 0), snap(2, 1, 0), head=2, version=1)).versions == (1, 2)


def test_broken_ancestries_are_refused() -> None:
    with pytest.raises(InvalidLogError, match="loops"):
        main_ancestry(state(snap(1, 2, 1), snap(2, 1, 2), head=2))
    with pytest.raises(InvalidLogError, match="not above its parent"):
        main_ancestry(state(snap(1, None, 3), snap(2, 1, 3), head=2))
    with pytest.raises(InvalidLogError, match="not in the metadata"):
        main_ancestry(state(snap(1, None, 1), head=7))
    # a parent gone (or dropped by the writer, the totals say so) in a v1 table: it cannot be numbered
    with pytest.raises(VersionGapError, match="v1"):
        main_ancestry(state(snap(2, 1, 0), head=2, version=1))
    gone = snap(2, None, 0, **{"total-data-files": "2", "added-data-files": "1"})
    with pytest.raises(VersionGapError):
        main_ancestry(state(gone, head=2, version=1))
    assert not main_ancestry(state(snap(2, None, 5, **{"total-records": "9", "added-records": "3"}), head=2)).complete


def test_delete_files_apply_by_sequence_number_and_partition() -> None:
    data = f("d", seq=3)
    pos_same = f("p1", POSITION_DELETES, seq=3)  # position deletes: data sequence <= delete sequence
    pos_old = f("p0", POSITION_DELETES, seq=2)
    eq_same = f("e1", EQUALITY_DELETES, seq=3, equality_ids=(1,))  # equality deletes: strictly below
    eq_new = f("e2", EQUALITY_DELETES, seq=4, equality_ids=(1,))
    other_part = f("p2", POSITION_DELETES, seq=5, part=(2,))
    unpartitioned = f("p3", POSITION_DELETES, seq=5, spec=0, part=())
    named_other = f("p4", POSITION_DELETES, seq=5, referenced_data_file="x")
    index = DeleteIndex([pos_same, pos_old, eq_same, eq_new, other_part, unpartitioned, named_other], frozenset({0}))
    assert set(index.for_data(data)) == {pos_same, eq_new, unpartitioned}


def dv(path: str, data: str, seq: int, offset: int | None = 4) -> ContentFile:
    return ContentFile(path, POSITION_DELETES, 1, (1,), 2, 100, seq, "PUFFIN", (), data, offset, 40)


def test_a_deletion_vector_applies_to_its_data_file_and_replaces_position_delete_files() -> None:
    data = f("d", seq=3)
    pos = f("p1", POSITION_DELETES, seq=3)
    eq = f("e1", EQUALITY_DELETES, seq=4, equality_ids=(1,))
    vector, other, old = dv("v.puffin", "d", 4), dv("w.puffin", "other", 4), dv("o.puffin", "d", 2)
    # the vector of another file and one older than the data file do not apply; the position delete file is
    # ignored once a vector applies ("such a vector must contain all deletes from existing position delete files")
    index = DeleteIndex([pos, eq, vector, other, old], frozenset({0}))
    assert set(index.for_data(data)) == {eq, vector}
    assert set(DeleteIndex([pos, eq, other, old], frozenset({0})).for_data(data)) == {pos, eq}
    with pytest.raises(InvalidLogError, match="2 deletion vectors") as e:
        DeleteIndex([vector, dv("v.puffin", "d", 5, offset=60)], frozenset({0})).for_data(data)
    assert e.value.file == "d"


def test_a_replaced_deletion_vector_deletes_only_its_new_positions() -> None:
    data = f("d", seq=1)
    first, second = dv("v1.puffin", "d", 2), dv("v2.puffin", "d", 3)
    plan = plan_snapshot([data, first], [data, second], snap(3, 2, 3, "delete"), 3, frozenset({0}))
    # rows the new vector deletes and the old did not; and rows the old deleted and the new does not
    assert [(t.change_type, t.minus, t.within) for t in plan.tasks] == [
        ("delete", (first,), (second,)),
        ("insert", (second,), (first,)),
    ]


def test_files_deltatail_cannot_read_are_refused_before_reading() -> None:
    with pytest.raises(InvalidLogError, match="content_offset") as e:
        check_files([dv("dv.puffin", "d", 2, offset=None)], table="/t", version=4)
    assert (e.value.table, e.value.version, e.value.file) == ("/t", 4, "dv.puffin")
    check_files([dv("dv.puffin", "d", 2)], table="/t", version=4)  # a whole entry: read
    with pytest.raises(UnsupportedFeatureError, match="ORC data file") as u:
        check_files([f("d.orc", file_format="ORC")], table="/t", version=4)
    assert (u.value.table, u.value.version, u.value.file) == ("/t", 4, "d.orc")
    with pytest.raises(UnsupportedFeatureError, match="PUFFIN delete file"):  # equality deletes in Puffin
        check_files([f("e.puffin", EQUALITY_DELETES, file_format="PUFFIN", equality_ids=(1,))], table="/t", version=4)
    with pytest.raises(InvalidLogError, match="no equality field ids"):
        check_files([f("e", EQUALITY_DELETES)], table="/t", version=4)
    # a snapshot adding a deletion vector without its place in the Puffin file is refused when planned
    s1, s2 = snap(1, None, 1), snap(2, 1, 2, "delete")
    data = f("d", seq=1)
    with pytest.raises(InvalidLogError):
        plan_snapshot([data], [data, dv("dv", "d", 2, offset=None)], s2, 2, frozenset({0}))
    assert plan_snapshot(None, [data], s1, 1, frozenset({0})).tasks[0].change_type == "insert"
    assert plan_snapshot([data], [f("z", seq=2)], snap(3, 2, 3, "replace"), 3, frozenset({0})).tasks == ()
