"""Change rows per second: deltatail's ``ChangeFeed`` side by side with deltalake's ``load_cdf``.

Run ``.venv/bin/python -m benchmarks.changes`` (a few minutes on two cores the
first time, when the tables are written; they are kept in ``benchmarks/.data``
and reused) or add ``--quick`` for a smoke run with small tables. Workloads:

1. Many one-file appends (2,000 x 80 rows): target deltatail >= load_cdf.
2. A partitioned 500-commit history of appends, deletes, updates and merges:
   target deltatail >= load_cdf.
3. Two commits holding 3,000,000 cdc rows (an UPDATE of all 1,000,000 rows,
   then a MERGE updating half): target deltatail >= 0.8 x load_cdf.
4. Peak RSS growth while streaming the commit whose cdc files hold 2,000,000
   rows, each run in a fresh process.

Both sides are consumed alike: every batch is counted and dropped (deltalake's
reader through ``pyarrow.RecordBatchReader.from_stream``, zero-copy), and
each run opens the table from its path (``ChangeFeed``/``DeltaTable``
construction is timed too). Each figure is the median of several interleaved
runs after a dropped warm-up; the counts are printed. ``--profile`` adds a
cProfile of deltatail on workloads 1 and 3 (top 15 by cumulative time).

deltatail reads the small files of workloads 1 and 2 in its two reader
processes (``ChangeOptions.reader_processes``), which a process starts once,
on its first catch-up: the timed runs reuse them (the warm-up run started
them), and a second line gives deltatail's time when each run starts them
anew. Workload 4's files are large and read in-process, so its RSS is all of
deltatail's memory.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import platform
import pstats
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import deltalake
import pyarrow as pa
from deltalake import DeltaTable

from benchmarks.cdf_workloads import AppendsSpec, BulkSpec, MixedSpec, Spec, Workload, ensure
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.reader_pool import ReaderPool, shared_pool

PROJECT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = PROJECT / "benchmarks" / ".data" / "changes"
PROFILE_TOP = 15
Reader = Callable[[str, int, int], int]


# -- configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Sizes and repetition counts of one run."""

    appends: AppendsSpec
    mixed: MixedSpec
    bulk: BulkSpec
    repeat: int
    memory_repeat: int
    data_dir: Path
    regenerate: bool
    profile: bool
    quick: bool


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (``--probe`` is internal: one memory measurement in a child process)."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.changes", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small tables and few repetitions (a smoke run)")
    p.add_argument("--repeat", type=int, help="timed runs per side and workload (default 5; 2 with --quick)")
    p.add_argument("--memory-repeat", type=int, help="fresh processes per side for workload 4 (default 3; 1 quick)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help=f"where tables live (default {DEFAULT_DATA})")
    p.add_argument("--regenerate", action="store_true", help="rewrite the tables even if present")
    p.add_argument("--profile", action="store_true", help="print a cProfile of deltatail on workloads 1 and 3")
    p.add_argument("--probe", nargs=4, metavar=("SIDE", "TABLE", "FIRST", "LAST"), help=argparse.SUPPRESS)
    return p


def make_config(a: argparse.Namespace) -> Config:
    """The run's :class:`Config` from parsed arguments."""
    q = bool(a.quick)
    return Config(
        appends=AppendsSpec(commits=200 if q else 2_000, rows=80),
        mixed=MixedSpec(commits=60 if q else 500),
        bulk=BulkSpec(rows=200_000 if q else 1_000_000),
        repeat=max(1, a.repeat or (2 if q else 5)),
        memory_repeat=max(1, a.memory_repeat or (1 if q else 3)),
        data_dir=a.data_dir,
        regenerate=bool(a.regenerate),
        profile=bool(a.profile),
        quick=q,
    )


# -- the two readers -------------------------------------------------------------------------------


def deltatail_rows(uri: str, first: int, last: int) -> int:
    """Stream versions ``first..last`` through deltatail's ChangeFeed; returns the row count."""
    rows = 0
    for batch in ChangeFeed(uri).batches(first, last):
        rows += batch.rows.num_rows
    return rows


def load_cdf_rows(uri: str, first: int, last: int) -> int:
    """Stream versions ``first..last`` through deltalake's ``load_cdf``; returns the row count."""
    reader = pa.RecordBatchReader.from_stream(DeltaTable(uri).load_cdf(starting_version=first, ending_version=last))
    rows = 0
    for batch in reader:
        rows += batch.num_rows
    return rows


READERS: dict[str, Reader] = {"deltatail": deltatail_rows, "load_cdf": load_cdf_rows}


def plural(n: int, noun: str) -> str:
    """``3 runs``, ``1 run``, ``2 processes``."""
    if n == 1:
        return f"{n} {noun}"
    return f"{n} {noun}es" if noun.endswith("s") else f"{n} {noun}s"


# -- timing ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Timed runs of one side on one workload."""

    rows: int
    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """The median run time in seconds."""
        return statistics.median(self.samples)

    @property
    def rate(self) -> float:
        """Rows per second at the median run time."""
        return self.rows / self.median


def time_sides(work: Workload, repeat: int, warmup: int = 1) -> dict[str, Timing]:
    """Time both readers ``repeat`` times, interleaved so drift hits both alike; warm-up runs are dropped."""
    samples: dict[str, list[float]] = {side: [] for side in READERS}
    rows: dict[str, int] = {}
    for rep in range(warmup + repeat):
        for side, read in READERS.items():
            gc.collect()
            start = time.perf_counter()
            rows[side] = read(work.uri, work.first, work.last)
            elapsed = time.perf_counter() - start
            if rep >= warmup:
                samples[side].append(elapsed)
    return {side: Timing(rows[side], tuple(samples[side])) for side in READERS}


@dataclass(frozen=True)
class Throughput:
    """The outcome of one throughput workload."""

    label: str
    deltatail: Timing
    load_cdf: Timing
    target: float

    @property
    def ratio(self) -> float:
        """deltatail rows/s divided by load_cdf rows/s (> 1: deltatail faster)."""
        return self.deltatail.rate / self.load_cdf.rate

    @property
    def met(self) -> bool:
        """Whether the ratio reaches the target."""
        return self.ratio >= self.target


def print_throughput(result: Throughput) -> None:
    """Print both sides' rows, median seconds and rows/s, then the ratio against the target."""
    for side, t in (("deltatail", result.deltatail), ("load_cdf", result.load_cdf)):
        spread = f"min {min(t.samples):.3f} s, max {max(t.samples):.3f} s"
        print(f"   {side:<10} {t.rows:>10,} rows  {t.median:8.3f} s  {t.rate:>12,.0f} rows/s   ({spread})")
    same = "" if result.deltatail.rows == result.load_cdf.rows else "   ROW COUNTS DIFFER"
    verdict = "met" if result.met else "MISSED"
    print(
        f"   ratio {result.ratio:.2f} (deltatail / load_cdf rows/s; target >= {result.target:.2f}: {verdict})"
        f"   median of {plural(len(result.deltatail.samples), 'run')} per side, 1 warm-up dropped{same}",
        flush=True,
    )


def bench_throughput(label: str, work: Workload, target: float, repeat: int) -> Throughput:
    """Run, print and return one throughput workload."""
    processes = shared_pool(ChangeOptions().reader_processes)
    reader_files = processes.files_sent
    timings = time_sides(work, repeat)
    result = Throughput(label, timings["deltatail"], timings["load_cdf"], target)
    print_throughput(result)
    if processes.files_sent > reader_files:
        print_cold(work, repeat, processes)
    return result


def print_cold(work: Workload, repeat: int, processes: ReaderPool) -> None:
    """Time deltatail with its reader processes started inside the run (the runs above reuse them)."""
    samples = []
    for _ in range(repeat):
        processes.close()
        gc.collect()
        start = time.perf_counter()
        deltatail_rows(work.uri, work.first, work.last)
        samples.append(time.perf_counter() - start)
    print(
        f"   deltatail, reader processes started inside the run: {statistics.median(samples):.3f} s"
        f" (median of {plural(repeat, 'run')}; a process starts them once, on its first catch-up)",
        flush=True,
    )


# -- memory (workload 4) ---------------------------------------------------------------------------


def status_kib(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``)."""
    text = Path("/proc/self/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def reset_peak() -> bool:
    """Reset ``VmHWM`` to the current RSS (``clear_refs`` 5); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


class RssSampler(threading.Thread):
    """Samples ``VmRSS`` every ``interval`` seconds (the fallback where the peak cannot be reset)."""

    def __init__(self, interval: float = 0.002) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak = status_kib("VmRSS")
        self.done = threading.Event()

    def run(self) -> None:
        """Sample until :meth:`stop`."""
        while not self.done.wait(self.interval):
            self.peak = max(self.peak, status_kib("VmRSS"))

    def stop(self) -> int:
        """Stop sampling; returns the highest RSS seen, in KiB."""
        self.done.set()
        self.join()
        return max(self.peak, status_kib("VmRSS"))


def probe(side: str, uri: str, first: int, last: int) -> int:
    """Child process: stream one side once and print its RSS figures as JSON."""
    gc.collect()
    baseline = status_kib("VmRSS")
    exact = reset_peak()
    sampler = None if exact else RssSampler()
    if sampler is not None:
        sampler.start()
    start = time.perf_counter()
    rows = READERS[side](uri, first, last)
    elapsed = time.perf_counter() - start
    peak = status_kib("VmHWM") if sampler is None else sampler.stop()
    method = "VmHWM after clear_refs" if exact else "VmRSS sampled every 2 ms"
    print(json.dumps({"rows": rows, "baseline_kib": baseline, "peak_kib": peak, "seconds": elapsed, "how": method}))
    return 0


@dataclass(frozen=True)
class MemoryRun:
    """One child process's figures."""

    rows: int
    baseline_kib: int
    peak_kib: int
    seconds: float
    how: str

    @property
    def growth_mib(self) -> float:
        """Peak RSS above the baseline taken just before reading, in MiB."""
        return (self.peak_kib - self.baseline_kib) / 1024


def run_probe(side: str, work: Workload) -> MemoryRun:
    """Measure one side in a fresh interpreter."""
    cmd = [sys.executable, "-m", "benchmarks.changes", "--probe", side, work.uri, str(work.first), str(work.last)]
    done = subprocess.run(cmd, cwd=PROJECT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"memory probe failed ({done.returncode}):\n{done.stderr}")
    fields = json.loads(done.stdout.strip().splitlines()[-1])
    return MemoryRun(**fields)


def bench_memory(work: Workload, repeat: int) -> dict[str, float]:
    """Print the median peak RSS growth of each side over ``repeat`` fresh processes; returns it in MiB."""
    runs: dict[str, list[MemoryRun]] = {side: [] for side in READERS}
    for _ in range(repeat):
        for side in READERS:
            runs[side].append(run_probe(side, work))
    medians = {side: statistics.median(r.growth_mib for r in rs) for side, rs in runs.items()}
    for side, rs in runs.items():
        each = ", ".join(f"{r.growth_mib:.0f}" for r in rs)
        print(
            f"   {side:<10} {rs[0].rows:>10,} rows  peak RSS growth {medians[side]:7.1f} MiB"
            f"  ({each} MiB; baseline {rs[0].baseline_kib / 1024:.0f} MiB; {rs[0].seconds:.2f} s; {rs[0].how})"
        )
    ratio = medians["deltatail"] / medians["load_cdf"] if medians["load_cdf"] > 0 else float("inf")
    print(
        f"   ratio {ratio:.2f} (deltatail / load_cdf peak growth)   median of {plural(repeat, 'process')} per side",
        flush=True,
    )
    return medians


# -- profile ---------------------------------------------------------------------------------------


def short_location(file_name: str, line: int) -> str:
    """A profile entry's file, relative to the project or to site-packages."""
    for root in (str(PROJECT / ".venv"), str(PROJECT)):
        if file_name.startswith(root + os.sep):
            file_name = file_name[len(root) + 1 :]
            break
    file_name = re.sub(r"^lib/python[\d.]+/site-packages/", "", file_name)
    return f"{file_name}:{line}" if line else file_name


def profile_deltatail(label: str, work: Workload) -> None:
    """Print deltatail's top functions by cumulative time on one workload (one run under cProfile)."""
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    rows = deltatail_rows(work.uri, work.first, work.last)
    profiler.disable()
    elapsed = time.perf_counter() - start
    entries = pstats.Stats(profiler).get_stats_profile().func_profiles
    top = sorted(entries.items(), key=lambda item: item[1].cumtime, reverse=True)[:PROFILE_TOP]
    print(f"\n-- profile: deltatail, {label}: {rows:,} rows in {elapsed:.3f} s under cProfile")
    print(f"   {'ncalls':>12} {'tottime':>8} {'cumtime':>8}  function")
    for name, f in top:
        where = short_location(f.file_name, f.line_number)
        print(f"   {f.ncalls:>12} {f.tottime:8.3f} {f.cumtime:8.3f}  {name}  ({where})")


# -- the run ---------------------------------------------------------------------------------------


def machine_lines(argv: Sequence[str]) -> list[str]:
    """The command line and the machine the figures come from."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
    return [
        f"command   {shlex.join([sys.executable, '-m', 'benchmarks.changes', *argv])}",
        f"machine   nproc {cpus}, {cpu_model()}, {memory_gib():.0f} GiB RAM, {platform.platform()}",
        f"versions  python {platform.python_version()}, pyarrow {pa.__version__}, deltalake {deltalake.__version__}",
    ]


def cpu_model() -> str:
    """The CPU model name from ``/proc/cpuinfo`` (the machine type elsewhere)."""
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    except OSError:
        match = None
    return match.group(1).strip() if match else platform.machine()


def memory_gib() -> float:
    """Total memory in GiB (0 where ``/proc/meminfo`` is missing)."""
    try:
        match = re.search(r"^MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
    except OSError:
        return 0.0
    return int(match.group(1)) / 2**20 if match else 0.0


def prepare(cfg: Config, spec: Spec, what: str) -> Workload:
    """Write or reuse one table and print where it is and its version range."""
    work = ensure(cfg.data_dir, spec, regenerate=cfg.regenerate)
    how = "reused" if work.reused else f"written in {work.seconds:.1f} s"
    print(f"workload  {spec.name}: {what}, versions {work.first}..{work.last}; {how} ({work.path})", flush=True)
    return work


@dataclass(frozen=True)
class Workloads:
    """The tables of one run; ``memory`` is the bulk table's first cdc commit alone."""

    appends: Workload
    mixed: Workload
    bulk: Workload
    memory: Workload


def make_workloads(cfg: Config) -> Workloads:
    """Write or reuse the three tables."""
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    a, m, b = cfg.appends, cfg.mixed, cfg.bulk
    appends = prepare(cfg, a, f"{a.commits:,} one-file appends of {a.rows} rows, CDF on")
    mixed = prepare(cfg, m, f"{m.commits} commits of appends/deletes/updates/merges, partitioned, CDF on")
    bulk = prepare(cfg, b, f"{b.rows:,} rows, UPDATE of all, MERGE updating half, CDF on")
    memory = Workload(bulk.path, bulk.first, bulk.first, bulk.reused, bulk.seconds)
    return Workloads(appends, mixed, bulk, memory)


def run(cfg: Config) -> tuple[list[Throughput], dict[str, float]]:
    """Run the four workloads (and the profile if asked); returns the figures for the summary."""
    work = make_workloads(cfg)
    a, m, b = cfg.appends, cfg.mixed, cfg.bulk
    labels = [
        f"1. {a.commits:,} one-file appends of {a.rows} rows",
        f"2. {m.commits}-commit mixed DML history, partitioned",
        f"3. {3 * b.rows:,} cdc rows in 2 commits (UPDATE all, MERGE half)",
    ]
    results: list[Throughput] = []
    for label, table, target in zip(labels, (work.appends, work.mixed, work.bulk), (1.0, 1.0, 0.8), strict=True):
        print(f"\n== {label}, versions {table.first}..{table.last}", flush=True)
        results.append(bench_throughput(label, table, target, cfg.repeat))
    print(f"\n== 4. peak RSS growth streaming version {work.memory.first} ({2 * b.rows:,} cdc rows), fresh processes")
    memory = bench_memory(work.memory, cfg.memory_repeat)
    if cfg.profile:
        profile_deltatail(labels[0], work.appends)
        profile_deltatail(labels[2], work.bulk)
    return results, memory


def print_summary(results: list[Throughput], memory: dict[str, float], seconds: float, quick: bool) -> None:
    """Print one line per workload and the total run time."""
    print("\n== summary")
    for r in results:
        verdict = "met" if r.met else "MISSED"
        print(
            f"- {r.label}: deltatail {r.deltatail.rate:,.0f} rows/s, load_cdf {r.load_cdf.rate:,.0f} rows/s, "
            f"ratio {r.ratio:.2f} (target >= {r.target:.2f}: {verdict})"
        )
    print(f"- 4. peak RSS growth: deltatail {memory['deltatail']:.0f} MiB, load_cdf {memory['load_cdf']:.0f} MiB")
    print(f"- total run time {seconds:.0f} s" + (" (--quick)" if quick else ""))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--probe``, one memory measurement) and print its figures."""
    args = list(sys.argv[1:] if argv is None else argv)
    parsed = build_parser().parse_args(args)
    if parsed.probe is not None:
        side, uri, first, last = parsed.probe
        return probe(side, uri, int(first), int(last))
    cfg = make_config(parsed)
    started = time.perf_counter()
    for line in machine_lines(args):
        print(line)
    results, memory = run(cfg)
    print_summary(results, memory, time.perf_counter() - started, cfg.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
