"""A ``deltatail serve`` child process for fault tests: started from a TOML text, scraped, limited with prlimit.

The child ignores SIGXFSZ (set before exec, kept across it; a child forked by the test launcher,
tests/launcher.py, ignores it as every interpreter does from its start), so a write past ``RLIMIT_FSIZE``
fails with ``EFBIG`` instead of killing it. Its logs are JSON lines (one status event per line) in ``log``.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: launcher.py (tests/ is not a package)
from launcher import Launched, popen

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}

Row = tuple[Any, ...]


def _ignore_sigxfsz() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


class ServeChild:
    """One ``deltatail serve --config FILE`` process (see the module docstring)."""

    def __init__(self, config: Path, log: Path, *, piped: bool = False, forked: bool = False) -> None:
        self.config = config
        self.log = log
        #: stderr through a pipe copied to ``log`` by a thread: not a file of the child (RLIMIT_FSIZE).
        self.piped = piped
        #: started by the test launcher (the same ``main`` without the interpreter's start), not ``subprocess``.
        self.forked = forked
        self.proc: subprocess.Popen[bytes] | Launched | None = None
        self.port = 0

    def start(self, timeout: float = 60.0) -> ServeChild:
        before = self.log.stat().st_size if self.log.exists() else 0
        args = [sys.executable, "-m", "deltatail", "serve", "--config", str(self.config)]
        env = {**os.environ, "DELTATAIL_LOG_FORMAT": "json"}
        with self.log.open("ab") as err:
            stderr = subprocess.PIPE if self.piped else err
            if self.forked:
                self.proc = popen(args, cwd=ROOT, stderr=stderr, env=env)
            else:
                self.proc = subprocess.Popen(args, cwd=ROOT, stderr=stderr, env=env, preexec_fn=_ignore_sigxfsz)
        if self.piped:
            threading.Thread(target=self._copy, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.findall(rb"metrics and health on http://127\.0\.0\.1:(\d+)/", self.log.read_bytes()[before:])
            if found:
                self.port = int(found[-1])
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}")
            time.sleep(0.05)
        raise AssertionError("serve did not start: " + self.log.read_text()[-3000:])

    def _copy(self, proc: subprocess.Popen[bytes] | Launched) -> None:
        assert proc.stderr is not None
        with self.log.open("ab") as out:
            for line in proc.stderr:
                out.write(line)
                out.flush()

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("not started")
        return self.proc.pid

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, bytes]:
        """``(status, body)`` of a GET; ``(0, b"")`` when the service does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=timeout) as r:
                return int(r.status), bytes(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), bytes(e.read())
        except OSError:
            return 0, b""

    def not_ready(self) -> dict[str, str] | None:
        """The tables /readyz says are not ready, by name, with why (``None``: no answer)."""
        code, body = self.get("/readyz")
        if code == 0:
            return None
        problems = json.loads(body)["not_ready"]
        return {p.split(":", 1)[0]: p for p in problems}

    def states(self) -> dict[str, str] | None:
        """Every table's state in /metrics (``None``: no answer)."""
        code, body = self.get("/metrics")
        if code != 200:
            return None
        return self.states_in(body.decode())

    @staticmethod
    def states_in(metrics: str) -> dict[str, str]:
        """Every table's state in the text of a /metrics answer."""
        out: dict[str, str] = {}
        for line in metrics.splitlines():
            if line.startswith("deltatail_table_state{") and line.endswith(" 1.0"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
                out[labels["table"]] = labels["state"]
        return out

    def metric(self, name: str, **labels: str) -> float:
        code, body = self.get("/metrics")
        assert code == 200, code
        total = 0.0
        for line in body.decode().splitlines():
            if not (line.startswith(name + "{") or line.startswith(name + " ")):
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def events(self, since: int = 0) -> list[dict[str, Any]]:
        """The JSON log lines written after byte ``since`` of the log."""
        out = []
        for line in self.log.read_bytes()[since:].decode("utf-8", "replace").splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def limit(self, which: int, soft: int) -> tuple[int, int]:
        """Set the child's soft limit ``which`` (``resource.RLIMIT_*``) to ``soft``; returns the limits before."""
        before = resource.prlimit(self.pid, which)
        resource.prlimit(self.pid, which, (soft, before[1]))
        return before

    def stop(self, timeout: float = 60.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def expected(path: str, storage_options: dict[str, str] | None = None) -> Counter[Row]:
    """deltalake's change feed of the whole table: ``(id, change type, version)`` with their counts."""
    table = pa.table(DeltaTable(path, storage_options=storage_options).load_cdf(starting_version=0).read_all())
    return Counter((r["id"], r["_change_type"], r["_commit_version"]) for r in table.to_pylist())


def delivered(out: Path) -> Counter[Row]:
    """What a JSON lines sink holds, as :func:`expected` counts it (a torn last line is not held)."""
    if not out.is_file():
        return Counter()
    rows: Counter[Row] = Counter()
    for line in out.read_bytes().split(b"\n"):
        if not line:
            continue
        try:
            r = json.loads(line)
        except ValueError:
            continue  # a torn last line: the sink drops it when it opens the file again
        rows[(r["id"], r["_change_type"], r["_commit_version"])] += 1
    return rows


def wait_for(done: Any, what: str, child: ServeChild | None = None, timeout: float = 90.0) -> None:
    """Poll ``done()`` until true; fail naming ``what`` (with the child's log tail) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not done():
        if child is not None and child.proc is not None and child.proc.poll() is not None:
            raise AssertionError(
                f"serve exited ({child.proc.returncode}) waiting for {what}: {child.log.read_text()[-3000:]}"
            )
        if time.monotonic() > deadline:
            tail = "" if child is None else child.log.read_text()[-3000:]
            raise AssertionError(f"timed out waiting for {what}: {tail}")
        time.sleep(0.1)
