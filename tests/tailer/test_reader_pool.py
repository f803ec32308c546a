"""Reader processes change nothing a consumer can see: same rows, batches, positions and errors.

The expectation is always in-process reading (``reader_processes=0``) of the same table in the same
test, which the rest of the suite checks against deltalake and the corpus's reference outputs.
Runs are made tiny here (``RunLimits(files=2, min_files=1)``) so that even a short table's files are
split over several runs and both processes.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from cdf_helpers import HandTable, peer_copy
from corpus import manifest_paths, table_root
from deltalake import DeltaTable, write_deltalake

import deltatail.tailer.read.reader_pool
from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.changes import FileTask
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, DeletionVectorError, DeltaTailError, InvalidLogError, MissingFileError
from deltatail.state.feed import ChangeBatch
from deltatail.state.planning import ReadContext
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.read import reader_worker
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.reader_pool import MAX_FAILURES, ReaderPool, RunLimits
from deltatail.tailer.read.tasks import read_run, read_task
from deltatail.tailer.storage import LocalStorage, Storage

PROJECT = Path(__file__).resolve().parents[2]
IN_PROCESS = ChangeOptions(reader_processes=0)

Outcome = tuple[list[tuple[object, pa.RecordBatch]], str | None]


#: Tiny runs: even a short table's files are split over several runs and both processes.
TINY_RUNS = RunLimits(files=2, min_files=1)


@pytest.fixture
def pool() -> Iterator[ReaderPool]:
    """A private two-process pool, with runs of two files, that the test's feeds are given."""
    pool = ReaderPool(2, TINY_RUNS)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def _module_pool() -> Iterator[list[ReaderPool]]:
    """One pool for the module's corpus comparisons (in a list, so that a pool gone off can be replaced)."""
    pools = [ReaderPool(2, TINY_RUNS)]
    yield pools
    pools[0].close()


@pytest.fixture
def corpus_pool(_module_pool: list[ReaderPool]) -> Iterator[ReaderPool]:
    """:func:`pool`, but started once for the ~230 corpus tables: each test starting two worker processes
    (each importing the reading stack) was most of their time. A pool that turned itself off (workers
    failed :data:`MAX_FAILURES` times) is replaced, so that every test reads through live processes;
    after each test the pool must be free again (its consumer released it)."""
    if not _module_pool[0].usable:
        _module_pool[0].close()
        _module_pool[0] = ReaderPool(2, TINY_RUNS)
    pool = _module_pool[0]
    yield pool
    assert pool.acquire() or not pool.usable, "the feed's consumer left the pool held"
    if pool.usable:
        pool.release()


def _outcome(feed: ChangeFeed, **kwargs: object) -> Outcome:
    """Every batch (start position and rows) up to the error, and the error's type and text."""
    batches: list[tuple[object, pa.RecordBatch]] = []
    try:
        for batch in feed.batches(**kwargs):  # type: ignore[arg-type]
            batches.append((batch.start, batch.rows))
    except DeltaTailError as e:
        return batches, f"{type(e).__name__}: {e}"
    return batches, None


def _assert_same(got: Outcome, expected: Outcome) -> None:
    assert got[1] == expected[1]
    assert [start for start, _ in got[0]] == [start for start, _ in expected[0]]
    for (_, rows), (_, want) in zip(got[0], expected[0], strict=True):
        assert rows.equals(want)


def _appends(root: Path, commits: int, rows: int = 10, first: int = 0) -> None:
    """``commits`` one-file appends of ``rows`` rows with ids ``first``, ``first + 1``, ..."""
    for c in range(commits):
        i = first // rows + c
        table = pa.table({"id": [i * rows + j for j in range(rows)], "v": [f"row-{i}-{j}" for j in range(rows)]})
        write_deltalake(root, table, mode="append", configuration={"delta.enableChangeDataFeed": "true"})


def _ids(outcome: Outcome) -> list[int]:
    return [i for _, rows in outcome[0] for i in rows.column("id").to_pylist()]


@pytest.mark.slow
def test_appends_read_by_processes_are_the_rows_of_in_process_reading(tmp_path: Path, pool: ReaderPool) -> None:
    _appends(tmp_path, 30)
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS), starting_version=0)
    got = _outcome(ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=16), pool=pool), starting_version=0)
    _assert_same(got, expected)
    assert _ids(got) == list(range(300))  # what the writer wrote, in commit order
    assert pool.files_sent == 30


@pytest.mark.slow
def test_runs_end_at_their_byte_budget(tmp_path: Path) -> None:
    _appends(tmp_path, 10)
    pool = ReaderPool(2, RunLimits(files=32, bytes=1, min_files=1))  # every file alone fills a run
    try:
        expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS))
        _assert_same(_outcome(ChangeFeed(str(tmp_path), pool=pool)), expected)
        assert pool.files_sent == 10 and pool.runs_sent == 10
    finally:
        pool.close()


def test_files_of_unknown_size_are_streamed_in_process(tmp_path: Path, pool: ReaderPool) -> None:
    # A remove may omit its size; such a file could be large, so it is never sent to a process.
    _appends(tmp_path, 12)
    DeltaTable(str(tmp_path)).delete()
    commit = tmp_path / "_delta_log" / f"{12:020d}.json"
    lines = [json.loads(line) for line in commit.read_text().splitlines()]
    for action in lines:
        if "remove" in action:
            action["remove"].pop("size", None)
    commit.write_text("".join(json.dumps(a) + "\n" for a in lines))
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS), starting_version=12)
    got = _outcome(ChangeFeed(str(tmp_path), pool=pool), starting_version=12)
    _assert_same(got, expected)
    assert sorted(_ids(got)) == list(range(120))
    assert pool.files_sent == 0


def test_a_run_whose_rows_cannot_be_packed_is_handed_back(tmp_path: Path) -> None:
    # The worker side, in-process: when packing the rows fails (a string column past 2 GiB, say), the
    # answer says "stopped at task 0" with no rows, so the consumer reads the whole run itself.
    _appends(tmp_path, 3)
    feed = ChangeFeed(str(tmp_path), options=IN_PROCESS)
    items = [(plan.context, task) for plan in feed.plans(0, None) for task in plan.tasks]
    header, payload = reader_worker.answer(LocalStorage(), 65536, items)
    assert pickle.loads(header) == ([[10], [10], [10]], None) and payload

    def refuse(rows: pa.RecordBatch) -> bytes:
        raise pa.ArrowInvalid("offset overflow")

    header, payload = reader_worker.answer(LocalStorage(), 65536, items, ipc=refuse)
    assert pickle.loads(header) == ([], 0) and payload == b""


def test_a_task_that_fails_after_some_rows_leaves_none_of_them_in_its_run(tmp_path: Path) -> None:
    # Two good files around one whose logical type is int but whose Parquet column is int64: its first
    # batch (batches of 3 rows) fits, its second holds 2**40 and cannot be read. The run keeps the first
    # file's rows and stops at the second, dropping its partial rows: the caller reads it and raises.
    table = HandTable(tmp_path / "t", [{"name": "id", "type": "integer", "nullable": True, "metadata": {}}])
    good = pa.table({"id": pa.array([1, 2, 3, 4], pa.int32())})
    bad = pa.table({"id": pa.array([5, 6, 7, 2**40], pa.int64())})
    table.commit([table.add("a.parquet", good), table.add("b.parquet", bad), table.add("c.parquet", good)])
    feed = ChangeFeed(str(table.root), options=IN_PROCESS)
    (plan,) = list(feed.plans(0, 0))
    items = [(plan.context, task) for task in plan.tasks]
    assert [task.path for _, task in items] == ["a.parquet", "b.parquet", "c.parquet"]
    lengths, failed, rows = read_run(LocalStorage(), items, 3)
    assert (lengths, failed) == ([[3, 1]], 1)
    assert rows is not None and rows.column("id").to_pylist() == [1, 2, 3, 4]
    assert rows.column("_commit_version").to_pylist() == [0] * 4
    with pytest.raises(InvalidLogError, match=r"b\.parquet"):
        list(read_task(LocalStorage(), plan.context, items[1][1], 3))


def test_small_batches_keep_their_boundaries(tmp_path: Path, pool: ReaderPool) -> None:
    _appends(tmp_path, 12)
    expected = _outcome(ChangeFeed(str(tmp_path), options=ChangeOptions(reader_processes=0, batch_size=3), pool=pool))
    got = _outcome(ChangeFeed(str(tmp_path), options=ChangeOptions(batch_size=3), pool=pool))
    _assert_same(got, expected)
    assert [rows.num_rows for _, rows in got[0]][:4] == [3, 3, 3, 1]
    assert pool.files_sent == 12


@pytest.mark.slow
@pytest.mark.parametrize("path", manifest_paths())
def test_every_corpus_table_reads_the_same_through_processes(path: str, corpus_pool: ReaderPool) -> None:
    # Every table, including those that must fail (missing DV files, unsupported features, absent
    # data files): the same rows up to the same error. Initial snapshot and then every change.
    root = str(table_root(path))
    expected = _outcome(ChangeFeed(root, options=IN_PROCESS), starting_version=0, initial_snapshot=True)
    got = _outcome(ChangeFeed(root, pool=corpus_pool), starting_version=0, initial_snapshot=True)
    _assert_same(got, expected)


def test_the_corpus_comparison_exercises_the_processes(pool: ReaderPool) -> None:
    # The parametrized test above would pass with the processes never used; this one proves they are.
    root = str(table_root("kernel-rs/cdf-table-with-dv"))
    _outcome(ChangeFeed(root, pool=pool), starting_version=0, initial_snapshot=True)
    assert pool.files_sent > 0


@pytest.mark.slow
def test_a_missing_file_is_raised_after_every_row_before_it(tmp_path: Path, pool: ReaderPool) -> None:
    _appends(tmp_path, 30)
    new = set(DeltaTable(str(tmp_path), version=20).file_uris()) - set(
        DeltaTable(str(tmp_path), version=19).file_uris()
    )
    (added,) = new
    os.remove(added)
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS))
    got = _outcome(ChangeFeed(str(tmp_path), pool=pool))
    _assert_same(got, expected)
    assert got[1] is not None and got[1].startswith(MissingFileError.__name__) and Path(added).name in got[1]
    assert _ids(got) == list(range(200))  # versions 0..19, nothing after


def test_a_bad_deletion_vector_checksum_is_raised_by_the_consumer(tmp_path: Path, pool: ReaderPool) -> None:
    root = peer_copy(table_root("kernel-rs/cdf-table-with-dv"), tmp_path / "t")
    (dv,) = list(root.glob("**/deletion_vector_*.bin"))[:1]
    data = bytearray(dv.read_bytes())
    data[-1] ^= 0xFF  # the stored CRC-32 no longer matches
    dv.write_bytes(bytes(data))
    expected = _outcome(ChangeFeed(str(root), options=IN_PROCESS), starting_version=0)
    got = _outcome(ChangeFeed(str(root), pool=pool), starting_version=0)
    _assert_same(got, expected)
    assert got[1] is not None and got[1].startswith(DeletionVectorError.__name__) and dv.name in got[1]
    assert pool.files_sent > 0


@pytest.mark.slow
def test_killed_processes_lose_no_rows(tmp_path: Path, pool: ReaderPool, caplog: pytest.LogCaptureFixture) -> None:
    _appends(tmp_path, 40)
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS))
    feed = ChangeFeed(str(tmp_path), options=ChangeOptions(read_ahead=16), pool=pool)
    _assert_same(_outcome(feed), expected)  # both processes have answered (a process that never did counts more)
    assert len(pool._workers) == 2 and all(worker.answered for worker in pool._workers)
    batches = feed.batches()
    got = [next(batches)]
    for worker in pool._workers:  # both hold runs the consumer has not reached
        worker.proc.kill()
        worker.proc.wait()
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        got += list(batches)
    _assert_same(([(b.start, b.rows) for b in got], None), expected)
    assert "reader process" in caplog.text and "read in-process" in caplog.text
    assert pool.usable  # processes that had answered before: replaced on the next run


def test_processes_that_cannot_start_turn_the_pool_off(tmp_path: Path) -> None:
    _appends(tmp_path, 10)
    pool = ReaderPool(2, TINY_RUNS, command=["/bin/false"])  # starts, then exits before answering anything
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS))
    got = _outcome(ChangeFeed(str(tmp_path), pool=pool))
    _assert_same(got, expected)
    assert not pool.usable and pool._failures >= MAX_FAILURES
    assert not pool.acquire()


@pytest.mark.slow
def test_a_consumer_that_stops_early_leaves_the_pool_ready(tmp_path: Path, pool: ReaderPool) -> None:
    _appends(tmp_path, 30)
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS))
    batches = ChangeFeed(str(tmp_path), pool=pool).batches()
    next(batches)
    batches.close()  # runs still unanswered are received and dropped
    assert all(not worker.outstanding for worker in pool._workers)
    _assert_same(_outcome(ChangeFeed(str(tmp_path), pool=pool)), expected)


@pytest.mark.slow
def test_a_second_concurrent_consumer_reads_in_process(tmp_path: Path, pool: ReaderPool) -> None:
    _appends(tmp_path, 20)
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS))
    first = ChangeFeed(str(tmp_path), pool=pool).batches()
    head = next(first)
    read = pool.files_sent
    second = _outcome(ChangeFeed(str(tmp_path), pool=pool))
    assert pool.files_sent == read  # the pool was held by the first consumer
    _assert_same(second, expected)
    rest = [(b.start, b.rows) for b in first]
    _assert_same(([(head.start, head.rows), *rest], None), expected)


@pytest.mark.slow
def test_the_processes_exit_when_their_parent_is_killed(tmp_path: Path) -> None:
    _appends(tmp_path, 20)
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(PROJECT)!r})
        from deltatail.tailer.read.feed import ChangeFeed
        from deltatail.tailer.read.reader_pool import ReaderPool, RunLimits
        pool = ReaderPool(2, RunLimits(files=2, min_files=1))
        batches = ChangeFeed({str(tmp_path)!r}, pool=pool).batches()
        next(batches)
        print(*(w.proc.pid for w in pool._workers), flush=True)
        time.sleep(600)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), "a reader process outlived its parent"
    finally:
        parent.kill()


@pytest.mark.slow
def test_the_processes_ignore_stop_signals_meant_for_their_parent(tmp_path: Path, pool: ReaderPool) -> None:
    # Ctrl-C or `kill -TERM -<group>` reaches the workers too; only the parent acts on it (gracefully).
    _appends(tmp_path, 12)
    expected = _outcome(ChangeFeed(str(tmp_path), options=IN_PROCESS))
    _assert_same(_outcome(ChangeFeed(str(tmp_path), pool=pool)), expected)
    workers = list(pool._workers)
    for worker in workers:
        worker.proc.send_signal(signal.SIGINT)
        worker.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert all(worker.proc.poll() is None for worker in workers)
    _assert_same(_outcome(ChangeFeed(str(tmp_path), pool=pool)), expected)
    assert pool._workers == workers and not any(worker.broken for worker in workers)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie left for init to reap counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_pool_needs_a_process() -> None:
    with pytest.raises(ConfigError, match="at least one process"):
        ReaderPool(0)


# -- the tailer's run loop reads ahead too ------------------------------------------------------------


class _CheckingSink(JsonLinesSink):
    """JSON lines, checking at every write that the saved snapshot is the table's at its version."""

    def __init__(self, path: Path, state: Path, root: Path) -> None:
        super().__init__(str(path))
        self.state, self.root = state, root
        self.checked: set[int] = set()

    def write(self, batch: ChangeBatch) -> None:
        store = StateStore(str(self.state))
        saved = store.load()
        if saved is not None and saved.snapshot_version not in self.checked:
            snap = store.load_snapshot(saved)
            assert snap.live_keys() == DeltaLog(str(self.root)).snapshot(saved.snapshot_version).live_keys()
            self.checked.add(saved.snapshot_version)
        super().write(batch)


def _tail(root: Path, state: Path, sink: JsonLinesSink, pool: ReaderPool, **options: Any) -> None:
    config = TailerConfig(
        table=str(root),
        state_dir=str(state),
        until_caught_up=True,
        checkpoint_commits=options.pop("checkpoint_commits", 50),
        checkpoint_seconds=options.pop("checkpoint_seconds", 5.0),
        snapshot_commits=options.pop("snapshot_commits", 1000),
        options=ChangeOptions(**options),
    )
    Tailer(config, sink, feed=ChangeFeed(str(root), options=config.options, pool=pool)).run()


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_the_tailer_catches_up_through_the_processes(tmp_path: Path, pool: ReaderPool) -> None:
    root = tmp_path / "t"
    _appends(root, 40)
    _tail(root, tmp_path / "s0", JsonLinesSink(str(tmp_path / "in-process.jsonl")), pool, reader_processes=0)
    assert pool.files_sent == 0
    _tail(root, tmp_path / "s2", JsonLinesSink(str(tmp_path / "processes.jsonl")), pool)
    assert pool.files_sent == 40
    assert (tmp_path / "processes.jsonl").read_bytes() == (tmp_path / "in-process.jsonl").read_bytes()
    assert [r["id"] for r in _lines(tmp_path / "processes.jsonl")] == list(range(400))


@pytest.mark.slow
def test_saved_snapshots_stay_exact_while_the_tailer_plans_ahead(tmp_path: Path, pool: ReaderPool) -> None:
    # A checkpoint due by time at every version, a snapshot due every 7 versions: planning ahead
    # must neither save a snapshot that was handed on (StateError) nor one of the wrong version.
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    _appends(root, 30)
    DeltaTable(str(root)).delete("id % 3 = 0")  # removes too, so the live files really change
    _appends(root, 30, first=300)
    sink = _CheckingSink(out, state, root)
    _tail(root, state, sink, pool, checkpoint_commits=5, checkpoint_seconds=0.0, snapshot_commits=7)
    assert len(sink.checked) >= 5  # snapshots saved along the way, each checked
    latest = DeltaTable(str(root)).version()
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.cursor == Position.change(latest + 1, 0)
    assert saved.snapshot_version == latest
    _appends(root, 3, first=600)  # and a restart resumes exactly where the run stopped
    _tail(root, state, JsonLinesSink(str(out)), pool)
    inserted = [r["id"] for r in _lines(out) if r["_change_type"] == "insert"]
    deleted = [r["id"] for r in _lines(out) if r["_change_type"] == "delete"]
    assert inserted == list(range(630))
    assert sorted(deleted) == [i for i in range(300) if i % 3 == 0]


_ANSWERS = {
    # One answer to any request, in the worker's framing: a pickled (lengths, failed) header, then the rows.
    "too few tasks": ("header = ([[1]], None); rows = pa.table({'x': [1]})", "does not add up"),
    "too many rows": ("header = ([[1], [1]], None); rows = pa.table({'x': [1, 2, 3]})", "does not add up"),
    "two batches": (
        "header = ([[1], [1]], None); rows = pa.concat_tables([pa.table({'x': [1]})] * 2)",
        "more than one record batch",
    ),
}


@pytest.mark.parametrize("answer", sorted(_ANSWERS))
def test_an_answer_that_does_not_add_up_is_refused(
    tmp_path: Path, answer: str, caplog: pytest.LogCaptureFixture
) -> None:
    _appends(tmp_path, 2)
    script = textwrap.dedent(
        f"""
        import pickle, struct, sys
        import pyarrow as pa
        frame = struct.Struct("<Q")
        n, = frame.unpack(sys.stdin.buffer.read(8)); sys.stdin.buffer.read(n)
        {_ANSWERS[answer][0]}
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as w:
            for batch in rows.to_batches():
                w.write_batch(batch)
        for part in (pickle.dumps(header), sink.getvalue().to_pybytes()):
            sys.stdout.buffer.write(frame.pack(len(part)) + part)
        sys.stdout.buffer.flush()
        sys.stdin.buffer.read()
        """
    )
    pool = ReaderPool(1)
    worker = deltatail.tailer.read.reader_pool._Worker(pool, [sys.executable, "-c", script])
    items = [(plan.context, task) for plan in ChangeFeed(str(tmp_path)).plans(0, None) for task in plan.tasks]
    run = worker.submit(LocalStorage(), items, 65536)
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        assert run.remote_batches(0) is None and run.remote_batches(1) is None  # both read in-process
    assert _ANSWERS[answer][1] in caplog.text
    assert worker.broken and worker.proc.poll() is not None


class _Serving:
    """``_serve`` on a thread over two pipes; its ``_answer`` counts runs and answers 256 KiB (over a pipe buffer)."""

    ANSWER_BYTES = 256 << 10

    def __init__(self, outbox: reader_worker.Outbox | None = None) -> None:
        self.answered = 0

        def answer(storage: Storage, batch_size: int, items: list[tuple[ReadContext, FileTask]]) -> reader_worker.Reply:
            self.answered += 1
            return pickle.dumps(self.answered), bytes([self.answered]) * self.ANSWER_BYTES

        requests_in, requests_out = os.pipe()
        answers_in, answers_out = os.pipe()
        self.requests = os.fdopen(requests_out, "wb")
        self.answers = os.fdopen(answers_in, "rb")
        self.returned: list[int] = []
        self.thread = threading.Thread(
            target=lambda: self.returned.append(
                reader_worker.serve(
                    os.fdopen(requests_in, "rb"), os.fdopen(answers_out, "wb"), read=answer, outbox=outbox
                )
            ),
            daemon=True,
        )
        self.thread.start()

    def send_runs(self, n: int) -> None:
        for _ in range(n):
            reader_worker.write_frame(self.requests, reader_worker.wire(LocalStorage(), 65536, []))

    def finish(self, runs: int) -> None:
        """Receive the ``runs`` answers (each must arrive whole and in order), then stop: ``_serve`` returns 0."""
        for i in range(1, runs + 1):
            assert pickle.loads(reader_worker.read_frame(self.answers)) == i
            assert reader_worker.read_frame(self.answers) == bytes([i % 256]) * self.ANSWER_BYTES
        self.requests.close()
        self.thread.join(timeout=30)
        assert self.returned == [0]

    def wait_for(self, answered: int) -> None:
        deadline = time.monotonic() + 30
        while self.answered < answered and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.answered == answered


def test_a_worker_reads_on_while_its_answers_wait_for_the_parent() -> None:
    """Nothing is received: the worker still reads the next runs, up to a bounded number of answers held."""
    serving = _Serving()
    runs = reader_worker.OUTBOX_ANSWERS + 6
    serving.send_runs(runs)
    held = reader_worker.OUTBOX_ANSWERS + 2  # one being written, the outbox full, one waiting to enter it
    serving.wait_for(held)
    time.sleep(0.2)  # room for a (wrong) further read to happen
    assert serving.answered == held
    serving.finish(runs)  # then every answer arrives, whole and in order


def test_a_workers_outbox_holds_at_most_its_bytes() -> None:
    serving = _Serving(reader_worker.Outbox(size=3 * (_Serving.ANSWER_BYTES + 64)))  # 64: the header
    serving.send_runs(8)
    serving.wait_for(3 + 2)  # three answers fill the outbox's bytes; one being written, one waiting
    time.sleep(0.2)
    assert serving.answered == 3 + 2
    serving.finish(8)


def test_an_answer_larger_than_the_outbox_still_goes_alone() -> None:
    serving = _Serving(reader_worker.Outbox(size=_Serving.ANSWER_BYTES // 2))
    serving.send_runs(4)
    serving.wait_for(1 + 2)  # one in the outbox (alone), one being written, one waiting
    time.sleep(0.2)
    assert serving.answered == 1 + 2
    serving.finish(4)


def test_a_worker_whose_parent_stops_reading_for_good_exits() -> None:
    serving = _Serving()
    runs = reader_worker.OUTBOX_ANSWERS + 6
    serving.send_runs(runs)
    serving.wait_for(reader_worker.OUTBOX_ANSWERS + 2)
    serving.answers.close()  # the parent is gone: the blocked write fails
    serving.thread.join(timeout=30)
    assert serving.returned == [0]
    assert serving.answered < runs  # runs nobody would receive are not read
    serving.requests.close()
