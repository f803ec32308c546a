"""Reading ahead on worker threads changes nothing a consumer can see: same rows, same order, same errors."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from state.errors import MissingFileError, VersionGapError
from tailer.changes import ChangeFeed, ChangeOptions


def _table(root: Path, commits: int) -> None:
    for i in range(commits):
        rows = pa.table({"id": [i * 10 + j for j in range(10)], "v": [f"row-{i}-{j}" for j in range(10)]})
        write_deltalake(root, rows, mode="append")


def _rows(feed: ChangeFeed, collected: list[tuple[int, int, int]]) -> None:
    for batch in feed.batches(0, None):
        ids = batch.rows.column("id").to_pylist()
        collected += [(batch.start.version, batch.start.index + i, ids[i]) for i in range(len(ids))]


def test_read_ahead_gives_the_rows_of_sequential_reading(tmp_path: Path) -> None:
    _table(tmp_path, 40)
    sequential: list[tuple[int, int, int]] = []
    ahead: list[tuple[int, int, int]] = []
    _rows(ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=0)), sequential)
    _rows(ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=16)), ahead)
    assert ahead == sequential
    assert [r[2] for r in ahead] == list(range(400))  # what the writer wrote, in commit order


def test_a_missing_file_is_raised_after_every_row_before_it(tmp_path: Path) -> None:
    _table(tmp_path, 30)

    def paths(version: int) -> set[str]:
        actions = DeltaTable(str(tmp_path), version=version).get_add_actions(flatten=True)
        return set(pa.table(actions).column("path").to_pylist())

    (added,) = paths(20) - paths(19)
    os.remove(tmp_path / added)
    collected: list[tuple[int, int, int]] = []
    with pytest.raises(MissingFileError) as info:
        _rows(ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=16)), collected)
    assert added in str(info.value)
    assert [r[2] for r in collected] == list(range(200))  # versions 0..19, all of them, nothing after


def test_a_gap_is_raised_after_every_row_before_it(tmp_path: Path) -> None:
    _table(tmp_path, 30)
    os.remove(tmp_path / "_delta_log" / f"{25:020d}.json")
    collected: list[tuple[int, int, int]] = []
    with pytest.raises(VersionGapError):
        _rows(ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=16)), collected)
    assert [r[2] for r in collected] == list(range(250))
