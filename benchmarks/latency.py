"""Latency and per-commit cost of following a live table: deltatail's tailer next to ``deltalake``.

Run ``.venv/bin/python -m benchmarks.latency`` (about a minute on two cores) or add ``--quick`` for a
smoke run of a few seconds. Sections:

1. Commit-to-flush latency: the benchmark writes small valid commits (an ``add`` of a one-row Parquet
   file written beforehand) into ``_delta_log`` by atomic rename, one every ``--cadence`` seconds, and
   records the time just before each rename; a :class:`~tailer.follow.tailer.Tailer` runs in a thread into the
   JSON lines file sink, wrapped to time-stamp every flush (flush = written and fsynced). Latency is
   flush time minus rename time, per commit: p50/p99/max, with watching (inotify) and with polling.
2. Catch-up over many small commits (one-file appends, a checkpoint every 100 commits as delta-rs
   writers make by default): deltatail from version 0 to the end (time after start-up, per commit,
   per quarter of the log), against deltalake reading the same versions one ``load_cdf(v, v)`` at a
   time with ``update_incremental()`` before each, as delta-rs followers do (a stride of versions when
   ``--deltalake-stride`` > 1, spread over the whole log).
3. Following a 20,000-file table (a checkpoint of 20,000 files, then one-file appends): per-commit
   cost, commits written one at a time with 10 ms of idle time after each (the same for both
   followers); deltatail's time from a commit's rename (inotify wake-up included) to its Arrow rows
   in hand (handed to the sink: the end point of deltalake's ``read_all()``), to their encoding and
   write by the JSON lines sink, and to their fsync, against deltalake's ``update_incremental()`` +
   ``load_cdf(v, v).read_all()`` for the same commit (on an identical copy), which starts when the
   commit is in place and so has no wake-up to pay.

``--profile`` prints cProfile's hot spots of deltatail's catch-up (section 2) and following (section 3).

Targets: p99 commit-to-flush under 50 ms with watching; per-commit cost at least 10x lower than
deltalake in section 2 and 20x lower in section 3, flat as the log grows.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import os
import platform
import pstats
import random
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import deltalake
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.cursor import Position
from deltatail.state.feed import ChangeBatch, CommitEvent, TableInfo
from deltatail.tailer.cli.process import tune_for_latency
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.sink import Sink

CDF = {"delta.enableChangeDataFeed": "true"}
CHECKPOINT_EVERY = 100
"""delta-rs writers checkpoint every 100 commits by default; the catch-up table does the same."""
SCHEMA_STRING = orjson.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "v", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
).decode()
TARGET_P99_MS = 50.0
TARGET_CATCH_UP_RATIO = 10.0
TARGET_BIG_TABLE_RATIO = 20.0
WAIT = 60.0


# -- configuration ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Sizes for one run."""

    latency_commits: int
    cadence: float
    poll: float
    catch_up_commits: int
    deltalake_stride: int
    big_files: int
    follow_commits: int
    profile: bool
    data_dir: Path | None
    quick: bool


def parse_args(argv: Sequence[str] | None) -> Config:
    """The run's :class:`Config` from the command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.latency", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    p.add_argument("--latency-commits", type=int, help="commits per latency run (default 500)")
    p.add_argument("--cadence", type=float, default=0.02, help="mean seconds between commits (default 0.02)")
    p.add_argument("--poll", type=float, default=0.05, help="poll interval of the polling run (default 0.05)")
    p.add_argument("--catch-up-commits", type=int, help="commits of the catch-up table (default 2000)")
    p.add_argument("--deltalake-stride", type=int, help="time deltalake on every N-th version (default 10)")
    p.add_argument("--big-files", type=int, help="files in the large table's checkpoint (default 20000)")
    p.add_argument("--follow-commits", type=int, help="commits followed on the large table (default 200)")
    p.add_argument("--profile", action="store_true", help="print cProfile hot spots of deltatail (sections 2, 3)")
    p.add_argument("--data-dir", type=Path, help="where to write the tables (default: a temporary directory)")
    a = p.parse_args(argv)
    q = bool(a.quick)
    return Config(
        latency_commits=a.latency_commits or (100 if q else 500),
        cadence=a.cadence,
        poll=a.poll,
        catch_up_commits=a.catch_up_commits or (300 if q else 2_000),
        deltalake_stride=a.deltalake_stride or (5 if q else 10),
        big_files=a.big_files or 20_000,
        follow_commits=a.follow_commits or (40 if q else 200),
        profile=a.profile,
        data_dir=a.data_dir,
        quick=q,
    )


# -- tables whose commits the benchmark writes -----------------------------------------------------


class HandWrittenTable:
    """A table created by deltalake (version 0, CDF on) whose later commits are written here by hand.

    Each commit ``v`` adds ``part-<v>.parquet``, one row ``(v, "row-<v>")``, written beforehand.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log_dir = root / "_delta_log"
        self.sizes: dict[int, int] = {}

    @staticmethod
    def create(root: Path) -> HandWrittenTable:
        """Version 0 written by deltalake: one row, change data feed on."""
        write_deltalake(str(root), rows([0]), configuration=CDF)
        return HandWrittenTable(root)

    def copy(self, root: Path) -> HandWrittenTable:
        """An identical table at ``root`` (log and data files)."""
        shutil.copytree(self.root, root)
        table = HandWrittenTable(root)
        table.sizes = dict(self.sizes)
        return table

    def write_data(self, versions: range) -> None:
        """Write the data file of each commit in ``versions``."""
        for v in versions:
            path = self.root / data_name(v)
            pq.write_table(rows([v]), path)
            self.sizes[v] = path.stat().st_size

    def commit_bytes(self, v: int) -> bytes:
        """Commit ``v``: commitInfo and the add of its data file."""
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"}}},
            {
                "add": {
                    "path": data_name(v),
                    "partitionValues": {},
                    "size": self.sizes[v],
                    "modificationTime": now,
                    "dataChange": True,
                    "stats": orjson.dumps({"numRecords": 1}).decode(),
                }
            },
        ]
        return b"\n".join(orjson.dumps(a) for a in actions) + b"\n"

    def publish(self, v: int) -> float:
        """Write commit ``v`` to a temporary name and rename it into place; returns the time just before the rename."""
        tmp = self.log_dir / f".{v:020d}.json.{uuid.uuid4().hex}.tmp"
        tmp.write_bytes(self.commit_bytes(v))
        stamp = time.perf_counter()
        os.rename(tmp, self.log_dir / f"{v:020d}.json")
        return stamp


def rows(ids: Sequence[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([f"row-{i}" for i in ids], pa.string())})


def data_name(v: int) -> str:
    return f"part-{v:06d}.parquet"


def big_table(root: Path, files: int) -> tuple[HandWrittenTable, int]:
    """A log-only table whose checkpoint holds ``files`` live files (never read: the followers start after it).

    Returns the table and the checkpoint version.
    """
    log_dir = root / "_delta_log"
    log_dir.mkdir(parents=True)
    now = int(time.time() * 1000)
    header: list[dict[str, Any]] = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 4}},
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": SCHEMA_STRING,
                "partitionColumns": [],
                "configuration": CDF,
                "createdTime": now,
            }
        },
    ]
    rng = random.Random(5)
    version, written, per_commit = 0, 0, 4_000
    while written < files:
        actions: list[dict[str, Any]] = [{"commitInfo": {"timestamp": now, "operation": "WRITE"}}]
        if version == 0:
            actions += header
        for _ in range(min(per_commit, files - written)):
            actions.append(
                {
                    "add": {
                        "path": f"part-00000-{uuid.UUID(int=rng.getrandbits(128))}-c000.snappy.parquet",
                        "partitionValues": {},
                        "size": rng.randrange(1 << 20, 1 << 27),
                        "modificationTime": now,
                        "dataChange": True,
                        "stats": orjson.dumps({"numRecords": rng.randrange(1000, 100_000)}).decode(),
                    }
                }
            )
            written += 1
        (log_dir / f"{version:020d}.json").write_bytes(b"\n".join(orjson.dumps(a) for a in actions) + b"\n")
        version += 1
    DeltaTable(str(root)).create_checkpoint()
    return HandWrittenTable(root), version - 1


# -- sinks that time-stamp what the tailer does ----------------------------------------------------


class TimedJsonLines(JsonLinesSink):
    """The JSON lines file sink, recording when each version's rows were in hand (Arrow rows handed to
    :meth:`write`), delivered (encoded and written: the commit's event) and flushed (fsynced)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.pending: set[int] = set()
        self.flushed: dict[int, float] = {}
        self.delivered: dict[int, float] = {}
        self.in_hand: dict[int, float] = {}
        self._cond = threading.Condition()

    def write(self, batch: ChangeBatch) -> None:
        self.in_hand.setdefault(batch.start.version, time.perf_counter())
        super().write(batch)
        self.pending.add(batch.start.version)

    def commit_event(self, event: CommitEvent) -> None:
        self.delivered[event.version] = time.perf_counter()

    def flush(self) -> None:
        super().flush()
        stamp = time.perf_counter()
        with self._cond:
            for v in self.pending:
                self.flushed[v] = stamp
            self.pending.clear()
            self._cond.notify_all()

    def wait_for(self, version: int) -> None:
        """Block until ``version``'s rows are flushed."""
        with self._cond:
            if not self._cond.wait_for(lambda: version in self.flushed, timeout=WAIT):
                raise RuntimeError(f"version {version} was not flushed within {WAIT}s")


@dataclass
class CountingSink(Sink):
    """Counts rows (the batches are materialized by the tailer) and time-stamps each commit's end."""

    rows: int = 0
    opened: float = 0.0
    done: dict[int, float] = field(default_factory=dict)

    def open(self, table: TableInfo) -> Position | None:
        self.opened = time.perf_counter()
        return None

    def write(self, batch: ChangeBatch) -> None:
        self.rows += len(batch)

    def commit_event(self, event: CommitEvent) -> None:
        self.done[event.version] = time.perf_counter()

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Following:
    """A tailer running in a thread (profiled with cProfile when ``profile``)."""

    def __init__(self, tailer: Tailer, *, profile: bool = False) -> None:
        self.tailer = tailer
        self.error: BaseException | None = None
        self.profiler = cProfile.Profile() if profile else None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.profiler is not None:
            self.profiler.enable()
        try:
            self.tailer.run()
        except BaseException as e:
            self.error = e
        finally:
            if self.profiler is not None:
                self.profiler.disable()

    def stop(self) -> None:
        self.tailer.stop()
        self.thread.join(WAIT)
        if self.error is not None:
            raise self.error


# -- measurements ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Latency:
    """Commit-to-flush latencies of one run, in seconds."""

    mode: str
    samples: tuple[float, ...]

    def pct(self, p: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def follow_latency(base: HandWrittenTable, work: Path, cfg: Config, *, watch: bool) -> Latency:
    """Section 1: commits at a cadence, one tailer following them into a timed JSON lines file."""
    table = base.copy(work / "table")
    n = cfg.latency_commits
    table.write_data(range(1, n + 1))
    sink = TimedJsonLines(str(work / "out.jsonl"))
    config = TailerConfig(
        table=str(table.root), state_dir=str(work / "state"), watch=watch, poll_interval=1.0 if watch else cfg.poll
    )
    following = Following(Tailer(config, sink))
    sink.wait_for(0)
    rng = random.Random(1)
    renamed: dict[int, float] = {}
    due = time.perf_counter()
    for v in range(1, n + 1):
        due += cfg.cadence * rng.uniform(0.5, 1.5)
        time.sleep(max(0.0, due - time.perf_counter()))
        renamed[v] = table.publish(v)
    sink.wait_for(n)
    following.stop()
    check_output(work / "out.jsonl", n)
    return Latency(
        "watching" if watch else f"polling {cfg.poll:g}s", tuple(sink.flushed[v] - renamed[v] for v in renamed)
    )


def check_output(path: Path, last: int) -> None:
    """The output holds exactly one row per version 0..last, the row the commit added."""
    ids = [orjson.loads(line)["id"] for line in path.read_bytes().splitlines()]
    if ids != list(range(last + 1)):
        raise RuntimeError(f"unexpected output in {path}: {len(ids)} rows: {ids[:5]}...{ids[-5:]}")


@dataclass(frozen=True)
class CatchUp:
    """Per-commit seconds of one follower over a range of versions (``times[i]`` for ``versions[i]``)."""

    name: str
    versions: tuple[int, ...]
    times: tuple[float, ...]
    total: float

    def mean(self) -> float:
        return self.total / len(self.times)

    def quarters(self, first: int, last: int) -> list[float]:
        """Mean per-commit time in each quarter of the version range ``first..last``."""
        span = (last - first + 1) / 4
        out = []
        for q in range(4):
            lo, hi = first + q * span, first + (q + 1) * span
            chosen = [t for v, t in zip(self.versions, self.times, strict=True) if lo <= v < hi]
            out.append(statistics.fmean(chosen) if chosen else float("nan"))
        return out


def deltatail_catch_up(root: Path, state: Path, first: int, last: int, *, profile: bool = False) -> CatchUp:
    """deltatail from ``first`` to the end (``until_caught_up``), timed from the sink's open (after start-up)."""
    sink = CountingSink()
    config = TailerConfig(table=str(root), state_dir=str(state), until_caught_up=True, starting_version=first)
    tailer = Tailer(config, sink)
    profiler = cProfile.Profile() if profile else None
    if profiler is not None:
        profiler.enable()
    tailer.run()
    end = time.perf_counter()
    if profiler is not None:
        profiler.disable()
        print("  cProfile of deltatail's catch-up, by own time:")
        report_profile(profiler)
    versions = tuple(range(first, last + 1))
    stamps = [sink.opened] + [sink.done[v] for v in versions]
    times = tuple(b - a for a, b in itertools.pairwise(stamps))
    if sink.rows != len(versions):
        raise RuntimeError(f"deltatail delivered {sink.rows} rows for {len(versions)} one-row commits")
    return CatchUp("deltatail", versions, times, end - sink.opened)


def deltalake_catch_up(root: Path, start: int, versions: Sequence[int]) -> CatchUp:
    """deltalake: ``update_incremental()`` then ``load_cdf(v, v)`` for each version, as a follower does."""
    dt = DeltaTable(str(root), version=start)
    times = []
    for v in versions:
        t0 = time.perf_counter()
        dt.update_incremental()
        rows_read = dt.load_cdf(starting_version=v, ending_version=v).read_all().num_rows
        times.append(time.perf_counter() - t0)
        if rows_read != 1:
            raise RuntimeError(f"deltalake read {rows_read} rows at version {v}")
    return CatchUp("deltalake", tuple(versions), tuple(times), sum(times))


def catch_up_table(root: Path, commits: int) -> HandWrittenTable:
    """Section 2's table: ``commits`` one-file appends after version 0, a checkpoint every 100 commits."""
    table = HandWrittenTable.create(root)
    table.write_data(range(1, commits + 1))
    for v in range(1, commits + 1):
        (table.log_dir / f"{v:020d}.json").write_bytes(table.commit_bytes(v))
        if v % CHECKPOINT_EVERY == 0:
            DeltaTable(str(root)).create_checkpoint()
    return table


#: Idle time between two followed commits in section 3, the same for both followers (each then
#: meets every commit with equally cold caches, as a follower of a live table does).
FOLLOW_GAP = 0.01


def deltatail_follow(
    table: HandWrittenTable, work: Path, first: int, last: int, *, profile: bool = False
) -> tuple[CatchUp, CatchUp, CatchUp]:
    """Section 3, deltatail: commits published one at a time; each timed from its rename to its rows in
    hand (Arrow rows handed to the sink, the end point of deltalake's ``read_all()``), to its rows
    delivered (encoded and written by the JSON lines sink) and to its rows flushed (fsynced)."""
    table.write_data(range(first, last + 1))
    sink = TimedJsonLines(str(work / "out.jsonl"))
    config = TailerConfig(table=str(table.root), state_dir=str(work / "state"), starting_version=first)
    following = Following(Tailer(config, sink), profile=profile)
    time.sleep(0.5)  # start-up: the snapshot at the checkpoint is loaded
    renamed = {}
    for v in range(first, last + 1):
        renamed[v] = table.publish(v)
        sink.wait_for(v)
        time.sleep(FOLLOW_GAP)
    following.stop()
    if following.profiler is not None:
        print("  cProfile of deltatail following (waiting for changes left out), by own time:")
        report_profile(following.profiler, leave_out="acquire")
    versions = tuple(range(first, last + 1))
    in_hand = tuple(sink.in_hand[v] - renamed[v] for v in versions)
    delivered = tuple(sink.delivered[v] - renamed[v] for v in versions)
    flushed = tuple(sink.flushed[v] - renamed[v] for v in versions)
    return (
        CatchUp("deltatail (rows in hand)", versions, in_hand, sum(in_hand)),
        CatchUp("deltatail (rows delivered)", versions, delivered, sum(delivered)),
        CatchUp("deltatail (rows fsynced)", versions, flushed, sum(flushed)),
    )


def deltalake_follow(table: HandWrittenTable, start: int, first: int, last: int) -> CatchUp:
    """Section 3, deltalake: commits published one at a time; ``update_incremental`` + ``load_cdf(v, v)`` each."""
    table.write_data(range(first, last + 1))
    dt = DeltaTable(str(table.root), version=start)
    times = []
    for v in range(first, last + 1):
        table.publish(v)
        t0 = time.perf_counter()
        dt.update_incremental()
        rows_read = dt.load_cdf(starting_version=v, ending_version=v).read_all().num_rows
        times.append(time.perf_counter() - t0)
        if rows_read != 1:
            raise RuntimeError(f"deltalake read {rows_read} rows at version {v}")
        time.sleep(FOLLOW_GAP)
    return CatchUp("deltalake", tuple(range(first, last + 1)), tuple(times), sum(times))


# -- printing --------------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def report_profile(profiler: cProfile.Profile, *, leave_out: str = "") -> None:
    """Print the top functions by own time (skipping lines that mention ``leave_out``)."""
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(
        int(os.environ.get("DELTATAIL_PROFILE_LINES", "14"))  # how many rows of the profile to print
    )
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    for line in lines[start:]:
        if not leave_out or leave_out not in line:
            print("   ", line.replace(str(Path(__file__).resolve().parents[1]) + "/", ""))


def fs_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (Linux ``/proc/mounts``)."""
    try:
        mounts = [line.split() for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    resolved = str(path.resolve())
    best = ("", "unknown")
    for m in mounts:
        if (
            len(m) > 2
            and (resolved == m[1] or resolved.startswith(m[1].rstrip("/") + "/"))
            and len(m[1]) > len(best[0])
        ):
            best = (m[1], m[2])
    return best[1]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def header(argv: Sequence[str], base: Path) -> None:
    print(f"command   {shlex.join([sys.executable, '-m', 'benchmarks.latency', *argv])}")
    print(f"machine   {cpu_model()}, nproc {os.cpu_count()}, {platform.platform()}")
    print(f"versions  python {platform.python_version()}, pyarrow {pa.__version__}, deltalake {deltalake.__version__}")
    print(f"data dir  {base} ({fs_type(base)})")


def section(title: str) -> None:
    print(f"\n== {title}")


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Summary:
    lines: list[str] = field(default_factory=list)


def run(cfg: Config, base: Path, argv: Sequence[str]) -> None:
    header(argv, base)
    summary = Summary()

    section(f"1. commit-to-flush latency, {cfg.latency_commits} one-row commits, one every ~{cfg.cadence * 1000:g} ms")
    template = HandWrittenTable.create(base / "latency-base")
    print(f"  {'mode':<16}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}")
    runs = []
    for watch in (True, False):
        lat = follow_latency(template, base / f"latency-{'watch' if watch else 'poll'}", cfg, watch=watch)
        runs.append(lat)
        print(f"  {lat.mode:<16}" + "".join(f"{ms(lat.pct(p)):>10}" for p in (50, 90, 99, 100)))
    p99 = runs[0].pct(99) * 1000
    met = verdict(p99 < TARGET_P99_MS)
    summary.lines.append(f"p99 commit-to-flush with watching {p99:.1f} ms (target < {TARGET_P99_MS:g} ms): {met}")

    n = cfg.catch_up_commits
    section(f"2. catch-up over {n} one-file appends (checkpoint every {CHECKPOINT_EVERY} commits)")
    t0 = time.perf_counter()
    table = catch_up_table(base / "catch-up", n)
    print(f"  table written in {time.perf_counter() - t0:.1f}s")
    ours = deltatail_catch_up(table.root, base / "catch-up-state", 1, n, profile=cfg.profile)
    sampled = list(range(1, n + 1, cfg.deltalake_stride))
    theirs = deltalake_catch_up(table.root, 0, sampled)
    print(f"  {'follower':<12}{'versions':>10}{'per commit':>13}   per commit by quarter of the log")
    for c in (ours, theirs):
        quarters = "  ".join(f"{q * 1000:7.2f}" for q in c.quarters(1, n))
        print(f"  {c.name:<12}{len(c.versions):>10}{ms(c.mean()):>13}   {quarters}  ms")
    ratio = theirs.mean() / ours.mean()
    q = ours.quarters(1, n)
    summary.lines.append(
        f"catch-up per commit: deltatail {ms(ours.mean())}, deltalake {ms(theirs.mean())} ({len(sampled)} "
        f"versions), {ratio:.1f}x (target >= {TARGET_CATCH_UP_RATIO:g}x): {verdict(ratio >= TARGET_CATCH_UP_RATIO)}; "
        f"deltatail last/first quarter {q[3] / q[0]:.2f}"
    )

    m = cfg.follow_commits
    section(f"3. following a {cfg.big_files:,}-file table, {m} one-file appends published one at a time")
    t0 = time.perf_counter()
    big, cp = big_table(base / "big", cfg.big_files)
    twin = HandWrittenTable(base / "big-twin")
    shutil.copytree(big.root, twin.root)
    print(f"  table written in {time.perf_counter() - t0:.1f}s (checkpoint at version {cp})")
    first, last = cp + 1, cp + m
    in_hand, delivered, flushed = deltatail_follow(big, base / "big-follow", first, last, profile=cfg.profile)
    theirs = deltalake_follow(twin, cp, first, last)
    print(f"  {'follower':<28}{'p50':>10}{'mean':>10}{'max':>10}   mean by quarter of the followed commits")
    for c in (in_hand, delivered, flushed, theirs):
        quarters = "  ".join(f"{x * 1000:6.2f}" for x in c.quarters(first, last))
        print(
            f"  {c.name:<28}{ms(statistics.median(c.times)):>10}{ms(c.mean()):>10}{ms(max(c.times)):>10}   "
            f"{quarters}  ms"
        )
    print("  deltatail: from the commit's rename (inotify wake-up included) to its Arrow rows handed to the")
    print("  JSON lines sink (in hand: the end point of deltalake's read_all()), to their encoding and write")
    print("  (delivered) and to their fsync; deltalake: update_incremental() + load_cdf(v, v).read_all()")
    catch = deltatail_catch_up(big.root, base / "big-catch-up-state", first, last)
    print(f"  deltatail catch-up over the same commits after start-up: {ms(catch.mean())} per commit")
    for c in (in_hand, delivered, flushed):
        ratio = statistics.median(theirs.times) / statistics.median(c.times)
        summary.lines.append(
            f"{cfg.big_files:,}-file table per commit (p50): {c.name} {ms(statistics.median(c.times))}, deltalake "
            f"{ms(statistics.median(theirs.times))}, {ratio:.1f}x (target >= {TARGET_BIG_TABLE_RATIO:g}x): "
            f"{verdict(ratio >= TARGET_BIG_TABLE_RATIO)}"
        )

    section("summary")
    for line in summary.lines:
        print(f"  {line}")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(args)
    tune_for_latency()  # as `deltatail run` does
    if cfg.data_dir is not None:
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="deltatail-latency-", dir=cfg.data_dir))
    try:
        run(cfg, base, args)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
