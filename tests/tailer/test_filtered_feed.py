"""Filters end to end: the filtered feed is the unfiltered feed filtered, at the same positions, across restarts."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from damage import Ran, run_inline
from deltalake import DeltaTable, write_deltalake

from deltatail.state.errors import ConfigError, InvalidLogError
from deltatail.state.filters import ChangeFilter
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_table

CDF = {"delta.enableChangeDataFeed": "true"}


def rows(ids: range, region: str) -> pa.Table:
    return pa.table(
        {"id": pa.array(list(ids), pa.int64()), "region": [region] * len(ids), "amount": [i * 1.5 for i in ids]}
    )


def history(root: Path, cdf: bool) -> None:
    """Appends, an update, a delete and a merge: rows of every change type, in several commits."""
    write_deltalake(str(root), rows(range(0, 10), "emea"), configuration=CDF if cdf else None)
    write_deltalake(str(root), rows(range(10, 20), "amer"), mode="append")
    dt = DeltaTable(str(root))
    dt.update(updates={"amount": "amount + 100"}, predicate="id % 3 = 0")
    dt.delete("id % 5 = 0")
    source = rows(range(15, 25), "apac")
    dt.merge(
        source, predicate="t.id = s.id", source_alias="s", target_alias="t"
    ).when_matched_update_all().when_not_matched_insert_all().execute()


def positioned(feed: ChangeFeed) -> list[dict[str, Any]]:
    """Every delivered row with its position."""
    out = []
    for batch in feed.batches(0):
        for i, row in enumerate(batch.rows.to_pylist()):
            p = batch.position(i)
            out.append({**row, "_position": (p.version, p.index, p.snapshot)})
    return out


@pytest.mark.parametrize("cdf", [True, False], ids=["cdc-files", "add-remove"])
def test_a_filtered_feed_is_the_unfiltered_feed_filtered_at_the_same_positions(tmp_path: Path, cdf: bool) -> None:
    history(tmp_path, cdf)
    everything = positioned(ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0)))
    f = ChangeFilter(
        columns=("id",),
        where="region <> 'amer' AND amount > 4",
        change_types=frozenset({"insert", "delete", "update_postimage"}),
    )
    filtered = positioned(ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0, filter=f)))
    expected = [
        {k: v for k, v in r.items() if k != "region" and k != "amount"}
        for r in everything
        if r["region"] != "amer" and r["amount"] > 4 and r["_change_type"] in ("insert", "delete", "update_postimage")
    ]
    assert filtered == expected and expected  # same rows, same order, same positions
    assert len(expected) < len(everything)


def test_skipped_operations_deliver_nothing_and_move_nothing_else(tmp_path: Path) -> None:
    history(tmp_path, cdf=True)
    everything = positioned(ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0)))
    f = ChangeFilter(skip_operations=frozenset({"DELETE"}))
    filtered = positioned(ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0, filter=f)))
    deletes = {h["version"] for h in DeltaTable(str(tmp_path)).history() if h["operation"] == "DELETE"}
    assert deletes
    assert filtered == [r for r in everything if r["_commit_version"] not in deletes]


def test_an_unknown_column_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    history(tmp_path, cdf=True)
    feed = ChangeFeed(str(tmp_path), options=ChangeOptions(filter=ChangeFilter(where="colour = 'red'")))
    with pytest.raises(ConfigError, match="unknown column 'colour'"):
        feed.check_filter()


def deltatail(*args: str) -> Ran:
    """``deltatail ARGS`` through the command line's entry point in this process (``damage.run_inline``)."""
    return run_inline(*args)


@pytest.mark.slow
def test_run_with_filters_delivers_exactly_once_across_restarts(tmp_path: Path) -> None:
    table, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    write_deltalake(str(table), rows(range(0, 10), "emea"), configuration=CDF)
    flags = [
        "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up",
        "--columns", "id", "--where", "id IN (0, 2, 4, 6, 8, 10, 12, 14, 16, 18)", "--change-types", "insert,delete",
    ]  # fmt: skip
    first = deltatail(*flags)
    assert first.returncode == 0, first.stderr
    write_deltalake(str(table), rows(range(10, 20), "amer"), mode="append")
    DeltaTable(str(table)).delete("id < 4")
    second = deltatail(*flags)
    assert second.returncode == 0, second.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    expected = positioned(ChangeFeed(str(table), options=ChangeOptions(reader_processes=0)))
    want = [
        (r["id"], r["_change_type"], r["_position"][:2])
        for r in expected
        if r["id"] % 2 == 0 and r["_change_type"] in ("insert", "delete")
    ]
    got = [(r["id"], r["_change_type"], tuple(r["_position"][:2])) for r in lines]
    assert got == want
    assert all(set(r) == {"id", "_change_type", "_commit_version", "_commit_timestamp", "_position"} for r in lines)


def test_a_bad_filter_is_a_config_error_on_the_command_line(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "t"), rows(range(3), "emea"))
    done = deltatail("changes", str(tmp_path / "t"), "--where", "amount >")
    assert done.returncode == 2 and "where: cannot parse" in done.stderr and "Traceback" not in done.stderr


# ---------------------------------------------------------------- pruning --


def pruned_tasks(feed: ChangeFeed) -> tuple[int, int]:
    """(pruned, all) file tasks of the feed's plans from version 0."""
    tasks = [t for plan in feed.plans(0) for t in plan.tasks]
    return sum(t.pruned for t in tasks), len(tasks)


def partitioned_history(root: Path, cdf: bool) -> None:
    """A table partitioned by region: appends to each region, an update, a delete and a merge across them."""
    write_deltalake(str(root), rows(range(0, 10), "emea"), partition_by=["region"], configuration=CDF if cdf else None)
    write_deltalake(str(root), rows(range(10, 20), "amer"), mode="append")
    write_deltalake(str(root), rows(range(20, 25), "apac"), mode="append")
    dt = DeltaTable(str(root))
    dt.update(updates={"amount": "amount + 100"}, predicate="id % 3 = 0")
    dt.delete("id % 5 = 0")
    source = pa.concat_tables([rows(range(18, 22), "amer"), rows(range(22, 24), "apac")])
    dt.merge(
        source, predicate="t.id = s.id AND t.region = s.region", source_alias="s", target_alias="t"
    ).when_matched_update_all().when_not_matched_insert_all().execute()


@pytest.mark.parametrize("processes", [0, 2], ids=["in-process", "reader-processes"])
@pytest.mark.parametrize("cdf", [True, False], ids=["cdc-files", "add-remove"])
def test_files_of_other_partitions_are_counted_not_read_and_positions_hold(
    tmp_path: Path, cdf: bool, processes: int
) -> None:
    partitioned_history(tmp_path, cdf)
    everything = positioned(ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0)))
    f = ChangeFilter(where="region IN ('emea', 'apac') AND _commit_version >= 1")
    feed = ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=processes, filter=f))
    expected = [r for r in everything if r["region"] in ("emea", "apac") and r["_commit_version"] >= 1]
    assert positioned(feed) == expected and expected
    pruned, total = pruned_tasks(feed)
    assert 0 < pruned < total  # amer's files and version 0's are never read


def test_change_types_prune_the_files_of_other_change_types(tmp_path: Path) -> None:
    partitioned_history(tmp_path, cdf=False)
    everything = positioned(ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0)))
    f = ChangeFilter(change_types=frozenset({"delete"}))
    feed = ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0, filter=f))
    assert positioned(feed) == [r for r in everything if r["_change_type"] == "delete"]
    pruned, total = pruned_tasks(feed)
    assert 0 < pruned < total  # every added file is only counted


def test_a_predicate_over_data_columns_prunes_nothing(tmp_path: Path) -> None:
    partitioned_history(tmp_path, cdf=True)
    f = ChangeFilter(where="region = 'emea' OR amount > 20")
    feed = ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0, filter=f))
    assert pruned_tasks(feed)[0] == 0


@pytest.mark.parametrize(
    "table",
    [
        "delta-golden/dv-partitioned-with-checkpoint/delta",
        "delta-golden/dv-with-columnmapping/delta",  # partition values under physical names
        "delta-spark/partitioned-table-with-dv-large",
    ],
)
def test_pruning_counts_deletion_vectors_exactly_on_corpus_tables(table: str, tmp_path: Path) -> None:
    root = str(corpus_table(table))
    if table.startswith("delta-spark/"):
        # Delta Spark's test builds name DV files test%dv%prefix-... without saying so in the log
        # (MANIFEST.md): readable once the prefix is stripped, in a copy.
        shutil.copytree(root, tmp_path / "t")
        for dv in (tmp_path / "t").glob("test%dv%prefix-*.bin"):
            dv.rename(dv.with_name(dv.name.removeprefix("test%dv%prefix-")))
        root = str(tmp_path / "t")
    partition = ChangeFeed(root).log.snapshot().metadata.partition_columns[0]  # type: ignore[union-attr]
    everything = positioned(ChangeFeed(root, options=ChangeOptions(reader_processes=0)))
    values = sorted({r[partition] for r in everything if r[partition] is not None})
    keep = values[: max(1, len(values) // 2)]
    f = ChangeFilter(where=f"{partition} IN ({', '.join(str(v) for v in keep)})")
    feed = ChangeFeed(root, options=ChangeOptions(reader_processes=0, filter=f))
    expected = [r for r in everything if r[partition] in keep]
    assert positioned(feed) == expected and expected
    assert pruned_tasks(feed)[0] > 0


def test_a_partition_value_that_does_not_parse_is_named_when_pruning(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path), pa.table({"id": [1], "n": pa.array([7], pa.int32())}), partition_by=["n"])
    log = tmp_path / "_delta_log" / f"{0:020d}.json"
    log.write_text(log.read_text().replace('"partitionValues":{"n":"7"}', '"partitionValues":{"n":"seven"}'))
    feed = ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0, filter=ChangeFilter(where="n = 7")))
    with pytest.raises(InvalidLogError, match="seven") as e:
        positioned(feed)
    assert e.value.version == 0 and e.value.file is not None and e.value.file.startswith("n=")


def test_an_empty_filtered_parquet_output_has_the_filtered_columns(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "t"), rows(range(3), "emea"))
    out = tmp_path / "none.parquet"
    done = deltatail("changes", str(tmp_path / "t"), "--columns", "id", "--where", "id < 0", "--output", str(out))
    assert done.returncode == 0, done.stderr
    written = pq.read_table(out)
    assert written.num_rows == 0
    assert written.column_names == ["id", "_change_type", "_commit_version", "_commit_timestamp"]
