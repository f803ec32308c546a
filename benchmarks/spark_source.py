"""Figures for the Spark source (:mod:`sinks.spark`), next to the standalone :class:`~tailer.read.feed.ChangeFeed`.

Run ``.venv/bin/python -m benchmarks.spark_source`` (a few minutes on two cores)
or add ``--quick`` for a smoke run. Sections:

1. Throughput: rows/s of every change row of a table with large cdc files
   (deltalake writes it with the change data feed on: an insert of N rows,
   then an UPDATE of a third, a MERGE of a quarter, a DELETE of a fifth), read
   by ``ChangeFeed.batches``, by a Spark batch read and by a Spark stream
   (``availableNow``), both into Spark's ``noop`` sink. Spark runs ``local[2]``.
2. Planning: the driver's time for one micro-batch (``latestOffset`` +
   ``partitions`` + ``commit``) after 10 new commits, on log-only tables whose
   log holds 100, 1000 and 2000 commits after a checkpoint, next to a restart
   (a new reader from the same offset, which rebuilds its snapshot).
3. Giant commit (``--giant``; alone, as it starts a Spark per side): one UPDATE of every row of a
   table with the change data feed on, partitioned so the commit holds 16 cdc files, streamed with
   ``maxFilesPerTrigger=1`` into a ``foreachBatch`` that collects each micro-batch to Arrow in the
   driver (``toArrow``), with ``splitCommits=auto`` (the commit admitted whole, as Delta does) and
   ``always`` (a cdc file per micro-batch), next to deltalake's ``load_cdf`` of the same version read
   whole (``read_all``). Each side is a child process; its peak is that process's ``VmHWM`` (the
   Python driver, where ``toArrow`` lands; Spark's JVM not counted).

Every time is a median of several repetitions (counts printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyspark
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable

from benchmarks.workload import TableSpec, generate_table
from deltatail.sinks.spark import DeltaTailDataSource, DeltaTailStreamReader, register
from deltatail.tailer.read.feed import ChangeFeed

NEW_COMMITS = 10
#: Partitions (so cdc files) of the giant commit's table.
GIANT_PARTS = 16


@dataclass(frozen=True)
class Config:
    """Sizes and repetitions of one run."""

    rows: int
    log_sizes: tuple[int, ...]
    repeat: int
    quick: bool
    giant: bool = False
    child: tuple[str, str] | None = None


def parse_args(argv: Sequence[str] | None) -> Config:
    """The run's :class:`Config` from the command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.spark_source", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few repetitions (a smoke run)")
    p.add_argument("--rows", type=int, help="rows of the throughput (or giant commit's) table (default 2000000)")
    p.add_argument("--giant", action="store_true", help="only the giant commit section")
    p.add_argument("--child", nargs=2, metavar=("SIDE", "TABLE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    child = None if args.child is None else (args.child[0], args.child[1])
    if args.quick:
        return Config(args.rows or 200_000, (100, 1000), 3, True, args.giant, child)
    return Config(args.rows or 2_000_000, (100, 1000, 2000), 5, False, args.giant, child)


def median_time(fn: Callable[[], object], repeat: int) -> tuple[float, Any]:
    """The median wall time of ``fn`` over ``repeat`` runs, and its last result."""
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def row(*cells: object, widths: Sequence[int] = (34, 12, 10, 12)) -> None:
    print(
        "  ".join(f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(cells, widths, strict=False)))
    )


# -- throughput ------------------------------------------------------------------------------------


def write_table(root: Path, rows: int) -> None:
    """Version 0 inserts ``rows`` rows; 1 updates a third, 2 merges a quarter (half new), 3 deletes a fifth."""
    ids = pa.array(range(rows), pa.int64())
    data = pa.table(
        {"id": ids, "name": pc.cast(ids, pa.string()), "amount": pc.multiply(pc.cast(ids, pa.float64()), 0.25)}
    )
    write_deltalake(str(root), data, configuration={"delta.enableChangeDataFeed": "true"})
    table = DeltaTable(str(root))
    table.update({"amount": "amount + 1"}, predicate="id % 3 = 0")
    source = data.slice(rows - rows // 8, rows // 8)
    extra = pa.array(range(rows, rows + rows // 8), pa.int64())
    source = pa.concat_tables(
        [source, pa.table({"id": extra, "name": pc.cast(extra, pa.string()), "amount": pc.cast(extra, pa.float64())})]
    )
    table.merge(
        source, "s.id = t.id", source_alias="s", target_alias="t"
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    table.delete("id % 5 = 0")


def spark_session() -> SparkSession:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # loopback only, also for the JVM
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("deltatail-benchmark")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def standalone_rows(root: Path) -> int:
    return sum(len(b) for b in ChangeFeed(str(root)).batches(0))


def spark_batch(spark: SparkSession, root: Path) -> None:
    spark.read.format("deltatail").option("startingVersion", 0).load(str(root)).write.format("noop").mode(
        "overwrite"
    ).save()


def spark_stream(spark: SparkSession, root: Path, scratch: Path) -> None:
    checkpoint = Path(tempfile.mkdtemp(dir=scratch, prefix="ck-"))
    stream = spark.readStream.format("deltatail").option("startingVersion", 0).load(str(root))
    query = (
        stream.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    query.awaitTermination()


def throughput(cfg: Config, scratch: Path, spark: SparkSession) -> None:
    root = scratch / "cdc-table"
    t0 = time.perf_counter()
    write_table(root, cfg.rows)
    plans = list(ChangeFeed(str(root)).plans(0))
    cdc_files = sum(1 for p in plans for t in p.tasks if t.is_cdc)
    cdc_bytes = sum(t.size or 0 for p in plans for t in p.tasks if t.is_cdc)
    mib = cdc_bytes / 2**20
    print(
        f"\n== Throughput: {cfg.rows:,} rows, {len(plans)} commits, {cdc_files} cdc files ({mib:.1f} MiB), "
        f"written in {time.perf_counter() - t0:.1f} s; Spark local[2]"
    )
    spark_batch(spark, root)  # warm up the JVM and the Python workers
    rows = standalone_rows(root)
    row("reader", "rows", "seconds", "rows/s")
    for name, fn in (
        ("ChangeFeed.batches (standalone)", lambda: standalone_rows(root)),
        ("Spark batch read -> noop", lambda: spark_batch(spark, root)),
        ("Spark stream availableNow -> noop", lambda: spark_stream(spark, root, scratch)),
    ):
        seconds, _ = median_time(fn, cfg.repeat)
        row(name, f"{rows:,}", f"{seconds:.2f}", f"{rows / seconds:,.0f}")
    print(f"  (median of {cfg.repeat})")


# -- planning --------------------------------------------------------------------------------------


def reader_at(root: Path) -> DeltaTailStreamReader:
    source = DeltaTailDataSource({"path": str(root), "startingVersion": "latest"})
    reader = source.streamReader(source.schema())
    assert isinstance(reader, DeltaTailStreamReader)
    return reader


def micro_batch(reader: DeltaTailStreamReader, start: dict[str, Any]) -> tuple[dict[str, Any], int]:
    end = reader.latestOffset(start, ReadAllAvailable())
    parts = reader.partitions(start, end)
    reader.commit(end)
    return end, len(parts)


def plan_timings(root: Path, grow: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median seconds of one incremental micro-batch, and of a restarted query's first one (same offsets)."""
    reader = reader_at(root)
    start = reader.initialOffset()
    batch_times, restart_times = [], []
    for _ in range(repeat):
        for _ in range(NEW_COMMITS):
            grow()
        t0 = time.perf_counter()
        end, parts = micro_batch(reader, start)
        batch_times.append(time.perf_counter() - t0)
        assert parts == 2 * NEW_COMMITS and reader.planner.rebuilds == 1
        t0 = time.perf_counter()
        micro_batch(reader_at(root), start)  # a restarted query: schema, then the snapshot is rebuilt
        restart_times.append(time.perf_counter() - t0)
        start = end
    return statistics.median(batch_times), statistics.median(restart_times)


def planning(cfg: Config, scratch: Path) -> None:
    print(
        f"\n== Planning one micro-batch of {NEW_COMMITS} new commits (log-only tables: 1000 live files, a checkpoint,"
    )
    print("   then the commits, each replacing one file: 2 file tasks per commit)")
    widths = (20, 10, 12, 12)
    row("commits in the log", "batch ms", "per commit", "restart ms", widths=widths)
    for size in cfg.log_sizes:
        spec = TableSpec(files=1000, tail_commits=size, files_per_commit=1000, partitions=10)
        table = generate_table(scratch / f"log-{size}", spec)
        commits = table.latest_version + 1
        batch, restart = plan_timings(table.root, table.append_replace_commit, cfg.repeat)
        row(
            f"{commits:,}",
            f"{batch * 1e3:.2f}",
            f"{batch * 1e3 / NEW_COMMITS:.3f}",
            f"{restart * 1e3:.1f}",
            widths=widths,
        )
    print(f"  (median of {cfg.repeat}; batch = latestOffset + partitions + commit on the running reader;")
    print("   restart = a new query's first micro-batch from the same offset: schema, snapshot rebuild, planning)")


# -- giant commit ----------------------------------------------------------------------------------


def write_giant(root: Path, rows: int) -> None:
    """Version 0 inserts ``rows`` rows in ``GIANT_PARTS`` partitions; version 1 updates every row."""
    ids = pa.array(range(rows), pa.int64())
    data = pa.table(
        {"id": ids, "name": pc.cast(ids, pa.string()), "p": pc.cast(pc.bit_wise_and(ids, GIANT_PARTS - 1), pa.string())}
    )
    write_deltalake(str(root), data, partition_by=["p"], configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(root)).update({"name": "concat(name, '+')"})


def peak_mib() -> float:
    """This process's resident high-water mark (``VmHWM``), MiB."""
    found = re.search(r"^VmHWM:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(found.group(1)) / 1024 if found else float("nan")


def giant_child(side: str, root: Path) -> dict[str, Any]:
    """One side of the giant-commit section, in this (child) process."""
    t0 = time.perf_counter()
    if side == "load_cdf":
        rows = DeltaTable(str(root)).load_cdf(starting_version=1, ending_version=1).read_all()
        return {"batches": 1, "largest": rows.num_rows, "rows": rows.num_rows, "seconds": time.perf_counter() - t0}
    spark = spark_session()
    sizes: list[int] = []

    def collect(df: Any, batch_id: int) -> None:
        sizes.append(df.toArrow().num_rows)

    stream = (
        spark.readStream.format("deltatail")
        .option("startingVersion", 1)
        .option("maxFilesPerTrigger", 1)
        .option("splitCommits", side)
        .load(str(root))
    )
    checkpoint = tempfile.mkdtemp(dir=root.parent, prefix="ck-")
    t0 = time.perf_counter()
    stream.writeStream.foreachBatch(collect).trigger(availableNow=True).option(
        "checkpointLocation", checkpoint
    ).start().awaitTermination()
    seconds = time.perf_counter() - t0
    spark.stop()
    return {"batches": len(sizes), "largest": max(sizes), "rows": sum(sizes), "seconds": seconds}


def giant(cfg: Config, scratch: Path) -> None:
    root = scratch / "giant"
    t0 = time.perf_counter()
    write_giant(root, cfg.rows)
    print(
        f"\n== Giant commit: an UPDATE of {cfg.rows:,} rows in {GIANT_PARTS} partitions "
        f"({2 * cfg.rows:,} cdc rows in {GIANT_PARTS} cdc files), written in {time.perf_counter() - t0:.1f} s; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    widths = (34, 10, 14, 12, 10, 10)
    row("side", "batches", "largest batch", "rows", "seconds", "peak MiB", widths=widths)
    for side, name in (
        ("auto", "Spark splitCommits=auto (whole)"),
        ("always", "Spark splitCommits=always"),
        ("load_cdf", "deltalake load_cdf read_all"),
    ):
        command = [sys.executable, "-m", "benchmarks.spark_source", "--child", side, str(root)]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{name}: failed\n{done.stderr[-3000:]}")
            continue
        got = json.loads(done.stdout.strip().splitlines()[-1])
        row(
            name,
            got["batches"],
            f"{got['largest']:,}",
            f"{got['rows']:,}",
            f"{got['seconds']:.1f}",
            f"{got['peak']:.0f}",
            widths=widths,
        )
    print(f"  (one run; maxFilesPerTrigger=1; load average after: {os.getloadavg()[0]:.1f})")


def main(argv: Sequence[str] | None = None) -> None:
    cfg = parse_args(argv)
    if cfg.child is not None:
        result = giant_child(cfg.child[0], Path(cfg.child[1]))
        print(json.dumps({**result, "peak": peak_mib()}))
        return
    print(
        f"benchmarks.spark_source{' --quick' if cfg.quick else ''}: python {platform.python_version()}, "
        f"pyspark {pyspark.__version__}, {os.cpu_count()} cpus, {platform.machine()}"
    )
    scratch = Path(tempfile.mkdtemp(prefix="deltatail-spark-bench-"))
    try:
        if cfg.giant:
            giant(cfg, scratch)
            return
        planning(cfg, scratch)
        spark = spark_session()
        try:
            throughput(cfg, scratch, spark)
        finally:
            spark.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
