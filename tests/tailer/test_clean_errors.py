"""Bad input and file-system faults end a command with one ``deltatail: error:`` line naming the file.

Faults are real: a regular file where a directory is expected, a directory where a file is, a binary
file as a config, ``RLIMIT_FSIZE`` in the child process (``EFBIG``: tests run as root, so permissions
stop nothing), a tmpfs too small for the state (``ENOSPC``) and a read-only bind mount of the state
directory (``EROFS``), both in a private mount namespace (``unshare -m``). After each fault is removed,
a restart delivers exactly deltalake's ``load_cdf`` rows: nothing lost, nothing twice.
"""

from __future__ import annotations

import re
import resource
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Hashable
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.tailer.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
DELTATAIL = [sys.executable, "-m", "deltatail"]
CDF = {"delta.enableChangeDataFeed": "true"}


def make_table(root: Path, commits: int = 6) -> Path:
    write_deltalake(str(root), pa.table({"id": list(range(50)), "v": ["x" * 20] * 50}), configuration=CDF)
    for i in range(1, commits):
        write_deltalake(
            str(root), pa.table({"id": list(range(i * 100, i * 100 + 50)), "v": ["y" * 20] * 50}), mode="append"
        )
    DeltaTable(str(root)).delete("id < 10")
    return root


def cli(*args: str, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DELTATAIL, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=preexec
    )


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) deltatail ")


def one_line(stderr: str) -> str:
    """The error line of ``stderr``: exactly one, no traceback (log lines before it are allowed)."""
    lines = [line for line in stderr.splitlines() if not LOG_LINE.match(line)]
    assert len(lines) == 1 and lines[0].startswith("deltatail: error: "), stderr
    return lines[0]


Row = tuple[tuple[str, Hashable], ...]


def sink_rows(out: Path) -> Counter[Row]:
    rows = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    return Counter(
        tuple(sorted((k, v) for k, v in r.items() if k not in ("_commit_timestamp", "_position"))) for r in rows
    )


def cdf_rows(root: Path) -> Counter[Row]:
    table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=0).read_all())
    return Counter(tuple(sorted((k, v) for k, v in r.items() if k != "_commit_timestamp")) for r in table.to_pylist())


def file_size_limit(limit: int) -> Callable[[], None]:
    """A child's ``preexec_fn``: files it writes stop at ``limit`` bytes with EFBIG (SIGXFSZ ignored)."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return apply


# ---------------------------------------------------------------- bad input


def test_a_binary_config_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = make_table(tmp_path / "t", 1)
    config = tmp_path / "bin.toml"
    config.write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\xff\xfe" * 20)
    for argv in (
        ["run", str(table), "--config", str(config)],
        ["serve", "--config", str(config)],
        ["audit", str(table), "--config", str(config)],
    ):
        assert main(argv) == 2
        line = one_line(capsys.readouterr().err)
        assert "cannot read config file: 'utf-8' codec can't decode byte" in line and f"[file {config}]" in line


def test_a_state_dir_that_is_a_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = make_table(tmp_path / "t", 1)
    blocker = tmp_path / "state"
    blocker.write_text("not a directory")
    for state in (blocker, blocker / "below"):
        assert main(["run", str(table), "--state-dir", str(state), "--until-caught-up"]) == 1
        line = one_line(capsys.readouterr().err)
        assert "cannot create the state directory" in line and "--state-dir must be a directory" in line
        assert f"[file {state}]" in line


def test_a_cursor_that_is_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = make_table(tmp_path / "t", 1)
    (tmp_path / "state" / "cursor.json").mkdir(parents=True)
    assert main(["run", str(table), "--state-dir", str(tmp_path / "state"), "--until-caught-up"]) == 1
    line = one_line(capsys.readouterr().err)
    assert "cannot read the tailer's cursor (Is a directory)" in line
    assert f"[file {tmp_path / 'state' / 'cursor.json'}]" in line


@pytest.mark.parametrize("command", ["run", "changes", "snapshot", "audit"])
def test_a_table_path_that_is_a_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    path = tmp_path / "table.parquet"
    path.write_bytes(b"PAR1")
    extra = ["--state-dir", str(tmp_path / "s"), "--until-caught-up"] if command == "run" else []
    assert main([command, str(path), *extra]) == 1
    assert (
        one_line(capsys.readouterr().err)
        == f"deltatail: error: no _delta_log directory: not a Delta table [table {path}]"
    )


def test_a_listen_port_out_of_range_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = make_table(tmp_path / "t", 1)
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[service]\nstate_root = "{tmp_path / "root"}"\nlisten = "0.0.0.0:99999"\n[[tables]]\npath = "{table}"\n'
    )
    assert main(["serve", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    line = one_line(err.splitlines()[-1])  # after the INFO line of the table checked before it
    assert "listen must be HOST:PORT with a port of 0 to 65535, got '0.0.0.0:99999'" in line and str(config) in line


# ---------------------------------------------------------------- faults, then an exact restart


def test_sink_file_too_large_then_restart_is_exact(tmp_path: Path) -> None:
    table, state, out = make_table(tmp_path / "t"), tmp_path / "state", tmp_path / "out.jsonl"
    args = ("run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up")
    failed = cli(*args, "--checkpoint-commits", "1", "--sink-retries", "0", preexec=file_size_limit(20_000))
    assert failed.returncode == 1
    assert "File too large" in one_line(failed.stderr) and f"file {out}" in failed.stderr
    assert out.stat().st_size == 20_000  # the fault struck mid-way: a torn last line
    assert cli(*args).returncode == 0
    assert sink_rows(out) == cdf_rows(table)


def test_state_file_too_large_then_restart_is_exact(tmp_path: Path) -> None:
    table, state, out = make_table(tmp_path / "t"), tmp_path / "state", tmp_path / "out.jsonl"
    args = (
        "run",
        str(table),
        "--state-dir",
        str(state),
        "--until-caught-up",
        "--checkpoint-commits",
        "1",
        "--sink-retries",
        "0",
    )
    # stdout is a pipe (not limited): only the state's files hit the limit; the snapshot is the first
    failed = cli(*args, preexec=file_size_limit(4_000))
    assert failed.returncode == 1
    line = one_line(failed.stderr)
    assert "cannot save the snapshot:" in line and "File too large" in line and f"file {state}/snapshot-" in line
    assert not [p.name for p in state.iterdir() if p.name.startswith(".")]  # no temporary file left
    assert cli(*args, "--sink", f"jsonl:{out}").returncode == 0
    assert sink_rows(out) == cdf_rows(table)


NAMESPACE = (
    shutil.which("unshare") is not None
    and subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
)
needs_namespace = pytest.mark.skipif(not NAMESPACE, reason="needs unshare -m (a private mount namespace)")

#: Run inside ``unshare -m``: the state directory on a 16 KiB tmpfs (ENOSPC), then grown, and a restart.
_TMPFS_RUNS = """
import subprocess, sys
deltatail, table, state, out = sys.argv[1:5]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", state], check=True)
args = [*deltatail.split(), "run", table, "--state-dir", state, "--sink", f"jsonl:{out}", "--until-caught-up",
        "--checkpoint-commits", "1", "--snapshot-commits", "1", "--sink-retries", "0"]
first = subprocess.run(args, capture_output=True, text=True)
subprocess.run(["mount", "-o", "remount,size=4m", state], check=True)
second = subprocess.run(args, capture_output=True, text=True)
print(repr((first.returncode, first.stderr, second.returncode, second.stderr)))
"""


@needs_namespace
def test_state_disk_full_then_restart_is_exact(tmp_path: Path) -> None:
    table, state, out = make_table(tmp_path / "t", 8), tmp_path / "state", tmp_path / "out.jsonl"
    state.mkdir()
    done = subprocess.run(
        ["unshare", "-m", sys.executable, "-c", _TMPFS_RUNS, " ".join(DELTATAIL), str(table), str(state), str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first_rc, first_err, second_rc, second_err = eval(done.stdout)
    assert first_rc == 1
    line = one_line(first_err)
    assert "No space left on device" in line and f"file {state}/" in line
    assert second_rc == 0, second_err
    assert sink_rows(out) == cdf_rows(table)


#: Run inside ``unshare -m``: follow, make the state directory read-only mid-run, commit more. The
#: kernel refuses to remount a mount read-only while a file on it is open for writing (the LOCK), so a
#: read-only bind of the directory is made aside and moved over it: every path the tailer opens from
#: then on is on a read-only file system, as when an operator remounts a volume read-only.
_READ_ONLY_MID_RUN = """
import os, subprocess, sys, time
import pyarrow as pa
from deltalake import write_deltalake
deltatail, table, state, out = sys.argv[1:5]
run = subprocess.Popen([*deltatail.split(), "run", table, "--state-dir", state, "--sink", f"jsonl:{out}",
                        "--no-watch", "--poll-interval", "0.05", "--checkpoint-commits", "1", "--sink-retries", "0"],
                       stderr=subprocess.PIPE, text=True)
try:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(os.path.join(state, "cursor.json")):
        time.sleep(0.05)
    stage = state + "-stage"  # made read-only where nothing writes, then moved over the state directory
    os.makedirs(stage)
    subprocess.run(["mount", "--bind", state, stage], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", stage], check=True)
    subprocess.run(["mount", "--move", stage, state], check=True)
    for i in range(3):
        write_deltalake(table, pa.table({"id": [1000 + i], "v": ["z"]}), mode="append")
    _, err = run.communicate(timeout=60)
finally:
    if run.poll() is None:
        run.kill()
        run.wait()
print(repr((run.returncode, err)))
"""


@needs_namespace
@pytest.mark.slow
def test_state_dir_read_only_mid_run_then_restart_is_exact(tmp_path: Path) -> None:
    table, state, out = make_table(tmp_path / "t"), tmp_path / "state", tmp_path / "out.jsonl"
    done = subprocess.run(
        ["unshare", "-m", sys.executable, "-c", _READ_ONLY_MID_RUN, " ".join(DELTATAIL), str(table), str(state),
         str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rc, err = eval(done.stdout)
    assert rc == 1
    line = one_line(err)
    assert "Read-only file system" in line and str(state) in line
    # the fault is gone with the namespace: a restart resumes exactly
    restart = cli("run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up")
    assert restart.returncode == 0, restart.stderr
    assert sink_rows(out) == cdf_rows(table)


@needs_namespace
def test_a_read_only_state_dir_at_start_is_one_line(tmp_path: Path) -> None:
    table, state = make_table(tmp_path / "t", 1), tmp_path / "state"
    assert cli("run", str(table), "--state-dir", str(state), "--until-caught-up").returncode == 0
    script = (
        f"mount --bind {state} {state} && mount -o remount,bind,ro {state} && "
        f"{' '.join(DELTATAIL)} run {table} --state-dir {state} --until-caught-up"
    )
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "Read-only file system" in line and str(state) in line


def test_a_state_root_that_is_a_file_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    table, blocker = make_table(tmp_path / "t", 1), tmp_path / "root"
    blocker.write_text("not a directory")
    config = tmp_path / "serve.toml"
    config.write_text(f'[service]\nstate_root = "{blocker}"\nlisten = "off"\n[[tables]]\npath = "{table}"\n')
    done = cli("serve", "--config", str(config))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    line = one_line(done.stderr.splitlines()[-1])
    assert "the state root is unusable" in line and f"[file {blocker}]" in line
