"""What deltatail says about how far behind a table is: the lag metric, readiness and ``deltatail status``.

``deltatail_seconds_behind`` is the age of the oldest commit not yet delivered: 0 on a
caught-up table however long it stays idle, and the age of that commit (its file's
modification time, set here by the test) on a table held behind. ``deltatail status`` shows
a delivery within about a second, not at the next checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from damage import Ran, run_inline
from deltalake import write_deltalake
from lance_datasets import rows as lance_rows
from prometheus_client import CollectorRegistry

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.lance.dataset import LanceDataset
from deltatail.tailer.lance.follow import LanceTailer
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.serve.http import TableCollector, readiness

ROOT = Path(__file__).resolve().parents[2]
DAY = 86_400.0


def make(root: Path, versions: int) -> None:
    write_deltalake(str(root), pa.table({"id": [0]}), configuration={"delta.enableChangeDataFeed": "true"})
    for v in range(1, versions):
        write_deltalake(str(root), pa.table({"id": [v]}), mode="append")


def set_commit_time(root: Path, version: int, epoch_ms: int) -> None:
    """The commit's file modification time, which is its commit time for deltalake's commits."""
    os.utime(root / "_delta_log" / f"{version:020d}.json", ns=(epoch_ms * 1_000_000, epoch_ms * 1_000_000))


def config(root: Path, state: Path, *, until_caught_up: bool = False) -> TailerConfig:
    return TailerConfig(
        table=str(root),
        state_dir=str(state),
        watch=False,
        until_caught_up=until_caught_up,
        options=ChangeOptions(reader_processes=0),
    )


def scrape(stats: TableStats, now: float) -> dict[str, float | None]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TableCollector(lambda: [stats], clock=lambda: now))
    return {
        name: registry.get_sample_value(name, {"table": stats.name})
        for name in (
            "deltatail_seconds_behind",
            "deltatail_versions_behind",
            "deltatail_delivered_commit_timestamp_seconds",
        )
    }


def test_a_caught_up_idle_table_is_never_behind(tmp_path: Path) -> None:
    root, state = tmp_path / "t", tmp_path / "state"
    make(root, 3)
    committed_ms = 1_700_000_000_000
    for v in (0, 1, 2):  # in order: commit times only go forward
        set_commit_time(root, v, committed_ms - (2 - v) * 1000)
    tailer = Tailer(config(root, state, until_caught_up=True), JsonLinesSink(str(tmp_path / "out.jsonl")))
    tailer.run()
    stats = tailer.stats
    assert (stats.delivered_version, stats.versions_behind) == (2, 0)
    for waited in (0.0, 36.0, 46.0, DAY, 30 * DAY):
        now = time.time() + waited
        assert scrape(stats, now) == {
            "deltatail_seconds_behind": 0.0,
            "deltatail_versions_behind": 0.0,
            "deltatail_delivered_commit_timestamp_seconds": committed_ms / 1000,  # the idle figure, by its name
        }
        assert stats.seconds_behind(now) == 0.0
    stats.set_state(TableState.CATCHING_UP)
    assert readiness([stats], 60.0, time.time() + DAY) == []


def test_a_table_held_behind_reports_the_age_of_its_oldest_undelivered_commit(tmp_path: Path) -> None:
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    make(root, 3)
    Tailer(config(root, state, until_caught_up=True), JsonLinesSink(str(out))).run()
    for v in (3, 4, 5):
        write_deltalake(str(root), pa.table({"id": [v]}), mode="append")
    oldest_ms = int(time.time() * 1000) - 3_600_000  # version 3, an hour ago: the oldest not delivered
    for v, ms in ((3, oldest_ms), (4, oldest_ms + 60_000), (5, oldest_ms + 120_000)):
        set_commit_time(root, v, ms)
    tailer = Tailer(config(root, state), JsonLinesSink(str(out)))
    tailer.open()
    try:
        tailer.stop()  # held: it looks, sees versions 3..5, and delivers none of them
        assert tailer.step() == 3
        stats = tailer.stats
        now = oldest_ms / 1000 + 500.0
        assert scrape(stats, now)["deltatail_seconds_behind"] == 500.0
        assert scrape(stats, now + DAY)["deltatail_seconds_behind"] == 500.0 + DAY
        assert scrape(stats, now)["deltatail_versions_behind"] == 3.0
        assert readiness([stats], 60.0, now) == ["t: catching_up (500s behind)"]
        assert readiness([stats], 600.0, now) == []
    finally:
        tailer.close()
    # The same figure once stopped, from `deltatail status` (the lag counted from now).
    [doc] = json.loads(deltatail("status", str(state), "--json").stdout)
    assert (doc["delivered_version"], doc["versions_behind"]) == (2, 3)
    assert 3600 <= doc["seconds_behind"] < 3600 + 600  # an hour, and the minutes this test took
    caught_up = Tailer(config(root, state, until_caught_up=True), JsonLinesSink(str(out)))
    caught_up.run()
    assert (caught_up.stats.versions_behind, caught_up.stats.seconds_behind(time.time() + DAY)) == (0, 0.0)
    [doc] = json.loads(deltatail("status", str(state), "--json").stdout)
    assert (doc["delivered_version"], doc["versions_behind"], doc["seconds_behind"]) == (5, 0, 0.0)


def deltatail(*args: str) -> Ran:
    """``deltatail status`` and the like through the entry point in this process (``damage.run_inline``): the
    polls below ask every 0.1 s, where a process of their own took a second or more to start."""
    return run_inline(*args)


def _status(state: Path) -> dict[str, object]:
    done = deltatail("status", str(state), "--json")
    assert done.returncode == 0, done.stderr
    [doc] = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def _poll(what: str, check: object, seconds: float = 15.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


@pytest.mark.slow
def test_status_of_a_running_tailer_is_as_fresh_as_the_sink(tmp_path: Path) -> None:
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    make(root, 2)
    log = (tmp_path / "run.log").open("wb")
    args = ["run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--poll-interval", "0.1"]
    args += ["--checkpoint-seconds", "3600", "--checkpoint-commits", "1000"]  # the cursor is not saved while it runs
    proc = subprocess.Popen([sys.executable, "-m", "deltatail", *args], cwd=ROOT, stderr=log)
    try:
        _poll("the first versions delivered", lambda: out.exists() and len(out.read_text().splitlines()) == 2)
        _poll("status: caught up at version 1", lambda: _status(state)["delivered_version"] == 1)
        write_deltalake(str(root), pa.table({"id": [7]}), mode="append")  # version 2
        _poll("row 7 in the sink", lambda: '"id":7' in out.read_text().replace(" ", ""))
        # Within about a second of the row reaching the sink (the cursor is saved only in an hour).
        _poll("status: version 2 delivered", lambda: _status(state)["delivered_version"] == 2, seconds=5.0)
        doc = _status(state)
        assert (doc["versions_behind"], doc["seconds_behind"], doc["state"]) == (0, 0.0, "following")
        assert "0 versions behind (0s" in deltatail("status", str(state)).stdout
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
        log.close()
    doc = _status(state)  # stopped: the cursor saved on the way out
    assert (doc["delivered_version"], doc["versions_behind"], doc["state"]) == (2, 0, "stopped")


@pytest.mark.slow
def test_serve_status_and_metrics_are_as_fresh_as_the_sink(tmp_path: Path) -> None:
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    make(root, 2)
    conf = tmp_path / "serve.toml"
    conf.write_text(
        f'[service]\nstate_root = "{state}"\nlisten = "127.0.0.1:0"\nsafety_poll_seconds = 0.2\n'
        f'[defaults]\nsink = "jsonl:{out}"\ncheckpoint_seconds = 3600\ncheckpoint_commits = 1000\n'
        f'[[tables]]\npath = "{root}"\nname = "t"\n'
    )
    log = tmp_path / "serve.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltatail", "serve", "--config", str(conf)], cwd=ROOT, stderr=err
        )
    try:
        _poll("the service listens", lambda: b"metrics and health on" in log.read_bytes())
        port = int(log.read_text().split("http://127.0.0.1:")[1].split("/")[0])
        _poll("the first versions delivered", lambda: out.exists() and len(out.read_text().splitlines()) == 2)
        write_deltalake(str(root), pa.table({"id": [7]}), mode="append")  # version 2
        _poll("row 7 in the sink", lambda: '"id":7' in out.read_text().replace(" ", ""))
        _poll("status: version 2 delivered", lambda: _status(state)["delivered_version"] == 2, seconds=5.0)
        doc = _status(state)
        assert (doc["versions_behind"], doc["seconds_behind"], doc["state"]) == (0, 0.0, "following")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert 'deltatail_seconds_behind{table="t"} 0.0' in metrics
        assert 'deltatail_delivered_version{table="t"} 2.0' in metrics
    finally:
        proc.terminate()
        assert proc.wait(60) == 0, log.read_text()


def test_a_lance_dataset_held_behind_reports_the_age_of_its_oldest_undelivered_version(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(lance_rows(range(3)), str(root))
    lance_config = TailerConfig(table=str(root), state_dir=str(state), until_caught_up=True, watch=False)
    LanceTailer(lance_config, JsonLinesSink(str(out))).run()
    for i in (3, 4):
        lance.write_dataset(lance_rows([i]), str(root), mode="append")  # versions 2 and 3
    oldest_ms = int(time.time() * 1000) - 600_000
    dataset = LanceDataset(str(root))
    for v, ms in ((2, oldest_ms), (3, oldest_ms + 60_000)):
        manifest = dataset.manifest_file(v)
        assert manifest is not None
        path = root / "_versions" / manifest.name
        os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))
    tailer = LanceTailer(TailerConfig(table=str(root), state_dir=str(state), watch=False), JsonLinesSink(str(out)))
    tailer.open()
    try:
        tailer.stop()
        assert tailer.step() == 2
        now = oldest_ms / 1000 + 700.0
        assert scrape(tailer.stats, now)["deltatail_seconds_behind"] == 700.0
        assert scrape(tailer.stats, now)["deltatail_versions_behind"] == 2.0
    finally:
        tailer.close()
    caught_up = LanceTailer(lance_config, JsonLinesSink(str(out)))
    caught_up.run()
    assert (caught_up.stats.versions_behind, caught_up.stats.seconds_behind(time.time() + DAY)) == (0, 0.0)


def test_a_status_file_that_cannot_be_written_is_logged_once_and_stops_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    make(root, 4)
    (state / "status.json").mkdir(parents=True)  # a directory where the file goes: every write fails
    tailer = Tailer(config(root, state, until_caught_up=True), JsonLinesSink(str(out)))
    tailer.run()
    assert len(out.read_text().splitlines()) == 4 and tailer.stats.delivered_version == 3
    warnings = [r for r in caplog.records if "cannot write its status file" in r.getMessage()]
    assert len(warnings) == 1 and str(state) in warnings[0].getMessage()
