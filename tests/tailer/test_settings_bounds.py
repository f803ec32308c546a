"""Every setting has a type and bounds, checked once, the same for flags, environment variables and TOML files.

A flag out of bounds is a usage error (exit 2, argparse's one line); a value from the environment or a
file is a :class:`ConfigError` naming the setting and where it came from (exit 1). Nothing out of bounds
reaches a loop: before, ``--poll-interval 0`` spun a core, ``nan`` and ``inf`` gave tracebacks, and
``checkpoint_commits = true`` was taken as 1.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltatail.state.errors import ConfigError
from deltatail.tailer.cli.main import main
from deltatail.tailer.cli.serve import load_serve_config
from deltatail.tailer.cli.settings import merge

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bounds") / "t"
    write_deltalake(str(root), pa.table({"id": [1, 2, 3]}))
    return root


FLAG_CASES = [
    (["--poll-interval", "0", "--no-watch"], "--poll-interval: must be at least 0.01, got '0'"),
    (["--poll-interval", "-1", "--no-watch"], "--poll-interval: must be at least 0.01, got '-1'"),
    (["--poll-interval", "nan"], "--poll-interval: expected a finite number, got 'nan'"),
    (["--poll-interval", "inf"], "--poll-interval: expected a finite number, got 'inf'"),
    (["--poll-interval", "1e300"], "--poll-interval: must be at most 86400, got '1e300'"),
    (["--max-poll-interval", "0"], "--max-poll-interval: must be at least 0.01"),
    (["--checkpoint-seconds", "0"], "--checkpoint-seconds: must be at least 0.01"),
    (["--checkpoint-seconds", "-3"], "--checkpoint-seconds: must be at least 0.01"),
    (["--checkpoint-commits", "0"], "--checkpoint-commits: must be at least 1, got '0'"),
    (["--checkpoint-commits", "-1"], "--checkpoint-commits: must be at least 1, got '-1'"),
    (["--checkpoint-commits", "2.5"], "--checkpoint-commits: expected a whole number, got '2.5'"),
    (["--snapshot-commits", "0"], "--snapshot-commits: must be at least 1"),
    (["--snapshot-commits", "-1"], "--snapshot-commits: must be at least 1"),
    (["--sink-retries", "-1"], "--sink-retries: must be at least 0, got '-1'"),
    (["--reader-processes", "100000"], "--reader-processes: must be at most 64 (each is a process of its own)"),
    (["--starting-version", "-1"], "--starting-version: expected a version number (0 or more) or 'latest'"),
]


@pytest.mark.parametrize(("flags", "message"), FLAG_CASES)
def test_run_flags_out_of_bounds_are_usage_errors(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["run", str(table), "--state-dir", str(tmp_path / "s"), "--until-caught-up", *flags])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert not (tmp_path / "s").exists()  # refused before anything started


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--starting-version", "-1"], "--starting-version: expected a version number (0 or more)"),
        (["--reader-processes", "100000"], "--reader-processes: must be at most 64"),
    ],
)
def test_changes_flags_out_of_bounds_are_usage_errors(
    table: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["changes", str(table), *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--poll-interval", "0"], "--poll-interval: must be at least 0.01"),
        (["--checkpoint-commits", "0"], "--checkpoint-commits: must be at least 1"),
        (["--checkpoint-seconds", "nan"], "--checkpoint-seconds: expected a finite number"),
    ],
)
def test_audit_follow_flags_out_of_bounds_are_usage_errors(
    table: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["audit", str(table), "--follow", "--state-dir", str(tmp_path / "s"), *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("POLL_INTERVAL", "0", "invalid value for poll_interval in DELTATAIL_POLL_INTERVAL: must be at least 0.01"),
        ("POLL_INTERVAL", "nan", "poll_interval in DELTATAIL_POLL_INTERVAL: expected a finite number, got 'nan'"),
        ("MAX_POLL_INTERVAL", "inf", "expected a finite number, got 'inf'"),
        ("CHECKPOINT_SECONDS", "-1", "checkpoint_seconds in DELTATAIL_CHECKPOINT_SECONDS: must be at least 0.01"),
        ("CHECKPOINT_COMMITS", "0", "checkpoint_commits in DELTATAIL_CHECKPOINT_COMMITS: must be at least 1"),
        ("SNAPSHOT_COMMITS", "-1", "must be at least 1"),
        ("SINK_RETRIES", "-1", "sink_retries in DELTATAIL_SINK_RETRIES: must be at least 0"),
        ("READER_PROCESSES", "100000", "must be at most 64"),
        ("STARTING_VERSION", "-1", "expected a version number (0 or more) or 'latest', got '-1'"),
        ("NO_WATCH", "maybe", "no_watch in DELTATAIL_NO_WATCH: expected true or false, got 'maybe'"),
    ],
)
def test_environment_values_out_of_bounds_are_config_errors(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        merge({}, {f"DELTATAIL_{name}": value})
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("checkpoint_commits = true", "checkpoint_commits in {file}: expected a number, got True"),
        ("checkpoint_commits = 2.5", "expected a whole number, got 2.5"),
        ("poll_interval = nan", "poll_interval in {file}: expected a finite number, got nan"),
        ("poll_interval = inf", "expected a finite number, got inf"),
        ("poll_interval = 0", "poll_interval in {file}: must be at least 0.01, got 0"),
        ("snapshot_commits = 0", "must be at least 1"),
        ("starting_version = -1", "expected a version number (0 or more) or 'latest', got -1"),
        ("reader_processes = 100000", "must be at most 64"),
        ("no_watch = 1", "no_watch in {file}: expected true or false, got 1"),
        ('key = ["id"]', "key in {file}: expected a string, got ['id']"),
    ],
)
def test_toml_values_out_of_bounds_are_config_errors(tmp_path: Path, body: str, message: str) -> None:
    config = tmp_path / "run.toml"
    config.write_text(body + "\n")
    with pytest.raises(ConfigError) as info:
        merge({"config": str(config)}, {})
    assert message.format(file=config) in str(info.value)


def test_a_bad_environment_value_is_one_line_and_exit_2(table: Path, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "DELTATAIL_STATUS_SECONDS": "0", "DELTATAIL_POLL_INTERVAL": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "deltatail", "run", str(table), "--state-dir", str(tmp_path / "s"), "--no-watch"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2  # a configuration error
    assert done.stderr == (
        "deltatail: error: invalid value for poll_interval in DELTATAIL_POLL_INTERVAL: must be at least 0.01, got '0'\n"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("status_seconds = 0", "invalid value for status_seconds in [service]: must be at least 0.1, got 0"),
        ("status_seconds = -5", "status_seconds in [service]: must be at least 0.1"),
        ("safety_poll_seconds = 0", "safety_poll_seconds in [service]: must be at least 0.1"),
        ("discover_seconds = -1", "discover_seconds in [service]: must be at least 0.1"),
        ("discover_seconds = nan", "discover_seconds in [service]: expected a finite number, got nan"),
        ("ready_lag_seconds = -1", "ready_lag_seconds in [service]: must be at least 0"),
        ("ready_lag_seconds = inf", "ready_lag_seconds in [service]: expected a finite number, got inf"),
        ("workers = 0", "workers in [service]: must be at least 1"),
        ("workers = 100000", "workers in [service]: must be at most 64"),
        ("workers = true", "workers in [service]: expected a number, got True"),
        ("step_versions = 0", "step_versions in [service]: must be at least 1"),
        ("state_root = 5", "state_root in [service]: expected a string, got 5"),
    ],
)
def test_service_settings_out_of_bounds(tmp_path: Path, body: str, message: str) -> None:
    root = "" if body.startswith("state_root") else f'state_root = "{tmp_path}"'
    path = tmp_path / "serve.toml"
    path.write_text(f'[service]\n{root}\n{body}\n[[tables]]\npath = "/t"\n')
    with pytest.raises(ConfigError) as info:
        load_serve_config(str(path))
    assert message in str(info.value) and info.value.file == str(path)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("max_depth = -1", "max_depth in [[discover]] #1: must be at least 0, got -1"),
        ("max_depth = 100000", "max_depth in [[discover]] #1: must be at most 64"),
        ("max_depth = true", "expected a number, got True"),
        ("include = 5", "include in [[discover]] #1: expected a list of names"),
    ],
)
def test_discover_settings_out_of_bounds(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(f'[service]\nstate_root = "{tmp_path}"\n[[discover]]\nroot = "{tmp_path}"\n{body}\n')
    with pytest.raises(ConfigError) as info:
        load_serve_config(str(path))
    assert message in str(info.value)


def test_table_settings_in_a_service_have_the_same_bounds(tmp_path: Path) -> None:
    path = tmp_path / "serve.toml"
    path.write_text(f'[service]\nstate_root = "{tmp_path}"\n[[tables]]\npath = "/t"\ncheckpoint_commits = 0\n')
    with pytest.raises(ConfigError, match="checkpoint_commits in table 't': must be at least 1"):
        load_serve_config(str(path))


def test_in_bounds_values_pass_from_every_source(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("poll_interval = 2\ncheckpoint_commits = 7\nstarting_version = 0\n")
    merged = merge(
        {"config": str(config), "snapshot_commits": 9},
        {"DELTATAIL_MAX_POLL_INTERVAL": "0.01", "DELTATAIL_READER_PROCESSES": "64", "DELTATAIL_SINK_RETRIES": "0"},
    )
    assert merged["poll_interval"] == 2.0 and isinstance(merged["poll_interval"], float)
    assert merged["checkpoint_commits"] == 7 and merged["starting_version"] == 0
    assert merged["max_poll_interval"] == 0.01 and merged["reader_processes"] == 64 and merged["sink_retries"] == 0
    assert merged["snapshot_commits"] == 9


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--commits", "-1"], "--commits: must be at least 1, got '-1'"),
        (["--interval", "nan"], "--interval: expected a finite number, got 'nan'"),
        (["--interval", "-1"], "--interval: must be at least 0, got '-1'"),
    ],
)
def test_demo_flags_out_of_bounds_are_usage_errors(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["demo", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err
