"""arrow-rs (``arro3-io``) decoding large local files: the same batches as pyarrow's, or pyarrow reads the file.

The expectations are pyarrow's own batches of the same files (an independent decoder), the values
the tests wrote, and deltalake's reading of the tables.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cdf_helpers import HandTable, corpus_table, load_cdf, manifest_entries, multiset
from deltalake import write_deltalake

from deltatail.state.errors import DeltaTailError
from deltatail.state.filters import ChangeFilter
from deltatail.tailer.read import rows
from deltatail.tailer.read.arrow_rs import arrow_rs_batches
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions

SEQUENTIAL = ChangeOptions(read_ahead=0, allow_non_additive=True)


class Decoders:
    """Counts the large local files read whole: by ``arrow-rs``, or by ``pyarrow`` (arrow-rs declined or was off)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, *, arrow_rs: bool) -> None:
        self.used = Counter[str]()

        def decode(path: str, want: pa.Schema, batch_size: int) -> Iterator[pa.RecordBatch] | None:
            got = arrow_rs_batches(path, want, batch_size) if arrow_rs else None
            self.used["arrow-rs" if got is not None else "pyarrow"] += 1
            return got

        monkeypatch.setattr(rows, "arrow_rs_batches", decode)


def feed_batches(root: str, start: int = 0, end: int | None = None) -> list[pa.RecordBatch]:
    return [b.rows for b in ChangeFeed(root, options=SEQUENTIAL).batches(starting_version=start, ending_version=end)]


def outcome(root: str, start: int, end: int) -> list[pa.RecordBatch] | str:
    try:
        return feed_batches(root, start, end)
    except DeltaTailError as e:
        return f"{type(e).__name__}: {e}"


def assert_same_batches(got: list[pa.RecordBatch] | str, want: list[pa.RecordBatch] | str, where: str) -> None:
    if isinstance(want, str) or isinstance(got, str):
        assert got == want, where
        return
    assert len(got) == len(want), where
    for g, w in zip(got, want, strict=True):
        assert g.schema.equals(w.schema, check_metadata=True), (where, g.schema, w.schema)
        assert g.equals(w), where


@pytest.mark.slow
def test_every_corpus_table_reads_the_same_through_arrow_rs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file of every table goes to arrow-rs (the row threshold set to 0); pyarrow alone is the expectation."""
    monkeypatch.setattr(rows, "SMALL_FILE_ROWS", 0)
    ranges = {p: e["json_commit_range"] for p, e in manifest_entries().items() if e.get("json_commit_range")}
    roots = {p: str(corpus_table(p)) for p in ranges}
    pyarrow_only = Decoders(monkeypatch, arrow_rs=False)
    want = {p: outcome(roots[p], *ranges[p]) for p in ranges}
    both = Decoders(monkeypatch, arrow_rs=True)
    for p in ranges:
        assert_same_batches(outcome(roots[p], *ranges[p]), want[p], p)
    assert pyarrow_only.used["arrow-rs"] == 0
    # Most files are read by arrow-rs (1,269 of 1,329); the rest, with INT96 timestamps, by pyarrow.
    assert both.used["arrow-rs"] >= 500, both.used
    assert both.used["pyarrow"] >= 10, both.used
    assert sum(not isinstance(w, str) for w in want.values()) >= 150


def large_table(root: Path, rows_n: int = 300_000, **kw: Any) -> None:
    data = pa.table({"id": pa.array(range(rows_n), pa.int64()), "name": [f"n{i % 977}" for i in range(rows_n)]})
    write_deltalake(str(root), data, configuration={"delta.enableChangeDataFeed": "true"}, **kw)


def test_a_large_delta_rs_file_is_decoded_by_arrow_rs_into_pyarrows_types(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta-rs stores its strings as ``string_view`` in the file's Arrow schema; rows come out as ``string``."""
    large_table(tmp_path / "t")
    used = Decoders(monkeypatch, arrow_rs=True)
    got = pa.Table.from_batches(feed_batches(str(tmp_path / "t")))
    assert used.used == {"arrow-rs": 1}
    assert got.schema.field("name").type == pa.string()
    assert got.column("id").to_pylist() == list(range(300_000))
    assert got.column("name").to_pylist()[:3] == ["n0", "n1", "n2"]
    assert multiset(got) == multiset(load_cdf(tmp_path / "t", 0))


def test_deleted_rows_of_a_large_file_are_found_by_position(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A deletion vector's row indexes apply to arrow-rs's rows as to pyarrow's (file order, all rows)."""
    table = HandTable(tmp_path / "t", [{"name": "id", "type": "long", "nullable": True, "metadata": {}}])
    ids = pa.table({"id": pa.array(range(300_000), pa.int64())})
    table.commit([table.add("f.parquet", ids)])
    gone = [i for i in range(300_000) if i % 7 == 3]
    [dv] = table.file_dvs([gone])
    table.commit([table.remove("f.parquet"), table.add("f.parquet", dv=dv)])
    used = Decoders(monkeypatch, arrow_rs=True)
    got = pa.Table.from_batches(feed_batches(str(table.root), 1, 1))
    assert used.used == {"arrow-rs": 1}
    assert got.column("_change_type").unique().to_pylist() == ["delete"]
    assert got.column("id").to_pylist() == gone


def test_a_read_of_some_columns_goes_to_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """arro3-io reads every column of a file; a file with a column the read leaves out is read by pyarrow."""
    root = tmp_path / "t"
    data = pa.table({"id": pa.array(range(200_000), pa.int64()), "extra": pa.array(range(200_000), pa.int32())})
    write_deltalake(str(root), data)
    # The table's schema says only ``id`` (a column dropped from the schema but still in the file).
    file = next((root).glob("*.parquet"))
    pq.write_table(data.select(["id"]).append_column("gone", data["extra"]), file)
    used = Decoders(monkeypatch, arrow_rs=True)
    opts = ChangeOptions(read_ahead=0, filter=ChangeFilter(columns=("id",)))
    got = pa.Table.from_batches([b.rows for b in ChangeFeed(str(root), options=opts).batches(0, 0)])
    assert not used.used  # arrow-rs is not asked
    assert got.column("id").to_pylist() == list(range(200_000))


@pytest.mark.parametrize(
    ("values", "file_type", "want_type", "read"),
    [
        (["a", None], pa.string(), pa.string(), True),
        (["a", None], pa.string_view(), pa.string(), True),
        (["a", None], pa.large_string(), pa.string(), True),
        (["a", "a"], pa.dictionary(pa.int32(), pa.string()), pa.string(), True),
        ([b"a", None], pa.binary_view(), pa.binary(), True),
        ([1, 2], pa.timestamp("us", "+00:00"), pa.timestamp("us", "UTC"), True),
        ([1, 2], pa.timestamp("ns", "UTC"), pa.timestamp("us", "UTC"), False),
        ([1, 2], pa.timestamp("us", "Europe/Paris"), pa.timestamp("us", "UTC"), False),
        ([1, 2], pa.int32(), pa.int64(), False),
        ([[1], None], pa.large_list(pa.int64()), pa.list_(pa.int64()), False),
    ],
)
def test_which_layouts_arrow_rs_reads(
    tmp_path: Path, values: list[Any], file_type: pa.DataType, want_type: pa.DataType, read: bool
) -> None:
    """What the file's stored Arrow schema asks arrow-rs for decides: the same type, a cast, or pyarrow (``None``)."""
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"c": pa.array(values, file_type)}), path)
    want = pa.schema([pa.field("c", want_type)])
    got = arrow_rs_batches(str(path), want, 1024)
    if not read:
        assert got is None
        return
    assert got is not None
    [batch] = list(got)
    assert batch.schema == want
    assert batch.column(0).to_pylist() == pa.array(values, file_type).to_pylist()


def test_a_file_arrow_rs_cannot_open_is_left_to_pyarrow(tmp_path: Path) -> None:
    assert arrow_rs_batches(str(tmp_path / "missing.parquet"), pa.schema([("c", pa.int64())]), 1024) is None
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    assert arrow_rs_batches(str(tmp_path / "junk.parquet"), pa.schema([("c", pa.int64())]), 1024) is None


def test_damage_past_the_footer_names_the_table_version_and_file(tmp_path: Path) -> None:
    """A data page damaged in a large file: a DeltaTailError naming where, raised as pyarrow's would be."""
    root = tmp_path / "t"
    large_table(root)
    file = next(root.glob("*.parquet"))
    data = bytearray(file.read_bytes())
    for i in range(64, 4096):
        data[i] ^= 0x5A
    file.write_bytes(data)
    with pytest.raises(DeltaTailError, match="cannot read Parquet data") as caught:
        feed_batches(str(root))
    assert caught.value.version == 0 and caught.value.file is not None and file.name in caught.value.file
