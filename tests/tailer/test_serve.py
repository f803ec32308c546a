"""``deltatail serve`` end to end: 50 tables, some appearing while it runs, one broken, a SIGKILL and a restart.

A writer in another process changes the tables while the service follows them;
every table's output must equal deltalake's ``load_cdf`` over its versions, each
row exactly once (the JSON-lines sink reports what it holds), the broken table
must stop alone, and the metrics and health endpoints must tell the truth about
what was delivered.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: launcher.py (tests/ is not a package)
from launcher import Launched, popen

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}
TABLES = 50
LATE = 10  # of them, created while the service runs
BROKEN = "t07"

WRITER = textwrap.dedent(
    """
    import sys, time
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    root, tables, late, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    cdf = {"delta.enableChangeDataFeed": "true"}
    def rows(t, r):
        return pa.table({"id": pa.array([r * 10 + i for i in range(3)], pa.int64()), "t": [t] * 3})
    for r in range(rounds):
        for t in range(tables):
            path = f"{root}/t{t:02d}"
            if t >= tables - late and r == 0:
                write_deltalake(path, rows(t, r), configuration=cdf)  # a table appears
                continue
            write_deltalake(path, rows(t, r), mode="append")
            if r % 2 == 1:
                DeltaTable(path).delete(f"id = {r * 10}")
        time.sleep(0.2)
    """
)


def rows(t: int, r: int) -> pa.Table:
    return pa.table({"id": pa.array([r * 10 + i for i in range(3)], pa.int64()), "t": [t] * 3})


def start(config: Path, log: Path, *, forked: bool = False) -> tuple[subprocess.Popen[bytes] | Launched, int]:
    """``deltatail serve`` started by ``subprocess``, or ``forked`` by the test launcher (tests/launcher.py:
    the same ``main`` without the interpreter's start); returns it and its HTTP port once it listens."""
    before = log.stat().st_size if log.exists() else 0
    args = [sys.executable, "-m", "deltatail", "serve", "--config", str(config)]
    with log.open("ab") as err:
        proc = (
            popen(args, cwd=ROOT, env=os.environ, stderr=err)
            if forked
            else subprocess.Popen(args, cwd=ROOT, stderr=err)
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.findall(rb"metrics and health on http://127\.0\.0\.1:(\d+)/", log.read_bytes()[before:])
        if found and proc.poll() is None:
            return proc, int(found[-1])
        assert proc.poll() is None, log.read_text()
        time.sleep(0.1)
    raise AssertionError("the service did not start: " + log.read_text())


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read())


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not (line.startswith(name + "{") or line.startswith(name + " ")):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def expected(path: Path) -> Counter[tuple[Any, ...]]:
    table = pa.table(DeltaTable(str(path)).load_cdf(starting_version=0).read_all())
    return Counter((r["id"], r["_change_type"], r["_commit_version"]) for r in table.to_pylist())


def delivered(out: Path) -> list[tuple[Any, ...]]:
    if not out.exists():
        return []
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    return [(r["id"], r["_change_type"], r["_commit_version"]) for r in lines]


def break_table(path: Path) -> None:
    """The table's next commit is not JSON: its tailer must stop with an error naming it, alone."""
    version = max(int(p.name.split(".")[0]) for p in (path / "_delta_log").glob("*.json")) + 1
    (path / "_delta_log" / f"{version:020d}.json").write_text("{ this is not json\n")


@pytest.mark.slow
def test_fifty_tables_one_broken_killed_and_restarted(tmp_path: Path) -> None:
    lake, out, state = tmp_path / "lake", tmp_path / "out", tmp_path / "state"
    for t in range(TABLES - LATE):
        write_deltalake(str(lake / f"t{t:02d}"), rows(t, 0), configuration=CDF)
    config = tmp_path / "serve.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [service]
            state_root = "{state}"
            listen = "127.0.0.1:0"
            discover_seconds = 0.5
            status_seconds = 1
            ready_lag_seconds = 3600

            [defaults]
            sink = "jsonl:{out}/{{table_name}}.jsonl"
            checkpoint_seconds = 0.5
            poll_interval = 0.2

            [[discover]]
            root = "{lake}"
            """
        )
    )
    out.mkdir()
    log = tmp_path / "serve.log"
    proc, port = start(config, log, forked=True)  # forked by the launcher; the test below starts it anew
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(lake), str(TABLES), str(LATE), "6"])
    try:
        time.sleep(2.0)
        proc.send_signal(signal.SIGKILL)  # mid-run: a restart must lose and repeat nothing
        proc.wait()
        proc, port = start(config, log, forked=True)
        assert writer.wait(timeout=300) == 0
        break_table(lake / BROKEN)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = all(
                Counter(delivered(out / f"t{t:02d}.jsonl")) == expected(lake / f"t{t:02d}")
                for t in range(TABLES)
                if f"t{t:02d}" != BROKEN
            )
            if done and b"table t07 stopped" in log.read_bytes():
                break
            time.sleep(1.0)
        for t in range(TABLES):
            name = f"t{t:02d}"
            got = delivered(out / f"{name}.jsonl")
            assert len(got) == len(set(got)), f"{name}: rows repeated"
            if name != BROKEN:
                assert Counter(got) == expected(lake / name), name
        text = log.read_text()
        assert re.search(r"table t07 stopped: .*t07/_delta_log/0+\d+\.json", text), text[-3000:]

        code, body = get(port, "/metrics")
        assert code == 200
        metrics = body.decode()
        for name in ("t00", "t45", "t49"):
            lines = delivered(out / f"{name}.jsonl")
            for kind in ("insert", "delete"):
                # the counters count this run's deliveries; the file holds both runs'
                assert metric(metrics, "deltatail_rows_delivered_total", table=name, change_type=kind) <= sum(
                    1 for r in lines if r[1] == kind
                )
            assert metric(metrics, "deltatail_table_state", table=name, state="following") == 1.0
            assert metric(metrics, "deltatail_versions_behind", table=name) == 0.0
            assert metric(metrics, "deltatail_delivered_version", table=name) == DeltaTable(str(lake / name)).version()
        assert metric(metrics, "deltatail_table_state", table=BROKEN, state="failed") == 1.0
        assert metric(metrics, "deltatail_errors_total", table=BROKEN, kind="InvalidLogError") == 1.0
        assert metric(metrics, "process_resident_memory_bytes") > 0
        assert get(port, "/healthz")[0] == 200
        code, ready = get(port, "/readyz")
        assert code == 503 and BROKEN in json.loads(ready)["not_ready"][0]
    finally:
        writer.kill()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]

    listed = subprocess.run(
        [sys.executable, "-m", "deltatail", "status", str(state), "--json"], cwd=ROOT, capture_output=True
    )
    assert listed.returncode == 0, listed.stderr
    states = {r["name"]: r for r in json.loads(listed.stdout)}
    assert len(states) == TABLES
    assert states[BROKEN]["state"] == "failed" and "not" in (states[BROKEN]["error"] or "")
    assert states["t00"]["state"] == "stopped" and states["t00"]["versions_behind"] == 0


@pytest.mark.slow
def test_metrics_reflect_a_table_that_is_rows_behind(tmp_path: Path) -> None:
    """Without a writer: one table, scraped while following; figures equal the file's rows."""
    lake, out, state = tmp_path / "lake", tmp_path / "out", tmp_path / "state"
    write_deltalake(str(lake / "orders"), rows(1, 0), configuration=CDF)
    DeltaTable(str(lake / "orders")).delete("id = 1")
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[service]\nstate_root = "{state}"\nlisten = "127.0.0.1:0"\nstatus_seconds = 1\n\n'
        f'[[tables]]\npath = "{lake / "orders"}"\nsink = "jsonl:{out}.jsonl"\n'
    )
    log = tmp_path / "serve.log"
    proc, port = start(config, log)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(delivered(Path(f"{out}.jsonl"))) < 4:
            time.sleep(0.1)
        time.sleep(0.5)
        metrics = get(port, "/metrics")[1].decode()
        assert metric(metrics, "deltatail_rows_delivered_total", table="orders", change_type="insert") == 3
        assert metric(metrics, "deltatail_rows_delivered_total", table="orders", change_type="delete") == 1
        assert metric(metrics, "deltatail_commits_total", table="orders") == 2
        assert metric(metrics, "deltatail_delivered_version", table="orders") == 1
        assert "\ndeltatail_watch_overflows_total 0.0\n" in metrics  # the service's watcher, wired in
        assert get(port, "/readyz")[0] == 200
        assert get(port, "/nope")[0] == 404
        # The service reports its tables itself (every status_seconds); a table's tailer adds no
        # "following" lines of its own, which with many tables would fill the log.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and b"orders: following, version 1" not in log.read_bytes():
            time.sleep(0.1)
        text = log.read_text()
        assert "orders: following, version 1, 0 versions behind" in text, text
        assert "following: at version" not in text, text
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
