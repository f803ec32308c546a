"""``deltatail audit TABLE`` over a range, and the logs it appends to.

The commands run through the command line's entry point in this process, as the console script
calls it (``damage.run_cli``, ``damage.run_inline``: exit code, stdout and stderr captured; stdout is
not a terminal, as a pipe is not): a process of their own, which imports the whole stack again,
proves nothing more about the audit. One audit runs as a user runs it, in a child process
(``test_json_lines_are_the_events``).

The table is the ops table of ``audit_tables.py`` (versions 0..9, one operation each, users recorded
by deltalake's commit properties). Expected values are what the test told deltalake to do; the JSON
output is also checked against the library's events (``AuditFeed``), which the CLI only prints.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from audit_tables import write_ops_table
from damage import Ran, run_cli, run_inline
from deltalake import write_deltalake

from deltatail.state.alerts import parse_alert_rules
from deltatail.state.audit import AuditEvent
from deltatail.state.errors import ConfigError, MissingFileError, SinkError
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.commit_files import read_local_commit
from deltatail.tailer.audit.feed import AuditFeed
from deltatail.tailer.audit.log import (
    AlertLog,
    JsonlAuditLog,
    ParquetAuditLog,
    open_audit_log,
    read_audit_log,
)
from deltatail.tailer.cli.audit import EventPrinter, details, format_line, table_row
from deltatail.tailer.cli.settings import audit_config, load_toml
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.storage import LocalStorage

DELTATAIL = [sys.executable, "-m", "deltatail"]
ROOT = Path(__file__).resolve().parents[2]

RULES = """
[[audit.alerts]]
name = "large delete"
operation_in = ["DELETE", "MERGE"]
rows_deleted_pct_over = 10

[[audit.alerts]]
name = "properties"
property_change = ["delta.enableChangeDataFeed"]
"""


def run(*args: str, check: bool = True, env: dict[str, str] | None = None) -> Ran:
    """``deltatail ARGS`` in this process (``damage.run_inline``); with ``check``, it must succeed."""
    result = run_inline(*args, env=env)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def in_child(*args: str) -> subprocess.CompletedProcess[str]:
    """``deltatail ARGS`` as a user runs it, in a child process; it must succeed."""
    result = subprocess.run([*DELTATAIL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ops_table(tmp_path_factory.mktemp("audit-cli") / "ops")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit-config") / "deltatail.toml"
    path.write_text(RULES)
    return path


@pytest.mark.slow
def test_json_lines_are_the_events(ops: Path) -> None:
    out = in_child("audit", str(ops)).stdout  # not a terminal: JSON lines
    lines = [json.loads(line) for line in out.splitlines()]
    assert [d["version"] for d in lines] == list(range(10))
    assert [d["operation"] for d in lines] == [
        "WRITE",
        "WRITE",
        "DELETE",
        "UPDATE",
        "MERGE",
        "WRITE",
        "OPTIMIZE",
        "SET TBLPROPERTIES",
        "WRITE",
        "RESTORE",
    ]
    assert [d["actor"]["user_name"] for d in lines[:5]] == [
        "alice@corp",
        "alice@corp",
        "bob@corp",
        "bob@corp",
        "bob@corp",
    ]
    assert (lines[2]["counts"]["rows_deleted"], lines[3]["counts"]["rows_updated"]) == (2, 1)
    assert lines == [e.to_json() for e in AuditFeed(str(ops)).events()]
    ranged = run("audit", str(ops), "--starting-version", "3", "--ending-version", "5", "--format", "jsonl").stdout
    assert [json.loads(line)["version"] for line in ranged.splitlines()] == [3, 4, 5]
    latest = run("audit", str(ops), "--starting-version", "latest").stdout
    assert [json.loads(line)["version"] for line in latest.splitlines()] == [9]


def test_table_format_shows_who_what_and_how_much(ops: Path, config: Path) -> None:
    result = run("audit", str(ops), "--format", "table", "--config", str(config), env={"COLUMNS": "250"})
    header, *lines = result.stdout.splitlines()
    assert header.split()[:4] == ["VERSION", "TIME", "(UTC)", "OPERATION"]
    assert len(lines) == 10
    cells = {int(line.split()[0]): line for line in lines}
    assert cells[2].split()[3:8] == ["DELETE", "bob@corp", "0", "2", "0"]
    assert "ALERT large delete" in cells[2] and "where id > 6" in cells[2]
    assert cells[3].split()[3:8] == ["UPDATE", "bob@corp", "0", "0", "1"]
    assert cells[4].split()[3:8] == ["MERGE", "bob@corp", "1", "1", "1"]
    assert "ALERT properties" in cells[7] and "set delta.enableChangeDataFeed=true" in cells[7]
    assert "schema +w" in cells[8]
    assert cells[0].split()[3:5] == ["WRITE", "alice@corp"] and "table created" in cells[0]
    # the alerts are also logged to stderr
    assert result.stderr.count("alert 'large delete'") == 2 and result.stderr.count("alert 'properties'") == 1


def test_table_cells_fit_the_width() -> None:
    line = format_line(["12", "2024-01-01 00:00:00", "WRITE", "x" * 40, "1", "2", "3", "1/0", "d" * 300], 160)
    assert len(line) == 160 and line.endswith("…")
    assert "x" * 17 + "…" in line  # a long user is clipped to its column
    narrow = format_line(["1", "t", "op", "u", "1", "1", "1", "0/0", "d" * 300], 40)
    assert narrow.endswith("d" * 23 + "…")  # however narrow the terminal, DETAILS keeps its minimum


@pytest.mark.slow
def test_outputs_report_and_alerts(ops: Path, config: Path, tmp_path: Path) -> None:
    jsonl, parquet, html, alerts = (tmp_path / n for n in ("a.jsonl", "a.parquet", "a.html", "alerts.jsonl"))
    result = run(
        "audit", str(ops), "--output", str(jsonl), "--html", str(html), "--config", str(config),
        "--alert-output", str(alerts),
    )  # fmt: skip
    assert result.stdout == ""  # the outputs replace stdout
    assert [e.version for e in read_audit_log(str(jsonl))] == list(range(10))
    assert "<svg" in html.read_text() or "vega" in html.read_text()
    raised = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [(a["rule"], a["version"]) for a in raised] == [("large delete", 2), ("large delete", 4), ("properties", 7)]
    run("audit", str(ops), "--output", str(parquet), "--starting-version", "2", "--ending-version", "4")
    table = pq.read_table(parquet)
    assert table.column("version").to_pylist() == [2, 3, 4]
    assert table.column("operation").to_pylist() == ["DELETE", "UPDATE", "MERGE"]
    # a second run appends no alert the log holds
    run("audit", str(ops), "--config", str(config), "--alert-output", str(alerts), "--output", str(jsonl))
    assert len(alerts.read_text().splitlines()) == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--output", "x.csv"], "--output must end in .jsonl or .parquet"),
        (["--alert-output", "x.json"], "--alert-output must end in .jsonl"),
        (["--follow"], "--follow needs --state-dir"),
        (["--follow", "--state-dir", "S", "--ending-version", "3"], "--ending-version ends a range"),
        (["--follow", "--state-dir", "S", "--html", "r.html"], "--html writes the report of a range"),
        (["--state-dir", "S"], "--state-dir is a setting of --follow"),
        (["--until-caught-up"], "--until-caught-up is a setting of --follow"),
    ],
)
@pytest.mark.slow
def test_bad_flags(ops: Path, args: list[str], message: str) -> None:
    result = run_cli(["audit", str(ops), *args])
    assert result.escaped is None, result.escaped
    assert result.code == 2 and message in result.stderr, result.stderr  # a usage error
    assert "Traceback" not in result.stderr


def test_a_version_after_the_latest_is_an_error_not_a_usage_error(ops: Path) -> None:
    result = run("audit", str(ops), "--ending-version", "20", check=False)
    assert result.returncode == 1 and "ending version 20 is after the latest version 9" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_starting_version_is_a_usage_error(ops: Path) -> None:
    for value in ("soon", "-1"):
        result = run("audit", str(ops), "--starting-version", value, check=False)
        assert result.returncode == 2, result.stderr
        assert f"--starting-version: expected a version number (0 or more) or 'latest', got '{value}'" in result.stderr


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[audit]\nalert = []\n", "audit: unknown key 'alert'; known keys: alerts, webhook"),
        ('[[audit.alerts]]\nname = "x"\nrows_deleted_ovr = 3\n', "alert rule 'x': unknown key 'rows_deleted_ovr'"),
        ('[[audit.alerts]]\nname = "x"\nrows_deleted_over = "many"\n', "alert rule 'x'"),
        ('[audit.webhook]\nurl = "http://127.0.0.1:9/x"\nretry = 2\n', "audit.webhook: unknown key 'retry'"),
        ('[audit.webhook]\nurl_env = "DELTATAIL_TEST_UNSET_HOOK"\n', "DELTATAIL_TEST_UNSET_HOOK"),
        ("audit = 3\n", "'audit' must be a table"),
        ("[audit\n", "cannot read config file"),
    ],
)
@pytest.mark.slow
def test_bad_config_names_the_key(ops: Path, tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    result = run_cli(["audit", str(ops), "--config", str(path)])
    assert result.escaped is None, result.escaped
    assert result.code == 2 and message in result.stderr, result.stderr
    assert str(path) in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        audit_config({"config": str(path)}, env={})


def test_run_settings_accept_an_audit_table(tmp_path: Path) -> None:
    path = tmp_path / "both.toml"
    path.write_text('state_dir = "/s"\npoll_interval = 0.5\n' + RULES + "\n[storage]\nAWS_REGION = 'x'\n")
    assert load_toml(str(path)) == {"state_dir": "/s", "poll_interval": 0.5, "storage": {"aws_region": "x"}}
    assert [r.name for r in audit_config({"config": str(path)}, env={}).rules] == ["large delete", "properties"]
    assert audit_config({}, env={}).rules == ()
    env_only = audit_config({}, env={"DELTATAIL_CONFIG": str(path)})
    assert env_only.needs_table_rows
    path.write_text('state_dir = "/s"\nsink_typo = 1\n')
    with pytest.raises(ConfigError, match="unknown setting 'sink_typo'"):
        load_toml(str(path))


@pytest.mark.slow
def test_run_with_an_audit_table_in_its_config(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "t"), pa.table({"id": [1, 2]}))
    path = tmp_path / "run.toml"
    path.write_text(f'state_dir = "{tmp_path / "state"}"\n' + RULES)
    out = run("run", str(tmp_path / "t"), "--config", str(path), "--until-caught-up").stdout
    assert len(out.splitlines()) == 2


# -- the library parts the command uses -----------------------------------------------------------


class ListedStorage(LocalStorage):
    """Local files, but not read from disk by path: the range reader lists the log as on an object store."""

    local_files = False


def test_listing_and_local_readers_give_the_same_events(ops: Path, tmp_path: Path) -> None:
    direct = [e.to_json() for e in AuditFeed(str(ops)).events()]
    listed = [e.to_json() for e in AuditFeed(str(ops), ListedStorage()).events()]
    assert listed == direct
    assert [e.to_json() for e in AuditFeed(str(ops), ListedStorage()).events(4, 6)] == direct[4:7]
    copy = tmp_path / "gap"
    shutil.copytree(ops, copy)
    (copy / "_delta_log" / f"{5:020d}.json").unlink()
    for storage in (LocalStorage(), ListedStorage()):
        feed = AuditFeed(str(copy), storage)
        seen: list[int] = []
        with pytest.raises(Exception, match="commit 5 is missing") as e:
            seen.extend(ev.version for ev in feed.events(2, 7))
        assert seen == [2, 3, 4]  # the events before the gap are handed over first
        assert getattr(e.value, "version", None) == 5


def test_read_local_commit(ops: Path) -> None:
    path = DeltaLog(str(ops)).commit_path(3)
    data, mtime = read_local_commit(path)
    assert data == Path(path).read_bytes()
    assert mtime == os.stat(path).st_mtime_ns // 1_000_000
    with pytest.raises(MissingFileError):
        read_local_commit(path + ".gone")


def events(ops: Path) -> list[AuditEvent]:
    return list(AuditFeed(str(ops)).events())


def test_jsonl_log_appends_once_and_repairs_a_torn_tail(ops: Path, tmp_path: Path) -> None:
    all_events = events(ops)
    table_id = all_events[0].table_id or ""
    path = tmp_path / "log.jsonl"
    log = open_audit_log(str(path))
    assert isinstance(log, JsonlAuditLog) and log.open(table_id) is None
    for e in all_events[:4]:
        log.write(e, ())
    log.flush()
    log.close()
    with open(path, "ab") as fh:
        fh.write(b'{"format": "deltatail.audit.com')  # a crash mid-line
    again = JsonlAuditLog(str(path))
    assert again.open(table_id) == 3
    for e in all_events:
        again.write(e, ())
    again.flush()
    again.close()
    assert [e.version for e in read_audit_log(str(path))] == list(range(10))
    with pytest.raises(SinkError, match=r"holds entries of table id .* not of this table"):
        JsonlAuditLog(str(path)).open("another-table")
    path.write_text('{"not": "an event"}\n')
    with pytest.raises(SinkError, match="last line of the audit log is not an audit event"):
        JsonlAuditLog(str(path)).open(table_id)
    with pytest.raises(SinkError, match="cannot open the audit log"):
        JsonlAuditLog(str(tmp_path / "no" / "dir.jsonl")).open(table_id)
    with pytest.raises(SinkError, match="not open"):
        JsonlAuditLog(str(path)).write(all_events[0], ())
    full = JsonlAuditLog("/dev/full")
    full.open(table_id)
    full.write(all_events[0], ())
    with pytest.raises(SinkError, match="cannot flush"):
        full.flush()
    full.close()
    with pytest.raises(ConfigError, match=r"FILE\.jsonl or FILE\.parquet"):
        open_audit_log(str(tmp_path / "log.csv"))


def test_parquet_log_parts_compaction_and_crash_leftovers(ops: Path, tmp_path: Path) -> None:
    all_events = events(ops)
    table_id = all_events[0].table_id or ""
    path = tmp_path / "log.parquet"
    log = ParquetAuditLog(str(path), compact_parts=3)
    assert log.open(table_id) is None
    for e in all_events[:2]:
        log.write(e, ())
    log.flush()
    log.write(all_events[2], ())
    log.flush()
    log.flush()  # nothing new: no part
    assert sorted(p.name for p in path.iterdir()) == [
        "part-v00000000000000000000-v00000000000000000001.parquet",
        "part-v00000000000000000002-v00000000000000000002.parquet",
    ]
    log.write(all_events[3], ())
    log.flush()  # the third part: merged into one
    assert [p.name for p in path.iterdir()] == ["part-v00000000000000000000-v00000000000000000003.parquet"]
    log.write(all_events[4], ())
    log.close()  # not flushed: dropped
    # a crash after a merge was written but before its parts were removed, and a half-written temporary
    pq.write_table(pq.read_table(path / "part-v00000000000000000000-v00000000000000000003.parquet").slice(2, 2),
                   path / "part-v00000000000000000002-v00000000000000000003.parquet")  # fmt: skip
    (path / ".part-v00000000000000000004-v00000000000000000004.parquet.tmp").write_bytes(b"PAR1")
    again = ParquetAuditLog(str(path))
    assert again.open(table_id) == 3
    assert [p.name for p in path.iterdir()] == ["part-v00000000000000000000-v00000000000000000003.parquet"]
    for e in all_events:
        again.write(e, ())
    again.flush()
    assert [e.to_json() for e in read_audit_log(str(path))] == [e.to_json() for e in all_events]
    assert pa.concat_tables(pq.read_table(p) for p in sorted(path.iterdir())).num_rows == 10
    with pytest.raises(SinkError, match="holds entries of table id"):
        ParquetAuditLog(str(path)).open("another-table")
    (path / "part-v00000000000000000010-v00000000000000000010.parquet").write_bytes(b"not parquet")
    with pytest.raises(SinkError, match="cannot use the Parquet audit log"):
        ParquetAuditLog(str(path)).open(table_id)
    broken = ParquetAuditLog(str(tmp_path / "gone.parquet"))
    broken.open(table_id)
    shutil.rmtree(tmp_path / "gone.parquet")
    broken.write(all_events[0], ())
    with pytest.raises(SinkError, match="cannot write an audit log part"):
        broken.flush()
    merged = ParquetAuditLog(str(tmp_path / "m.parquet"), compact_parts=2)
    merged.open(table_id)
    merged.write(all_events[0], ())
    merged.flush()
    (tmp_path / "m.parquet" / "part-v00000000000000000000-v00000000000000000000.parquet").write_bytes(b"x")
    merged.write(all_events[1], ())
    with pytest.raises(SinkError, match="cannot read the audit log's parts"):
        merged.flush()


def test_alert_log_repeats_no_alert(ops: Path, tmp_path: Path) -> None:
    all_events = events(ops)
    table_id = all_events[0].table_id or ""
    rules = parse_alert_rules(
        [{"name": "a", "operation_in": ["DELETE", "MERGE"]}, {"name": "b", "operation_in": ["DELETE"]}]
    )
    notifier = AlertNotifier(rules)
    raised = {e.version: notifier.notify(e).alerts for e in all_events}
    path = tmp_path / "alerts.jsonl"
    log = AlertLog(str(path))
    assert log.open(table_id) is None
    log.write(all_events[2], raised[2][:1])  # stopped between the two alerts of version 2
    log.flush()
    log.close()
    again = AlertLog(str(path))
    assert again.open(table_id) == 2
    for e in all_events:
        again.write(e, raised[e.version])
    again.flush()
    again.close()
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [(a["version"], a["rule"]) for a in lines] == [(2, "a"), (2, "b"), (4, "a")]
    with pytest.raises(SinkError, match="alert log holds entries of table id"):
        AlertLog(str(path)).open("another-table")
    path.write_text('{"format": "deltatail.audit.commit/1"}\n')
    with pytest.raises(SinkError, match="cannot use the alert log"):
        AlertLog(str(path)).open(table_id)


def test_printer_and_details(ops: Path, tmp_path: Path) -> None:
    all_events = events(ops)
    out = tmp_path / "out"
    with open(out, "wb") as fh:
        printer = EventPrinter("table", fh, width=200)
        assert printer.open("x") is None
        for e in all_events[:2]:
            printer.write(e, ())
        printer.close()
    lines = out.read_text().splitlines()
    assert lines[0].startswith("VERSION") and len(lines) == 3
    assert table_row(all_events[2])[4:8] == ["0", "2", "0", "1/1"]
    assert details(all_events[9]) == "schema -w"
    assert details(all_events[7]).startswith("protocol r1/w2→r1/w4")
    with pytest.raises(ConfigError, match="--format must be table or jsonl"):
        EventPrinter("csv")


def test_unknown_figures_show_as_question_marks(ops: Path) -> None:
    event = events(ops)[1]
    unknown = dataclasses.replace(event, counts=dataclasses.replace(event.counts, rows_inserted=None), operation=None)
    assert table_row(unknown)[2:5] == ["?", "alice@corp", "?"]
