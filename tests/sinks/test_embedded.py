"""The embedded sinks and sink URIs: what they write, what they report on reopening, how they fail."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from deltatail.sinks.embedded import (
    DICTIONARY_PAGE_BYTES,
    ROW_GROUP_ROWS,
    JsonLinesSink,
    ParquetDirSink,
)
from deltatail.sinks.json_text import ENCODE_ROWS
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.cli.settings import load_toml
from deltatail.tailer.cli.sink_uri import open_sink

TABLE = TableInfo("/data/t", "table-id", "t")


def _batch(version: int, start: int, ids: list[int], *, snapshot: bool = False) -> ChangeBatch:
    rows = pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "_change_type": pa.array(["insert"] * len(ids)),
            "_commit_version": pa.array([version] * len(ids), pa.int64()),
            "_commit_timestamp": pa.array([1_700_000_000_000_000] * len(ids), pa.timestamp("us", tz="UTC")),
        }
    )
    pos = Position.in_snapshot(version, start) if snapshot else Position.change(version, start)
    return ChangeBatch(pos, rows)


def test_jsonl_file_reports_the_position_after_its_last_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = JsonLinesSink(str(path))
    assert sink.open(TABLE) is None
    sink.write(_batch(3, 0, [1, 2]))
    sink.write(_batch(4, 0, [3]))
    sink.flush()
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["id"] for line in lines] == [1, 2, 3]
    assert [line["_position"] for line in lines] == [[3, 0, False], [3, 1, False], [4, 0, False]]
    assert lines[0]["_commit_timestamp"] == "2023-11-14T22:13:20.000000Z"
    again = JsonLinesSink(str(path))
    assert again.open(TABLE) == Position.change(4, 1)
    again.close()


def test_jsonl_file_writes_a_long_batch_slice_by_slice_every_row_once_in_order(tmp_path: Path) -> None:
    """A batch of 2.5 encoding slices: every row once, in order, at its own position, in both encodings."""
    path = tmp_path / "out.jsonl"
    count = 2 * ENCODE_ROWS + ENCODE_ROWS // 2
    sink = JsonLinesSink(str(path))
    sink.open(TABLE)
    sink.write(_batch(3, 10, list(range(count))))
    sink.write(_batch(4, 0, [7]))  # a short batch: the row-by-row encoding
    sink.flush()
    sink.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["id"] for line in lines] == [*range(count), 7]
    assert [line["_position"] for line in lines] == [[3, 10 + i, False] for i in range(count)] + [[4, 0, False]]
    assert {line["_change_type"] for line in lines} == {"insert"}


def test_jsonl_file_drops_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = JsonLinesSink(str(path))
    sink.open(TABLE)
    sink.write(_batch(0, 0, [1, 2, 3]))
    sink.flush()
    sink.close()
    whole = path.read_bytes()
    path.write_bytes(whole + whole.splitlines(keepends=True)[0][:15])  # a crash mid-write
    again = JsonLinesSink(str(path))
    assert again.open(TABLE) == Position.change(0, 3)
    again.close()
    assert path.read_bytes() == whole


def test_jsonl_file_refuses_a_file_that_is_not_its_own(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    path.write_text('{"hello": "world"}\n')
    with pytest.raises(SinkError, match="not a deltatail change row"):
        JsonLinesSink(str(path)).open(TABLE)
    with pytest.raises(SinkError, match="cannot open"):
        JsonLinesSink(str(tmp_path / "missing-dir" / "out.jsonl")).open(TABLE)


def test_jsonl_write_before_open_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SinkError, match="not open"):
        JsonLinesSink(str(tmp_path / "x.jsonl")).write(_batch(0, 0, [1]))


def test_parquet_dir_names_files_by_position_and_resumes_after_the_largest(tmp_path: Path) -> None:
    sink = ParquetDirSink(str(tmp_path / "out"))
    assert sink.open(TABLE) is None
    sink.write(_batch(5, 0, [1, 2], snapshot=True))
    sink.flush()
    sink.write(_batch(6, 0, [3]))
    sink.write(_batch(6, 1, [4]))
    sink.flush()
    sink.write(_batch(7, 0, [5]))  # never flushed: never acknowledged
    sink.close()
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert files == [
        "v00000000000000000005-s000000000000_v00000000000000000005-s000000000002.parquet",
        "v00000000000000000006-c000000000000_v00000000000000000006-c000000000002.parquet",
    ]
    ids = [pq.read_table(tmp_path / "out" / f).column("id").to_pylist() for f in files]
    assert ids == [[1, 2], [3, 4]]
    (tmp_path / "out" / ".v1_v2.parquet.tmp").write_bytes(b"half")
    again = ParquetDirSink(str(tmp_path / "out"))
    assert again.open(TABLE) == Position.change(6, 2)
    assert not (tmp_path / "out" / ".v1_v2.parquet.tmp").exists()


def test_parquet_dir_encodes_row_groups_as_rows_arrive_and_shows_the_file_only_at_flush(tmp_path: Path) -> None:
    """A flush covering many batches is one file of row groups of at most ROW_GROUP_ROWS rows: small batches
    gathered into one row group, a run larger than it cut; nothing is visible under a final name before
    the flush, and a close without flush leaves no file at all."""
    out = tmp_path / "out"
    sink = ParquetDirSink(str(out))
    sink.open(TABLE)
    sink.write(_batch(1, 0, [1, 2, 3]))
    sink.write(_batch(2, 0, [4]))
    big = list(range(10, 10 + 2 * ROW_GROUP_ROWS + 5))
    sink.write(_batch(3, 0, big))
    assert [p.name for p in out.iterdir() if not p.name.startswith(".")] == []
    sink.flush()
    (name,) = [p.name for p in out.iterdir()]
    assert name == f"v00000000000000000001-c000000000000_v00000000000000000003-c{len(big):012d}.parquet"
    meta = pq.read_metadata(out / name)
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert max(sizes) <= ROW_GROUP_ROWS and sum(sizes) == 4 + len(big)
    assert sizes[0] == ROW_GROUP_ROWS  # the four small rows went into the first group with the big run's start
    assert pq.read_table(out / name).column("id").to_pylist() == [1, 2, 3, 4, *big]
    assert (meta.metadata or {})[b"deltatail.table_id"] == b"table-id"
    sink.write(_batch(4, 0, [7]))
    sink.close()
    assert [p.name for p in out.iterdir()] == [name]


def test_parquet_dir_keeps_dictionaries_for_few_values_and_writes_many_plainly(tmp_path: Path) -> None:
    """A column of distinct values stops building its dictionary at DICTIONARY_PAGE_BYTES (pyarrow's own
    limit, 1 MiB, would hold all 65,536 ids of a row group: 512 KiB of dictionary), while the change
    columns' few values stay dictionary-encoded (a 65,536-row chunk of them is a few hundred bytes)."""
    out = tmp_path / "out"
    sink = ParquetDirSink(str(out))
    sink.open(TABLE)
    ids = list(range(ROW_GROUP_ROWS))
    sink.write(_batch(1, 0, ids))
    sink.flush()
    (name,) = [p for p in out.iterdir()]
    group = pq.read_metadata(name).row_group(0)
    chunks = {group.column(i).path_in_schema: group.column(i) for i in range(group.num_columns)}
    ids_chunk = chunks["id"]
    dictionary_page = ids_chunk.data_page_offset - ids_chunk.dictionary_page_offset
    assert dictionary_page <= DICTIONARY_PAGE_BYTES + 64  # the page and its header
    assert ids_chunk.total_uncompressed_size > ROW_GROUP_ROWS * 8  # the ids written out, not referenced
    for change_column in ("_change_type", "_commit_version", "_commit_timestamp"):
        assert chunks[change_column].has_dictionary_page
        assert chunks[change_column].total_compressed_size < 1024
    assert pq.read_table(name).column("id").to_pylist() == ids


def test_parquet_dir_starts_a_new_file_when_the_schema_changes_inside_a_flush(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = ParquetDirSink(str(out))
    sink.open(TABLE)
    sink.write(_batch(1, 0, [1]))
    widened = _batch(2, 0, [2])
    widened = ChangeBatch(widened.start, widened.rows.append_column("extra", pa.array(["x"])))
    sink.write(widened)
    sink.flush()
    files = sorted(out.iterdir())
    assert [pq.read_schema(f).names for f in files] == [
        ["id", "_change_type", "_commit_version", "_commit_timestamp"],
        ["id", "_change_type", "_commit_version", "_commit_timestamp", "extra"],
    ]
    assert [pq.read_table(f).column("id").to_pylist() for f in files] == [[1], [2]]


def test_parquet_dir_removed_under_the_sink_is_an_error_at_write_or_flush(tmp_path: Path) -> None:
    out = tmp_path / "out"
    sink = ParquetDirSink(str(out))
    sink.open(TABLE)
    out.rmdir()
    with pytest.raises(SinkError, match="cannot write Parquet output"):
        sink.write(_batch(1, 0, [1]))
        sink.flush()


def test_parquet_dir_that_cannot_be_created_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SinkError):
        ParquetDirSink(str(tmp_path / "file" / "out")).open(TABLE)


@pytest.mark.parametrize("uri", ["csv:out.csv", "jsonl:", "parquet:", "s3://bucket/x"])
def test_unknown_or_empty_sink_uris_are_config_errors(uri: str) -> None:
    with pytest.raises(ConfigError):
        open_sink(uri)


def test_sink_uris() -> None:
    assert isinstance(open_sink("jsonl:-"), JsonLinesSink)
    assert isinstance(open_sink("jsonl:/tmp/x.jsonl"), JsonLinesSink)
    assert isinstance(open_sink("parquet:/tmp/out"), ParquetDirSink)


def test_bad_settings_are_config_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("state_dir = [")
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_toml(str(bad))
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('colour = "blue"\n')
    with pytest.raises(ConfigError, match="unknown setting"):
        load_toml(str(unknown))
    wrong = tmp_path / "wrong.toml"
    wrong.write_text('[run]\npoll-interval = "often"\n')
    with pytest.raises(ConfigError, match="poll_interval"):
        load_toml(str(wrong))
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_toml(str(tmp_path / "absent.toml"))


OTHER = TableInfo("/data/u", "other-id", "u")


def test_jsonl_file_of_another_table_is_refused_and_a_broken_record_named(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    sink = JsonLinesSink(str(path))
    sink.open(TABLE)
    sink.write(_batch(0, 0, [1]))
    sink.flush()
    sink.close()
    with pytest.raises(SinkError, match="holds rows of table /data/t \\(id table-id\\), not of /data/u") as e:
        JsonLinesSink(str(path)).open(OTHER)
    assert e.value.file == str(path)
    marker = tmp_path / ".out.jsonl.deltatail.json"
    marker.write_text("{not json")
    with pytest.raises(SinkError, match="cannot read which table") as e:
        JsonLinesSink(str(path)).open(TABLE)
    assert e.value.file == str(marker)


def test_parquet_directory_of_another_table_or_an_unreadable_newest_file_is_refused(tmp_path: Path) -> None:
    sink = ParquetDirSink(str(tmp_path))
    sink.open(TABLE)
    sink.write(_batch(0, 0, [1, 2]))
    sink.flush()
    sink.close()
    with pytest.raises(SinkError, match="holds rows of table /data/t \\(id table-id\\), not of /data/u"):
        ParquetDirSink(str(tmp_path)).open(OTHER)
    (only,) = tmp_path.glob("v*.parquet")
    assert pq.read_table(only).column("id").to_pylist() == [1, 2]  # the rows users read are unchanged
    broken = tmp_path / f"v{1:020d}-c{0:012d}_v{1:020d}-c{1:012d}.parquet"  # the newest by its name
    broken.write_bytes(b"not parquet")
    with pytest.raises(SinkError, match="cannot read the newest Parquet output file") as e:
        ParquetDirSink(str(tmp_path)).open(TABLE)
    assert e.value.file == str(broken)
