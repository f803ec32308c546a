"""Reading ahead on worker threads changes nothing a consumer can see: same rows, same order, same errors."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Generator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.state.errors import MissingFileError, VersionGapError
from deltatail.tailer.read import prefetch, read_ahead
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.rows import FileBatch
from deltatail.tailer.read.tasks import decode_task
from deltatail.tailer.storage.local import LocalStorage


def _table(root: Path, commits: int) -> None:
    for i in range(commits):
        rows = pa.table({"id": [i * 10 + j for j in range(10)], "v": [f"row-{i}-{j}" for j in range(10)]})
        write_deltalake(root, rows, mode="append")


def _rows(feed: ChangeFeed, collected: list[tuple[int, int, int]]) -> None:
    for batch in feed.batches(0, None):
        ids = batch.rows.column("id").to_pylist()
        collected += [(batch.start.version, batch.start.index + i, ids[i]) for i in range(len(ids))]


#: Every file read by the worker threads (files of at least 0 bytes count as large), in batches of 3 rows.
ON_WORKERS = ChangeOptions(read_ahead=16, read_ahead_min_bytes=0, batch_size=3)


@pytest.mark.parametrize(
    "ahead",
    [ChangeOptions(read_ahead=16), ChangeOptions(read_ahead=3), ON_WORKERS],
    ids=["inline", "inline-refilled-often", "workers"],
)
def test_read_ahead_gives_the_rows_of_sequential_reading(tmp_path: Path, ahead: ChangeOptions) -> None:
    _table(tmp_path, 40)
    sequential: list[tuple[int, int, int]] = []
    collected: list[tuple[int, int, int]] = []
    _rows(ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=0)), sequential)
    _rows(ChangeFeed(str(tmp_path), options=ahead), collected)
    assert collected == sequential
    assert [r[2] for r in collected] == list(range(400))  # what the writer wrote, in commit order


def test_a_consumer_that_stops_early_leaves_no_reader_thread_behind(tmp_path: Path) -> None:
    _table(tmp_path, 40)
    feed = ChangeFeed(str(tmp_path), options=ON_WORKERS)
    batches = feed.batches(0, None)
    first = next(batches)
    assert first.start.version == 0 and first.rows.num_rows == 3
    assert any(t.name.startswith("deltatail-read") for t in threading.enumerate())
    batches.close()
    assert not any(t.name.startswith("deltatail-read") for t in threading.enumerate())


@pytest.mark.parametrize("options", [ChangeOptions(read_ahead=16), ON_WORKERS], ids=["inline", "workers"])
def test_a_missing_file_is_raised_after_every_row_before_it(tmp_path: Path, options: ChangeOptions) -> None:
    _table(tmp_path, 30)

    def paths(version: int) -> set[str]:
        actions = DeltaTable(str(tmp_path), version=version).get_add_actions(flatten=True)
        return set(pa.table(actions).column("path").to_pylist())

    (added,) = paths(20) - paths(19)
    os.remove(tmp_path / added)
    collected: list[tuple[int, int, int]] = []
    with pytest.raises(MissingFileError) as info:
        _rows(ChangeFeed(str(tmp_path), options=options), collected)
    assert added in str(info.value)
    assert [r[2] for r in collected] == list(range(200))  # versions 0..19, all of them, nothing after


@pytest.mark.parametrize("options", [ChangeOptions(read_ahead=16), ON_WORKERS], ids=["inline", "workers"])
def test_a_gap_is_raised_after_every_row_before_it(tmp_path: Path, options: ChangeOptions) -> None:
    _table(tmp_path, 30)
    os.remove(tmp_path / "_delta_log" / f"{25:020d}.json")
    collected: list[tuple[int, int, int]] = []
    with pytest.raises(VersionGapError):
        _rows(ChangeFeed(str(tmp_path), options=options), collected)
    assert [r[2] for r in collected] == list(range(250))


def test_a_consumer_that_stops_before_a_started_file_does_not_hang(tmp_path: Path) -> None:
    # One commit of two 40-row files, read a row per batch: each worker fills its queue (16 batches) and
    # waits; the consumer stops inside the first file, before the second that a worker already reads.
    rows = pa.table({"id": list(range(80)), "part": ["a"] * 40 + ["b"] * 40})
    write_deltalake(tmp_path, rows, partition_by=["part"])
    feed = ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=16, read_ahead_min_bytes=0, batch_size=1))
    batches = feed.batches(0, 0)
    assert next(batches).rows.num_rows == 1
    closing = threading.Thread(target=batches.close, daemon=True)
    closing.start()
    closing.join(timeout=60)
    assert not closing.is_alive(), "closing the generator hung on a reader thread"
    assert not any(t.name.startswith("deltatail-read") for t in threading.enumerate())


def test_a_worker_holds_decoded_batches_up_to_the_byte_bound_and_then_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 1,000 int64 rows (8,000 bytes and a validity bitmap) under a bound of three: the worker holds
    three, decodes a fourth and waits for the consumer; every row still comes out, in file order."""
    write_deltalake(tmp_path, pa.table({"id": pa.array(range(20_000), pa.int64())}))
    plan = next(ChangeFeed(str(tmp_path)).plans(0, 0))
    (task,) = plan.tasks
    size = next(iter(decode_task(LocalStorage(), plan.context_of(task), task, 1_000))).batch.nbytes
    assert 8_000 <= size <= 8_125  # the values, and at most a bit a row of validity
    monkeypatch.setattr(prefetch, "READ_AHEAD_BYTES", 3 * size)
    decoded: list[int] = []

    def read() -> Generator[FileBatch, None, None]:
        for batch in decode_task(LocalStorage(), plan.context_of(task), task, 1_000):
            decoded.append(batch.batch.nbytes)
            yield batch

    with ThreadPoolExecutor(max_workers=1) as threads:
        fetch = prefetch.Prefetch(threads, read)
        try:
            waited = 0.0
            while len(decoded) < 4 and waited < 60:
                time.sleep(0.05)
                waited += 0.05
            time.sleep(0.3)  # time to run further ahead, were it not held back
            assert decoded == [size] * 4
            ids = [i for b in fetch.batches() for i in b.batch.column(0).to_pylist()]
        finally:
            fetch.cancel()  # a failed assertion must not leave the worker waiting for a consumer
    assert ids == list(range(20_000))
    assert len(decoded) == 20 and fetch.most_held == 3 * size


def _decoded_batches(root: Path, rows: int, batch: int) -> Generator[FileBatch, None, None]:
    """The one data file of ``root`` (written here with ``rows`` int64 rows), decoded ``batch`` rows at a time."""
    write_deltalake(root, pa.table({"id": pa.array(range(rows), pa.int64())}))
    plan = next(ChangeFeed(str(root)).plans(0, 0))
    (task,) = plan.tasks
    return decode_task(LocalStorage(), plan.context_of(task), task, batch)


def _shut_down(threads: ThreadPoolExecutor) -> bool:
    """Shut the pool down waiting for its workers; whether that finished within 30 s (else a worker hangs)."""
    closing = threading.Thread(target=threads.shutdown, daemon=True)
    closing.start()
    closing.join(timeout=30)
    return not closing.is_alive()


def test_a_worker_created_unstarted_reads_nothing_until_started_or_consumed(tmp_path: Path) -> None:
    calls: list[str] = []

    def read() -> Generator[FileBatch, None, None]:
        calls.append("read")
        yield from _decoded_batches(tmp_path / "t", 3_000, 1_000)

    threads = ThreadPoolExecutor(max_workers=1)
    fetch = prefetch.Prefetch(threads, read, started=False)
    time.sleep(0.3)  # time to start, were it allowed to
    assert calls == [] and not fetch.decoded
    ids = [i for b in fetch.batches() for i in b.batch.column(0).to_pylist()]  # consuming starts it
    assert calls == ["read"] and ids == list(range(3_000)) and fetch.decoded
    assert _shut_down(threads)


def test_an_unstarted_worker_cancelled_returns_its_thread_without_reading(tmp_path: Path) -> None:
    calls: list[str] = []

    def read() -> Generator[FileBatch, None, None]:
        calls.append("read")
        yield from ()

    threads = ThreadPoolExecutor(max_workers=1)
    fetch = prefetch.Prefetch(threads, read, started=False)
    time.sleep(0.1)  # the worker is waiting to start
    fetch.cancel()
    assert _shut_down(threads) and calls == []


def test_a_consumer_waiting_for_a_batch_after_the_first_marks_the_worker_starved(tmp_path: Path) -> None:
    """Batches ready when asked for leave ``starved`` unset; a batch the consumer has to wait for sets it."""
    release = threading.Event()
    batches = _decoded_batches(tmp_path / "t", 4_000, 1_000)
    produced: list[int] = []

    def read() -> Generator[FileBatch, None, None]:
        for n, batch in enumerate(batches):
            if n == 3:
                release.wait(timeout=30)  # the fourth batch comes only when released
            produced.append(n)
            yield batch

    threads = ThreadPoolExecutor(max_workers=1)
    fetch = prefetch.Prefetch(threads, read)
    out = fetch.batches()
    next(out)  # the first batch is always waited for: not starvation
    waited = 0.0
    while (len(produced) < 3 or len(fetch._items) < 2) and waited < 30:  # the second and third, queued meanwhile
        time.sleep(0.05)
        waited += 0.05
    next(out)
    next(out)
    assert not fetch.starved and not fetch.decoded
    threading.Timer(0.3, release.set).start()
    next(out)  # waits for the release
    assert fetch.starved
    assert list(out) == [] and fetch.decoded
    assert _shut_down(threads)


def test_the_nearest_large_file_is_found_for_every_position_of_a_plan() -> None:
    later = read_ahead._LATER
    fetches: list[Any] = [None, later, None, None, later, None]
    assert read_ahead._nearest_large(fetches) == [1, 1, 4, 4, 4, None, None]
    assert read_ahead._nearest_large([]) == [None]


class _Opening(LocalStorage):
    """The local file system, recording the data files opened."""

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    def open_input(self, path: str, size: int | None = None) -> pa.NativeFile:
        if path.endswith(".parquet"):
            self.opened.append(path)
        return super().open_input(path, size)


def test_the_next_commits_large_file_waits_while_the_one_before_it_is_neither_decoded_nor_waited_for(
    tmp_path: Path,
) -> None:
    """Commits of one large file each, more batches a file than a worker may hold: a consumer holding its
    first batch has only the first commit's file open (that worker cannot finish, the consumer has not
    waited; the next commit's file has a worker that waits); every row still comes out, in order."""
    per_commit = 3 * (prefetch.READ_AHEAD_BATCHES + 4)
    for i in range(4):
        write_deltalake(tmp_path, pa.table({"id": range(i * per_commit, (i + 1) * per_commit)}), mode="append")
    storage = _Opening()
    feed = ChangeFeed(str(tmp_path), storage, ChangeOptions(read_ahead=16, read_ahead_min_bytes=0, batch_size=3))
    batches = feed.batches(0, None)
    ids = next(batches).rows.column("id").to_pylist()
    time.sleep(0.5)  # time for the next commit's file to start, were it allowed to
    assert len(storage.opened) == 1
    ids += [i for b in batches for i in b.rows.column("id").to_pylist()]
    assert ids == list(range(4 * per_commit)) and len(storage.opened) == 4
