"""Many idle tables in one process (``deltatail serve``) against one ``deltatail run`` process per table.

Run ``.venv/bin/python -m benchmarks.serve`` (a few minutes) or ``--quick``. Both setups follow
tables of one commit each, with JSON-lines file sinks, in the same run:

1. Idle cost: CPU time of the whole process tree over ``--idle-seconds`` (as % of one core) and
   resident memory per followed table, once everything is caught up and checkpointed (the window
   starts ``SETTLE_SECONDS`` after the last table's first rows).
2. Commit-to-flush latency: the benchmark publishes a one-row commit to a random table by atomic
   rename (hand-written commits, see :class:`benchmarks.latency.HandWrittenTable`) and times until
   the table's output file has grown (the JSON-lines sink writes on flush); p50/p99.
3. (serve only) The same latency while one more table with a ``--backlog``-commit history is
   caught up by the same service, timed from the moment discovery (every 30 s, the default) finds it.

``--old-way`` sets how many ``deltatail run`` processes the old way starts (each is a whole Python
with pyarrow: ~100 MiB, so 200 of them do not fit beside everything else on a 24 GiB machine); its
figures are per table. Targets: serve idle at most 2% of one core and under 20 MiB per table; p99
commit-to-flush under 50 ms with 200 tables; followers' p99 under 100 ms while one table catches up
2,000 commits.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.latency import HandWrittenTable, cpu_model

PROJECT = Path(__file__).resolve().parent.parent
DATA = PROJECT / "benchmarks" / ".data" / "serve"
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
#: Seconds between every table's first rows and the idle window: past the first checkpoint of each
#: table (due 5 s after its catch-up), so the window measures the steady state, not the start.
SETTLE_SECONDS = 10.0


@dataclass
class Config:
    tables: int
    old_way: int
    commits: int
    backlog: int
    idle_seconds: float


def parse(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(prog="python -m benchmarks.serve", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="20 tables, short windows (a smoke run)")
    p.add_argument("--tables", type=int, default=None, help="tables the service follows (default 200)")
    p.add_argument("--old-way", type=int, default=None, help="deltatail run processes of the old way (default 50)")
    p.add_argument("--commits", type=int, default=None, help="commits timed per latency run (default 100)")
    p.add_argument("--backlog", type=int, default=None, help="commits of the table caught up in section 3 (2000)")
    p.add_argument("--idle-seconds", type=float, default=None, help="the idle window (default 60)")
    a = p.parse_args(argv)
    q = a.quick
    return Config(
        tables=a.tables or (20 if q else 200),
        old_way=a.old_way or (5 if q else 50),
        commits=a.commits or (20 if q else 100),
        backlog=a.backlog or (200 if q else 2000),
        idle_seconds=a.idle_seconds or (5.0 if q else 60.0),
    )


# ---------------------------------------------------------------- processes --


def tree(pid: int) -> list[int]:
    """``pid`` and every process below it."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def cpu_seconds(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        for p in tree(pid):
            try:
                fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICK


def rss_bytes(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        for p in tree(pid):
            try:
                total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            except OSError:
                continue
    return total


# ---------------------------------------------------------------- tables --


def make_tables(root: Path, n: int, commits: int) -> list[HandWrittenTable]:
    tables = []
    for i in range(n):
        t = HandWrittenTable.create(root / f"t{i:03d}")
        t.write_data(range(1, commits + 1))
        tables.append(t)
    return tables


def backlog_table(n: int) -> Path:
    """A table of ``n`` one-row commits, kept in benchmarks/.data."""
    cached = DATA / f"backlog-{n}"
    if not (cached / "_delta_log" / f"{n:020d}.json").exists():
        shutil.rmtree(cached, ignore_errors=True)
        t = HandWrittenTable.create(cached)
        t.write_data(range(1, n + 1))
        for v in range(1, n + 1):
            t.publish(v)
    return cached


def wait_lines(out: Path, lines: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if out.exists() and out.read_bytes().count(b"\n") >= lines:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{out} did not reach {lines} lines")


def wait_log(log: Path, text: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_bytes():
            return
        time.sleep(0.01)
    raise RuntimeError(f"{log} never said {text.decode()!r}")


def latency(tables: list[HandWrittenTable], outs: list[Path], commits: int, next_v: dict[int, int]) -> list[float]:
    """Publish ``commits`` commits to random tables; each one's time from rename to its line in the output."""
    rng = random.Random(7)
    got = []
    for _ in range(commits):
        i = rng.randrange(len(tables))
        out = outs[i]
        size = out.stat().st_size
        v = next_v[i]
        next_v[i] += 1
        t0 = tables[i].publish(v)
        while out.stat().st_size == size:
            if time.perf_counter() - t0 > 30:
                raise RuntimeError(f"no line for commit {v} of {tables[i].root}")
            time.sleep(0.0005)
        got.append(time.perf_counter() - t0)
        time.sleep(0.02)
    return got


def pct(values: list[float], q: float) -> float:
    return sorted(values)[min(int(q * len(values)), len(values) - 1)] * 1000


@dataclass
class Figures:
    cpu_pct: float
    rss_per_table: float
    p50: float
    p99: float


def idle_and_latency(
    pids: list[int], tables: list[HandWrittenTable], outs: list[Path], cfg: Config, next_v: dict[int, int]
) -> Figures:
    c0, w0 = cpu_seconds(pids), time.monotonic()
    time.sleep(cfg.idle_seconds)
    cpu = (cpu_seconds(pids) - c0) / (time.monotonic() - w0) * 100
    rss = rss_bytes(pids) / len(tables)
    lat = latency(tables, outs, cfg.commits, next_v)
    return Figures(cpu, rss, pct(lat, 0.5), pct(lat, 0.99))


# ---------------------------------------------------------------- runs --


def start_serve(config: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    err = log.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)], cwd=PROJECT, stderr=err
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = re.search(rb"metrics and health on http://127\.0\.0\.1:(\d+)/", log.read_bytes())
        if m:
            return proc, int(m.group(1))
        time.sleep(0.1)
    raise RuntimeError("the service did not start")


def run_serve(base: Path, cfg: Config) -> tuple[Figures, float, float, float]:
    lake, out = base / "serve-lake", base / "serve-out"
    out.mkdir()
    tables = make_tables(lake, cfg.tables, cfg.commits * 2)
    outs = [out / f"t{i:03d}.jsonl" for i in range(cfg.tables)]
    config = base / "serve.toml"
    config.write_text(
        f'[service]\nstate_root = "{base / "serve-state"}"\nlisten = "127.0.0.1:0"\n'
        f'status_seconds = 3600\n\n[defaults]\nsink = "jsonl:{out}/{{table_name}}.jsonl"\n\n'
        f'[[discover]]\nroot = "{lake}"\n'
    )
    proc, _ = start_serve(config, base / "serve.log")
    try:
        for o in outs:
            wait_lines(o, 1)
        time.sleep(SETTLE_SECONDS)
        next_v = dict.fromkeys(range(cfg.tables), 1)
        figures = idle_and_latency([proc.pid], tables, outs, cfg, next_v)
        # Section 3: a table with a long backlog appears; followers are timed while it catches up.
        backlog = backlog_table(cfg.backlog)
        shutil.copytree(backlog, lake / "zz-backlog")
        # Discovery runs every discover_seconds (30 s by default): timed from the moment it finds the table.
        wait_log(base / "serve.log", b"following table zz-backlog", timeout=120)
        started = time.monotonic()
        during = latency(tables, outs, max(cfg.commits // 2, 10), next_v)
        wait_lines(out / "zz-backlog.jsonl", cfg.backlog + 1, timeout=600)
        caught_up = time.monotonic() - started
        return figures, pct(during, 0.5), pct(during, 0.99), caught_up
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)


def run_old_way(base: Path, cfg: Config) -> Figures:
    lake, out = base / "old-lake", base / "old-out"
    out.mkdir()
    tables = make_tables(lake, cfg.old_way, cfg.commits * 2)
    outs = [out / f"t{i:03d}.jsonl" for i in range(cfg.old_way)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "deltatail.tailer.cli",
                "run",
                str(t.root),
                "--state-dir",
                str(base / "old-state" / str(i)),
                "--sink",
                f"jsonl:{outs[i]}",
            ],
            cwd=PROJECT,
            stderr=subprocess.DEVNULL,
        )
        for i, t in enumerate(tables)
    ]
    try:
        for o in outs:
            wait_lines(o, 1)
        time.sleep(SETTLE_SECONDS)
        return idle_and_latency([p.pid for p in procs], tables, outs, cfg, dict.fromkeys(range(cfg.old_way), 1))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=60)


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse(argv)
    print(f"command   {sys.executable} -m benchmarks.serve {' '.join(argv or sys.argv[1:])}")
    print(f"machine   {cpu_model()}, nproc {os.cpu_count()}")
    with tempfile.TemporaryDirectory(prefix="deltatail-serve-") as tmp:
        base = Path(tmp)
        serve, during_p50, during_p99, caught_up = run_serve(base, cfg)
        old = run_old_way(base, cfg)
    print(f"\n{'':44} {'serve':>14} {'run per table':>14}")
    print(f"{'tables':44} {cfg.tables:>14} {cfg.old_way:>14}")
    print(f"{'idle CPU, % of one core (all tables)':44} {serve.cpu_pct:>13.2f}% {old.cpu_pct:>13.2f}%")
    per_serve, per_old = serve.cpu_pct / cfg.tables, old.cpu_pct / cfg.old_way
    print(f"{'idle CPU per table, % of one core':44} {per_serve:>13.4f}% {per_old:>13.4f}%")
    print(f"{'memory per table (RSS), MiB':44} {serve.rss_per_table / 2**20:>14.1f} {old.rss_per_table / 2**20:>14.1f}")
    print(f"{'commit to flush, p50 ms':44} {serve.p50:>14.1f} {old.p50:>14.1f}")
    print(f"{'commit to flush, p99 ms':44} {serve.p99:>14.1f} {old.p99:>14.1f}")
    print(
        f"\nwhile a {cfg.backlog}-commit table is caught up ({caught_up:.1f} s): "
        f"followers p50 {during_p50:.1f} ms, p99 {during_p99:.1f} ms"
    )
    print("\ntargets: idle <= 2% of one core and < 20 MiB per table; p99 < 50 ms; p99 during catch-up < 100 ms")
    ok = serve.cpu_pct <= 2 and serve.rss_per_table < 20 * 2**20 and serve.p99 < 50 and during_p99 < 100
    print("verdict:", "MET" if ok else "MISSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
