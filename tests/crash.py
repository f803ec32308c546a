"""The crash-campaign skeleton shared by the tailer's and the Kafka sink's kill tests.

A campaign runs ``deltatail run`` again and again on one state directory, each
run ended by a spec: ``<crash point>:<n>`` (``DELTATAIL_CRASH_AT``, a SIGKILL at
a named point of the run loop), ``kill:<s>``/``term:<s>`` (SIGKILL/SIGTERM at a
random instant up to ``s`` seconds after the run shows progress), or ``clean``.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence, Sized
from pathlib import Path
from typing import IO, Protocol

#: The run loop's crash points (tailer/faults.py).
POINTS = ("after_write", "after_flush", "after_snapshot", "after_save")


def next_spec(rng: random.Random, delay: float, *, kill_share: float, term_share: float) -> str:
    """A random spec: a random-instant SIGKILL or SIGTERM, or a crash point at a small count."""
    roll = rng.random()
    if roll < kill_share:
        return f"kill:{delay}"
    if roll < kill_share + term_share:
        return f"term:{delay}"
    point = rng.choice(POINTS)
    return f"{point}:{rng.randint(1, 4 if point == 'after_write' else 2)}"


def run_campaign(
    run: Callable[[str], int],
    kills: Sized,
    rng: random.Random,
    *,
    kills_wanted: int,
    max_runs: int,
    delay: float,
    first: Sequence[str] = (),
    kill_share: float = 0.3,
    term_share: float = 0.06,
) -> None:
    """The ``first`` specs, then random ones, until ``kills`` holds ``kills_wanted`` distinct kill points or a
    crash-point run got to the end (later kills would all land after it); then a clean run.

    ``run`` runs one spec and returns the exit code; it records kill points in ``kills``.
    """
    for i in range(max_runs):
        if len(kills) >= kills_wanted:
            break
        spec = first[i] if i < len(first) else next_spec(rng, delay, kill_share=kill_share, term_share=term_share)
        if run(spec) == 0 and spec.partition(":")[0] in POINTS:
            break
    assert run("clean") == 0


class Proc(Protocol):
    """What a campaign needs of a started process: ``subprocess.Popen`` or the launcher's ``Launched``."""

    @property
    def returncode(self) -> int | None: ...

    @property
    def stdout(self) -> IO[bytes] | None: ...

    @property
    def stderr(self) -> IO[bytes] | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


def strike(
    proc: Proc,
    spec: str,
    rng: random.Random,
    progressed: Callable[[], bool],
    *,
    wait: float,
    tick: float,
) -> None:
    """For a ``kill:<s>``/``term:<s>`` spec: once the run shows progress (or ends, or ``wait`` seconds pass),
    sleep a random part of ``s`` seconds and send SIGKILL/SIGTERM if it still runs. Other specs: nothing."""
    kind, _, arg = spec.partition(":")
    if kind not in ("kill", "term"):
        return
    deadline = time.monotonic() + wait
    while proc.poll() is None and not progressed() and time.monotonic() < deadline:
        time.sleep(tick)
    time.sleep(rng.uniform(0, float(arg)))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)


def run_struck(
    args: Sequence[str],
    spec: str,
    rng: random.Random,
    *,
    out: Path,
    env: Mapping[str, str],
    cwd: Path,
    kills: set[str],
    wait: float,
    start: Callable[..., Proc] = subprocess.Popen,
) -> int:
    """Run ``args`` under ``spec`` (a crash point through ``DELTATAIL_CRASH_AT``, or a strike once ``out`` grows).

    ``start`` starts the process (``subprocess.Popen``'s arguments): ``launcher.popen`` for a ``deltatail``
    command line (tests/launcher.py), which saves each run the command line's imports.

    A run ended by SIGKILL adds ``<spec>@<size of out before it>`` to ``kills``; any other run must exit 0
    (its stderr's end is in the failure message). Returns the exit code.
    """
    child = dict(env)
    if spec.partition(":")[0] in POINTS:
        child["DELTATAIL_CRASH_AT"] = spec
    size = out.stat().st_size if out.exists() else 0
    proc = start(list(args), cwd=cwd, env=child, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = bytearray()
    reader = threading.Thread(target=lambda: err.extend(proc.stderr.read() if proc.stderr else b""), daemon=True)
    reader.start()
    try:
        strike(proc, spec, rng, lambda: (out.stat().st_size if out.exists() else 0) != size, wait=wait, tick=0.005)
        proc.wait(wait)
    finally:
        proc.kill()
        reader.join(wait)
    if proc.returncode == -signal.SIGKILL:
        kills.add(f"{spec}@{size}")
    else:
        assert proc.returncode == 0, f"{spec}: {bytes(err).decode()[-3000:]}"
    return int(proc.returncode)
