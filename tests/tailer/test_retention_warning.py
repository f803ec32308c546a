"""Retention you see coming: how long the oldest undelivered version stays readable.

The table's retention properties and its commit times are set here (the commit files'
modification times, which are deltalake's commit times, and their ``commitInfo.timestamp``),
and every expected figure is worked out by hand from them: log retention 2 days, deleted-file
retention 3 days, so a version stays readable 2 days after its commit; the oldest undelivered
version, committed 40 hours before "now", has 8 hours left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from prometheus_client import CollectorRegistry

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.alerts import evaluate, parse_alert_rules
from deltatail.state.errors import ConfigError
from deltatail.tailer.audit.feed import AuditFeed
from deltatail.tailer.cli.serve import load_serve_config
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.serve.http import HealthServer, TableCollector, readiness

ROOT = Path(__file__).resolve().parents[2]
HOUR_MS = 3_600_000
RETENTION = {
    "delta.logRetentionDuration": "interval 2 days",
    "delta.deletedFileRetentionDuration": "interval 3 days",
}


def set_commit_time(root: Path, version: int, epoch_ms: int) -> None:
    """Both commit times of a version: its file's modification time and its ``commitInfo.timestamp``."""
    path = root / "_delta_log" / f"{version:020d}.json"
    lines = []
    for line in path.read_text().splitlines():
        action = json.loads(line)
        if "commitInfo" in action:
            action["commitInfo"]["timestamp"] = epoch_ms
        lines.append(json.dumps(action))
    path.write_text("\n".join(lines) + "\n")
    os.utime(path, ns=(epoch_ms * 1_000_000, epoch_ms * 1_000_000))


def make(root: Path, now_ms: int) -> None:
    """Versions 0..3 committed 50, 45, 40 and 35 hours before ``now_ms``, with the retention of ``RETENTION``."""
    write_deltalake(str(root), pa.table({"id": [0]}), configuration=RETENTION)
    for v in (1, 2, 3):
        write_deltalake(str(root), pa.table({"id": [v]}), mode="append")
    for v in range(4):
        set_commit_time(root, v, now_ms - (50 - 5 * v) * HOUR_MS)


def config(root: Path, state: Path) -> TailerConfig:
    return TailerConfig(
        table=str(root),
        state_dir=str(state),
        watch=False,
        until_caught_up=True,
        starting_version=0,
        options=ChangeOptions(reader_processes=0),
    )


def held_behind(tmp_path: Path, now_ms: int) -> Tailer:
    """A tailer that delivered versions 0 and 1, then looked and holds 2 and 3 undelivered (opened)."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    make(root, now_ms)
    first = Tailer(config(root, state), JsonLinesSink(str(out)))
    first.open()
    try:
        assert first.step(max_versions=2) == 2
        first.checkpoint()
    finally:
        first.close()
    tailer = Tailer(config(root, state), JsonLinesSink(str(out)))
    tailer.open()
    tailer.stop()  # it looks, sees versions 2 and 3, and delivers neither
    assert tailer.step() == 2
    return tailer


def scrape(stats: TableStats, now: float) -> float | None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TableCollector(lambda: [stats], clock=lambda: now))
    return registry.get_sample_value("deltatail_readable_seconds", {"table": stats.name})


def test_the_metric_and_readiness_count_down_from_the_oldest_undelivered_commit(tmp_path: Path) -> None:
    now_ms = (int(time.time()) // 1000) * 1_000_000  # a whole second, so the figures below are exact
    tailer = held_behind(tmp_path, now_ms)
    try:
        stats = tailer.stats
        assert (stats.delivered_version, stats.versions_behind) == (1, 2)
        now = now_ms / 1000
        # version 2 committed 40 h ago; readable 2 days (the shorter retention): 8 h left
        assert stats.readable_seconds(now) == 8 * 3600.0
        assert scrape(stats, now) == 8 * 3600.0
        assert scrape(stats, now + 9 * 3600) == -3600.0  # past it: may be cleaned up already
        assert readiness([stats], 1e9, now, min_readable_seconds=7 * 3600) == []
        [problem] = readiness([stats], 1e9, now, min_readable_seconds=9 * 3600)
        assert problem.startswith("t: the oldest undelivered version (after 1) stays readable 28800s more")
    finally:
        tailer.close()


def test_readyz_fails_over_a_real_socket_under_the_threshold(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    tailer = held_behind(tmp_path, now_ms)
    tailer.close()
    tailer.stats.set_state(TableState.CATCHING_UP)  # as serve keeps it between steps
    answers = {}
    for threshold in (7 * 3600, 9 * 3600):  # 8 h left (less the seconds this test takes)
        server = HealthServer("127.0.0.1", 0, lambda: [tailer.stats], 1e9, min_readable_seconds=threshold)
        server.start()
        try:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/readyz", timeout=10) as r:
                    answers[threshold] = (r.status, json.loads(r.read()))
            except urllib.error.HTTPError as e:
                answers[threshold] = (e.code, json.loads(e.read()))
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as r:
                metrics = r.read().decode()
        finally:
            server.close()
        left = float(metrics.split('deltatail_readable_seconds{table="t"} ')[1].split()[0])
        assert 8 * 3600 - 600 < left <= 8 * 3600
    assert answers[7 * 3600] == (200, {"ready": True, "not_ready": []})
    code, doc = answers[9 * 3600]
    assert code == 503 and doc["ready"] is False and "stays readable" in doc["not_ready"][0]


def test_status_shows_how_long_the_oldest_undelivered_version_stays_readable(tmp_path: Path) -> None:
    now_ms = int(time.time() * 1000)
    held_behind(tmp_path, now_ms).close()
    done = subprocess.run(
        [sys.executable, "-m", "deltatail", "status", str(tmp_path / "state"), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    [doc] = json.loads(done.stdout)
    assert (doc["delivered_version"], doc["versions_behind"]) == (1, 2)
    assert 8 * 3600 - 600 < doc["readable_seconds"] <= 8 * 3600
    assert (doc["data_losses"], doc["versions_lost"]) == (0, 0)
    text = subprocess.run(
        [sys.executable, "-m", "deltatail", "status", str(tmp_path / "state")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout
    assert "oldest undelivered version readable for at least 28" in text  # 28,7xx s


def test_a_caught_up_table_has_nothing_at_risk(tmp_path: Path) -> None:
    root, state = tmp_path / "t", tmp_path / "state"
    make(root, int(time.time() * 1000))
    tailer = Tailer(config(root, state), JsonLinesSink(str(tmp_path / "out.jsonl")))
    tailer.run()
    assert tailer.stats.versions_behind == 0
    assert tailer.stats.readable_seconds(time.time() + 10 * 86400) is None
    assert scrape(tailer.stats, time.time()) is None
    tailer.stats.set_state(TableState.FOLLOWING)  # as serve keeps it between steps
    assert readiness([tailer.stats], 1e9, time.time(), min_readable_seconds=1e9) == []


def test_the_audit_rule_fires_on_commits_audited_close_to_their_cleanup(tmp_path: Path) -> None:
    root = tmp_path / "t"
    now_ms = 1_800_000_000_000
    make(root, now_ms)
    rules = parse_alert_rules([{"name": "cleanup soon", "readable_under_seconds": 6 * 3600}])
    events = list(AuditFeed(str(root)).events())
    # audited at now: versions 0..3 have 2 days less 50, 45, 40, 35 hours left: -2 h, 3 h, 8 h, 13 h
    left = [(48 - (50 - 5 * e.version)) * 3600.0 for e in events]
    fired = [a.version for e, s in zip(events, left, strict=True) for a in evaluate(rules, e, s).alerts]
    assert fired == [0, 1]
    assert evaluate(rules, events[0]).undecided[0].unknown == ("how long the commit stays readable",)


def test_min_readable_seconds_is_a_service_setting(tmp_path: Path) -> None:
    conf = tmp_path / "serve.toml"
    table = f'[[tables]]\npath = "{tmp_path}"\n'
    conf.write_text(f'[service]\nstate_root = "{tmp_path}"\nmin_readable_seconds = 3600\n{table}')
    assert load_serve_config(str(conf)).min_readable_seconds == 3600.0
    conf.write_text(f'[service]\nstate_root = "{tmp_path}"\n{table}')
    assert load_serve_config(str(conf)).min_readable_seconds == 86400.0
    conf.write_text(f'[service]\nstate_root = "{tmp_path}"\nmin_readable_seconds = -1\n{table}')
    with pytest.raises(ConfigError, match="min_readable_seconds"):
        load_serve_config(str(conf))


def test_audit_follow_fires_the_rule_on_commits_it_reaches_close_to_their_cleanup(tmp_path: Path) -> None:
    root = tmp_path / "t"
    make(root, int(time.time() * 1000))  # versions 0..3: 50, 45, 40, 35 hours old; readable 2 days
    conf = tmp_path / "audit.toml"
    conf.write_text('[[audit.alerts]]\nname = "cleanup soon"\nreadable_under_seconds = 21600\n')  # 6 hours
    alerts = tmp_path / "alerts.jsonl"
    args = ["audit", str(root), "--follow", "--until-caught-up", "--state-dir", str(tmp_path / "state")]
    args += ["--config", str(conf), "--alert-output", str(alerts), "--starting-version", "0"]
    done = subprocess.run([sys.executable, "-m", "deltatail", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fired = [json.loads(line) for line in alerts.read_text().splitlines()]
    # left when audited now: -2 h, 3 h, 8 h, 13 h: under 6 h for versions 0 and 1
    assert [a["version"] for a in fired] == [0, 1]
    assert "stays readable" in fired[1]["reasons"][0] and fired[1]["rule"] == "cleanup soon"
