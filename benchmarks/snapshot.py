"""Figures for the snapshot state machine, deltatail side by side with ``deltalake``.

Run ``.venv/bin/python -m benchmarks.snapshot`` (under a minute at full size on
two cores) or add ``--quick`` for a smoke run of a few seconds. Sections:

1. Loading the latest snapshot of a large table (checkpoint + a few commits).
2. The target table (20,000 files as a checkpoint + 200 commits): goal ratio <= 1.
3. The cost of one incremental commit: ``Snapshot.apply`` on pre-parsed commits
   at three table sizes (it should be flat), and ``DeltaLog.update`` for one new
   commit file (list + read + parse + apply) next to ``update_incremental``,
   on the large table and on a small table whose ``_delta_log`` holds many
   commit files (a month of a streaming writer's log).
4. Memory retained per live file (tracemalloc), against the 400-byte budget.

Workloads are generated on every run (see :mod:`benchmarks.workload`); every
time is the median of several repetitions, and the repetition count is printed.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import deltalake
import orjson
import pyarrow
from deltalake import DeltaTable

from benchmarks.workload import GeneratedTable, SyntheticFiles, TableSpec, generate_table
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.log.delta_log import DeltaLog

MEMORY_TARGET = 400
"""Bytes per live file the snapshot may retain."""
APPLY_CHUNK = 100_000
"""Files per bulk commit when building in-memory snapshots."""
NAME_WIDTH = 50
LONG_LOG_FILES = 1_000
"""Live files of the table with a long log (many commit files after its checkpoint)."""


# -- configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Sizes and repetition counts for one run."""

    files: int
    big_files: int
    target_files: int
    target_commits: int
    load_tail_commits: int
    repeat: int
    apply_batch: int
    update_commits: int
    long_log_commits: int
    data_dir: Path | None
    quick: bool


def parse_args(argv: Sequence[str] | None) -> Config:
    """The run's :class:`Config` from the command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.snapshot", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions (a smoke run)")
    p.add_argument("--files", type=int, help="live files of the large on-disk table (default 100000)")
    p.add_argument("--big-files", type=int, help="live files of the largest in-memory snapshot (default 1000000)")
    p.add_argument("--target-files", type=int, help="files in the target table's checkpoint (default 20000)")
    p.add_argument("--target-commits", type=int, help="commits after the target table's checkpoint (default 200)")
    p.add_argument("--repeat", type=int, help="repetitions per measurement (default 7; 3 with --quick)")
    p.add_argument("--data-dir", type=Path, help="write the tables here and keep them (e.g. benchmarks/.data)")
    a = p.parse_args(argv)
    q = bool(a.quick)
    return Config(
        files=a.files or (10_000 if q else 100_000),
        big_files=a.big_files or (100_000 if q else 1_000_000),
        target_files=a.target_files or (2_000 if q else 20_000),
        target_commits=a.target_commits if a.target_commits is not None else (20 if q else 200),
        load_tail_commits=5,
        repeat=max(1, a.repeat or (3 if q else 7)),
        apply_batch=1_000 if q else 2_000,
        update_commits=5 if q else 25,
        long_log_commits=1_000 if q else 10_000,
        data_dir=a.data_dir,
        quick=q,
    )


# -- measuring and printing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Samples of one measurement, in seconds."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        """The median sample."""
        return statistics.median(self.samples)

    @property
    def reps(self) -> int:
        """The number of samples."""
        return len(self.samples)


def round_robin(fns: dict[str, Callable[[], object]], repeat: int, warmup: int = 1) -> dict[str, Timing]:
    """Time each function ``repeat`` times, interleaved so drift hits all alike; warm-up runs are dropped."""
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(warmup + repeat):
        for name, fn in fns.items():
            gc.collect()
            start = time.perf_counter()
            fn()
            elapsed = time.perf_counter() - start
            if rep >= warmup:
                samples[name].append(elapsed)
    return {name: Timing(tuple(s)) for name, s in samples.items()}


def fmt_time(seconds: float) -> str:
    """A duration with a unit that keeps three or four significant digits."""
    if seconds >= 0.1:
        return f"{seconds:.3f} s"
    if seconds >= 1e-4:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.2f} us"


def size_label(n: int) -> str:
    """``1000000`` -> ``1m``, ``20000`` -> ``20k``, ``10`` -> ``10``."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}m"
    if n >= 1_000 and n % 1_000 == 0:
        return f"{n // 1_000}k"
    return str(n)


def plural(n: int, noun: str) -> str:
    """``3 commits``, ``1 commit``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def row(name: str, *cells: str) -> None:
    """Print one result line: a padded name, then its cells."""
    print(f"{name:<{NAME_WIDTH}} " + "  ".join(cells), flush=True)


def versus(name: str, ours: Timing, theirs: Timing, note: str) -> float:
    """Print a deltatail-vs-deltalake line; returns the ratio deltatail / deltalake (< 1: deltatail faster)."""
    ratio = ours.median / theirs.median
    row(
        name,
        f"deltatail {fmt_time(ours.median):>9}",
        f"deltalake {fmt_time(theirs.median):>9}",
        f"ratio {ratio:5.2f}" if ratio >= 0.1 else f"ratio {ratio:.3f}",
        note,
    )
    return ratio


def section(title: str) -> None:
    """Print a section heading."""
    print(f"\n== {title}", flush=True)


def machine_lines(argv: Sequence[str]) -> list[str]:
    """The command line and the machine the figures come from."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 0
    return [
        f"command   {shlex.join([sys.executable, '-m', 'benchmarks.snapshot', *argv])}",
        f"machine   nproc {cpus}, {platform.platform()}, {platform.machine()}",
        f"versions  python {platform.python_version()}, pyarrow {pyarrow.__version__}, "
        f"deltalake {deltalake.__version__}, orjson {orjson.__version__}",
    ]


@dataclass
class Results:
    """Headline figures gathered for the summary."""

    load_ratio: float = 0.0
    load_uris_ratio: float = 0.0
    target_ratio: float = 0.0
    target_uris_ratio: float = 0.0
    apply: dict[int, Timing] = field(default_factory=dict)
    update: tuple[Timing, Timing] | None = None
    update_long_log: tuple[Timing, Timing] | None = None
    memory: list[MemoryFigure] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryFigure:
    """Bytes retained by a snapshot, per live file."""

    name: str
    files: int
    retained: int
    detail: str

    @property
    def per_file(self) -> float:
        """Retained bytes divided by live files."""
        return self.retained / self.files


# -- workloads -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workloads:
    """The on-disk tables of one run."""

    large: GeneratedTable
    target: GeneratedTable
    long_log: GeneratedTable


def generate_logged(root: Path, spec: TableSpec) -> GeneratedTable:
    """Generate one table (replacing any previous one at ``root``) and print what was written."""
    if root.exists():
        shutil.rmtree(root)
    start = time.perf_counter()
    table = generate_table(root, spec)
    elapsed = time.perf_counter() - start
    print(
        f"workload  {root.name}: {spec.files} files in {plural(table.checkpoint_version + 1, 'commit')}, "
        f"deltalake checkpoint at v{table.checkpoint_version}, {spec.tail_commits} commits after "
        f"(latest v{table.latest_version}); written in {elapsed:.1f} s",
        flush=True,
    )
    return table


def make_workloads(cfg: Config, base: Path) -> Workloads:
    """Write the large table, the target table and the long-log table under ``base``."""
    large = TableSpec(cfg.files, cfg.load_tail_commits, seed=1)
    target = TableSpec(cfg.target_files, cfg.target_commits, seed=2)
    long_log = TableSpec(LONG_LOG_FILES, cfg.long_log_commits, seed=3)
    return Workloads(
        large=generate_logged(base / f"load_{size_label(cfg.files)}", large),
        target=generate_logged(base / f"target_{size_label(cfg.target_files)}_{cfg.target_commits}", target),
        long_log=generate_logged(base / f"long_log_{size_label(cfg.long_log_commits)}", long_log),
    )


# -- 1 and 2: loading ------------------------------------------------------------------------------


def check_same_state(table: GeneratedTable) -> str:
    """Check that deltatail and deltalake see the same table; returns a note saying what they saw."""
    root = str(table.root)
    snap = DeltaLog(root).snapshot()
    dt = DeltaTable(root)
    ours, theirs = {e.path for e in snap.live_files()}, set(dt.file_uris())
    expected = {path for path, _ in table.live}
    theirs_rel = {uri.removeprefix(root.rstrip("/") + "/") for uri in theirs}
    if not (ours == expected == theirs_rel and snap.version == dt.version() == table.latest_version):
        raise SystemExit(f"{root}: deltatail and deltalake disagree about the table (or the generator is wrong)")
    return f"both read {len(ours)} live files at v{snap.version}"


def load_functions(root: str) -> dict[str, Callable[[], object]]:
    """The loads compared: deltatail's snapshot, and deltalake's lazy and materialising variants."""
    return {
        "deltatail": lambda: DeltaLog(root).snapshot(),
        "deltalake": lambda: DeltaTable(root),
        "file_uris": lambda: DeltaTable(root).file_uris(),
        "add_actions": lambda: DeltaTable(root).get_add_actions(flatten=True),
    }


def bench_load(name: str, table: GeneratedTable, repeat: int) -> tuple[float, float]:
    """Print the load lines for ``table``; returns the ratios against ``DeltaTable`` and ``file_uris``."""
    note = check_same_state(table)
    t = round_robin(load_functions(str(table.root)), repeat)
    ours = t["deltatail"]
    ratio = versus(name, ours, t["deltalake"], f"DeltaTable(root); {note}")
    uris = versus(name + "+file_uris", ours, t["file_uris"], "DeltaTable(root).file_uris()")
    versus(name + "+add_actions", ours, t["add_actions"], "DeltaTable(root).get_add_actions(flatten=True)")
    return ratio, uris


# -- 3: one incremental commit ---------------------------------------------------------------------


@dataclass
class InMemory:
    """A snapshot built in memory from synthetic commits, and the source of its next commits."""

    snapshot: Snapshot
    files: SyntheticFiles
    traced_bytes: int
    string_bytes: int


def build_in_memory(n: int) -> InMemory:
    """Build an ``n``-file snapshot through ``Snapshot.empty`` + ``apply``, measuring what it retains.

    The commits are made before tracing starts, so tracemalloc sees what ``apply``
    allocates and keeps (index, columns, partition pool) but not the path strings,
    which the parser would have made; their sizes are added from ``sys.getsizeof``.
    """
    syn = SyntheticFiles(seed=n)
    commits = list(syn.bulk_commits(n, APPLY_CHUNK))
    string_bytes = sum(map(sys.getsizeof, syn.live))
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    snap = Snapshot.empty(f"memory://{n}")
    for commit in commits:
        snap, _ = snap.apply(commit)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return InMemory(snap, syn, traced, string_bytes)


def time_applies(built: InMemory, batch: int, repeat: int) -> Timing:
    """Seconds per ``apply`` of a pre-parsed 1-remove-1-add commit: one warm-up batch, then ``repeat`` batches."""
    snap = built.snapshot
    live = len(snap.files)
    first = snap.version + 1
    commits = [built.files.replace_commit(v) for v in range(first, first + batch * (repeat + 1))]
    samples: list[float] = []
    for rep in range(repeat + 1):
        chunk = commits[rep * batch : (rep + 1) * batch]
        gc.collect()
        start = time.perf_counter()
        for commit in chunk:
            snap, _ = snap.apply(commit)
        elapsed = time.perf_counter() - start
        if rep:
            samples.append(elapsed / batch)
    if len(snap.files) != live:
        raise SystemExit(f"apply changed the live file count from {live} to {len(snap.files)}")
    built.snapshot = snap
    return Timing(tuple(samples))


def apply_memory_figure(n: int, built: InMemory) -> MemoryFigure:
    """Bytes per live file of a snapshot made by :func:`build_in_memory`."""
    detail = (
        f"built by apply; tables {built.traced_bytes / n:.1f} (tracemalloc) "
        f"+ path strings {built.string_bytes / n:.1f} (getsizeof)"
    )
    name = f"memory.per_live_file_{size_label(n)}_files.apply"
    return MemoryFigure(name, n, built.traced_bytes + built.string_bytes, detail)


def bench_apply(cfg: Config, results: Results) -> None:
    """Per-commit ``apply`` cost at 10, ``files`` and ``big_files`` live files; records memory too."""
    for n in sorted({10, cfg.files, cfg.big_files}):
        built = build_in_memory(n)
        timing = time_applies(built, cfg.apply_batch, cfg.repeat)
        results.apply[n] = timing
        row(
            f"snapshot.apply_1_commit_{size_label(n)}_files",
            f"deltatail {fmt_time(timing.median):>9}/commit",
            f"(pre-parsed 1 remove + 1 add; median of {timing.reps} batches of {cfg.apply_batch})",
        )
        if n >= 1_000:
            results.memory.append(apply_memory_figure(n, built))
        del built
        gc.collect()
    small, middle, large = (results.apply[n].median for n in (10, cfg.files, cfg.big_files))
    row(
        "snapshot.apply_flatness",
        f"{size_label(cfg.big_files)}/10 files: x{large / small:.2f}",
        f"{size_label(cfg.big_files)}/{size_label(cfg.files)} files: x{large / middle:.2f}",
        f"(x1.00 = independent of table size; O(n) would be x{cfg.big_files // 10} and "
        f"x{cfg.big_files / cfg.files:.0f})",
    )


def bench_update(name: str, table: GeneratedTable, commits: int) -> tuple[Timing, Timing]:
    """Print ``DeltaLog.update`` for one new commit file vs ``DeltaTable.update_incremental`` on ``table``."""
    root = str(table.root)
    log = DeltaLog(root)
    snap = log.snapshot()
    dt = DeltaTable(root)
    ours: list[float] = []
    theirs: list[float] = []
    for rep in range(commits + 1):
        version = table.append_replace_commit()
        gc.collect()
        start = time.perf_counter()
        snap, applied = log.update(snap)
        middle = time.perf_counter()
        dt.update_incremental()
        end = time.perf_counter()
        if not (snap.version == dt.version() == version and len(applied) == 1):
            raise SystemExit(f"update did not reach version {version}")
        if rep:
            ours.append(middle - start)
            theirs.append(end - middle)
    mine, other = Timing(tuple(ours)), Timing(tuple(theirs))
    entries = sum(1 for _ in table.log_dir.iterdir())
    note = f"DeltaLog.update vs DeltaTable.update_incremental; median of {mine.reps} commits; {entries} log files"
    versus(name, mine, other, note)
    return mine, other


# -- 4: memory -------------------------------------------------------------------------------------


def traced_checkpoint_load(table: GeneratedTable) -> MemoryFigure:
    """Python heap retained by ``DeltaLog(root).snapshot()`` of ``table`` (Arrow buffers are not traced)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    snap = DeltaLog(str(table.root)).snapshot()
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    n = len(snap.files)
    detail = (
        f"DeltaLog.snapshot() from the checkpoint, everything retained (tracemalloc); peak {(peak - before) / n:.0f}"
    )
    return MemoryFigure(f"memory.per_live_file_{size_label(n)}_files.checkpoint", n, current - before, detail)


def report_memory(figures: list[MemoryFigure]) -> None:
    """Print bytes per live file next to the target."""
    for fig in figures:
        verdict = "met" if fig.per_file < MEMORY_TARGET else "MISSED"
        row(fig.name, f"{fig.per_file:6.1f} B/file", f"target < {MEMORY_TARGET}: {verdict}", f"({fig.detail})")


# -- summary and main ------------------------------------------------------------------------------


def summary_lines(cfg: Config, r: Results) -> list[str]:
    """The closing summary, one line per question asked."""
    small, middle, big = (r.apply[n].median for n in (10, cfg.files, cfg.big_files))
    flat = big / middle
    lines = [
        f"load {size_label(cfg.files)} files: deltatail takes {r.load_ratio:.2f}x the time of DeltaTable(root) "
        f"and {r.load_uris_ratio:.2f}x that of DeltaTable(root).file_uris()",
        f"target ({size_label(cfg.target_files)} files + {cfg.target_commits} commits): ratio {r.target_ratio:.2f} "
        f"({r.target_uris_ratio:.2f} with file_uris) -> goal 'no slower': "
        + ("met" if r.target_ratio <= 1.0 else "MISSED"),
        f"apply one commit: {fmt_time(small)} at 10 files, {fmt_time(middle)} at {size_label(cfg.files)}, "
        f"{fmt_time(big)} at {size_label(cfg.big_files)} (x{flat:.2f} for 10x the files) -> "
        + ("flat in table size" if flat < 1.5 else "NOT flat"),
    ]
    if r.update is not None and r.update_long_log is not None:
        ours, theirs = r.update
        long_ours = r.update_long_log[0]
        lines.append(
            f"update for one new commit on {size_label(cfg.files)} files: {fmt_time(ours.median)} "
            f"(deltalake update_incremental {fmt_time(theirs.median)}); with {cfg.long_log_commits} "
            f"files in _delta_log: {fmt_time(long_ours.median)} (listing cost grows with the log directory)"
        )
    worst = max(r.memory, key=lambda m: m.per_file)
    lines.append(
        f"memory: at most {worst.per_file:.0f} B per live file ({worst.name}); target < {MEMORY_TARGET} -> "
        + ("met" if worst.per_file < MEMORY_TARGET else "MISSED")
    )
    return lines


def run(cfg: Config, base: Path) -> Results:
    """Generate the workloads under ``base`` and run every section."""
    results = Results()
    work = make_workloads(cfg, base)
    reps = f"median of {cfg.repeat} runs after 1 warm-up, tools interleaved; ratio = deltatail / deltalake"
    section(f"1. load the latest snapshot: {cfg.files} files, checkpoint + {cfg.load_tail_commits} commits ({reps})")
    results.load_ratio, results.load_uris_ratio = bench_load(
        f"snapshot.load_{size_label(cfg.files)}_files", work.large, cfg.repeat
    )
    section(f"2. target table: {cfg.target_files} files as a checkpoint + {cfg.target_commits} commits ({reps})")
    results.target_ratio, results.target_uris_ratio = bench_load(
        f"snapshot.load_{size_label(cfg.target_files)}_files_{cfg.target_commits}_commits", work.target, cfg.repeat
    )
    section("3. one incremental commit (apply: pre-parsed, in-memory snapshots; update: a new commit file on disk)")
    bench_apply(cfg, results)
    results.update = bench_update(
        f"snapshot.update_1_commit_{size_label(cfg.files)}_files", work.large, cfg.update_commits
    )
    results.update_long_log = bench_update(
        f"snapshot.update_1_commit_{size_label(cfg.long_log_commits)}_log_files",
        work.long_log,
        cfg.update_commits,
    )
    section(f"4. memory retained per live file (target < {MEMORY_TARGET} B)")
    results.memory.append(traced_checkpoint_load(work.large))
    report_memory(results.memory)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print its figures."""
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(args)
    started = time.perf_counter()
    for line in machine_lines(args):
        print(line)
    if cfg.data_dir is not None:
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
        results = run(cfg, cfg.data_dir.resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="deltatail-bench-") as tmp:
            results = run(cfg, Path(tmp).resolve())
    section("summary")
    for line in summary_lines(cfg, results):
        print(f"- {line}")
    print(f"- total run time {time.perf_counter() - started:.0f} s" + (" (--quick)" if cfg.quick else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
