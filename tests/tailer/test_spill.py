"""A commit of many key-hash passes is read once and spilled by pass (tailer/read/spill.py).

The passes read back must hold exactly the rows, in the order, that filtering every read of the
files by pass gives (:func:`in_pass`, the reading before the spill); a commit in passes opens each of
its files once; the spill's directory goes when the reading ends, however it ends; a spill that
cannot be written or read fails naming the table, the version and the file.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltatail.state.errors import DeltaTailError
from deltatail.tailer.read import net_changes as net_changes_module
from deltatail.tailer.read import spill as spill_module
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.net_changes import in_pass, pass_ids
from deltatail.tailer.read.spill import PassSpill
from deltatail.tailer.storage.local import LocalStorage


def batches(seed: int, count: int, rows: int) -> list[pa.RecordBatch]:
    rng = random.Random(seed)
    return [
        pa.record_batch(
            {
                "id": pa.array([rng.randrange(500) for _ in range(rows)], pa.int64()),
                "name": pa.array([f"n{rng.randrange(50)}" for _ in range(rows)]),
                "seq": pa.array(range(i * rows, (i + 1) * rows), pa.int64()),
            }
        )
        for i in range(count)
    ]


@pytest.mark.parametrize("buffer", [1, 1 << 30], ids=["append-every-batch", "append-at-the-end"])
def test_each_pass_holds_its_rows_in_the_order_read(monkeypatch: pytest.MonkeyPatch, buffer: int) -> None:
    monkeypatch.setattr(spill_module, "SPILL_BUFFER_BYTES", buffer)
    monkeypatch.setattr(spill_module, "SPILL_BYTES_PER_PASS", 1)
    data = batches(seed=3, count=9, rows=700)
    passes = 7
    with PassSpill(data[0].schema, passes, table="t", version=4) as spill:
        for b in data:
            spill.add(b, pass_ids(b, ("id",), passes))
        read_back = [spill.rows(which) for which in range(passes)]
        folder = spill._require_dir()
        assert spill.spilled_bytes > 0 and folder.is_dir()
    assert not folder.exists()
    for which, table in enumerate(read_back):
        filtered = pa.Table.from_batches([in_pass(b, ("id",), passes, which) for b in data], schema=data[0].schema)
        assert table.to_pylist() == filtered.to_pylist(), which
    seqs = sorted(s for t in read_back for s in t.column("seq").to_pylist())
    assert seqs == list(range(9 * 700))  # every row once


def test_the_spill_directory_goes_when_the_reading_fails() -> None:
    data = batches(seed=5, count=2, rows=50)
    with pytest.raises(RuntimeError, match="consumer gave up"), PassSpill(data[0].schema, 3, table="t", version=1) as s:
        s.add(data[0], pass_ids(data[0], ("id",), 3))
        s.rows(0)
        folder = s._require_dir()
        raise RuntimeError("consumer gave up")
    assert not folder.exists()


def test_a_spill_that_cannot_be_made_written_or_read_names_the_table_version_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = batches(seed=7, count=1, rows=100)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
    with pytest.raises(DeltaTailError, match=r"cannot make a directory to spill to.*TMPDIR.*table t, version 9"):
        PassSpill(data[0].schema, 3, table="t", version=9).__enter__()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spill_module, "SPILL_BUFFER_BYTES", 1)
    monkeypatch.setattr(spill_module, "SPILL_BYTES_PER_PASS", 1)
    with PassSpill(data[0].schema, 3, table="t", version=9) as spill:
        folder = spill._require_dir()
        folder.rmdir()  # gone under the reader (a cleaner of the temporary directory, say)
        with pytest.raises(DeltaTailError, match=rf"cannot spill rows to disk.*table t, version 9, file {folder}\]"):
            spill.add(data[0], pass_ids(data[0], ("id",), 3))
    with PassSpill(data[0].schema, 3, table="t", version=9) as spill:
        spill.add(data[0], pass_ids(data[0], ("id",), 3))
        torn = spill._path(1)
        torn.write_bytes(torn.read_bytes()[:-20])
        with pytest.raises(DeltaTailError, match=rf"cannot read back the spilled rows of pass 1.*file {torn}\]"):
            spill.rows(1)
    with pytest.raises(DeltaTailError, match="outside its with block"):
        spill.rows(0)


class CountingStorage(LocalStorage):
    """The local file system, recording the data files opened (a real read; only counted)."""

    def __init__(self, root: str) -> None:
        super().__init__()
        self.root = root
        self.opened: list[str] = []

    def open_input(self, path: str, size: int | None = None) -> pa.NativeFile:
        if "_delta_log" not in path:
            self.opened.append(os.path.relpath(path, self.root))
        return super().open_input(path, size)


@pytest.fixture(scope="module")
def rewritten(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A table of four files, then an overwrite of every row with a third of the values changed (no cdc files)."""
    root = tmp_path_factory.mktemp("spill") / "t"
    for part in range(4):
        ids = range(part * 500, (part + 1) * 500)
        write_deltalake(str(root), pa.table({"id": list(ids), "v": [i * 1.0 for i in ids]}), mode="append")
    ids = range(2_000)
    write_deltalake(
        str(root), pa.table({"id": list(ids), "v": [i * (2.0 if i % 3 == 0 else 1.0) for i in ids]}), mode="overwrite"
    )
    return root, 4


def test_a_commit_in_passes_reads_each_of_its_files_once(
    rewritten: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, version = rewritten
    options = ChangeOptions(net_changes=True, key_columns=("id",), batch_size=200, read_ahead=0)
    one_pass = [r for b in ChangeFeed(str(root), options=options).batches(version, version) for r in b.rows.to_pylist()]
    plan = next(ChangeFeed(str(root)).plans(version, version))
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", -(-sum(t.size or 0 for t in plan.tasks) // 4))
    storage = CountingStorage(str(root))
    batches_out = list(ChangeFeed(str(root), storage, options=options).batches(version, version))
    rows = [r for b in batches_out for r in b.rows.to_pylist()]
    assert sorted(storage.opened) == sorted(t.path for t in plan.tasks)  # each file once, not once a pass
    assert len(rows) == len(one_pass) == 2 * 666  # ids 3, 6, ..., 1998 changed (0 doubled is 0): update pairs
    assert sorted(map(str, rows)) == sorted(map(str, one_pass))
    assert {r["_change_type"] for r in rows} == {"update_preimage", "update_postimage"}


def test_a_spill_removes_the_directories_killed_processes_left_and_keeps_running_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        orphan = tmp_path / f"deltatail-spill-{dead.pid}-abc"
        running = tmp_path / f"deltatail-spill-{alive.pid}-def"
        other = tmp_path / "deltatail-spill-notapid-x"
        for folder in (orphan, running, other):
            (folder / "pass-0.arrows").parent.mkdir()
            (folder / "pass-0.arrows").write_bytes(b"rows")
        data = batches(seed=1, count=1, rows=10)
        with PassSpill(data[0].schema, 2, table="t", version=1) as spill:
            assert spill._require_dir().name.startswith(f"deltatail-spill-{os.getpid()}-")
        assert not orphan.exists() and running.is_dir() and other.is_dir()
    finally:
        alive.kill()
        alive.wait()


def test_passes_are_read_back_on_a_thread_of_the_spill_which_ends_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-back runs on the spill's own thread (where jemalloc returns a pass's pages when freed,
    :meth:`PassSpill._read_back`), one thread for every pass, gone when the spill is left."""
    readers: list[str] = []
    read_back = PassSpill._read_back

    def recorded(self: PassSpill, which: int) -> pa.Table:
        readers.append(threading.current_thread().name)
        return read_back(self, which)

    monkeypatch.setattr(PassSpill, "_read_back", recorded)
    data = batches(seed=8, count=3, rows=200)
    with PassSpill(data[0].schema, 3, table="t", version=2) as spill:
        for b in data:
            spill.add(b, pass_ids(b, ("id",), 3))
        rows = sum(spill.rows(which).num_rows for which in range(3))
    assert rows == 600
    assert len(readers) == 3 and len(set(readers)) == 1
    assert readers[0].startswith("deltatail-spill") and readers[0] != threading.current_thread().name
    assert not any(t.name.startswith("deltatail-spill") for t in threading.enumerate())
