"""A file sink reports the holdings of its own table only, and rows lost from it are not passed over.

Tables are written by deltalake in ``tmp_path``; the tailer runs in-process (``Tailer``) or as
``deltatail run`` through the command line's entry point (``damage.run_inline``, in this process);
sinks are real files and directories.

- Two tables, one sink (``jsonl:F`` or ``parquet:DIR``): the second table is refused with a
  ``SinkError`` naming both tables and the sink, and nothing of it is written (before: "sink
  already holds rows up to ...; skipping them", 0 rows, exit 0).
- A sink file truncated or deleted by hand: refused by default (``on_sink_gap = "fail"``) with the
  gap and the ways out; with ``on_sink_gap = "accept"`` a warning and ``TableStats.sink_gaps``.
- No false alarm: versions that deliver no rows (an empty table, an OPTIMIZE) leave the sink behind
  the cursor without a gap.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from damage import Ran, run_inline
from deltalake import DeltaTable, write_deltalake

from deltatail.sinks.embedded import JsonLinesSink, ParquetDirSink
from deltatail.state.errors import SinkError
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.sink import Sink

CDF = {"delta.enableChangeDataFeed": "true"}


def data(ids: range | list[int]) -> pa.Table:
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}" for i in ids], pa.string())})


def table_with(root: Path, *appends: range) -> str:
    """A table created with ``appends[0]`` and appended the others; returns its id."""
    write_deltalake(str(root), data(appends[0]), configuration=CDF)
    for ids in appends[1:]:
        write_deltalake(str(root), data(ids), mode="append")
    return str(DeltaTable(str(root)).metadata().id)


def run(root: Path, state: Path, sink: Sink, **kwargs: Any) -> Tailer:
    tailer = Tailer(TailerConfig(table=str(root), state_dir=str(state), until_caught_up=True, **kwargs), sink)
    tailer.run()
    return tailer


def jsonl_ids(path: Path) -> list[int]:
    return [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()] if path.exists() else []


def parquet_ids(directory: Path) -> list[int]:
    files = sorted(p for p in directory.glob("v*.parquet"))
    return [i for f in files for i in pq.read_table(f).column("id").to_pylist()]


def cli(*args: str) -> Ran:
    """``deltatail ARGS`` through the entry point in this process (``damage.run_inline``), in an environment
    without ``DELTATAIL_`` settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
    return run_inline(*args, env=env, clear=True)


# ---------------------------------------------------------------- two tables, one sink


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_a_second_table_on_one_sink_is_refused(tmp_path: Path, kind: str) -> None:
    """``run T1 --sink S`` then ``run T3 --sink S``: the second exits 1 naming both tables and S; S is unchanged."""
    t1, t3 = tmp_path / "t1", tmp_path / "t3"
    id1 = table_with(t1, range(12), range(12, 20))
    id3 = table_with(t3, range(100, 125))
    out = tmp_path / ("out.jsonl" if kind == "jsonl" else "out")
    uri = f"{kind}:{out}"
    first = cli("run", str(t1), "--state-dir", str(tmp_path / "s1"), "--sink", uri, "--until-caught-up")
    assert first.returncode == 0, first.stderr
    held = jsonl_ids(out) if kind == "jsonl" else parquet_ids(out)
    assert Counter(held) == Counter(range(20))
    second = cli("run", str(t3), "--state-dir", str(tmp_path / "s3"), "--sink", uri, "--until-caught-up")
    assert second.returncode == 1, second.stderr
    for name in (id1, id3, str(t1), str(t3)):
        assert name in second.stderr, second.stderr
    assert str(out) in second.stderr and "Traceback" not in second.stderr
    assert "skipping" not in second.stderr
    assert (jsonl_ids(out) if kind == "jsonl" else parquet_ids(out)) == held


def test_a_jsonl_file_emptied_may_change_table(tmp_path: Path) -> None:
    """Holdings are only what the file holds: once it is empty, another table may use it (from its start)."""
    t1, t3 = tmp_path / "t1", tmp_path / "t3"
    table_with(t1, range(5))
    table_with(t3, range(100, 103))
    out = tmp_path / "out.jsonl"
    run(t1, tmp_path / "s1", JsonLinesSink(str(out)))
    out.write_bytes(b"")
    run(t3, tmp_path / "s3", JsonLinesSink(str(out)))
    assert jsonl_ids(out) == [100, 101, 102]


def test_a_jsonl_file_of_an_older_deltatail_is_adopted_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file with rows and no record of their table (no marker beside it): adopted, resumed, and said so."""
    root = tmp_path / "t"
    tid = table_with(root, range(4), range(4, 6))
    out = tmp_path / "out.jsonl"
    run(root, tmp_path / "s", JsonLinesSink(str(out)))
    marker = tmp_path / ".out.jsonl.deltatail.json"
    assert orjson.loads(marker.read_bytes())["deltatail.table_id"] == tid
    marker.unlink()  # as an older deltatail left it
    write_deltalake(str(root), data(range(6, 8)), mode="append")
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        run(root, tmp_path / "fresh-state", JsonLinesSink(str(out)))
    assert jsonl_ids(out) == list(range(8))  # the fresh tailer skipped what the file held
    assert any("does not record their table" in r.getMessage() and str(out) in r.getMessage() for r in caplog.records)
    assert orjson.loads(marker.read_bytes())["deltatail.table_id"] == tid


def test_parquet_files_record_their_table_and_legacy_files_are_adopted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "t"
    tid = table_with(root, range(3))
    out = tmp_path / "out"
    run(root, tmp_path / "s", ParquetDirSink(str(out)))
    (only,) = out.glob("v*.parquet")
    meta = pq.read_metadata(only).metadata
    assert meta[b"deltatail.table_id"] == tid.encode() and meta[b"deltatail.table"] == str(root).encode()
    table = pq.read_table(only)
    pq.write_table(table.replace_schema_metadata({}), only)  # as an older deltatail wrote it
    write_deltalake(str(root), data(range(3, 5)), mode="append")
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        run(root, tmp_path / "fresh-state", ParquetDirSink(str(out)))
    assert parquet_ids(out) == list(range(5))
    assert any("does not record their table" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------- rows lost from the sink


def _truncate_to(path: Path, lines: int) -> None:
    kept = path.read_bytes().splitlines(keepends=True)[:lines]
    path.write_bytes(b"".join(kept))


@pytest.mark.parametrize("damage", ["truncated", "deleted"])
def test_a_jsonl_file_that_lost_rows_is_refused(tmp_path: Path, damage: str) -> None:
    root, state, out = tmp_path / "t", tmp_path / "s", tmp_path / "out.jsonl"
    table_with(root, range(10), range(10, 20), range(20, 33))
    run(root, state, JsonLinesSink(str(out)))
    assert jsonl_ids(out) == list(range(33))
    if damage == "truncated":
        _truncate_to(out, 14)  # keeps version 0 and 4 rows of version 1
    else:
        out.unlink()
    write_deltalake(str(root), data(range(33, 35)), mode="append")
    with pytest.raises(SinkError) as info:
        run(root, state, JsonLinesSink(str(out)))
    text = str(info.value)
    assert str(out) in text and str(root) in text, text
    assert "up to 2:12" in text, text  # rows up to the end of version 2 (13 rows) were delivered
    assert (" from 1:4 to 2:12 " if damage == "truncated" else " from the start to 2:12 ") in text, text
    assert f"deltatail seek {state} --to-version {1 if damage == 'truncated' else 0}" in text, text
    assert "on_sink_gap" in text
    assert jsonl_ids(out) == (list(range(14)) if damage == "truncated" else [])  # nothing written past the gap
    seek = cli("seek", str(state), "--to-version", "1" if damage == "truncated" else "0")  # the way out it names
    assert seek.returncode == 0, seek.stderr
    run(root, state, JsonLinesSink(str(out)))
    assert jsonl_ids(out) == list(range(35))  # the missing rows again, once; the held ones not repeated


def test_a_gap_accepted_is_warned_counted_and_passed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root, state, out = tmp_path / "t", tmp_path / "s", tmp_path / "out.jsonl"
    table_with(root, range(10), range(10, 20))
    run(root, state, JsonLinesSink(str(out)))
    _truncate_to(out, 10)
    write_deltalake(str(root), data(range(20, 23)), mode="append")
    stats = TableStats(str(root), "t")
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        tailer = Tailer(
            TailerConfig(table=str(root), state_dir=str(state), until_caught_up=True, on_sink_gap="accept"),
            JsonLinesSink(str(out)),
            stats=stats,
        )
        tailer.run()
    assert jsonl_ids(out) == [*range(10), 20, 21, 22]  # the gap stays; the new rows arrive
    assert stats.sink_gaps == 1
    warned = [r.getMessage() for r in caplog.records if "missing" in r.getMessage()]
    assert warned and str(out) in warned[0] and "on_sink_gap = accept" in warned[0], warned


def test_a_parquet_directory_that_lost_its_newest_file_is_refused(tmp_path: Path) -> None:
    root, state, out = tmp_path / "t", tmp_path / "s", tmp_path / "out"
    table_with(root, range(4))
    run(root, state, ParquetDirSink(str(out)), checkpoint_commits=1)
    write_deltalake(str(root), data(range(4, 8)), mode="append")
    run(root, state, ParquetDirSink(str(out)), checkpoint_commits=1)
    newest = max(out.glob("v*.parquet"))
    newest.unlink()
    with pytest.raises(SinkError, match="missing") as info:
        run(root, state, ParquetDirSink(str(out)))
    assert str(out) in str(info.value)


@pytest.mark.slow
def test_the_cli_refuses_a_gap_and_accepts_it_when_told(tmp_path: Path) -> None:
    root, state, out = tmp_path / "t", tmp_path / "s", tmp_path / "out.jsonl"
    table_with(root, range(5), range(5, 9))
    base = ["run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up"]
    assert cli(*base).returncode == 0
    out.unlink()
    refused = cli(*base)
    assert refused.returncode == 1 and "missing" in refused.stderr and "Traceback" not in refused.stderr
    accepted = cli(*base, "--on-sink-gap", "accept")
    assert accepted.returncode == 0, accepted.stderr
    assert "missing" in accepted.stderr
    assert cli(*base).returncode == 0  # the gap was passed: rows delivered since are held again


def test_versions_without_rows_are_not_a_gap(tmp_path: Path) -> None:
    """An empty table's first version and an OPTIMIZE deliver no rows: the sink is behind the cursor, rightly."""
    root, state, out = tmp_path / "t", tmp_path / "s", tmp_path / "out.jsonl"
    write_deltalake(str(root), data([]), configuration=CDF)
    run(root, state, JsonLinesSink(str(out)))
    assert jsonl_ids(out) == []
    run(root, state, JsonLinesSink(str(out)))  # nothing held, nothing delivered: no gap
    write_deltalake(str(root), data(range(3)), mode="append")
    write_deltalake(str(root), data(range(3, 6)), mode="append")
    run(root, state, JsonLinesSink(str(out)))
    DeltaTable(str(root)).optimize.compact()  # dataChange=false: no change rows
    run(root, state, JsonLinesSink(str(out)))
    run(root, state, JsonLinesSink(str(out)))
    assert jsonl_ids(out) == list(range(6))
