"""Apache Flink for the consumer tests, in a virtual environment of its own.

PyPI's ``apache-flink`` (which bundles Flink's jars, its ``debezium-json`` format and a local
mini-cluster) pins ``pyarrow<21`` (and ``py4j==0.10.9.7``, ``apache-beam``, ``pandas<2.3``):
installed next to deltatail's pyarrow 26 it would downgrade it. So the tests run Flink in a
separate virtual environment that :func:`flink_python` creates on first use (``pip install -r
tests/sinks/flink-requirements.txt``, about 30 s and 850 MB) and reuses afterwards:
``$DELTATAIL_FLINK_VENV``, by default ``~/.cache/deltatail/flink-<version>-py<X.Y>``. A Flink
worker (:mod:`tests.sinks.flink_worker`) runs there, one JVM per test module, and answers SQL
over a pipe (:class:`FlinkWorker`). Needs Java 17 (``java`` on the path or ``JAVA_HOME``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).parent
REQUIREMENTS = HERE / "flink-requirements.txt"
WORKER = HERE / "flink_worker.py"
MARK = "@@flink@@"


def flink_version() -> str:
    """The pinned apache-flink version (from the requirements file)."""
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith("apache-flink=="):
            return line.split("==", 1)[1].strip()
    raise RuntimeError(f"{REQUIREMENTS} pins no apache-flink version")


def venv_dir() -> Path:
    """Where the Flink virtual environment lives."""
    given = os.environ.get("DELTATAIL_FLINK_VENV")
    if given:
        return Path(given)
    tag = f"flink-{flink_version()}-py{sys.version_info.major}.{sys.version_info.minor}"
    return Path.home() / ".cache" / "deltatail" / tag


def java_home() -> str | None:
    """``JAVA_HOME``, or the JDK of the ``java`` on the path; ``None`` without Java."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        return None
    return str(Path(os.path.realpath(java)).parent.parent)


def flink_python() -> Path:
    """The Python of the Flink environment, created (under a file lock) if it is not there yet.

    Raises:
        RuntimeError: if creating it fails (with pip's output).
    """
    root = venv_dir()
    python = root / "bin" / "python"
    done = root / ".complete"
    if done.exists():
        return python
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return python
        shutil.rmtree(root, ignore_errors=True)
        steps = [
            [sys.executable, "-m", "venv", str(root)],
            [str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)],
        ]
        for step in steps:
            run = subprocess.run(step, capture_output=True, text=True, check=False)
            if run.returncode != 0:
                shutil.rmtree(root, ignore_errors=True)
                raise RuntimeError(f"{' '.join(step)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        done.write_text(flink_version())
    return python


class FlinkWorker:
    """One running Flink worker (one JVM); :meth:`run` sends statements and a query, returns the changelog."""

    def __init__(self, python: Path, java: str, timeout: float = 300.0) -> None:
        env = {**os.environ, "JAVA_HOME": java, "PATH": f"{java}/bin:{os.environ.get('PATH', '')}"}
        env.pop("PYTHONPATH", None)
        self._log = tempfile.NamedTemporaryFile(prefix="flink-worker-", suffix=".log", delete=False)  # noqa: SIM115
        self.timeout = timeout
        self.process = subprocess.Popen(
            [str(python), str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        ready = self._answer()
        if not ready.get("ready"):
            raise RuntimeError(f"the Flink worker did not start: {ready}")

    def run(self, statements: list[str], query: str) -> list[tuple[str, tuple[str | None, ...]]]:
        """Run ``statements`` then ``query``; the query's changelog as ``(row kind, values)`` in order.

        Raises:
            RuntimeError: with Flink's error if a statement or the query fails.
        """
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"statements": statements, "query": query}) + "\n")
        self.process.stdin.flush()
        body = self._answer()
        if "error" in body:
            raise RuntimeError(f"Flink failed: {body['error']}")
        return [(kind, tuple(values)) for kind, values in body["rows"]]

    def _answer(self) -> dict[str, Any]:
        """The next marked line of the worker's stdout (other lines are Flink's noise), within the timeout."""
        assert self.process.stdout is not None
        found: list[dict[str, Any]] = []
        reader = threading.Thread(target=_read_answer, args=(self.process.stdout, found), daemon=True)
        reader.start()
        reader.join(self.timeout)
        if not found:
            self.close()
            log = Path(self._log.name).read_text(errors="replace")[-4000:]
            raise RuntimeError(f"the Flink worker gave no answer within {self.timeout} s; its log:\n{log}")
        return found[0]

    def close(self) -> None:
        """Stop the worker (closing its stdin ends it; killed if it lingers)."""
        if self.process.poll() is None:
            with contextlib.suppress(OSError):
                assert self.process.stdin is not None
                self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self._log.name)


def _read_answer(stream: IO[str], found: list[dict[str, Any]]) -> None:
    for line in stream:
        if line.startswith(MARK):
            found.append(json.loads(line[len(MARK) :]))
            return
