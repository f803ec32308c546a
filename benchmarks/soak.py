"""A table's life followed for its whole length: memory and commit-to-rows latency, window by window.

``python -m benchmarks.soak [--operations N] [--seed S] [--windows W]``

The writer is the soak test's (``tests/tailer/soak_writer.py``: deltalake in a process of its own,
appending, deleting, updating, merging, compacting, checkpointing, vacuuming, cleaning the log up,
adding a column, changing a property, restoring), without its stop. Two followers run beside it,
each a child process of its own:

- deltatail: ``deltatail run --sink jsonl:FILE --checkpoint-commits 1 --on-data-loss resnapshot``
  (a version's rows are in the file, flushed, when it is delivered);
- the peer: deltalake following the same table the way its users do, ``update_incremental()`` and
  ``load_cdf(v, v).read_all()`` for each new version (a version it cannot read any more, its files
  vacuumed, is counted, not timed).

A version's latency is from its commit file's mtime (the writer's rename) to its first change row
in the JSON lines file (polled every 5 ms), and for the peer to its rows in hand (the peer's own
clock; the same machine's). Memory is each child's resident set (``VmRSS``) and its CPU time
(``/proc/PID/stat``), sampled every 0.25 s; CPU milliseconds a version depend less on how loaded the
machine is than latencies do.
The history is cut into ``--windows`` windows of versions; a follower whose memory or latency grows
with history shows it as a rising column.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRITER = ROOT / "tests" / "tailer" / "soak_writer.py"

PEER = r"""
import sys, time
from deltalake import DeltaTable
uri = sys.argv[1]
dt = None
seen = -1
while True:
    try:
        if dt is None:
            dt = DeltaTable(uri)
        else:
            dt.update_incremental()
    except Exception:
        time.sleep(0.005)
        continue
    for v in range(seen + 1, dt.version() + 1):
        try:
            n = dt.load_cdf(v, v).read_all().num_rows
            print(f"{v} {time.time():.6f} {n}", flush=True)
        except Exception as e:
            print(f"{v} lost {type(e).__name__}", flush=True)
    seen = dt.version()
    time.sleep(0.005)
"""


@dataclass
class Side:
    """One follower's figures: when each version's rows were in hand, and its memory over time."""

    name: str
    arrived: dict[int, float] = field(default_factory=dict)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (wall time, bytes)
    cpu: list[tuple[float, float]] = field(default_factory=list)  # (wall time, CPU seconds used so far)
    lost: int = 0


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds of ``pid`` so far (``/proc/PID/stat``), ``None`` once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


class Watch:
    """Threads that record commit times, deltatail's and the peer's arrivals, and both processes' memory."""

    def __init__(
        self, log_dir: Path, out: Path, ours: subprocess.Popen[bytes], peer: subprocess.Popen[str] | None
    ) -> None:
        self.log_dir, self.out, self.ours, self.peer = log_dir, out, ours, peer
        self.committed: dict[int, float] = {}
        self.deltatail, self.peer_side = Side("deltatail"), Side("deltalake")
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=f, daemon=True) for f in (self._log, self._sink, self._peer, self._mem)]

    def start(self) -> Watch:
        for t in self.threads:
            t.start()
        return self

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def _log(self) -> None:
        while not self.stop.is_set():
            try:
                entries = list(os.scandir(self.log_dir))
            except OSError:
                entries = []
            for e in entries:
                name = e.name
                if name.endswith(".json") and name[:20].isdigit() and int(name[:20]) not in self.committed:
                    with contextlib.suppress(OSError):  # cleaned up since the listing: that version is not timed
                        self.committed[int(name[:20])] = e.stat().st_mtime_ns / 1e9
            time.sleep(0.005)

    def _sink(self) -> None:
        offset = 0
        pending = b""
        while not self.stop.is_set():
            if self.out.exists():
                with self.out.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
                now = time.time()
                offset += len(chunk)
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    version, _, in_snapshot = json.loads(line)["_position"]
                    if not in_snapshot:
                        self.deltatail.arrived.setdefault(version, now)
            time.sleep(0.005)

    def _peer(self) -> None:
        if self.peer is None:
            return
        assert self.peer.stdout is not None
        for line in self.peer.stdout:
            version, when, rows = line.split(maxsplit=2)
            if when == "lost":
                self.peer_side.lost += 1
            elif int(rows) > 0:
                self.peer_side.arrived[int(version)] = float(when)

    def _mem(self) -> None:
        while not self.stop.is_set():
            for side, proc in ((self.deltatail, self.ours), (self.peer_side, self.peer)):
                if proc is None:
                    continue
                rss, cpu, now = rss_bytes(proc.pid), cpu_seconds(proc.pid), time.time()
                if rss is not None and cpu is not None:
                    side.rss.append((now, rss))
                    side.cpu.append((now, cpu))
            time.sleep(0.25)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def window_figures(side: Side, committed: dict[int, float], timed: list[int], versions: range) -> list[str]:
    """Over ``timed`` (the window's versions both followers delivered): p50 / p99 latency (ms); while the
    window's versions were followed: peak RSS (MiB) and CPU milliseconds per version."""
    if not timed:
        return ["-", "-", "-"]
    lat = [(side.arrived[v] - committed[v]) * 1000 for v in timed]
    start, end = min(committed[v] for v in timed), max(side.arrived[v] for v in timed)
    mem = [r for t, r in side.rss if start <= t <= end]
    used = [c for t, c in side.cpu if start <= t <= end]
    per_version = (used[-1] - used[0]) * 1000 / len(versions) if len(used) > 1 else float("nan")
    peak = f"{max(mem) / 2**20:.0f}" if mem else "-"
    return [f"{statistics.median(lat):.1f} / {pct(lat, 99):.1f}", peak, f"{per_version:.1f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n")[0])
    parser.add_argument("--operations", type=int, default=600, help="operations of the life (default 600)")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--windows", type=int, default=6)
    parser.add_argument(
        "--no-peer",
        action="store_true",
        help="follow with deltatail alone (a control: the peer's work grows with the history and takes CPU from it)",
    )
    args = parser.parse_args(argv)
    print(f"command   {sys.executable} -m benchmarks.soak {' '.join(argv or sys.argv[1:])}")
    print(f"machine   nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="deltatail-soak-") as tmp:
        base = Path(tmp)
        root, truth, out = base / "t", base / "truth.jsonl", base / "out.jsonl"
        no_pause = str(args.operations + 1)
        writer = subprocess.Popen(
            [sys.executable, str(WRITER), str(root), str(truth), str(args.seed), str(args.operations), no_pause]
        )
        while not (root / "_delta_log").is_dir():
            time.sleep(0.01)
        run = ["run", str(root), "--state-dir", str(base / "state"), "--sink", f"jsonl:{out}"]
        run += ["--starting-version", "0", "--checkpoint-commits", "1", "--on-data-loss", "resnapshot"]
        ours = subprocess.Popen([sys.executable, "-m", "deltatail", *run], cwd=ROOT, stderr=subprocess.DEVNULL)
        peer = (
            None
            if args.no_peer
            else subprocess.Popen([sys.executable, "-c", PEER, str(root)], stdout=subprocess.PIPE, text=True)
        )
        watch = Watch(root / "_delta_log", out, ours, peer).start()
        started = time.monotonic()
        try:
            if writer.wait() != 0:
                raise SystemExit("the writer failed")
            last = max(watch.committed)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (
                watch.deltatail.arrived and max(watch.deltatail.arrived) >= last - 2
            ):
                time.sleep(0.1)
            time.sleep(1.0)
        finally:
            for p in (ours, peer):
                if p is not None:
                    p.kill()
                    p.wait()
            watch.close()
        elapsed = time.monotonic() - started
    theirs = set(watch.deltatail.arrived) if peer is None else set(watch.peer_side.arrived)
    both = sorted(set(watch.deltatail.arrived) & theirs & set(watch.committed))
    last = max(watch.committed)
    print(
        f"life      {args.operations} operations, {last + 1} versions in {elapsed:.0f} s (seed {args.seed});"
        f" versions with change rows timed on both sides: {len(both)}; the peer could not read {watch.peer_side.lost}"
        f" (vacuumed)"
    )
    print(
        "\n| versions | deltatail p50 / p99 ms | peak RSS MiB | CPU ms a version"
        " | deltalake p50 / p99 ms | peak RSS MiB | CPU ms a version |"
    )
    print("|---|---|---|---|---|---|---|")
    size = max(1, (last + 1 + args.windows - 1) // args.windows)
    for lo in range(0, last + 1, size):
        versions = range(lo, min(lo + size, last + 1))
        timed = [v for v in versions if v in both]
        mine = window_figures(watch.deltatail, watch.committed, timed, versions)
        peer_figures = ["-"] * 3 if peer is None else window_figures(watch.peer_side, watch.committed, timed, versions)
        print(f"| {versions.start}-{versions.stop - 1} | {' | '.join(mine)} | {' | '.join(peer_figures)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
