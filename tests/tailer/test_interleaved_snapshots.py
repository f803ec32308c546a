"""On-demand snapshots of a keyed run (``run --key id``): chunks interleaved with commits (rule 4 of state/signals.py).

The table is written by deltalake and followed by the real command line in another process.
Every expected value comes from deltalake: the snapshot's rows from
``DeltaTable(path, version=V)``, which keys changed when from ``load_cdf``, and the table at every
version after the snapshot completed from ``DeltaTable(path, version=W)``, against which the
delivered stream, folded per key in position order, is compared.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: launcher.py (tests/ is not a package)
import launcher

from deltatail.tailer.follow import signals

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}
CHUNK = 6
Row = dict[str, Any]


def deltatail(*args: str, crash_at: str | None = None, forked: bool = True) -> subprocess.CompletedProcess[str]:
    """``deltatail ARGS`` run to its end, ``forked`` by the test launcher (tests/launcher.py: the same ``main``
    without the interpreter's start) or started by ``subprocess``, as the writer test below starts all of it."""
    env = {k: v for k, v in os.environ.items() if k != "DELTATAIL_CRASH_AT"}
    if crash_at is not None:
        env["DELTATAIL_CRASH_AT"] = crash_at
    argv = [sys.executable, "-m", "deltatail", *args]
    if forked:
        return launcher.run(argv, cwd=ROOT, env=env, timeout=300, text=True)
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)


def follow(table: Path, state: Path, out: Path, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    return deltatail(
        "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up",
        "--key", "id", "--net-changes", "--reader-processes", "0", crash_at=crash_at,
    )  # fmt: skip


def lines(out: Path) -> list[Row]:
    """The complete lines of the output so far (a line being written by a running tailer is left out)."""
    if not out.exists():
        return []
    complete = out.read_bytes().split(b"\n")[:-1]
    return [json.loads(line) for line in complete]


def order(r: Row) -> tuple[int, int, int]:
    """A JSON line's position as a sortable tuple: a snapshot row before the change rows of its version."""
    version, index, snapshot = r["_position"]
    return (version, 0 if snapshot else 1, index)


def table_at(path: Path, version: int) -> dict[int, str]:
    return {r["id"]: r["v"] for r in DeltaTable(str(path), version=version).to_pyarrow_table().to_pylist()}


def changed_at(path: Path) -> dict[int, set[int]]:
    """The versions at which each key has a change row, by deltalake's change data feed."""
    out: dict[int, set[int]] = {}
    for r in pa.table(DeltaTable(str(path)).load_cdf(starting_version=1).read_all()).to_pylist():
        out.setdefault(r["id"], set()).add(r["_commit_version"])
    return out


def newest_change(out: list[Row]) -> int:
    return max((r["_commit_version"] for r in out if not r["_position"][2]), default=-1)


def fold(rows: list[Row]) -> dict[int, str]:
    state: dict[int, str] = {}
    for r in rows:
        if r["_change_type"] in ("insert", "update_postimage"):
            state[r["id"]] = r["v"]
        elif r["_change_type"] == "delete":
            state.pop(r["id"], None)
    return state


def write_commits(path: Path) -> int:
    """Six commits after version 0: updates, deletes (one of an updated key), inserts, a deleted key written again."""
    t = str(path)
    DeltaTable(t).update(predicate="id < 5", updates={"v": "'u1'"})
    DeltaTable(t).delete("id >= 10 AND id < 15")
    write_deltalake(t, pa.table({"id": pa.array(range(100, 105), pa.int64()), "v": ["n3"] * 5}), mode="append")
    DeltaTable(t).update(predicate="id % 7 = 0", updates={"v": "'u4'"})
    DeltaTable(t).delete("id % 9 = 0")
    write_deltalake(t, pa.table({"id": pa.array([10], pa.int64()), "v": ["r6"]}), mode="append")
    return 6


def check_interleaved(table: Path, out: list[Row], taken: int, last: int, *, turns: bool = True) -> None:
    """The keyed rule's outcome, every expected value from deltalake (see the module docstring)."""
    assert [order(r) for r in out] == sorted({order(r) for r in out}), "positions not strictly increasing"
    snap = [r for r in out if r["_position"][2]]
    at_v, changed = table_at(table, taken), changed_at(table)
    # Each snapshot row is the key's row at V, delivered only while the key had no change after V.
    assert all(r["_change_type"] == "insert" and r["_commit_version"] == taken for r in snap)
    assert all(r["v"] == at_v[r["id"]] for r in snap)
    for r in snap:
        after = r["_position"][0] - 1  # the chunk went out after this commit
        assert not {v for v in changed.get(r["id"], set()) if taken < v <= after}, f"key {r['id']} out of order"
    ids = Counter(r["id"] for r in snap)
    assert max(ids.values()) == 1
    unchanged = {k for k in at_v if not {v for v in changed.get(k, set()) if v > taken}}
    assert unchanged <= set(ids) <= set(at_v)
    per_commit = Counter(r["_position"][0] for r in snap)
    if turns:  # every commit there when the run started: one chunk of at most CHUNK rows after each
        assert all(n <= CHUNK for v, n in per_commit.items() if v <= last)
        assert {taken + 1, taken + 2} <= set(per_commit)  # a commit went out between two chunks
    # Folded per key from the snapshot's first row on, the stream is the table at every version after it completed.
    first = out.index(snap[0])
    done = max(per_commit) - 1
    for w in range(done, last + 1):
        upto = [r for r in out[first:] if order(r) < (w + 1, 1, 0)]
        assert fold(upto) == table_at(table, w), f"version {w}"
        assert fold([r for r in out if order(r) < (w + 1, 1, 0)]) == table_at(table, w)


def setup(tmp_path: Path, states: int = 1) -> tuple[Path, list[tuple[Path, Path]]]:
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": pa.array(range(40), pa.int64()), "v": [f"a{i}" for i in range(40)]}),
                    configuration=CDF)  # fmt: skip
    runs = [(tmp_path / f"state{i}", tmp_path / f"out{i}.jsonl") for i in range(states)]
    for state, out in runs:
        assert follow(table, state, out).returncode == 0
        asked = deltatail("signal", str(state), "snapshot", "--id", "k", "--chunk-rows", str(CHUNK))
        assert asked.returncode == 0, asked.stderr
    return table, runs


@pytest.mark.slow
def test_a_keyed_snapshot_alternates_chunks_with_commits_and_folds_to_the_table(tmp_path: Path) -> None:
    table, [(state, out)] = setup(tmp_path)
    last = write_commits(table)
    done = follow(table, state, out)
    assert done.returncode == 0, done.stderr
    end = signals.last_end(state)
    assert end is not None and end["outcome"] == "done" and end["request"]["key"] == ["id"]
    got = lines(out)
    check_interleaved(table, got, 0, last)
    cdf = pa.table(DeltaTable(str(table)).load_cdf(starting_version=1).read_all()).to_pylist()
    deleted_at = {r["id"]: r["_commit_version"] for r in cdf if r["_change_type"] == "delete"}
    assert sorted(deleted_at) == [0, 9, 10, 11, 12, 13, 14, 18, 27, 36]
    for r in got:  # a key deleted after V is not resurrected by a chunk delivered after its delete
        assert not (r["_position"][2] and r["id"] in deleted_at and r["_position"][0] - 1 >= deleted_at[r["id"]])
    changes = Counter((r["id"], r["v"], r["_change_type"]) for r in got if r["_commit_version"] > 0)
    assert changes == Counter((r["id"], r["v"], r["_change_type"]) for r in cdf)


@pytest.mark.slow
def test_a_keyed_snapshot_killed_between_chunks_and_commits_resumes_exactly_once(tmp_path: Path) -> None:
    table, [(clean, clean_out), (state, out)] = setup(tmp_path, states=2)
    last = write_commits(table)
    assert follow(table, clean, clean_out).returncode == 0
    for spec in ("after_save:2", "after_write:2", "after_flush:3", "after_save:4", "after_write:3", "after_save:3"):
        killed = follow(table, state, out, crash_at=spec)
        assert killed.returncode == -signal.SIGKILL, (spec, killed.stderr)
    finished = follow(table, state, out)
    assert finished.returncode == 0, finished.stderr
    got = lines(out)
    check_interleaved(table, got, 0, last)
    keep = ("_position", "id", "v", "_change_type", "_commit_version")
    assert [[r[k] for k in keep] for r in got] == [[r[k] for k in keep] for r in lines(clean_out)]
    assert (signals.last_end(state) or {}).get("outcome") == "done"


WRITER = textwrap.dedent(
    """
    import os, sys, time
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    path, commits, go = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    while not os.path.exists(go):
        time.sleep(0.05)
    for c in range(1, commits + 1):
        if c % 3 == 0:
            DeltaTable(path).update(predicate=f"id % 10 = {c % 10}", updates={"v": f"'u{c}'"})
        elif c % 3 == 1:
            ids = [c * 100, c * 100 + 1] + {4: [2], 7: [5], 10: [8]}.get(c, [])  # a key deleted before, again
            write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "v": [f"c{c}"] * len(ids)}), mode="append")
        else:
            DeltaTable(path).delete(f"id % 7 = {c % 7}")
        time.sleep(0.1)
    """
)


@pytest.mark.slow
def test_a_keyed_snapshot_asked_while_a_writer_updates_and_deletes_folds_to_the_table(tmp_path: Path) -> None:
    table, state, out, go = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl", tmp_path / "go"
    write_deltalake(str(table), pa.table({"id": pa.array(range(40), pa.int64()), "v": [f"a{i}" for i in range(40)]}),
                    configuration=CDF)  # fmt: skip
    run = subprocess.Popen(
        [sys.executable, "-m", "deltatail", "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}",
         "--key", "id", "--net-changes", "--poll-interval", "0.05", "--checkpoint-seconds", "0.2",
         "--reader-processes", "0"],
        cwd=ROOT, stderr=subprocess.PIPE,
    )  # fmt: skip
    commits = 12
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(table), str(commits), str(go)])
    try:
        deadline = time.monotonic() + 180
        while len(lines(out)) < 40:
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        while not (state / "cursor.json").exists():  # the request needs the run's saved state to name its version
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        go.touch()  # the writer starts; the request is asked for while it writes
        asked = deltatail("signal", str(state), "snapshot", "--id", "w", "--chunk-rows", "3", forked=False)
        assert asked.returncode == 0, asked.stderr
        assert writer.wait(timeout=120) == 0
        newest = DeltaTable(str(table)).version()  # a delete that matches nothing commits nothing
        while not signals.last_end(state) or newest_change(lines(out)) < newest:
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.1)
    finally:
        writer.kill()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err.decode()[-3000:]
    end = signals.last_end(state)
    assert end is not None and end["outcome"] == "done"
    got = lines(out)
    assert newest_change(got) == newest >= commits - 2
    check_interleaved(table, got, end["request"]["version"], newest, turns=False)
