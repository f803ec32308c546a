"""What a new user meets on the command line: exit codes, JSON logs to the last line, positions as users write
them, ``audit --fail-on`` and ``audit --html`` without its extra.

Commands run through the command line's entry point in this process, as the console script calls it
(``damage.run_inline``: exit code, stdout and stderr captured); what is about the process itself runs
as a user runs it, in a child process (:func:`in_child`): a run logging as it goes in JSON (every line
the child writes, native libraries' too), a terminal, Python's start-up (an extra missing from the
path), uncaught exceptions. Tables are written by deltalake.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from audit_tables import write_ops_table
from damage import run_inline as cli
from deltalake import write_deltalake

from deltatail.state.cursor import Position

ROOT = Path(__file__).resolve().parents[2]

#: "large delete" fires at versions 2 and 4 of the ops table, "properties" at version 7.
RULES = """
[[audit.alerts]]
name = "large delete"
severity = "critical"
operation_in = ["DELETE", "MERGE"]
rows_deleted_pct_over = 10

[[audit.alerts]]
name = "properties"
severity = "warning"
property_change = ["delta.enableChangeDataFeed"]
"""


def in_child(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltatail", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, **(env or {})},
    )


def json_lines(text: str) -> list[dict[str, object]]:
    """Every line of ``text`` as JSON (fails on any line that is not)."""
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ux") / "t"
    write_deltalake(root, pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    write_deltalake(root, pa.table({"id": pa.array([4], pa.int64())}), mode="append")
    return root


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ops_table(tmp_path_factory.mktemp("ux-audit") / "ops")


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ux-rules") / "deltatail.toml"
    path.write_text(RULES)
    return path


# ---------------------------------------------------------------- exit codes


@pytest.mark.slow
def test_exit_codes_follow_one_convention(table: Path, tmp_path: Path) -> None:
    t = str(table)
    state = tmp_path / "state"
    usage = {
        "a bad --change-types (changes)": ["changes", t, "--change-types", "insert,bogus"],
        "a bad --change-types (run)": ["run", t, "--state-dir", str(state), "--change-types", "bogus"],
        "a missing argument": ["snapshot"],
        "an unknown flag": ["changes", t, "--no-such-flag"],
        "a config file that is not there": ["serve", "--config", str(tmp_path / "none.toml")],
        "a bad environment setting": ["run", t, "--state-dir", str(state)],
    }
    for what, args in usage.items():
        env = {"DELTATAIL_POLL_INTERVAL": "soon"} if what == "a bad environment setting" else None
        done = cli(*args, env=env)
        assert done.returncode == 2, (what, done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
    done = cli("run", t, "--state-dir", str(state), "--sink", f"jsonl:{tmp_path / 'o.jsonl'}", "--until-caught-up")
    assert done.returncode == 0, done.stderr
    refused = cli("reset", str(state))
    assert refused.returncode == 2 and "--yes" in refused.stderr
    errors = {
        "no table there": ["snapshot", str(tmp_path / "nothing")],
        "a version after the latest": ["changes", t, "--starting-version", "9"],
    }
    for what, args in errors.items():
        done = cli(*args)
        assert done.returncode == 1, (what, done.returncode, done.stderr)
    assert cli("snapshot", t).returncode == 0


# ---------------------------------------------------------------- JSON logs


@pytest.mark.slow
def test_json_mode_prints_every_line_as_json_the_fatal_error_too(table: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "nothing")
    done = cli("--log-format", "json", "snapshot", missing)
    assert done.returncode == 1
    [record] = json_lines(done.stderr)
    assert record["event"] == "fatal" and record["level"] == "error" and record["exit_code"] == 1
    assert record["error"] == "TableNotFoundError" and record["table"] == missing
    assert "no _delta_log" in str(record["message"])

    config_error = cli("--log-format", "json", "changes", str(table), "--change-types", "bogus")
    assert config_error.returncode == 2
    [record] = json_lines(config_error.stderr)
    assert record["event"] == "fatal" and record["error"] == "ConfigError" and record["exit_code"] == 2

    by_env = cli("changes", str(table), "--change-types", "bogus", env={"DELTATAIL_LOG_FORMAT": "json"})
    assert by_env.returncode == 2 and json_lines(by_env.stderr)[0]["event"] == "fatal"

    usage = cli("--log-format", "json", "snapshot")
    assert usage.returncode == 2
    [record] = json_lines(usage.stderr)
    assert record["event"] == "usage_error" and "table" in str(record["message"])
    assert str(record["usage"]).startswith("usage: deltatail snapshot")

    # a run that logs as it goes and then fails: all of it JSON
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    run = ["--log-format", "json", "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}"]
    assert in_child(*run, "--until-caught-up").returncode == 0
    write_deltalake(table, pa.table({"id": pa.array([5], pa.int64())}), mode="append")
    failed = in_child(*run, "--until-caught-up", "--sink", "jsnl:/tmp/x")
    assert failed.returncode == 2
    records = json_lines(failed.stderr)
    assert records[-1]["event"] == "fatal"


@pytest.mark.slow
def test_text_mode_keeps_one_line_and_verbose_adds_the_causes(table: Path, tmp_path: Path) -> None:
    taken = tmp_path / "taken.jsonl"
    taken.mkdir()  # a directory where the output file should go: the error wraps the OS's
    quiet = cli("changes", str(table), "--output", str(taken))
    assert quiet.returncode == 1 and len(quiet.stderr.strip().splitlines()) == 1
    assert quiet.stderr.startswith("deltatail: error: cannot open JSON lines output")
    verbose = cli("-v", "changes", str(table), "--output", str(taken))
    assert verbose.returncode == 1
    causes = [line for line in verbose.stderr.splitlines() if line.startswith("deltatail:   cause: ")]
    assert causes == [f"deltatail:   cause: IsADirectoryError: [Errno 21] Is a directory: '{taken}'"], verbose.stderr
    js = cli("-v", "--log-format", "json", "changes", str(table), "--output", str(taken))
    [record] = [r for r in json_lines(js.stderr) if r.get("event") == "fatal"]
    assert record["causes"] == [f"IsADirectoryError: [Errno 21] Is a directory: '{taken}'"]


# ---------------------------------------------------------------- positions


def test_positions_print_as_users_write_them() -> None:
    assert str(Position.change(6, 0)) == Position.change(6, 0).text() == "6:0"
    assert str(Position.in_snapshot(6, 0)) == "6:s0"
    assert f"{Position.change(12, 345)}" == "12:345"


@pytest.mark.slow
def test_log_lines_show_positions_not_reprs(table: Path, tmp_path: Path) -> None:
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    run = ["run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up"]
    assert cli(*run).returncode == 0
    write_deltalake(table, pa.table({"id": pa.array([6], pa.int64())}), mode="append")
    again = cli(*run)
    assert again.returncode == 0, again.stderr
    assert "Position(" not in again.stderr
    assert re.search(r"resuming \S+ at \d+:\d+ ", again.stderr), again.stderr
    status = cli("status", str(state))
    assert re.search(r"cursor \d+:\d+,", status.stdout) and "Position(" not in status.stdout


# ---------------------------------------------------------------- audit --fail-on, --html


@pytest.mark.slow
def test_audit_fail_on_exits_3_when_an_alert_of_that_severity_fired(ops: Path, rules: Path) -> None:
    base = ["audit", str(ops), "--config", str(rules), "--format", "jsonl"]
    assert cli(*base).returncode == 0  # without --fail-on, alerts never change the exit code
    critical = cli(*base, "--fail-on", "critical")
    assert critical.returncode == 3 and "--fail-on critical" in critical.stderr
    # versions 5..9 raise only the warning at version 7
    tail = [*base, "--starting-version", "5"]
    assert cli(*tail, "--fail-on", "critical").returncode == 0
    assert cli(*tail, "--fail-on", "warning").returncode == 3
    assert cli(*tail, "--ending-version", "6", "--fail-on", "warning").returncode == 0
    # an error is still an error
    assert cli("audit", str(ops) + "-gone", "--fail-on", "warning").returncode == 1
    bad = cli(*base, "--fail-on", "info")
    assert bad.returncode == 2


def test_audit_follow_fail_on(ops: Path, rules: Path, tmp_path: Path) -> None:
    follow = ["audit", str(ops), "--config", str(rules), "--format", "jsonl", "--follow", "--until-caught-up"]
    hit = cli(*follow, "--state-dir", str(tmp_path / "a"), "--fail-on", "critical")
    assert hit.returncode == 3, hit.stderr
    assert len(hit.stdout.splitlines()) == 10  # every event was still audited
    quiet = cli(*follow, "--state-dir", str(tmp_path / "b"), "--starting-version", "5", "--fail-on", "critical")
    assert quiet.returncode == 0, quiet.stderr


@pytest.mark.slow
def test_audit_html_without_its_extra_fails_before_reading(ops: Path, tmp_path: Path) -> None:
    fake = tmp_path / "site"
    (fake / "vl_convert").mkdir(parents=True)
    (fake / "vl_convert" / "__init__.py").write_text('raise ImportError("vl_convert is not installed here")\n')
    env = {"PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])}
    log, html = tmp_path / "log.jsonl", tmp_path / "r.html"
    done = in_child("audit", str(ops), "--output", str(log), "--html", str(html), env=env)
    assert done.returncode == 2 and "vl-convert-python" in done.stderr, done.stderr
    assert not log.exists() and not html.exists()  # nothing was audited or written first
    # not even a table that is not there is looked at
    gone = in_child("audit", str(tmp_path / "nothing"), "--html", str(html), env=env)
    assert gone.returncode == 2 and "vl-convert-python" in gone.stderr and "_delta_log" not in gone.stderr


def test_json_mode_on_a_terminal_draws_no_progress_bars(table: Path, tmp_path: Path) -> None:
    import pty

    controller, terminal = pty.openpty()
    out = tmp_path / "out.jsonl"
    args = ["--log-format", "json", "run", str(table), "--state-dir", str(tmp_path / "s"), "--sink", f"jsonl:{out}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltatail", *args, "--until-caught-up"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
    )
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    assert proc.wait(timeout=120) == 0
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    records = json_lines(text)  # no bar, no escape sequence: every line is JSON
    assert records and all(r["level"] in ("info", "warning") for r in records)


def test_json_mode_turns_uncaught_exceptions_and_warnings_into_json() -> None:
    program = (
        "import threading, warnings\n"
        "from deltatail.tailer.cli import logs\n"
        "logs.configure(verbose=False, json_lines=True)\n"
        "warnings.warn('a deprecated thing')\n"
        "t = threading.Thread(target=lambda: 1 / 0, name='worker')\n"
        "t.start(); t.join()\n"
        "raise KeyError('boom')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    records = json_lines(done.stderr)
    assert [r.get("event") for r in records] == [None, "uncaught", "uncaught"]
    assert "a deprecated thing" in str(records[0]["message"]) and records[0]["level"] == "warning"
    assert "ZeroDivisionError in thread worker" in str(records[1]["message"])
    assert "KeyError" in str(records[2]["message"]) and "Traceback" in str(records[2]["exception"])
