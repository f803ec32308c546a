"""A commit much larger than ``flush_rows``: delivered in bounded flushes, resumed from inside after a SIGKILL.

The table is written by ``deltalake``: 16 partitions, CDF on, then one UPDATE of every row (a commit
of 16 cdc files, one per partition, holding each row's pre- and post-image). The expected rows are
deltalake's ``load_cdf`` of that version. The deletion-vector commit (200 files written by ``deltalake``,
the DVs written here from the protocol) is checked against ``load_cdf`` and against the rows computed
here from pyarrow reads of the data files.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cdf_helpers import append_commit, write_dv_file
from deltalake import DeltaTable, write_deltalake

from deltatail.state.cursor import Position
from deltatail.state.errors import StateError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.tailer import Tailer
from deltatail.tailer.read import net_changes as net_changes_module
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.prefetch import READ_THREADS
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage.local import LocalStorage

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}
ROWS = 24_000
BATCH = 1_000
FLUSH = 5_000


def _rows(ids: range, bump: float) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array([i % 16 for i in ids], pa.int64()),
            "score": pa.array([i * 0.5 + bump for i in ids], pa.float64()),
        }
    )


@pytest.fixture(scope="module")
def giant(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The table and the version of its giant commit (an UPDATE of all ``ROWS`` rows: ``2 * ROWS`` cdc rows)."""
    root = tmp_path_factory.mktemp("giant") / "t"
    write_deltalake(str(root), _rows(range(ROWS), 0.0), partition_by=["p"], configuration=CDF)
    DeltaTable(str(root)).update(updates={"score": "score + 1.0"})
    return root, DeltaTable(str(root)).version()


def _key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["id"], row["p"], row["score"], row["_change_type"], row["_commit_version"])


def _expected(root: Path, version: int) -> Counter[tuple[Any, ...]]:
    table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=version, ending_version=version).read_all())
    return Counter(_key(r) for r in table.to_pylist())


class RecordingStorage(LocalStorage):
    """The local file system, recording each file opened into a shared event list."""

    def __init__(self, events: list[tuple[str, Any]]) -> None:
        super().__init__()
        self.events = events

    def open_input(self, path: str, size: int | None = None) -> pa.NativeFile:
        self.events.append(("open", path))
        return super().open_input(path, size)


class RecordingSink(Sink):
    """Keeps every row; records each write and flush into the event list and the most rows held unflushed."""

    def __init__(self, events: list[tuple[str, Any]]) -> None:
        self.events = events
        self.rows: list[dict[str, Any]] = []
        self.unflushed = 0
        self.most_unflushed = 0

    def open(self, table: TableInfo) -> Position | None:
        return None

    def write(self, batch: ChangeBatch) -> None:
        self.events.append(("write", batch.start))
        self.rows += batch.rows.to_pylist()
        self.unflushed += len(batch)
        self.most_unflushed = max(self.most_unflushed, self.unflushed)

    def flush(self) -> None:
        self.events.append(("flush", self.unflushed))
        self.unflushed = 0

    def close(self) -> None:
        pass


@pytest.mark.slow
def test_a_giant_commit_reaches_the_sink_in_bounded_flushes_before_its_last_file_is_read(
    tmp_path: Path, giant: tuple[Path, int]
) -> None:
    root, version = giant
    events: list[tuple[str, Any]] = []
    options = ChangeOptions(batch_size=BATCH, reader_processes=0)
    feed = ChangeFeed(str(root), RecordingStorage(events), options)
    config = TailerConfig(
        str(root), str(tmp_path / "state"), starting_version=version, until_caught_up=True, flush_rows=FLUSH
    )
    sink = RecordingSink(events)
    Tailer(config, sink, feed=feed).run()

    assert Counter(_key(r) for r in sink.rows) == _expected(root, version)
    assert len(sink.rows) == 2 * ROWS
    # Never more than flush_rows rows (plus the batch that reached it) held unflushed by the sink.
    assert sink.most_unflushed < FLUSH + BATCH
    flushes = [n for kind, n in events if kind == "flush" and n]
    assert len(flushes) >= 2 * ROWS // (FLUSH + BATCH)
    # The first rows reach the sink, and are flushed, before the commit's last cdc file is opened.
    cdc_opens = [i for i, (kind, path) in enumerate(events) if kind == "open" and "_change_data" in str(path)]
    assert len(cdc_opens) == 16
    first_write = next(i for i, (kind, _) in enumerate(events) if kind == "write")
    first_flush = next(i for i, (kind, n) in enumerate(events) if kind == "flush" and n)
    assert first_write < first_flush < cdc_opens[-1]


@pytest.mark.slow
def test_the_cursor_moves_inside_a_giant_commit_and_a_kill_resumes_there(
    tmp_path: Path, giant: tuple[Path, int]
) -> None:
    """SIGKILL right after the third cursor save (the first at the start, the next ones inside the commit);
    the restart delivers the rest. The sink is stdout (no read-back), so nothing repeated proves the
    restart resumed from the cursor saved inside the commit."""
    root, version = giant
    state = tmp_path / "state"
    args = [sys.executable, "-m", "deltatail", "run", str(root), "--state-dir", str(state), "--sink", "jsonl:-"]
    args += ["--starting-version", str(version), "--until-caught-up", "--flush-rows", str(FLUSH)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
    killed = subprocess.run(args, cwd=ROOT, env={**env, "DELTATAIL_CRASH_AT": "after_save:3"}, capture_output=True)
    assert killed.returncode == -9, killed.stderr.decode()[-2000:]
    saved = StateStore(str(state)).load()
    assert saved is not None
    assert saved.cursor.version == version and 0 < saved.cursor.index < 2 * ROWS
    first = [orjson.loads(line) for line in killed.stdout.splitlines()]
    assert len(first) == saved.cursor.index  # flushed exactly up to the cursor

    rest = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, check=True)
    second = [orjson.loads(line) for line in rest.stdout.splitlines()]
    assert second[0]["_position"] == [version, saved.cursor.index, False]
    assert Counter(_key(r) for r in first + second) == _expected(root, version)


# ---------------------------------------------------------------- --net-changes in key-hash partitioned passes


@pytest.fixture(scope="module")
def rewrite(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """Four files of 1,000 rows, then an overwrite without cdc files (CDF off) that keeps 2,000 rows as they
    were, changes 1,500, drops 500 and adds 700 new ones. Returns the table and the overwrite's version."""
    root = tmp_path_factory.mktemp("rewrite") / "t"
    for first in range(0, 4_000, 1_000):
        write_deltalake(str(root), _rows(range(first, first + 1_000), 0.0), mode="append")
    kept = _rows(range(2_000), 0.0)
    changed = _rows(range(2_000, 3_500), 7.0)
    added = _rows(range(10_000, 10_700), 0.0)
    write_deltalake(str(root), pa.concat_tables([kept, changed, added]), mode="overwrite")
    return root, DeltaTable(str(root)).version()


def _snapshot_diff(root: Path, version: int, *, keyed: bool) -> Counter[tuple[Any, ...]]:
    """The net change of ``version`` as the difference of the snapshots around it (the ground truth)."""
    before = {r["id"]: r for r in pa.table(DeltaTable(str(root), version=version - 1).to_pyarrow_table()).to_pylist()}
    after = {r["id"]: r for r in pa.table(DeltaTable(str(root), version=version).to_pyarrow_table()).to_pylist()}
    out: Counter[tuple[Any, ...]] = Counter()
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if keyed and old is not None and new is not None:
            out[_key({**old, "_change_type": "update_preimage", "_commit_version": version})] += 1
            out[_key({**new, "_change_type": "update_postimage", "_commit_version": version})] += 1
            continue
        if old is not None:
            out[_key({**old, "_change_type": "delete", "_commit_version": version})] += 1
        if new is not None:
            out[_key({**new, "_change_type": "insert", "_commit_version": version})] += 1
    return out


@pytest.mark.parametrize("keyed", [True, False], ids=["key", "no-key"])
@pytest.mark.parametrize("passes", [1, 5], ids=["one-pass", "five-passes"])
def test_net_changes_in_passes_equal_the_snapshot_difference(
    rewrite: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, keyed: bool, passes: int
) -> None:
    root, version = rewrite
    plan = next(ChangeFeed(str(root)).plans(version, version))
    total = sum(t.size or 0 for t in plan.tasks)
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", -(-total // passes))
    assert net_changes_module.net_passes(plan.tasks) == passes
    options = ChangeOptions(net_changes=True, key_columns=("id",) if keyed else (), batch_size=300, read_ahead=0)
    batches = list(ChangeFeed(str(root), options=options).batches(version, version))
    rows = [r for b in batches for r in b.rows.to_pylist()]
    assert Counter(_key(r) for r in rows) == _snapshot_diff(root, version, keyed=keyed)
    assert len(rows) == (3_000 + 1_200 if keyed else 2 * 1_500 + 500 + 700)
    # Positions count the netted rows: 0..n-1, each once, in order.
    starts = [b.start.index for b in batches]
    assert starts == sorted(starts) and starts[0] == 0
    assert [b.end.index for b in batches[:-1]] == starts[1:] and batches[-1].end.index == len(rows)


def test_net_passes_are_bounded(rewrite: tuple[Path, int], monkeypatch: pytest.MonkeyPatch) -> None:
    root, version = rewrite
    plan = next(ChangeFeed(str(root)).plans(version, version))
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", 1)
    assert net_changes_module.net_passes(plan.tasks) == 1024
    assert net_changes_module.net_passes([]) == 1


# ---------------------------------------------------------------- reading ahead within a commit of many large files


def test_reading_ahead_decodes_a_few_large_files_of_a_commit_not_all(giant: tuple[Path, int]) -> None:
    """Every cdc file counts as large (``read_ahead_min_bytes=1``): workers decode the file being read and at
    most ``READ_THREADS`` after it, whatever the commit holds; the rows are still exactly the commit's."""
    root, version = giant
    events: list[tuple[str, Any]] = []
    options = ChangeOptions(batch_size=BATCH, read_ahead_min_bytes=1, reader_processes=0)
    batches = ChangeFeed(str(root), RecordingStorage(events), options).batches(version, version)
    rows = next(batches).rows.to_pylist()
    time.sleep(0.5)  # time for workers to run ahead (they may not: then the count is lower still)
    opened = [path for kind, path in events if kind == "open" and "_change_data" in str(path)]
    assert 1 <= len(opened) <= READ_THREADS + 1 < 16
    rows += [r for b in batches for r in b.rows.to_pylist()]
    assert Counter(_key(r) for r in rows) == _expected(root, version)


def test_a_large_file_waits_while_the_one_before_it_is_neither_decoded_nor_waited_for(giant: tuple[Path, int]) -> None:
    """Batches of 100 rows (30 a cdc file, more than a worker may hold): a consumer holding its first batch
    has only the first cdc file opened (its worker cannot finish, the consumer has not waited; the files
    after it have workers that wait); the rows are still exactly the commit's."""
    root, version = giant
    events: list[tuple[str, Any]] = []
    options = ChangeOptions(batch_size=100, read_ahead_min_bytes=1, reader_processes=0)
    batches = ChangeFeed(str(root), RecordingStorage(events), options).batches(version, version)

    def opened() -> list[Any]:
        return [path for kind, path in events if kind == "open" and "_change_data" in str(path)]

    rows = next(batches).rows.to_pylist()
    time.sleep(0.5)  # time for others to start, were they allowed to
    assert len(opened()) == 1
    rows += [r for b in batches for r in b.rows.to_pylist()]
    assert Counter(_key(r) for r in rows) == _expected(root, version) and len(opened()) == 16


# ---------------------------------------------------------------- a deletion-vector commit touching many files

DV_FILES = 200
DV_ROWS = 6_000


def _dv_rows(index: int, count: int) -> list[int]:
    """The rows of data file ``index`` (of ``count`` rows) its DV marks deleted: about a third, varying by file."""
    return [i for i in range(count) if (7 * i + index) % 3 == 0]


@pytest.fixture(scope="module")
def dv_commit(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, list[dict[str, Any]]]:
    """``deltalake`` writes ``DV_FILES`` files (one per partition); then, from the protocol, a commit enabling
    deletion vectors and a DELETE removing every file and adding it back with a ``u`` DV (the DVs packed 100 to
    a DV file). Returns the table, the DELETE's version and its add actions."""
    root = tmp_path_factory.mktemp("dv") / "t"
    ids = range(DV_ROWS)
    data = {"id": pa.array(ids, pa.int64()), "p": pa.array([i % DV_FILES for i in ids], pa.int64())}
    write_deltalake(str(root), pa.table({**data, "score": pa.array([i * 0.5 for i in ids])}), partition_by=["p"])
    first = [orjson.loads(line) for line in (root / "_delta_log" / f"{0:020d}.json").read_bytes().splitlines()]
    metadata = next(a["metaData"] for a in first if "metaData" in a)
    metadata["configuration"] = {"delta.enableChangeDataFeed": "true", "delta.enableDeletionVectors": "true"}
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["deletionVectors"]}
    protocol["writerFeatures"] = ["changeDataFeed", "deletionVectors"]
    append_commit(root, [{"protocol": protocol}, {"metaData": metadata}])
    adds = [a["add"] for a in first if "add" in a]
    assert len(adds) == DV_FILES
    counts = [orjson.loads(a["stats"])["numRecords"] for a in adds]
    dvs = write_dv_file(root, [_dv_rows(i, n) for i, n in enumerate(counts[:100])])
    dvs += write_dv_file(root, [_dv_rows(i, n) for i, n in enumerate(counts[100:], start=100)])
    actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": 1_700_000_000_000, "operation": "DELETE"}}]
    readds = []
    for add, dv in zip(adds, dvs, strict=True):
        common = {"path": add["path"], "partitionValues": add["partitionValues"], "size": add["size"]}
        actions.append({"remove": {**common, "deletionTimestamp": 1, "dataChange": True}})
        readds.append({**common, "modificationTime": 1, "dataChange": True, "deletionVector": dv})
        actions.append({"add": readds[-1]})
    return root, append_commit(root, actions), readds


def _dv_deletes(root: Path, version: int, adds: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """The DELETE's rows computed here: each data file read by pyarrow, the rows at the indexes its DV was made of."""
    out: Counter[tuple[Any, ...]] = Counter()
    for i, add in enumerate(adds):
        rows = pq.read_table(root / add["path"]).to_pylist()
        for index in _dv_rows(i, len(rows)):
            row = {**rows[index], "p": int(add["partitionValues"]["p"])}
            out[_key({**row, "_change_type": "delete", "_commit_version": version})] += 1
    return out


@pytest.mark.slow
def test_a_deletion_vector_commit_touching_many_files_is_delivered_exactly_in_bounded_flushes(
    tmp_path: Path, dv_commit: tuple[Path, int, list[dict[str, Any]]]
) -> None:
    root, version, adds = dv_commit
    events: list[tuple[str, Any]] = []
    feed = ChangeFeed(str(root), RecordingStorage(events), ChangeOptions(batch_size=BATCH, reader_processes=0))
    config = TailerConfig(
        str(root), str(tmp_path / "state"), starting_version=version, until_caught_up=True, flush_rows=FLUSH // 5
    )
    sink = RecordingSink(events)
    Tailer(config, sink, feed=feed).run()

    expected = _dv_deletes(root, version, adds)
    assert sum(expected.values()) == sum(len(_dv_rows(i, DV_ROWS // DV_FILES)) for i in range(DV_FILES))
    assert Counter(_key(r) for r in sink.rows) == expected == _expected(root, version)
    assert sink.most_unflushed < FLUSH // 5 + BATCH
    assert len([n for kind, n in events if kind == "flush" and n]) >= len(sink.rows) // (FLUSH // 5 + BATCH)
    # Flushed before the commit's last data file is opened: the commit is never held whole.
    data_opens = [i for i, (kind, path) in enumerate(events) if kind == "open" and str(path).endswith(".parquet")]
    assert len(data_opens) == DV_FILES
    assert next(i for i, (kind, n) in enumerate(events) if kind == "flush" and n) < data_opens[-1]


class StoppingSink(RecordingSink):
    """A :class:`RecordingSink` that asks ``tailer`` to stop at its first flush holding rows."""

    tailer: Tailer | None = None

    def flush(self) -> None:
        if self.unflushed and self.tailer is not None:
            self.tailer.stop()
        super().flush()


def _edit_cursor(state: Path, **fields: object) -> None:
    """Set ``fields`` in ``cursor.json`` (a value of ``None`` removes the field), with its checksum made anew."""
    raw = orjson.loads((state / "cursor.json").read_bytes())
    for name, value in fields.items():
        if value is None:
            raw["state"].pop(name, None)
        else:
            raw["state"][name] = value
    raw["crc32"] = zlib.crc32(orjson.dumps(raw["state"], option=orjson.OPT_SORT_KEYS))
    (state / "cursor.json").write_bytes(orjson.dumps(raw))


def _as_older_deltatail(state: Path, row_order: int | None = None) -> None:
    """Rewrite ``cursor.json`` as a deltatail of ``row_order`` saved it (``None``: before ``row_order`` existed)."""
    _edit_cursor(state, row_order=row_order)


def _stopped_inside(root: Path, version: int, state: Path) -> StoppingSink:
    """A netting tailer run from ``version`` until its first flush holding rows; its sink."""
    sink = StoppingSink([])
    sink.tailer = _net_tailer(root, version, state, sink)
    sink.tailer.run()
    return sink


def _net_tailer(root: Path, version: int, state: Path, sink: Sink) -> Tailer:
    options = ChangeOptions(net_changes=True, key_columns=("id",), batch_size=300, read_ahead=0, reader_processes=0)
    config = TailerConfig(
        str(root), str(state), starting_version=version, until_caught_up=True, flush_rows=1_000, options=options
    )
    return Tailer(config, sink, feed=ChangeFeed(str(root), options=options))


def test_an_older_cursor_inside_a_commit_netted_in_one_pass_resumes_there(
    tmp_path: Path, rewrite: tuple[Path, int]
) -> None:
    """One pass: no hash picks rows, so the netted order is the one older deltatails gave too."""
    root, version = rewrite
    state = tmp_path / "state"
    first = _stopped_inside(root, version, state)
    _as_older_deltatail(state)
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.row_order == 1 and 0 < saved.cursor.index < 4_200
    rest = RecordingSink([])
    _net_tailer(root, version, state, rest).run()
    assert Counter(_key(r) for r in first.rows + rest.rows) == _snapshot_diff(root, version, keyed=True)
    assert len(first.rows) + len(rest.rows) == 4_200


def test_a_cursor_inside_a_commit_netted_in_passes_resumes_there_unless_an_older_deltatail_saved_it(
    tmp_path: Path, rewrite: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, version = rewrite
    plan = next(ChangeFeed(str(root)).plans(version, version))
    quarter = -(-sum(t.size or 0 for t in plan.tasks) // 4)
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", quarter)
    monkeypatch.setitem(net_changes_module.PASS_BYTES_OF_ORDER, 1, quarter)
    state = tmp_path / "state"

    def tailer(sink: Sink) -> Tailer:
        return _net_tailer(root, version, state, sink)

    first = StoppingSink([])
    first.tailer = tailer(first)
    first.tailer.run()
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.cursor.version == version and 0 < saved.cursor.index < 4_200
    assert saved.row_order == net_changes_module.ROW_ORDER
    shutil.copytree(state, tmp_path / "older")

    rest = RecordingSink([])
    tailer(rest).run()
    assert len(first.rows) == saved.cursor.index
    assert Counter(_key(r) for r in first.rows + rest.rows) == _snapshot_diff(root, version, keyed=True)

    shutil.rmtree(state)
    shutil.copytree(tmp_path / "older", state)
    _as_older_deltatail(state)
    with pytest.raises(StateError, match=rf"\(row order 1\) inside version {version}.*4 key-hash passes"):
        tailer(RecordingSink([])).run()
    _as_older_deltatail(state, 99)
    with pytest.raises(StateError, match=rf"\(row order 99\) inside version {version}.*does not know"):
        tailer(RecordingSink([])).run()


def test_a_cursor_of_an_earlier_pass_size_reads_its_commit_in_those_passes_to_the_end(
    tmp_path: Path, rewrite: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row order 2 netted in passes of another size: the commit a cursor of it is inside keeps them.

    Saved inside the commit in four passes; resumed by a deltatail whose passes are half as many, it
    delivers the rest of the four passes' order (so every row once), saves order 2 again while still
    inside that commit, and the current order once past it.
    """
    root, version = rewrite
    plan = next(ChangeFeed(str(root)).plans(version, version))
    total = sum(t.size or 0 for t in plan.tasks)
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", -(-total // 4))
    state = tmp_path / "state"
    first = _stopped_inside(root, version, state)
    _as_older_deltatail(state, 2)
    shutil.copytree(state, tmp_path / "older")

    monkeypatch.setitem(net_changes_module.PASS_BYTES_OF_ORDER, 2, -(-total // 4))
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", -(-total // 2))
    second = StoppingSink([])
    second.tailer = _net_tailer(root, version, state, second)
    second.tailer.run()
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.cursor.version == version and 0 < saved.cursor.index < 4_200
    assert saved.row_order == net_changes_module.ROW_ORDER and saved.earlier_order == (version, 2)
    assert len(first.rows) + len(second.rows) == saved.cursor.index
    rest = RecordingSink([])
    _net_tailer(root, version, state, rest).run()
    delivered = first.rows + second.rows + rest.rows
    assert len(delivered) == 4_200
    assert Counter(_key(r) for r in delivered) == _snapshot_diff(root, version, keyed=True)
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.cursor.version > version and saved.earlier_order is None

    # Read in the current passes instead, the same cursor delivers some rows twice and others never.
    shutil.rmtree(state)
    shutil.copytree(tmp_path / "older", state)
    _as_older_deltatail(state, net_changes_module.ROW_ORDER)
    shifted = RecordingSink([])
    _net_tailer(root, version, state, shifted).run()
    assert Counter(_key(r) for r in first.rows + shifted.rows) != _snapshot_diff(root, version, keyed=True)


def test_an_earlier_order_saved_for_one_commit_applies_inside_that_commit_only(
    rewrite: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sink's holdings past the commit read in the earlier order were delivered in the current one."""
    root, version = rewrite
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", 1)
    options = ChangeOptions(net_changes=True, key_columns=("id",), read_ahead=0, reader_processes=0)
    later = ChangeFeed(str(root), options=options)
    later.adopt_row_order(Position.change(version + 1, 5), net_changes_module.ROW_ORDER, (version, 2))
    assert later.earlier_order(version) is None and later.earlier_order(version + 1) is None
    inside = ChangeFeed(str(root), options=options)
    inside.adopt_row_order(Position.change(version, 5), net_changes_module.ROW_ORDER, (version, 2))
    assert inside.earlier_order(version) == (version, 2) and inside.earlier_order(version + 1) is None


@pytest.mark.parametrize("value", [[1], [1, "2"], [-1, 2], {"version": 1}, [1, 2, 3], "1,2"])
def test_a_malformed_earlier_order_in_the_cursor_file_is_refused(
    tmp_path: Path, rewrite: tuple[Path, int], value: object
) -> None:
    root, version = rewrite
    state = tmp_path / "state"
    _stopped_inside(root, version, state)
    _edit_cursor(state, earlier_order=value)
    with pytest.raises(StateError, match=r"cannot read the tailer's cursor.*earlier_order"):
        StateStore(str(state)).load()
