"""On-demand snapshots while streaming: ``deltatail signal STATE snapshot`` against a real ``deltatail run``.

Tables are written by deltalake; the tailer is the real command line in another process. Every
outcome is checked against deltalake itself: the snapshot's rows against
``DeltaTable(path, version=V).to_pyarrow_table()`` (``V`` the version the request was taken at),
the change rows against ``load_cdf``, and the order of the output: positions strictly increasing,
every change row of a version up to ``V`` before the first snapshot row and every later one after
the last (so no key's events are reordered).
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
Row = tuple[Any, ...]


def deltatail(*args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``deltatail ARGS`` run to its end, forked by the test launcher (tests/launcher.py: the same ``main``
    without the interpreter's start); the running tailer and service below are started by ``subprocess``."""
    env = dict(os.environ)
    env.pop("DELTATAIL_CRASH_AT", None)
    if crash_at is not None:
        env["DELTATAIL_CRASH_AT"] = crash_at
    return launcher.run([sys.executable, "-m", "deltatail", *args], cwd=ROOT, env=env, timeout=300, text=True)


def rows(ids: range, tag: str = "a") -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64()), "v": pa.array([f"{tag}{i}" for i in ids])})


def lines(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []


def table_at(path: Path, version: int, keep: Any = None) -> Counter[Row]:
    got = DeltaTable(str(path), version=version).to_pyarrow_table().to_pylist()
    return Counter((r["id"], r["v"]) for r in got if keep is None or keep(r))


def cdf(path: Path) -> Counter[Row]:
    got = pa.table(DeltaTable(str(path)).load_cdf(starting_version=0).read_all()).to_pylist()
    return Counter((r["id"], r["v"], r["_change_type"], r["_commit_version"]) for r in got)


def split(out: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(change rows, snapshot rows), after checking the order rule on the whole output."""
    positions = [(r["_position"][0], 0 if r["_position"][2] else 1, r["_position"][1]) for r in out]
    assert positions == sorted(positions) and len(set(positions)) == len(positions), "positions out of order"
    snap = [i for i, r in enumerate(out) if r["_position"][2]]
    changes = [r for r in out if not r["_position"][2]]
    if snap:
        at = out[snap[0]]["_commit_version"]
        assert snap == list(range(snap[0], snap[-1] + 1)), "snapshot rows interleaved with change rows"
        assert all(r["_commit_version"] == at and r["_change_type"] == "insert" for r in out[snap[0] : snap[-1] + 1])
        assert all(r["_commit_version"] <= at for r in out[: snap[0]])
        assert all(r["_commit_version"] > at for r in out[snap[-1] + 1 :])
    return changes, [out[i] for i in snap]


def change_rows(out: list[dict[str, Any]]) -> Counter[Row]:
    return Counter((r["id"], r["v"], r["_change_type"], r["_commit_version"]) for r in out)


def snapshot_rows(out: list[dict[str, Any]]) -> Counter[Row]:
    return Counter((r["id"], r["v"]) for r in out)


def follow_once(table: Path, state: Path, out: Path, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    return deltatail(
        "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up",
        "--reader-processes", "0", crash_at=crash_at,
    )  # fmt: skip


WRITER = textwrap.dedent(
    """
    import os, sys, time
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    path, commits, pause, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    for c in range(1, commits + 1):
        while c == pause + 1 and not os.path.exists(go):
            time.sleep(0.05)  # the request is asked for here, mid-stream
        ids = list(range(c * 100, c * 100 + 5))
        if c % 3 == 0:
            DeltaTable(path).update(predicate=f"id % 10 = {c % 10}", updates={"v": f"'u{c}'"})
        elif c % 3 == 1:
            write_deltalake(path, pa.table({"id": pa.array(ids, pa.int64()), "v": [f"c{c}"] * 5}), mode="append")
        else:
            DeltaTable(path).delete(f"id % 7 = {c % 7}")
        time.sleep(0.15)
    """
)


@pytest.mark.slow
def test_a_snapshot_asked_mid_stream_is_the_tables_rows_at_its_version_in_order(tmp_path: Path) -> None:
    table, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    write_deltalake(str(table), rows(range(60)), configuration=CDF)
    run = subprocess.Popen(
        [sys.executable, "-m", "deltatail", "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}",
         "--poll-interval", "0.05", "--checkpoint-seconds", "0.2", "--reader-processes", "0"],
        cwd=ROOT, stderr=subprocess.PIPE,
    )  # fmt: skip
    commits = 24
    go = tmp_path / "go"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(table), str(commits), "8", str(go)])
    try:
        deadline = time.monotonic() + 120
        while not (state / "cursor.json").exists() or DeltaTable(str(table)).version() < 8:
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.05)
        asked = deltatail("signal", str(state), "snapshot", "--id", "mid", "--chunk-rows", "4")
        assert asked.returncode == 0, asked.stderr
        go.touch()
        assert writer.wait(timeout=120) == 0
        while lines(out)[-1:] == [] or lines(out)[-1]["_commit_version"] < commits or not signals.last_end(state):
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.1)
    finally:
        writer.kill()
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err.decode()[-3000:]
    end = signals.last_end(state)
    assert end is not None and end["outcome"] == "done"
    taken_at = end["request"]["version"]
    assert 8 <= taken_at < commits  # asked mid-stream: taken between two of the writer's commits
    changes, snap = split(lines(out))
    assert change_rows(changes) == cdf(table)
    assert snapshot_rows(snap) == table_at(table, taken_at)
    assert {r["_position"][0] for r in snap} == {taken_at + 1}


@pytest.mark.slow
def test_a_snapshot_killed_in_the_middle_resumes_exactly_once(tmp_path: Path) -> None:
    table, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    write_deltalake(str(table), rows(range(0, 40)), configuration=CDF)
    write_deltalake(str(table), rows(range(40, 80)), mode="append")
    DeltaTable(str(table)).update(predicate="id < 50", updates={"v": "'u'"})
    assert follow_once(table, state, out).returncode == 0
    asked = deltatail("signal", str(state), "snapshot", "--id", "k", "--where", "id >= 20", "--chunk-rows", "7")
    assert asked.returncode == 0, asked.stderr
    DeltaTable(str(table)).delete("id < 30")  # version 3: delivered after the snapshot of version 2
    # after_save:2 - the request saved with the cursor, signal.json not yet removed; then kills inside the chunks
    for spec in ("after_save:2", "after_write:2", "after_flush:3", "after_save:4", "after_write:3"):
        killed = follow_once(table, state, out, crash_at=spec)
        assert killed.returncode == -signal.SIGKILL, (spec, killed.stderr)
    assert not (state / signals.REQUEST_FILE).exists()
    finished = follow_once(table, state, out)
    assert finished.returncode == 0, finished.stderr
    changes, snap = split(lines(out))
    assert change_rows(changes) == cdf(table)
    expected = table_at(table, 2, keep=lambda r: r["id"] >= 20)
    assert sum(expected.values()) == 60
    assert snapshot_rows(snap) == expected and len(snap) == 60  # each row once
    assert (signals.last_end(state) or {}).get("outcome") == "done"


@pytest.mark.slow
def test_a_bad_filter_is_refused_when_asked(tmp_path: Path) -> None:
    table, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    write_deltalake(str(table), rows(range(3)), configuration=CDF)
    assert follow_once(table, state, out).returncode == 0
    refused = deltatail("signal", str(state), "snapshot", "--where", "price > 1")
    assert refused.returncode != 0
    assert "unknown column 'price'" in refused.stderr and str(table) in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (state / signals.REQUEST_FILE).exists()
    (state / signals.REQUEST_FILE).write_text("{damaged")  # a request file that is not one: dropped, said
    write_deltalake(str(table), rows(range(3, 5)), mode="append")
    followed = follow_once(table, state, out)
    assert followed.returncode == 0 and "snapshot request dropped" in followed.stderr
    assert not (state / signals.REQUEST_FILE).exists()
    changes, snap = split(lines(out))
    assert snap == [] and change_rows(changes) == cdf(table)


@pytest.mark.slow
def test_a_second_request_waits_for_the_first_and_cancel_drops_it(tmp_path: Path) -> None:
    table, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    write_deltalake(str(table), rows(range(3)), configuration=CDF)
    assert follow_once(table, state, out).returncode == 0
    assert deltatail("signal", str(state), "snapshot", "--id", "one").returncode == 0
    again = deltatail("signal", str(state), "snapshot", "--id", "two")
    assert again.returncode != 0 and "snapshot request one is already waiting" in again.stderr
    shown = json.loads(deltatail("signal", str(state), "status", "--json").stdout)
    assert shown["waiting"]["id"] == "one" and shown["running"] is None
    assert deltatail("signal", str(state), "cancel").returncode == 0
    nothing = deltatail("signal", str(state), "cancel")
    assert nothing.returncode != 0 and "no snapshot" in nothing.stderr
    write_deltalake(str(table), rows(range(3, 5)), mode="append")
    assert follow_once(table, state, out).returncode == 0
    changes, snap = split(lines(out))
    assert snap == [] and change_rows(changes) == cdf(table)


@pytest.mark.slow
def test_a_running_snapshot_cancelled_ends_and_the_stream_goes_on(tmp_path: Path) -> None:
    table, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    write_deltalake(str(table), rows(range(30)), configuration=CDF)
    assert follow_once(table, state, out).returncode == 0
    assert deltatail("signal", str(state), "snapshot", "--id", "c", "--chunk-rows", "5").returncode == 0
    write_deltalake(str(table), rows(range(30, 32)), mode="append")
    killed = follow_once(table, state, out, crash_at="after_write:2")  # two chunks out, then killed
    assert killed.returncode == -signal.SIGKILL
    shown = json.loads(deltatail("signal", str(state), "status", "--json").stdout)
    assert shown["running"]["id"] == "c" and shown["running"]["version"] == 0
    listed = json.loads(deltatail("status", str(state), "--json").stdout)
    assert listed[0]["cursor"]["version"] == 1 and listed[0]["cursor"]["snapshot"]
    assert listed[0]["delivered_version"] == 0  # inside the snapshot of version 0: version 1 is not delivered
    assert deltatail("signal", str(state), "cancel").returncode == 0
    assert follow_once(table, state, out).returncode == 0
    changes, snap = split(lines(out))
    assert change_rows(changes) == cdf(table)  # version 1 delivered after the cancelled snapshot
    assert 0 < len(snap) < 30 and len({r["id"] for r in snap}) == len(snap)
    assert (signals.last_end(state) or {}).get("outcome") == "cancelled"


@pytest.mark.slow
def test_serve_takes_a_signal_for_the_table_it_names_only(tmp_path: Path) -> None:
    lake, out, state = tmp_path / "lake", tmp_path / "out", tmp_path / "state"
    for name in ("a", "b"):
        write_deltalake(str(lake / name), rows(range(10)), configuration=CDF)
    config = tmp_path / "serve.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [service]
            state_root = "{state}"
            listen = "127.0.0.1:0"

            [defaults]
            sink = "jsonl:{out}/{{table_name}}.jsonl"
            checkpoint_seconds = 0.2
            poll_interval = 0.1
            reader_processes = 0

            [[tables]]
            path = "{lake / "a"}"

            [[tables]]
            path = "{lake / "b"}"
            """
        )
    )
    out.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)], cwd=ROOT, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 120
        while len(lines(out / "a.jsonl")) < 10 or len(lines(out / "b.jsonl")) < 10:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        asked = deltatail("signal", str(state), "snapshot", "--table", "a", "--where", "id < 4")
        assert asked.returncode == 0, asked.stderr
        while len(lines(out / "a.jsonl")) < 14:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        for name in ("a", "b"):
            write_deltalake(str(lake / name), rows(range(10, 12)), mode="append")
        while len(lines(out / "a.jsonl")) < 16 or len(lines(out / "b.jsonl")) < 12:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()[-3000:]
    changes, snap = split(lines(out / "a.jsonl"))
    assert change_rows(changes) == cdf(lake / "a")
    assert snapshot_rows(snap) == table_at(lake / "a", 0, keep=lambda r: r["id"] < 4)
    changes, snap = split(lines(out / "b.jsonl"))
    assert snap == [] and change_rows(changes) == cdf(lake / "b")


def test_a_lance_dataset_refuses_signals(tmp_path: Path) -> None:
    lance = pytest.importorskip("lance")
    dataset, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(3)), str(dataset))
    followed = follow_once(dataset, state, out)  # a Lance dataset by its layout
    assert followed.returncode == 0, followed.stderr
    refused = deltatail("signal", str(state), "snapshot")
    assert refused.returncode != 0 and "on-demand snapshots are for Delta tables, not a Lance" in refused.stderr
    assert not (state / signals.REQUEST_FILE).exists()
