"""A/B: the same benchmark workloads run against two checkouts, alternating, in one session.

Run ``.venv/bin/python -m benchmarks.ab --before DIR`` where ``DIR`` is a checkout of the older
code (``git worktree add /tmp/ab-before <sha>``); the other side is this checkout. Each side runs
its own copy of ``benchmarks.changes``, ``benchmarks.latency`` and ``benchmarks.serve`` (their
workloads are the same in both), as a child process started in that checkout with ``PYTHONPATH``
set to it, so the child imports that checkout's ``state``, ``tailer`` and ``sinks`` whatever the
virtual environment's editable install points at. Both sides use this interpreter and its
packages.

Runs alternate in the order A B B A A B ... for each benchmark, so a drift of the shared machine's
speed during the session falls on both sides alike. The figures each run prints are picked from
its output (the lines named in :data:`PATTERNS`) and printed side by side: every run's value, and
the median of each side. ``--quick`` passes ``--quick`` to every benchmark (a smoke run).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent

#: Per benchmark: (measure, unit, regular expression whose first group is the figure).
PATTERNS: dict[str, list[tuple[str, str, str]]] = {
    "changes": [
        ("one-file appends, deltatail", "rows/s", r"^- 1\. .*?: deltatail ([\d,]+) rows/s"),
        ("one-file appends, ratio to load_cdf", "x", r"^- 1\. .*?ratio ([\d.]+)"),
        ("mixed DML history, deltatail", "rows/s", r"^- 2\. .*?: deltatail ([\d,]+) rows/s"),
        ("mixed DML history, ratio to load_cdf", "x", r"^- 2\. .*?ratio ([\d.]+)"),
        ("cdc rows, deltatail", "rows/s", r"^- 3\. .*?: deltatail ([\d,]+) rows/s"),
        ("cdc rows, ratio to load_cdf", "x", r"^- 3\. .*?ratio ([\d.]+)"),
        ("peak RSS growth, deltatail", "MiB", r"^- 4\. peak RSS growth: deltatail ([\d.]+) MiB"),
    ],
    "latency": [
        ("commit to flush, watching, p50", "ms", r"^\s+watching\s+([\d.]+) ms"),
        ("commit to flush, watching, p99", "ms", r"p99 commit-to-flush with watching ([\d.]+) ms"),
        ("catch-up per commit", "ms", r"catch-up per commit: deltatail ([\d.]+) ms"),
        ("20,000-file table, rows in hand, p50", "ms", r"\(p50\): deltatail \(rows in hand\) ([\d.]+) ms"),
        ("20,000-file table, rows fsynced, p50", "ms", r"\(p50\): deltatail \(rows fsynced\) ([\d.]+) ms"),
        ("deltalake, 20,000-file table, p50 (peer)", "ms", r"\(rows in hand\) \S+ ms, deltalake ([\d.]+) ms"),
    ],
    "serve": [
        ("serve idle CPU, all tables", "% core", r"^idle CPU, % of one core \(all tables\)\s+([\d.]+)%"),
        ("serve memory per table", "MiB", r"^memory per table \(RSS\), MiB\s+([\d.]+)"),
        ("serve commit to flush, p50", "ms", r"^commit to flush, p50 ms\s+([\d.]+)"),
        ("serve commit to flush, p99", "ms", r"^commit to flush, p99 ms\s+([\d.]+)"),
    ],
}

#: Arguments each benchmark gets in a full run. serve's "old way" (a ``deltatail run`` per table)
#: is not what is compared here: one such process keeps its part short.
FULL_ARGS: dict[str, list[str]] = {"changes": ["--repeat", "5"], "latency": [], "serve": ["--old-way", "1"]}


@dataclass(frozen=True)
class Side:
    """One checkout: a label and its root."""

    label: str
    root: Path


@dataclass
class Figures:
    """Every run's value of every measure, per side: ``values[(bench, measure)][side label]``."""

    values: dict[tuple[str, str], dict[str, list[float]]] = field(default_factory=dict)

    def add(self, bench: str, measure: str, side: str, value: float) -> None:
        self.values.setdefault((bench, measure), {}).setdefault(side, []).append(value)


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ab", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--before", type=Path, required=True, help="a checkout of the older code (side A)")
    p.add_argument("--rounds", type=int, default=4, help="runs per side and benchmark (default 4)")
    p.add_argument("--only", default="changes,latency,serve", help="benchmarks to run, comma-separated")
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (a smoke run)")
    p.add_argument("--data-dir", type=Path, default=PROJECT / "benchmarks" / ".data" / "ab", help="tables of changes")
    p.add_argument("--log-dir", type=Path, default=None, help="keep each run's full output here")
    p.add_argument(
        "--extra",
        action="append",
        default=[],
        metavar="BENCH=ARGS",
        help="more arguments for one benchmark, e.g. serve='--tables 50 --idle-seconds 20' (repeatable)",
    )
    p.add_argument(
        "--report-from", type=Path, default=None, help="only print the figures of the logs in this --log-dir"
    )
    return p.parse_args(argv)


def bench_args(bench: str, quick: bool, data_dir: Path, extra: list[str]) -> list[str]:
    """The arguments ``bench`` runs with on both sides; changes' tables are written once and shared."""
    args = ["--quick"] if quick else list(FULL_ARGS[bench])
    for item in extra:
        name, _, more = item.partition("=")
        if name == bench:
            args += shlex.split(more)
    if bench == "changes":
        args += ["--data-dir", str(data_dir / ("changes-quick" if quick else "changes"))]
    if bench == "serve" and quick:
        args += ["--old-way", "1"]
    return args


def run_one(side: Side, bench: str, args: list[str]) -> str:
    """Run ``benchmarks.<bench>`` of ``side``'s checkout in a child process; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(side.root)}
    command = [sys.executable, "-m", f"benchmarks.{bench}", *args]
    done = subprocess.run(command, cwd=side.root, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{side.label}: {' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done.stdout


def pick(bench: str, output: str) -> dict[str, float]:
    """The figures of :data:`PATTERNS` found in one run's output."""
    found: dict[str, float] = {}
    for measure, _unit, pattern in PATTERNS[bench]:
        match = re.search(pattern, output, re.MULTILINE)
        if match is not None:
            found[measure] = float(match.group(1).replace(",", ""))
    return found


def order(round_no: int, sides: tuple[Side, Side]) -> tuple[Side, Side]:
    """A B, then B A, then A B ...: each side runs first as often as the other."""
    return sides if round_no % 2 == 0 else (sides[1], sides[0])


def run_all(sides: tuple[Side, Side], benches: list[str], a: argparse.Namespace) -> Figures:
    figures = Figures()
    for bench in benches:
        args = bench_args(bench, a.quick, a.data_dir, a.extra)
        for round_no in range(a.rounds):
            for side in order(round_no, sides):
                t0 = time.monotonic()
                out = run_one(side, bench, args)
                if a.log_dir is not None:
                    a.log_dir.mkdir(parents=True, exist_ok=True)
                    (a.log_dir / f"{bench}-{round_no}-{side.label}.log").write_text(out)
                for measure, value in pick(bench, out).items():
                    figures.add(bench, measure, side.label, value)
                print(f"  {bench:<8} round {round_no + 1} {side.label:<7} {time.monotonic() - t0:6.0f} s", flush=True)
    return figures


def show(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.3g}"


def report(figures: Figures, sides: tuple[Side, Side]) -> None:
    a, b = sides[0].label, sides[1].label
    print(f"\n{'measure':<46}{'unit':>8}  {a + ' (runs; median)':<40}{b + ' (runs; median)':<40}{b + '/' + a:>8}")
    units = {(bench, m): u for bench, rows in PATTERNS.items() for m, u, _ in rows}
    for (bench, measure), per_side in figures.values.items():
        cells, medians = [], []
        for label in (a, b):
            runs = per_side.get(label, [])
            median = statistics.median(runs) if runs else float("nan")
            medians.append(median)
            cells.append(f"{', '.join(show(v) for v in runs)}; {show(median)}")
        ratio = medians[1] / medians[0] if medians[0] else float("nan")
        print(f"{measure:<46}{units[(bench, measure)]:>8}  {cells[0]:<40}{cells[1]:<40}{ratio:>8.2f}")


def from_logs(log_dir: Path) -> Figures:
    """The figures of the runs kept in ``log_dir`` (``<bench>-<round>-<side>.log``), in round order."""
    figures = Figures()
    logs = sorted(log_dir.glob("*-*-*.log"), key=lambda p: (p.name.split("-")[0], int(p.name.split("-")[1])))
    for log in logs:
        bench, _round, side = log.stem.split("-")
        for measure, value in pick(bench, log.read_text()).items():
            figures.add(bench, measure, side, value)
    return figures


def git_head(root: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main(argv: Sequence[str] | None = None) -> int:
    a = parse(argv)
    sides = (Side("before", a.before.resolve()), Side("now", PROJECT))
    if a.report_from is not None:
        report(from_logs(a.report_from), sides)
        return 0
    benches = [b.strip() for b in a.only.split(",") if b.strip()]
    unknown = [b for b in benches if b not in PATTERNS]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(PATTERNS)}")
    print(f"command   {sys.executable} -m benchmarks.ab {' '.join(argv if argv is not None else sys.argv[1:])}")
    print(f"before    {sides[0].root} at {git_head(sides[0].root)}; now {PROJECT} at {git_head(PROJECT)}")
    print(f"load      {os.getloadavg()[0]:.1f} at start", flush=True)
    figures = run_all(sides, benches, a)
    report(figures, sides)
    print(f"load      {os.getloadavg()[0]:.1f} at end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
