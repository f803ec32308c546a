"""``deltatail audit TABLE --follow``: a writer in another process, restarts, SIGKILLs, alerts and webhooks.

The auditor runs as a user runs it (``python -m tailer.cli audit ... --follow``) against tables deltalake
1.6.6 writes, in the test or in a writer process running beside it. What is checked:

- the audit log (JSON lines, or a directory of Parquet parts) ends up holding every version exactly
  once, in order, and equal to what ``deltatail audit TABLE`` prints for the same range (the same
  events, byte for byte), however often the auditor was stopped, killed at a crash point
  (``DELTATAIL_CRASH_AT``) or at a random instant, and restarted;
- the alert log holds each alert once; the webhook (a real HTTP server on 127.0.0.1 that fails
  before it recovers, or is not there at all) gets every alert, and never stops the follow;
- errors: a state directory of ``deltatail run``, of another table, or locked; gaps, malformed and
  unsupported commits, a recreated table;
- the tailer's audit hook: a sink that wants audit events gets, with each commit, the event the
  range audit builds; one that does not gets none.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from audit_tables import write_ops_table
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: crash.py (tests/ is not a package)
from crash import strike
from launcher import Launched, popen

from deltatail.state.alerts import parse_alert_rules
from deltatail.state.cursor import Position
from deltatail.state.errors import (
    InvalidLogError,
    MissingFileError,
    SinkError,
    StateError,
    UnsupportedFeatureError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.feed import ChangeBatch, CommitEvent, TableInfo
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.feed import AuditFeed, AuditTracker
from deltatail.tailer.audit.log import AlertLog, JsonlAuditLog, read_audit_log
from deltatail.tailer.follow.audit import AuditFollowConfig, AuditFollower
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import LogFollower
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.sink import Sink

DELTATAIL = [sys.executable, "-m", "deltatail"]
ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
RULES = '[[audit.alerts]]\nname = "deletes"\noperation_in = ["DELETE"]\n'

#: One commit per step: an append of one row, and a DELETE of an earlier row every fifth step.
WRITER = """
import sys, time
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
path, first, n, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
schema = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])
for i in range(first, first + n):
    if i % 5 == 4:
        DeltaTable(path).delete(f"id = {i - 2}")
    else:
        write_deltalake(path, pa.table({"id": [i], "v": [str(i)]}, schema=schema), mode="append")
    time.sleep(pause)
"""


def create(path: Path) -> None:
    write_deltalake(str(path), pa.table({"id": [0], "v": ["0"]}, schema=SCHEMA))


def write(path: Path, first: int, n: int, pause: float = 0.0) -> None:
    """Versions ``first .. first + n - 1`` (the table is at ``first - 1``), written by another process."""
    subprocess.run([sys.executable, "-c", WRITER, str(path), str(first), str(n), str(pause)], check=True, timeout=120)


def write_here(path: Path, i: int) -> None:
    """Version ``i``, as :data:`WRITER` writes it, by this process: for a commit made while no auditor runs
    (another interpreter would only add its start)."""
    if i % 5 == 4:
        DeltaTable(str(path)).delete(f"id = {i - 2}")
    else:
        write_deltalake(str(path), pa.table({"id": [i], "v": [str(i)]}, schema=SCHEMA), mode="append")


def deletes(last: int) -> list[int]:
    return [v for v in range(1, last + 1) if v % 5 == 4]


Started = subprocess.Popen[bytes] | Launched


def audit(table: Path, *args: str, env: dict[str, str] | None = None, forked: bool = False) -> Started:
    """``deltatail audit TABLE ARGS`` started by ``subprocess``, or ``forked`` by the test launcher
    (tests/launcher.py: the same ``main`` without the interpreter's start, for the crash campaign)."""
    argv, environ = [*DELTATAIL, "audit", str(table), *args], {**os.environ, **(env or {})}
    if forked:
        return popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)


def finish(proc: Started) -> tuple[int, str]:
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode is not None and err is not None
    return proc.returncode, err.decode()


def range_output(table: Path, *, forked: bool = False) -> bytes:
    """What ``deltatail audit TABLE`` prints (JSON lines) for the whole table."""
    proc = audit(table, forked=forked)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0 and out is not None, err
    return out


def wait_for_lines(path: Path, n: int, proc: Started) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {n} lines")


def follow_args(state: Path, *extra: str) -> list[str]:
    return ["--follow", "--state-dir", str(state), "--poll-interval", "0.05", *extra]


@pytest.mark.slow
def test_follow_with_a_writer_and_a_restart(tmp_path: Path) -> None:
    table, state, log, alerts, config = (tmp_path / n for n in ("t", "state", "a.jsonl", "alerts.jsonl", "c.toml"))
    config.write_text(RULES)
    create(table)
    args = follow_args(state, "--output", str(log), "--alert-output", str(alerts), "--config", str(config))
    auditor = audit(table, *args, "--checkpoint-commits", "3")
    writer = threading.Thread(target=write, args=(table, 1, 12, 0.03))
    writer.start()
    writer.join()
    wait_for_lines(log, 13, auditor)  # versions 0..12, audited while they were written
    auditor.send_signal(signal.SIGTERM)
    code, err = finish(auditor)
    assert code == 0, err
    assert err.count("alert 'deletes'") == len(deletes(12))
    write(table, 13, 8)  # versions 13..20 while the auditor is stopped
    code, err = finish(audit(table, *args, "--until-caught-up"))
    assert code == 0, err
    assert "resuming the audit" in err and "already holds events up to version 12" not in err
    assert [e.version for e in read_audit_log(str(log))] == list(range(21))
    assert log.read_bytes() == range_output(table)
    raised = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [a["version"] for a in raised] == deletes(20)
    assert all(a["event"]["operation"] == "DELETE" for a in raised)


@pytest.mark.slow
def test_stdout_follow_prints_the_events(tmp_path: Path) -> None:
    table, state = tmp_path / "t", tmp_path / "state"
    create(table)
    write(table, 1, 4)
    proc = audit(table, *follow_args(state, "--until-caught-up", "--format", "jsonl"))
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert out == range_output(table)


@dataclass
class Campaign:
    table: Path
    state: Path
    log: Path
    alerts: Path
    config: Path
    codes: list[tuple[str, int]] = field(default_factory=list)

    def size(self) -> int:
        """How much the audit log holds (bytes of the file, or of the directory's parts)."""
        if not self.log.exists():
            return 0
        if self.log.is_dir():
            return sum(p.stat().st_size for p in self.log.iterdir())
        return self.log.stat().st_size

    def run(self, spec: str, rng: random.Random) -> int:
        env = {"DELTATAIL_CRASH_AT": spec} if spec.split(":")[0].startswith("after_") else {}
        args = [
            *follow_args(self.state, "--until-caught-up", "--checkpoint-commits", "2", "--snapshot-commits", "3"),
            *("--output", str(self.log), "--alert-output", str(self.alerts), "--config", str(self.config)),
        ]
        size = self.size()
        proc = audit(self.table, *args, env=env, forked=True)
        strike(proc, spec, rng, lambda: self.size() != size, wait=WAIT, tick=0.01)  # once this run wrote
        code, err = finish(proc)
        # a SIGTERM that lands while the interpreter shuts down, after the run ended, ends it by the signal
        assert code in (0, -signal.SIGKILL) or (code == -signal.SIGTERM and "stopped:" in err), err
        assert "Traceback" not in err
        self.codes.append((spec, code))
        return code


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_killed_at_every_point_and_restarted(tmp_path: Path, suffix: str) -> None:
    table = tmp_path / "t"
    create(table)
    for i in range(1, 15):
        write_here(table, i)
    config = tmp_path / "c.toml"
    config.write_text(RULES)
    c = Campaign(table, tmp_path / "state", tmp_path / f"audit{suffix}", tmp_path / "alerts.jsonl", config)
    rng = random.Random(21)
    specs = ["after_write:3", "after_flush:1", "after_snapshot:1", "after_save:2", "after_write:1", "kill:0.4"]
    specs += ["after_flush:2", "term:0.3", "after_write:2", "kill:0.3", "after_save:1"]
    version = 14
    for spec in specs:
        c.run(spec, rng)
        write_here(table, version + 1)  # the table moves on between runs
        version += 1
    assert c.run("clean", rng) == 0
    assert sum(code == -signal.SIGKILL for _, code in c.codes) >= 6, c.codes
    events = [e.to_json() for e in read_audit_log(str(c.log))]
    assert [e["version"] for e in events] == list(range(version + 1))  # each version once, in order
    assert b"".join(orjson.dumps(e) + b"\n" for e in events) == range_output(table, forked=True)
    raised = [json.loads(line) for line in c.alerts.read_text().splitlines()]
    assert [a["version"] for a in raised] == deletes(version)


# -- webhooks -----------------------------------------------------------------------------------


@dataclass
class Hook:
    url: str
    script: list[int]
    received: list[tuple[int, dict[str, Any]]] = field(default_factory=list)


@pytest.fixture
def hook() -> Iterator[Hook]:
    state = Hook("", [])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            status = state.script.pop(0) if state.script else 200
            state.received.append((status, body))
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}/hooks/secret-token"
    try:
        yield state
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


def webhook_config(path: Path, url: str) -> None:
    # A timeout well above an answer's time on a loaded machine: a timed-out POST that reached the server is
    # retried, and the server would count its alert twice.
    path.write_text(RULES + f'\n[audit.webhook]\nurl = "{url}"\ntimeout = 5\nretries = 4\nbackoff = 0.05\n')


@pytest.mark.slow
def test_alerts_reach_a_webhook_that_fails_then_recovers(tmp_path: Path, hook: Hook) -> None:
    table, state, log, config = tmp_path / "t", tmp_path / "state", tmp_path / "a.jsonl", tmp_path / "c.toml"
    create(table)
    webhook_config(config, hook.url)
    hook.script = [500, 503, 500]  # the first three POSTs fail
    auditor = audit(table, *follow_args(state, "--output", str(log), "--config", str(config)))
    write(table, 1, 10, 0.02)
    wait_for_lines(log, 11, auditor)
    deadline = time.monotonic() + WAIT
    while sum(status == 200 for status, _ in hook.received) < len(deletes(10)) and time.monotonic() < deadline:
        time.sleep(0.05)
    auditor.send_signal(signal.SIGTERM)
    code, err = finish(auditor)
    assert code == 0, err
    delivered = [body for status, body in hook.received if status == 200]
    assert sorted(b["version"] for b in delivered) == deletes(10)
    assert all(b["format"] == "deltatail.audit.alert/1" and b["rule"] == "deletes" for b in delivered)
    assert [s for s, _ in hook.received[:3]] == [500, 503, 500]
    assert "secret-token" not in err


@pytest.mark.slow
def test_a_webhook_that_is_not_there_never_stops_the_follow(tmp_path: Path) -> None:
    table, state, log, config = tmp_path / "t", tmp_path / "state", tmp_path / "a.jsonl", tmp_path / "c.toml"
    create(table)
    write(table, 1, 5)
    with ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler) as closed:
        url = f"http://127.0.0.1:{closed.server_address[1]}/hooks/secret-token"
    webhook_config(config, url)  # the port is closed again: every POST is refused
    code, err = finish(
        audit(table, *follow_args(state, "--until-caught-up", "--output", str(log), "--config", str(config)))
    )
    assert code == 0, err
    assert [e.version for e in read_audit_log(str(log))] == list(range(6))
    assert "webhook" in err and "secret-token" not in err


# -- errors -------------------------------------------------------------------------------------


def follower(table: Path, state: Path, log: Path | None = None, **kwargs: Any) -> AuditFollower:
    config = AuditFollowConfig(
        table=str(table), state_dir=str(state), until_caught_up=True, watch=False, parse_retries=1,
        parse_retry_delay=0.01, **kwargs,
    )  # fmt: skip
    return AuditFollower(config, [JsonlAuditLog(str(log or state.with_suffix(".jsonl")))])


def test_state_directories_of_others_are_refused(tmp_path: Path) -> None:
    table, other = tmp_path / "t", tmp_path / "other"
    create(table)
    create(other)
    tailer_state = tmp_path / "tailer-state"
    code = subprocess.run(
        [*DELTATAIL, "run", str(table), "--state-dir", str(tailer_state), "--until-caught-up"],
        cwd=ROOT, capture_output=True, timeout=WAIT,
    ).returncode  # fmt: skip
    assert code == 0
    with pytest.raises(StateError, match="belongs to a `deltatail run` tailer"):
        follower(table, tailer_state, tmp_path / "a.jsonl").run()
    state = tmp_path / "state"
    assert follower(table, state).run().versions == 1
    with pytest.raises(StateError, match="belongs to table id"):
        follower(other, state, tmp_path / "b.jsonl").run()
    with StateStore(str(state)), pytest.raises(StateError, match="another tailer"):
        follower(table, state).run()
    with pytest.raises(SinkError, match="holds entries of table id"):
        follower(other, tmp_path / "state-2", state.with_suffix(".jsonl")).run()


def test_a_recreated_table_is_refused(tmp_path: Path) -> None:
    table, state = tmp_path / "t", tmp_path / "state"
    create(table)
    write(table, 1, 2)
    assert follower(table, state).run().versions == 3
    shutil.rmtree(table)
    create(table)
    write(table, 1, 3)
    with pytest.raises(StateError, match="deleted and recreated"):
        follower(table, state, tmp_path / "b.jsonl").run()


def test_gaps_bad_commits_and_starts(tmp_path: Path) -> None:
    table = tmp_path / "t"
    create(table)
    write(table, 1, 5)
    with pytest.raises(VersionNotFoundError):
        follower(table, tmp_path / "s1", starting_version=9).run()
    assert follower(table, tmp_path / "s2", starting_version=6).run().versions == 0  # only what comes next
    gap = tmp_path / "gap"
    shutil.copytree(table, gap)
    (gap / "_delta_log" / f"{3:020d}.json").unlink()
    with pytest.raises(VersionGapError, match="commit 3"):
        follower(gap, tmp_path / "s4").run()
    assert [e.version for e in read_audit_log(str(tmp_path / "s4.jsonl"))] == [0, 1, 2]  # flushed before the error
    bad = tmp_path / "bad"
    shutil.copytree(table, bad)
    (bad / "_delta_log" / f"{6:020d}.json").write_bytes(b'{"commitInfo": {}}\n{"add": {"path": ')
    with pytest.raises(InvalidLogError, match="line 2"):
        follower(bad, tmp_path / "s5").run()
    unsupported = tmp_path / "unsupported"
    shutil.copytree(table, unsupported)
    protocol = {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["futureFeature"], "writerFeatures": []}
    (unsupported / "_delta_log" / f"{6:020d}.json").write_bytes(orjson.dumps({"protocol": protocol}) + b"\n")
    with pytest.raises(UnsupportedFeatureError, match="futureFeature"):
        follower(unsupported, tmp_path / "s6").run()
    headless = tmp_path / "headless" / "_delta_log"
    headless.mkdir(parents=True)
    (headless / f"{0:020d}.json").write_bytes(
        orjson.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}})
    )
    with pytest.raises(InvalidLogError, match="no metaData"):
        follower(headless.parent, tmp_path / "s7").run()


def test_counted_follow_equals_the_counted_range_and_needs_the_data(tmp_path: Path) -> None:
    table = tmp_path / "ops"
    write_ops_table(table)
    assert follower(table, tmp_path / "s1", counted=True, track_table_rows=True).run().versions == 10
    followed = [e.to_json() for e in read_audit_log(str(tmp_path / "s1.jsonl"))]
    assert followed == [e.to_json() for e in AuditFeed(str(table)).events(counted=True, track_table_rows=True)]
    assert followed[2]["counts"]["row_sources"]["deleted"] == "counted"
    vacuumed = tmp_path / "vacuumed"
    shutil.copytree(table, vacuumed)
    DeltaTable(str(vacuumed)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    with pytest.raises(MissingFileError):
        follower(vacuumed, tmp_path / "s2", counted=True).run()


# -- the tailer's audit hook --------------------------------------------------------------------


class CommitRecorder(Sink):
    """A sink that keeps the commit events it gets (rows are counted, not kept)."""

    def __init__(self, wants: bool) -> None:
        self.wants = wants
        self.commits: list[CommitEvent] = []
        self.rows = 0

    @property
    def wants_audit_events(self) -> bool:
        return self.wants

    def open(self, table: TableInfo) -> Position | None:
        return None

    def write(self, batch: ChangeBatch) -> None:
        self.rows += len(batch)

    def flush(self) -> None:
        pass

    def commit_event(self, event: CommitEvent) -> None:
        self.commits.append(event)

    def close(self) -> None:
        pass


def test_the_tailer_builds_audit_events_only_for_sinks_that_want_them(tmp_path: Path) -> None:
    table = tmp_path / "ops"
    write_ops_table(table)
    expected = [e.to_json() for e in AuditFeed(str(table)).events()]
    for wants in (True, False):
        sink = CommitRecorder(wants)
        config = TailerConfig(
            table=str(table), state_dir=str(tmp_path / f"state-{wants}"), until_caught_up=True, watch=False,
            options=ChangeOptions(allow_non_additive=True, reader_processes=0),
        )  # fmt: skip
        Tailer(config, sink).run()
        assert [c.version for c in sink.commits] == list(range(10))
        if wants:
            assert [c.audit.to_json() if c.audit else None for c in sink.commits] == expected
            assert all(c.audit is not None and c.timestamp_ms == c.audit.timestamp_ms for c in sink.commits)
        else:
            assert all(c.audit is None for c in sink.commits)


def test_follower_step_and_the_audit_builder(tmp_path: Path) -> None:
    table = tmp_path / "ops"
    write_ops_table(table)
    log = DeltaLog(str(table))
    tracker = AuditTracker(log.table, log.storage)
    follower = LogFollower(log, Snapshot.empty(log.table), audit=tracker.build)
    expected = list(AuditFeed(str(table)).events())
    stepped = [follower.step(v) for v in range(10)]
    assert [s.audit for s in stepped] == expected
    assert [s.timestamp_ms for s in stepped] == [e.timestamp_ms for e in expected]
    assert follower.head.version == 9 and stepped[-1].snapshot is follower.head
    plain = LogFollower(log, Snapshot.empty(log.table))
    assert [plain.step(v).timestamp_ms for v in range(3)] == [e.timestamp_ms for e in expected[:3]]
    assert plain.step(3).audit is None
    with pytest.raises(VersionGapError, match="commit 11 is missing"):
        follower.step(11)
    with pytest.raises(StateError, match="the table id was other-id"):
        LogFollower(log, Snapshot.empty(log.table), table_id="other-id").step(0)
    with pytest.raises(VersionGapError, match="does not follow version -1"):
        tracker.build(log.read_commit(3), Snapshot.empty(log.table), log.storage.stat(log.commit_path(3)), None)


def test_alert_log_write_and_flush_errors(tmp_path: Path) -> None:
    table = tmp_path / "ops"
    write_ops_table(table)
    events = list(AuditFeed(str(table)).events())
    notifier = AlertNotifier(parse_alert_rules([{"name": "d", "operation_in": ["DELETE"]}]))
    alerts = notifier.notify(events[2]).alerts
    with pytest.raises(SinkError, match="not open"):
        AlertLog(str(tmp_path / "a.jsonl")).write(events[2], alerts)
    full = AlertLog("/dev/full")
    assert full.open(events[0].table_id or "") is None
    full.write(events[2], alerts)
    with pytest.raises(SinkError, match="cannot flush"):
        full.flush()
    full.close()
