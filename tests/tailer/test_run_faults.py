"""``deltatail run`` under a real file-system fault: a sink file that cannot grow (RLIMIT_FSIZE, EFBIG).

Before: the ``OSError`` escaped the retry loop as a traceback. Now it is retried like an unavailable sink
(a ``sink_unavailable`` status line naming the file, the cursor held), and when the retries run out it ends the
run with one clean error line.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from serve_child import CDF, ROOT, delivered, expected, wait_for

LIMIT = 4096  # bytes: the sink file cannot grow past it while the limit holds


def _limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, resource.RLIM_INFINITY))


def table(path: Path) -> str:
    write_deltalake(
        str(path), pa.table({"id": pa.array(range(100), pa.int64()), "v": ["x" * 40] * 100}), configuration=CDF
    )
    write_deltalake(
        str(path), pa.table({"id": pa.array(range(100, 200), pa.int64()), "v": ["y" * 40] * 100}), mode="append"
    )
    return str(path)


def run(t: str, tmp_path: Path, *flags: str) -> subprocess.Popen[bytes]:
    err = (tmp_path / "run.log").open("wb")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "deltatail.tailer.cli",
            "run",
            t,
            "--state-dir",
            str(tmp_path / "state"),
            "--sink",
            f"jsonl:{tmp_path / 'out.jsonl'}",
            "--until-caught-up",
            *flags,
        ],
        cwd=ROOT,
        stderr=err,
        env={**os.environ, "DELTATAIL_LOG_FORMAT": "json"},
        preexec_fn=_limited,
    )


def test_a_full_sink_file_ends_the_run_with_one_clean_error_when_retries_run_out(tmp_path: Path) -> None:
    t = table(tmp_path / "t")
    proc = run(t, tmp_path, "--sink-retries", "1")
    assert proc.wait(120) == 1
    text = (tmp_path / "run.log").read_text()
    assert "Traceback" not in text, text
    last = json.loads(text.splitlines()[-1])  # JSON logs: the fatal error is a JSON record too
    assert last["event"] == "fatal" and last["exit_code"] == 1, text[-2000:]
    assert "File too large" in last["message"] and last["file"] == str(tmp_path / "out.jsonl"), last
    events = [json.loads(line)["event"] for line in text.splitlines() if line.startswith("{") and '"event"' in line]
    assert "sink_unavailable" in events


@pytest.mark.slow
def test_a_full_sink_file_is_retried_and_delivery_is_exact_once_it_can_grow(tmp_path: Path) -> None:
    t = table(tmp_path / "t")
    proc = run(t, tmp_path)
    log = tmp_path / "run.log"
    try:
        wait_for(lambda: b"sink_unavailable" in log.read_bytes(), "the run to report the fault")
        assert proc.poll() is None
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert proc.wait(120) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert delivered(tmp_path / "out.jsonl") == expected(t)
    assert "Traceback" not in log.read_text()
