"""The crash campaigns' fork server (tests/launcher.py): its children behave as ``deltatail`` started by ``subprocess``.

Each test starts the same command both ways where the outcome can be compared (the ``deltatail`` script
through ``subprocess`` is the reference), and checks what the campaigns rely on: exit codes, the true
status of a SIGKILLed child, SIGTERM's clean stop, the request's environment (read when the command
runs, ``DELTATAIL_CRASH_AT`` included), working directory and output files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow as pa
import pytest
from deltalake import write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/: launcher.py (tests/ is not a package)
import launcher

SCRIPT = launcher.SCRIPT
WAIT = 60.0


def env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}, **extra}


def both(args: list[str], cwd: Path, **extra: str) -> tuple[tuple[int, bytes, bytes], tuple[int, bytes, bytes]]:
    """``(exit code, stdout, stderr)`` of ``deltatail args`` through the launcher (``communicate``), then through
    ``subprocess``."""
    proc = launcher.popen([SCRIPT, *args], env=env(**extra), cwd=cwd, stdout=launcher.PIPE, stderr=launcher.PIPE)
    out, err = proc.communicate(WAIT)
    assert out is not None and err is not None and proc.returncode is not None
    forked = (proc.returncode, out, err)
    done = subprocess.run([SCRIPT, *args], env=env(**extra), cwd=cwd, capture_output=True, timeout=WAIT)
    return forked, (done.returncode, done.stdout, done.stderr)


@pytest.fixture
def table(tmp_path: Path) -> Path:
    root = tmp_path / "table"
    write_deltalake(str(root), pa.table({"id": [1, 2, 3]}))
    write_deltalake(str(root), pa.table({"id": [4, 5]}), mode="append")
    return root


def ids(jsonl: bytes) -> list[int]:
    return [int(orjson.loads(line)["id"]) for line in jsonl.splitlines()]


@pytest.mark.slow
def test_exit_codes_and_output_are_the_scripts(tmp_path: Path) -> None:
    """``--version`` exits 0 and prints it; a usage error exits 2 with argparse's message; a missing
    config file exits 2 with the one-line error: the same bytes both ways."""
    for args in (["--version"], ["run"], ["serve", "--config", str(tmp_path / "none.toml")]):
        forked, spawned = both(args, tmp_path)
        assert forked == spawned
    assert both(["--version"], tmp_path)[0][:2] == (0, b"deltatail 0.1.0\n")
    assert both(["run"], tmp_path)[0][0] == 2
    done = launcher.run([SCRIPT, "--version"], env=env(), cwd=tmp_path, timeout=WAIT, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "deltatail 0.1.0\n", "")


def test_environment_and_working_directory_are_the_requests(table: Path, tmp_path: Path) -> None:
    """A relative table, state directory and output file resolve against the request's ``cwd``; the
    environment's ``DELTATAIL_LOG_FORMAT`` is read by the child, not inherited from the helper."""
    args = ["run", "table", "--state-dir", "state", "--sink", "jsonl:out.jsonl", "--until-caught-up"]
    proc = launcher.popen([SCRIPT, *args], env=env(), cwd=tmp_path)
    assert proc.wait(WAIT) == 0
    assert sorted(ids((tmp_path / "out.jsonl").read_bytes())) == [1, 2, 3, 4, 5]
    assert (tmp_path / "state").is_dir()
    forked, spawned = both(["changes", "nowhere"], tmp_path, DELTATAIL_LOG_FORMAT="json")
    assert forked[0] == spawned[0] == 1
    assert orjson.loads(forked[2].splitlines()[-1])["level"] == "error"
    assert orjson.loads(forked[2].splitlines()[-1]).keys() == orjson.loads(spawned[2].splitlines()[-1]).keys()


def test_output_goes_to_the_files_given(table: Path, tmp_path: Path) -> None:
    """stdout and stderr to open files (appended to, as a campaign's log), stdin from /dev/null."""
    log = tmp_path / "log"
    log.write_bytes(b"before\n")
    with log.open("ab") as out:
        proc = launcher.popen([SCRIPT, "changes", str(table)], env=env(), cwd=tmp_path, stdout=out, stderr=out)
    assert proc.wait(WAIT) == 0
    lines = log.read_bytes().splitlines()
    assert lines[0] == b"before" and sorted(ids(b"\n".join(lines[1:]))) == [1, 2, 3, 4, 5]


def test_sigkill_and_crash_points_report_minus_nine(table: Path, tmp_path: Path) -> None:
    """A child SIGKILLed by the test, or by its own crash point (``DELTATAIL_CRASH_AT``, read by the child
    though the helper imported ``tailer/runtime/faults.py`` before it was set), has status ``-9``."""
    state = tmp_path / "state"
    args = [SCRIPT, "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{tmp_path / 'out.jsonl'}"]
    crashed = launcher.popen([*args, "--until-caught-up"], env=env(DELTATAIL_CRASH_AT="after_save:1"), cwd=tmp_path)
    assert crashed.wait(WAIT) == -signal.SIGKILL
    following = launcher.popen(args, env=env(), cwd=tmp_path, stdout=launcher.DEVNULL, stderr=launcher.DEVNULL)
    assert following.poll() is None
    following.kill()
    assert following.wait(WAIT) == -signal.SIGKILL and following.returncode == -signal.SIGKILL


@pytest.mark.slow
def test_sigterm_stops_a_following_run_cleanly(table: Path, tmp_path: Path) -> None:
    """SIGTERM reaches the child's own handler (set by ``main`` in the child): it checkpoints and exits 0."""
    out = tmp_path / "out.jsonl"
    args = [SCRIPT, "run", str(table), "--state-dir", str(tmp_path / "state"), "--sink", f"jsonl:{out}"]
    proc = launcher.popen(args, env=env(), cwd=tmp_path, stderr=launcher.DEVNULL)
    deadline = time.monotonic() + WAIT
    while not (tmp_path / "state" / "cursor.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.terminate()
    assert proc.wait(WAIT) == 0
    assert sorted(ids(out.read_bytes())) == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_a_new_child_with_a_reused_pid_is_not_taken_for_the_old_one(table: Path, tmp_path: Path) -> None:
    """Pids wrap (at 32,768 here): a child may get the pid of one that exited earlier in the run. Its status,
    and whether it can still be signalled, are its own: here every pid is given a stale SIGKILL status first."""
    own = launcher.Launcher()
    try:
        limit = int(Path("/proc/sys/kernel/pid_max").read_text())
        with own.changed:
            own.statuses.update(dict.fromkeys(range(1, limit + 1), -signal.SIGKILL))
        args = [SCRIPT, "run", str(table), "--state-dir", str(tmp_path / "state"), "--sink", f"jsonl:{tmp_path / 'o'}"]
        proc = own.popen(args, env=env(), cwd=tmp_path, stderr=launcher.DEVNULL)
        assert proc.poll() is None, "the stale status of an earlier child with this pid was taken for its own"
        deadline = time.monotonic() + WAIT
        while not (tmp_path / "state" / "cursor.json").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.terminate()
        assert proc.wait(WAIT) == 0
    finally:
        own.close()


def test_a_timeout_raises_as_popen_does(tmp_path: Path) -> None:
    """``wait(timeout)`` on a running child raises ``TimeoutExpired``; ``poll`` says it still runs."""
    args = [SCRIPT, "run", str(tmp_path / "empty"), "--state-dir", str(tmp_path / "s")]
    (tmp_path / "empty").mkdir()
    proc = launcher.popen([SCRIPT, "demo", "--commits", "50", "--interval", "1"], env=env(), cwd=tmp_path)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.05)
    assert proc.poll() is None
    proc.kill()
    assert proc.wait(WAIT) == -signal.SIGKILL
    assert launcher.popen(args, env=env(), cwd=tmp_path, stderr=launcher.DEVNULL).wait(WAIT) == 1


def test_communicate_times_out_as_popen_does_then_reads_the_rest(table: Path, tmp_path: Path) -> None:
    """``communicate(timeout)`` on a running child raises ``TimeoutExpired``; a later call returns all its output."""
    out = tmp_path / "out.jsonl"
    args = [SCRIPT, "run", str(table), "--state-dir", str(tmp_path / "state"), "--sink", f"jsonl:{out}"]
    proc = launcher.popen(args, env=env(), cwd=tmp_path, stdout=launcher.PIPE, stderr=launcher.PIPE)
    with pytest.raises(subprocess.TimeoutExpired):
        proc.communicate(0.05)
    deadline = time.monotonic() + WAIT
    while not (tmp_path / "state" / "cursor.json").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.terminate()
    stdout, stderr = proc.communicate(WAIT)
    assert proc.returncode == 0 and stdout == b""
    assert stderr is not None and b"stopped" in stderr, stderr


def ignored(pid: int) -> int:
    """The mask of signals process ``pid`` ignores (``SigIgn`` of ``/proc/PID/status``)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16)


def test_the_signals_a_fresh_interpreter_ignores_stay_ignored(table: Path, tmp_path: Path) -> None:
    """The child ignores the signals a ``deltatail`` started by ``subprocess`` ignores (SIGPIPE and SIGXFSZ:
    the interpreter's own start-up; a write past ``RLIMIT_FSIZE`` fails with EFBIG instead of killing it)."""
    masks = []
    for i in range(2):
        state = tmp_path / f"state{i}"
        args = [SCRIPT, "run", str(table), "--state-dir", str(state), "--sink", f"jsonl:{tmp_path / f'{i}.jsonl'}"]
        start: Callable[..., launcher.Launched | subprocess.Popen[bytes]] = (launcher.popen, subprocess.Popen)[i]
        proc = start(args, env=env(), cwd=tmp_path, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + WAIT
        while not (state / "cursor.json").exists() and time.monotonic() < deadline:  # in main: started up
            time.sleep(0.01)
        masks.append(ignored(proc.pid))
        proc.terminate()
        assert proc.wait(WAIT) == 0
    assert masks[0] == masks[1]
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        assert masks[0] & (1 << (sig - 1)), (sig, hex(masks[0]))


def test_the_helper_forks_with_one_thread() -> None:
    """The helper imported pyarrow, the Kafka clients and the command line and still runs one thread."""
    helper = launcher.launcher().helper.pid
    assert os.listdir(f"/proc/{helper}/task") == [str(helper)]


def test_the_command_lines_it_takes(tmp_path: Path) -> None:
    """``python -m deltatail`` and ``python -m deltatail.tailer.cli`` as well as the script; anything else
    is refused (the launcher runs ``deltatail.main`` only)."""
    for args in ([sys.executable, "-m", "deltatail"], [sys.executable, "-m", "deltatail.tailer.cli"]):
        proc = launcher.popen([*args, "run"], env=env(), cwd=tmp_path, stderr=launcher.PIPE)
        assert proc.stderr is not None
        assert proc.wait(WAIT) == 2 and b"the following arguments are required: table" in proc.stderr.read()
    with pytest.raises(launcher.LauncherError, match="not a deltatail command line"):
        launcher.popen([sys.executable, "-c", "pass"], env=env(), cwd=tmp_path)
