"""Lance datasets written by pylance for the tests: every kind of version, with and without stable row ids.

Each builder returns the list of ``(version, what)`` it made, so a failing check can say which
operation it was. Rows have an ``id`` (unique), a string ``name`` and a float ``score``.
"""

from __future__ import annotations

from pathlib import Path

import lance
import pyarrow as pa


def rows(ids: range | list[int], *, tag: str = "n", bump: float = 0.0) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"{tag}{i}" for i in ids], pa.string()),
            "score": pa.array([i * 0.5 + bump for i in ids], pa.float64()),
        }
    )


def every_kind(root: Path, *, stable: bool) -> list[tuple[int, str]]:
    """Appends, deletes (sparse .arrow and dense .bin), updates, merge-inserts, a whole-fragment delete,
    compaction, an index, a column addition, a rename and a drop, an overwrite and a restore."""
    uri = str(root)
    made: list[tuple[int, str]] = []

    def note(what: str) -> None:
        made.append((lance.dataset(uri).version, what))

    lance.write_dataset(rows(range(12_000)), uri, enable_stable_row_ids=stable, max_rows_per_file=8_000)
    note("create: 2 fragments")
    lance.write_dataset(rows(range(12_000, 12_300)), uri, mode="append", max_rows_per_file=100)
    note("append: 3 fragments")
    lance.dataset(uri).delete("id % 97 = 3")
    note("sparse delete (.arrow)")
    lance.dataset(uri).delete("id >= 1000 AND id < 7000")
    note("dense delete (.bin)")
    lance.dataset(uri).update({"score": "score + 1000"}, where="id >= 7000 AND id < 7100")
    note("update of 100 rows")
    lance.dataset(uri).update({"name": "'renamed'"}, where="id = 12050")
    note("update of one row in a small fragment")
    source = pa.concat_tables([rows(range(11_990, 12_010), tag="m", bump=7.0), rows(range(20_000, 20_005), tag="m")])
    lance.dataset(uri).merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(source)
    note("merge-insert: 20 updated, 5 inserted")
    lance.dataset(uri).merge_insert("id").when_not_matched_by_source_delete("id >= 12100 AND id < 12200").execute(
        rows([12_150, 30_000], tag="k")
    )
    note("merge-insert deleting rows the source does not match")
    lance.dataset(uri).delete("id >= 12200 AND id < 12300")
    note("delete of whole fragments")
    lance.dataset(uri).optimize.compact_files(target_rows_per_fragment=50_000, num_threads=1)
    for v in range(made[-1][0] + 1, lance.dataset(uri).version + 1):
        made.append((v, "compaction"))
    lance.dataset(uri).create_scalar_index("id", "BTREE")
    note("scalar index")
    lance.dataset(uri).add_columns({"double": "id * 2"})
    note("add_columns")
    lance.write_dataset(
        pa.table(
            {
                "id": pa.array([40_000, 40_001], pa.int64()),
                "name": ["a", "b"],
                "score": [1.0, 2.0],
                "double": pa.array([1, 2], pa.int64()),
            }
        ),
        uri,
        mode="append",
    )
    note("append after add_columns")
    lance.dataset(uri).update({"double": "double + 1"}, where="id < 100")
    note("update of the added column")
    lance.dataset(uri).alter_columns({"path": "double", "name": "twice"})  # type: ignore[dict-item]
    note("rename (non-additive)")
    lance.dataset(uri).drop_columns(["twice"])
    note("drop (non-additive)")
    lance.write_dataset(rows(range(50_000, 50_010), tag="o"), uri, mode="overwrite")
    note("overwrite")
    lance.write_dataset(rows(range(50_010, 50_020), tag="o"), uri, mode="append")
    note("append after overwrite")
    lance.dataset(uri, version=made[4][0]).restore()  # type: ignore[no-untyped-call]
    note("restore to the update of 100 rows")
    lance.dataset(uri).delete("id < 10")
    note("delete after restore")
    return made
