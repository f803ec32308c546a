"""The deltatail command line: snapshot, changes, demo, and its exit codes.

The commands run through the command line's entry point in this process, as the console script calls
it (``damage.run_inline``: exit code, stdout and stderr captured); the demo (a writer process and a
tailer) and a run logging in JSON (every line the process writes) run as a user runs them, in a child
process (:func:`_in_child`).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from damage import Ran, run_inline
from deltalake import DeltaTable, write_deltalake

DELTATAIL = [sys.executable, "-m", "deltatail"]
ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, check: bool = True) -> Ran:
    result = run_inline(*args)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def _in_child(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([*DELTATAIL, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result


def _table(root: Path) -> None:
    config = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(root, pa.table({"id": [1, 2, 3], "p": ["a", "b", "a"]}), partition_by=["p"], configuration=config)
    write_deltalake(root, pa.table({"id": [4], "p": ["c"]}), mode="append")
    DeltaTable(root).delete("id = 2")


def test_snapshot_json_matches_deltalake(tmp_path: Path) -> None:
    _table(tmp_path)
    doc = json.loads(_run("snapshot", str(tmp_path), "--json").stdout)
    dt = DeltaTable(str(tmp_path))
    assert set(doc) == {"version", "protocol", "metadata", "appTransactions", "files"}
    assert doc["version"] == dt.version()
    assert doc["metadata"]["id"] == dt.metadata().id
    assert doc["metadata"]["partitionColumns"] == ["p"]
    assert doc["protocol"]["minReaderVersion"] == dt.protocol().min_reader_version
    actions = pa.table(dt.get_add_actions(flatten=True))
    assert sorted(f["path"] for f in doc["files"]) == sorted(actions.column("path").to_pylist())
    by_path = dict(zip(actions.column("path").to_pylist(), actions.column("partition.p").to_pylist(), strict=True))
    assert {f["path"]: f["partitionValues"]["p"] for f in doc["files"]} == by_path


def test_snapshot_text_and_time_travel(tmp_path: Path) -> None:
    _table(tmp_path)
    text = _run("snapshot", str(tmp_path), "--version", "0").stdout
    assert "version  0" in text
    assert "live files 2" in text  # version 0 wrote partitions a and b
    assert "delta.enableChangeDataFeed = true" in text


@pytest.mark.slow
def test_changes_outputs_agree_with_load_cdf(tmp_path: Path) -> None:
    _table(tmp_path / "t")
    out_parquet = tmp_path / "c.parquet"
    out_jsonl = tmp_path / "c.jsonl"
    _run("changes", str(tmp_path / "t"), "--output", str(out_parquet))
    _run("changes", str(tmp_path / "t"), "--starting-version", "1", "--output", str(out_jsonl))
    stdout = _run("changes", str(tmp_path / "t"), "--ending-version", "0").stdout
    expected = pa.table(DeltaTable(str(tmp_path / "t")).load_cdf(starting_version=0).read_all())

    def rows(table: pa.Table) -> list[tuple[int, str, str, int]]:
        return sorted((r["id"], r["p"], r["_change_type"], r["_commit_version"]) for r in table.to_pylist())

    got = pq.read_table(out_parquet)
    assert got.schema.names == ["id", "p", "_change_type", "_commit_version", "_commit_timestamp"]
    assert rows(got) == rows(expected)
    lines = [json.loads(line) for line in out_jsonl.read_text().splitlines()]
    assert sorted((r["id"], r["p"], r["_change_type"], r["_commit_version"]) for r in lines) == [
        r for r in rows(expected) if r[3] >= 1
    ]
    first = [json.loads(line) for line in stdout.splitlines()]
    assert sorted(r["id"] for r in first) == [1, 2, 3]


@pytest.mark.slow
def test_errors_exit_one_with_the_table_named_and_config_errors_two(tmp_path: Path) -> None:
    result = _run("snapshot", str(tmp_path / "nothing"), check=False)
    assert result.returncode == 1
    assert "deltatail: error:" in result.stderr and str(tmp_path / "nothing") in result.stderr
    _table(tmp_path / "t")
    bad_output = _run("changes", str(tmp_path / "t"), "--output", str(tmp_path / "x.csv"), check=False)
    assert bad_output.returncode == 2 and ".jsonl or .parquet" in bad_output.stderr
    future = _run("snapshot", str(tmp_path / "t"), "--version", "99", check=False)
    assert future.returncode == 1 and "version 99 does not exist" in future.stderr


@pytest.mark.slow
def test_an_output_that_cannot_be_written_is_a_one_line_error(tmp_path: Path) -> None:
    _table(tmp_path / "t")
    (tmp_path / "taken.jsonl").mkdir()  # a directory where the file should go
    result = _run("changes", str(tmp_path / "t"), "--output", str(tmp_path / "taken.jsonl"), check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("deltatail: error: cannot open JSON lines output"), result.stderr
    assert "Traceback" not in result.stderr and str(tmp_path / "taken.jsonl") in result.stderr


@pytest.mark.slow
def test_reader_processes_flag(tmp_path: Path) -> None:
    # 12 one-file commits: with the default (2 processes) they are read by the processes; with 0 in-process.
    for i in range(12):
        write_deltalake(tmp_path / "t", pa.table({"id": [i]}), mode="append")
    default = _run("changes", str(tmp_path / "t")).stdout
    in_process = _run("changes", str(tmp_path / "t"), "--reader-processes", "0").stdout
    assert default == in_process
    assert [json.loads(line)["id"] for line in default.splitlines()] == list(range(12))
    negative = _run("changes", str(tmp_path / "t"), "--reader-processes", "-1", check=False)
    assert negative.returncode == 2 and "--reader-processes: must be at least 0, got '-1'" in negative.stderr
    state = tmp_path / "state"
    run = _run(
        "run",
        str(tmp_path / "t"),
        "--state-dir",
        str(state),
        "--until-caught-up",
        "--reader-processes",
        "-2",
        check=False,
    )
    assert run.returncode == 2 and "--reader-processes: must be at least 0, got '-2'" in run.stderr


@pytest.mark.slow
def test_usage_errors_exit_two(tmp_path: Path) -> None:
    assert _run("snapshot", check=False).returncode == 2
    result = _run(
        "changes", str(tmp_path), "--starting-version", "1", "--starting-timestamp", "2024-01-01", check=False
    )
    assert result.returncode == 2


@pytest.mark.slow
def test_demo_streams_the_writers_changes() -> None:
    result = _in_child("demo", "--commits", "4", "--interval", "0.2", timeout=180)
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    versions = {r["_commit_version"] for r in rows}
    assert min(versions) == 0
    assert max(versions) == 6 + 4  # the bundled table's versions 0..6, then the writer's 4 commits
    assert {r["_change_type"] for r in rows} >= {"insert", "delete", "update_preimage", "update_postimage"}
    positions = [tuple(r["_position"]) for r in rows]
    assert len(positions) == len(set(positions))
    assert "demo done" in result.stderr


@pytest.mark.slow
def test_starting_version_latest(tmp_path: Path) -> None:
    _table(tmp_path / "t")
    latest = DeltaTable(str(tmp_path / "t")).version()
    rows = [
        json.loads(line)
        for line in _run("changes", str(tmp_path / "t"), "--starting-version", "latest").stdout.splitlines()
    ]
    assert rows and {r["_commit_version"] for r in rows} == {latest}
    out = tmp_path / "run.jsonl"
    state = str(tmp_path / "state")
    _run(
        "run",
        str(tmp_path / "t"),
        "--state-dir",
        state,
        "--sink",
        f"jsonl:{out}",
        "--starting-version",
        "latest",
        "--until-caught-up",
    )
    assert out.read_text() == ""  # only commits after the latest one
    write_deltalake(tmp_path / "t", pa.table({"id": [9], "p": ["z"]}), mode="append")
    _run("run", str(tmp_path / "t"), "--state-dir", state, "--sink", f"jsonl:{out}", "--until-caught-up")
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == [9]


def test_json_logs_are_one_object_per_line_with_status_fields(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from deltatail.tailer.cli.logs import JsonFormatter
    from deltatail.tailer.runtime.status import status

    _table(tmp_path / "t")
    result = _in_child(
        "--log-format", "json", "run", str(tmp_path / "t"), "--state-dir", str(tmp_path / "s"),
        "--sink", f"jsonl:{tmp_path / 'o.jsonl'}", "--until-caught-up",
    )  # fmt: skip
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert records and all({"ts", "level", "logger", "message"} <= set(r) for r in records)
    caplog.set_level(logging.INFO, logger="deltatail")
    status("following", "following: at version 3", version=3, seconds_behind=1.5)
    captured = [r for r in caplog.records if getattr(r, "event", None) == "following"]
    doc = json.loads(JsonFormatter().format(captured[0]))
    assert doc["event"] == "following" and doc["version"] == 3 and doc["seconds_behind"] == 1.5
    assert doc["message"] == "following: at version 3"


def test_client_library_chatter_is_shown_only_when_verbose() -> None:
    import logging

    from deltatail.tailer.cli.logs import configure

    root, kafka = logging.getLogger(), logging.getLogger("kafka")
    handlers, root_level, kafka_level = root.handlers[:], root.level, kafka.level
    try:
        configure(verbose=False, json_lines=False)
        connection = logging.getLogger("kafka.net.connection")
        assert not connection.isEnabledFor(logging.INFO)  # one set of these per producer, so per table
        assert connection.isEnabledFor(logging.WARNING)
        assert logging.getLogger("deltatail").isEnabledFor(logging.INFO)
        configure(verbose=True, json_lines=False)
        assert connection.isEnabledFor(logging.DEBUG)
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        kafka.setLevel(kafka_level)
