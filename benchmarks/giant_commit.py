"""Peak memory delivering one giant commit: ``deltatail run`` into each sink, side by side with ``load_cdf``.

Usage::

    python -m benchmarks.giant_commit [--rows 1000000,4000000] [--shapes cdc,rewrite,rewrite-net,dv]
                                      [--sinks jsonl,parquet,kafka,kafka-confluent,feed]
                                      [--flush-rows N] [--data-dir DIR] [--file-rows N] [--dv-files N]
                                      [--repeat N] [--warm K]

Each table is written by ``deltalake`` in appends of ``--file-rows`` rows (one file each), then one
giant commit, the one measured:

- ``cdc``: CDF on, an UPDATE of every row: one commit with a cdc file of ``2 * rows`` pre- and
  post-images (and, as ``deltalake`` writes it, every pre-image before every post-image).
- ``rewrite``: CDF on, an overwrite with every value changed: one commit that removes every file
  and adds one, without cdc files (``rows`` deletes and ``rows`` inserts).
- ``rewrite-net``: the same commit with ``--net-changes --key id`` (``rows`` update pairs).
- ``dv``: a deletion-vector DELETE touching ``--dv-files`` files (10,000). ``deltalake`` writes the
  table in one commit partitioned into that many files, CDF on; ``deltalake`` 1.6.6 cannot write
  deletion vectors, so this benchmark writes the next two commits from the protocol (Delta
  protocol, "Deletion Vectors"): a protocol (reader 3, writer 7, feature ``deletionVectors``) and
  metaData upgrade, then one commit removing every file and adding it back with a relative (``u``)
  DV marking every other row (even row indexes) deleted: ``rows / 2`` deletes, no cdc file. The DVs
  are packed 1,000 to a DV file (version byte, then per DV its big-endian size, ``magic + bitmap``,
  big-endian CRC-32 of the bitmap data).

Each side runs as a child process of its own, and its peak RSS is the child's ``VmHWM`` (the whole
process, interpreter and imports included; deltatail's reader processes, which read only small
files, are not counted). ``deltatail run --until-caught-up`` starts at the
giant commit (``--starting-version``) with a fresh state directory and writes to a ``jsonl:`` file,
a ``parquet:`` directory, or a Kafka topic of a memory-only tansu broker started here
(``--sinks kafka``: ``format=debezium`` keyed by ``id``, :func:`kafka_sink_uri`; ``kafka-confluent``:
the same with ``backend=confluent``). ``load_cdf``
of the same version is read as a stream (``RecordBatchReader``, every batch counted and dropped);
``--sinks feed`` reads it the same way through deltatail's Python API (``ChangeFeed.batches``: the
reading engine every sink sits on, without a sink), the like-for-like comparison. With the
``parquet`` sink, ``load_cdf`` is also streamed into a Parquet file (pyarrow's ``ParquetWriter``, its
default settings, row groups of 65,536 rows): the sink's like-for-like peer.

``--repeat N`` runs every side of a commit ``N`` times, the sides taking turns (side A, B, C, then
A, B, C again), and prints each side's median peak and rows/s with their range: the machine's noise
moves one run's rows/s by 10-25%. ``--warm K`` adds, for ``load_cdf`` and ``feed``, a child that
imports once and reads the commit ``K`` times: its rows/s is the median over reads 2 to ``K``, the
steady state of a running process, without start-up.
"""

from __future__ import annotations

import argparse
import functools
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
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "tailer")]  # the tests' DV writer (tests/ is no package)
from cdf_helpers import write_dv_file  # noqa: E402

SHAPES = ("cdc", "rewrite", "rewrite-net", "dv")
SINKS = ("jsonl", "parquet", "kafka", "kafka-confluent", "feed")
CDF_ON = {"delta.enableChangeDataFeed": "true"}

#: The child that streams ``load_cdf`` of one version and prints its row count.
LOAD_CDF = """
import sys, pyarrow as pa
from deltalake import DeltaTable
v = int(sys.argv[2])
reader = pa.RecordBatchReader.from_stream(DeltaTable(sys.argv[1]).load_cdf(starting_version=v, ending_version=v))
n = 0
while True:
    try:
        n += reader.read_next_batch().num_rows
    except StopIteration:
        break
print(n)
"""

#: The child that streams ``load_cdf`` of one version into one Parquet file (pyarrow's ``ParquetWriter``
#: with its defaults, the batches gathered into row groups of 65,536 rows as the ``parquet:`` sink does)
#: and prints its row count: the like-for-like peer of ``deltatail run`` into a ``parquet:`` directory.
LOAD_CDF_PARQUET = """
import sys, pyarrow as pa, pyarrow.parquet as pq
from deltalake import DeltaTable
v = int(sys.argv[2])
reader = pa.RecordBatchReader.from_stream(DeltaTable(sys.argv[1]).load_cdf(starting_version=v, ending_version=v))
n, held = 0, []
with pq.ParquetWriter(sys.argv[3], reader.schema) as writer:
    for batch in reader:
        held.append(batch)
        n += batch.num_rows
        if sum(b.num_rows for b in held) >= 65536:
            writer.write_table(pa.Table.from_batches(held, reader.schema), row_group_size=65536)
            held = []
    if held:
        writer.write_table(pa.Table.from_batches(held, reader.schema), row_group_size=65536)
print(n)
"""

#: The child that reads the same version through deltatail's Python API (``ChangeFeed.batches``, the
#: reading engine under every sink, no sink) and prints its row count: the like-for-like peer of ``LOAD_CDF``.
FEED = """
import sys
from deltatail import ChangeFeed
v = int(sys.argv[2])
n = 0
for batch in ChangeFeed(sys.argv[1]).batches(starting_version=v, ending_version=v):
    n += batch.rows.num_rows
print(n)
"""

#: The warm children: import once, read the version ``sys.argv[3]`` times, print the rows of one read and
#: the median seconds of the reads after the first (the first pays for opening the table's files first).
WARM = """
import statistics, sys, time
v, reads = int(sys.argv[2]), int(sys.argv[3])
READ
seconds = []
for _ in range(reads):
    started = time.perf_counter()
    n = read()
    seconds.append(time.perf_counter() - started)
print(n, statistics.median(seconds[1:] or seconds))
"""
WARM_LOAD_CDF = WARM.replace(
    "READ",
    """import pyarrow as pa
from deltalake import DeltaTable
def read():
    n = 0
    for b in pa.RecordBatchReader.from_stream(DeltaTable(sys.argv[1]).load_cdf(starting_version=v, ending_version=v)):
        n += b.num_rows
    return n""",
)
WARM_FEED = WARM.replace(
    "READ",
    """from deltatail import ChangeFeed
def read():
    n = 0
    for b in ChangeFeed(sys.argv[1]).batches(starting_version=v, ending_version=v):
        n += b.rows.num_rows
    return n""",
)


def rows_of(first: int, last: int, bump: float) -> pa.Table:
    """Rows ``first..last-1``: ``id``, a ~10-character ``name`` and ``value = id + bump``."""
    ids = pa.array(range(first, last), pa.int64())
    names = pc.binary_join_element_wise(pa.array(["row-"] * (last - first)), pc.cast(ids, pa.string()), "")
    return pa.table({"id": ids, "name": names, "value": pc.add(pc.cast(ids, pa.float64()), bump)})


def write_table(path: Path, rows: int, file_rows: int, shape: str, dv_files: int = 10_000) -> int:
    """Write the table of ``shape`` (module docstring) unless a marker says it is there; returns the giant version."""
    marker = path / "_written"
    if marker.is_file():
        return int(marker.read_text())
    shutil.rmtree(path, ignore_errors=True)
    if shape == "dv":
        version = write_dv_table(path, rows, dv_files)
        marker.write_text(str(version))
        return version
    for first in range(0, rows, file_rows):
        write_deltalake(path, rows_of(first, min(first + file_rows, rows), 0), mode="append", configuration=CDF_ON)
    if shape == "cdc":
        DeltaTable(path).update(updates={"value": "value + 1"})
    else:
        write_deltalake(path, rows_of(0, rows, 1), mode="overwrite")
    version = DeltaTable(path).version()
    marker.write_text(str(version))
    return version


#: DVs per DV file in the ``dv`` shape.
DVS_PER_FILE = 1_000


def write_log(path: Path, version: int, actions: Sequence[dict[str, object]]) -> None:
    """Write commit ``version`` of the table at ``path`` (one JSON action a line)."""
    lines = "".join(json.dumps(a) + "\n" for a in actions)
    (path / "_delta_log" / f"{version:020d}.json").write_text(lines, encoding="utf-8")


def write_dv_table(path: Path, rows: int, files: int) -> int:
    """The ``dv`` shape (module docstring): ``deltalake`` writes ``files`` files, then the DV commit; its version."""
    table = rows_of(0, rows, 0)
    per_file = pa.scalar(max(rows // files, 1), pa.int64())
    table = table.append_column("part", pc.divide(table["id"], per_file))  # integer division: ``files`` parts
    write_deltalake(path, table, partition_by=["part"], configuration=CDF_ON)
    del table
    first = [json.loads(line) for line in (path / "_delta_log" / f"{0:020d}.json").read_text().splitlines()]
    metadata = next(a["metaData"] for a in first if "metaData" in a)
    adds = [a["add"] for a in first if "add" in a]
    now = int(time.time() * 1000)
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["deletionVectors"],
        "writerFeatures": ["changeDataFeed", "deletionVectors"],
    }
    configuration = {**metadata["configuration"], "delta.enableDeletionVectors": "true"}
    upgrade: dict[str, object] = {"commitInfo": {"timestamp": now, "operation": "SET TBLPROPERTIES"}}
    write_log(path, 1, [upgrade, {"protocol": protocol}, {"metaData": {**metadata, "configuration": configuration}}])
    counts = [json.loads(a["stats"])["numRecords"] for a in adds]
    descriptors: list[dict[str, object]] = []
    for at in range(0, len(adds), DVS_PER_FILE):
        descriptors += write_dv_file(path, [range(0, c, 2) for c in counts[at : at + DVS_PER_FILE]])
    actions: list[dict[str, object]] = [{"commitInfo": {"timestamp": now + 1, "operation": "DELETE"}}]
    for add, dv in zip(adds, descriptors, strict=True):
        common = {"path": add["path"], "partitionValues": add["partitionValues"], "size": add["size"]}
        actions.append(
            {"remove": {**common, "deletionTimestamp": now + 1, "dataChange": True, "extendedFileMetadata": True}}
        )
        actions.append({"add": {**common, "modificationTime": now + 1, "dataChange": True, "deletionVector": dv}})
    write_log(path, 2, actions)
    return 2


@dataclass(frozen=True)
class Measure:
    """One child process: rows it delivered or read, peak RSS in MiB, seconds."""

    rows: int
    peak_mib: float
    seconds: float


def measure(command: list[str], env: dict[str, str] | None = None) -> tuple[str, float, float]:
    """Run ``command``; its stdout and stderr, peak RSS (MiB) and seconds. Exits on a failure.

    The peak is the child's ``VmHWM`` (its resident high-water mark since ``exec``), read every 10 ms
    until it exits: ``ru_maxrss`` would count the benchmark's own memory, copied at ``fork``.
    """
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=err)
        peak_kib = 0
        status = Path(f"/proc/{proc.pid}/status")
        while proc.poll() is None:
            try:
                found = re.search(r"^VmHWM:\s+(\d+) kB", status.read_text(), re.MULTILINE)
            except OSError:
                found = None
            if found:
                peak_kib = max(peak_kib, int(found.group(1)))
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{command[:3]} failed ({proc.returncode}):\n{err.read().decode()[-3000:]}")
        return out.read().decode() + err.read().decode(), peak_kib / 1024, seconds


#: The environment of the two reading children: Arrow memory from jemalloc (pyarrow's own setting), as
#: ``deltatail run`` and ``serve`` allocate it; ``load_cdf``'s rows are allocated by deltalake's Rust
#: side, so the setting is for deltatail, given to both so the two children differ only in the reader.
READER_ENV = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}


def run_load_cdf(table: Path, version: int) -> Measure:
    """``load_cdf`` of ``version`` streamed in a child."""
    out, peak, seconds = measure([sys.executable, "-c", LOAD_CDF, str(table), str(version)], READER_ENV)
    return Measure(int(out.strip()), peak, seconds)


def run_load_cdf_parquet(table: Path, version: int, scratch: Path) -> Measure:
    """``load_cdf`` of ``version`` streamed into a Parquet file in a child."""
    target = scratch / f"load_cdf-{uuid.uuid4().hex[:10]}.parquet"
    out, peak, seconds = measure(
        [sys.executable, "-c", LOAD_CDF_PARQUET, str(table), str(version), str(target)], READER_ENV
    )
    target.unlink(missing_ok=True)
    return Measure(int(out.strip()), peak, seconds)


def run_feed(table: Path, version: int) -> Measure:
    """deltatail's ``ChangeFeed`` of ``version`` read as a stream in a child, as :func:`run_load_cdf` reads."""
    out, peak, seconds = measure([sys.executable, "-c", FEED, str(table), str(version)], READER_ENV)
    return Measure(int(out.strip()), peak, seconds)


def run_warm(script: str, table: Path, version: int, reads: int) -> Measure:
    """A warm child (:data:`WARM_LOAD_CDF` or :data:`WARM_FEED`): seconds are its median read's, not its life."""
    out, peak, _ = measure([sys.executable, "-c", script, str(table), str(version), str(reads)], READER_ENV)
    rows, seconds = out.split()
    return Measure(int(rows), peak, float(seconds))


def run_deltatail(table: Path, version: int, sink: str, extra: list[str], scratch: Path) -> Measure:
    """``deltatail run --until-caught-up`` from ``version`` into ``sink`` in a child; rows from its last line."""
    script = Path(sys.executable).parent / "deltatail"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "deltatail"]
    state = tempfile.mkdtemp(prefix="state-", dir=scratch)
    command += ["run", str(table), "--state-dir", state, "--sink", sink, "--starting-version", str(version)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
    out, peak, seconds = measure([*command, *extra, "--until-caught-up"], env)
    return Measure(delivered_rows(out), peak, seconds)


def delivered_rows(output: str) -> int:
    """Rows the run delivered, from its last line (``stopped: V versions, D rows delivered, ...``)."""
    found = re.findall(r"([\d,]+) rows delivered", output)
    if not found:
        raise SystemExit(f"deltatail run did not say what it delivered:\n{output[-2000:]}")
    return int(found[-1].replace(",", ""))


@contextmanager
def broker(wanted: bool) -> Iterator[str | None]:
    """A memory-only tansu broker on 127.0.0.1 when Kafka is measured (``None`` otherwise)."""
    if not wanted:
        yield None
        return
    from benchmarks.kafka_sink import tansu_broker

    with tansu_broker() as bootstrap:
        yield bootstrap


def sink_uri(kind: str, scratch: Path, bootstrap: str | None) -> str:
    """A fresh destination of ``kind``."""
    name = uuid.uuid4().hex[:10]
    if kind == "jsonl":
        return f"jsonl:{scratch / (name + '.jsonl')}"
    if kind == "parquet":
        return f"parquet:{scratch / name}"
    if bootstrap is None:
        raise SystemExit("no broker for the kafka sink")
    uri = kafka_sink_uri(bootstrap, f"giant-{name}")
    return uri + "&backend=confluent" if kind == "kafka-confluent" else uri


def kafka_sink_uri(bootstrap: str, topic: str) -> str:
    """A new topic of 4 partitions, and the sink that writes Debezium events keyed by ``id`` to it.

    With a key, the sink pairs each update's two images into one ``u`` event, so a cdc commit is
    read in key-hash passes (``tailer/read/update_pairs.py``): this side measures that reading.
    """
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="bench")
    admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])
    admin.close()
    return f"kafka://{bootstrap}/{topic}?key=id&format=debezium"


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or reuse) the tables and print peak RSS and rows/s per size, shape and sink."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.giant_commit", description=__doc__)
    parser.add_argument("--rows", default="1000000,4000000", help="comma-separated table sizes")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--sinks", default="jsonl,parquet", help=f"comma-separated, of {', '.join(SINKS)}")
    parser.add_argument("--file-rows", type=int, default=500_000, help="rows per data file before the commit")
    parser.add_argument("--dv-files", type=int, default=10_000, help="files the dv shape's commit touches")
    parser.add_argument("--flush-rows", type=int, default=None, help="deltatail's --flush-rows (default: its own)")
    parser.add_argument("--data-dir", type=Path, default=ROOT / "benchmarks" / ".data" / "giant")
    parser.add_argument("--repeat", type=int, default=1, help="runs of every side, taking turns (medians shown)")
    parser.add_argument("--warm", type=int, default=0, help="reads of a warm load_cdf and feed child (0: none)")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.rows.split(",")]
    shapes = args.shapes.split(",")
    sinks = args.sinks.split(",")
    flush = [] if args.flush_rows is None else ["--flush-rows", str(args.flush_rows)]
    print(f"command   {' '.join([sys.executable, '-m', 'benchmarks.giant_commit', *(argv or sys.argv[1:])])}")
    print(f"machine   nproc {os.cpu_count()}, {platform.platform()}")
    print(f"versions  python {platform.python_version()}, pyarrow {pa.__version__}, deltalake {deltalake.__version__}")
    print(f"{'rows':>11} {'shape':<12} {'side':<26} {'rows out':>11} {'peak RSS':>10} {'rows/s':>12}  range")
    kafka = any(s.startswith("kafka") for s in sinks)
    with broker(kafka) as bootstrap, tempfile.TemporaryDirectory(prefix="giant-") as tmp:
        scratch = Path(tmp)
        for size in sizes:
            for shape in shapes:
                kind = "rewrite" if shape == "rewrite-net" else shape
                layout = args.dv_files if shape == "dv" else args.file_rows
                table = args.data_dir / f"{kind}-{size}-{layout}"
                version = write_table(table, size, args.file_rows, kind, args.dv_files)
                extra = [*flush, "--net-changes", "--key", "id"] if shape == "rewrite-net" else flush
                sides = _sides(table, version, shape, sinks, extra, scratch, bootstrap, args.warm)
                measured: dict[str, list[Measure]] = {name: [] for name, _ in sides}
                for _ in range(max(args.repeat, 1)):
                    for name, run in sides:
                        measured[name].append(run())
                        shutil.rmtree(scratch, ignore_errors=True)
                        scratch.mkdir()
                for name, runs in measured.items():
                    print(f"{size:>11,} {shape:<12} {name:<26} {_figures(runs)}", flush=True)
    return 0


def _sides(
    table: Path,
    version: int,
    shape: str,
    sinks: list[str],
    extra: list[str],
    scratch: Path,
    bootstrap: str | None,
    warm: int,
) -> list[tuple[str, Callable[[], Measure]]]:
    """The sides measured on one commit, in the order they run and print."""
    sides: list[tuple[str, Callable[[], Measure]]] = []
    peers = shape != "rewrite-net"  # load_cdf does not net; the feed has no --net-changes
    if peers:
        sides.append(("load_cdf", lambda: run_load_cdf(table, version)))
        if warm:
            sides.append(("load_cdf (warm)", lambda: run_warm(WARM_LOAD_CDF, table, version, warm)))
    if peers and "parquet" in sinks:
        sides.append(("load_cdf -> parquet", lambda: run_load_cdf_parquet(table, version, scratch)))
    for kind in sinks:
        if kind == "feed":
            if peers:
                sides.append(("deltatail feed", lambda: run_feed(table, version)))
                if warm:
                    sides.append(("deltatail feed (warm)", lambda: run_warm(WARM_FEED, table, version, warm)))
            continue
        sides.append(
            (
                f"deltatail {kind}",
                functools.partial(_run_sink, table, version, kind, extra, scratch, bootstrap),
            )
        )
    return sides


def _run_sink(table: Path, version: int, kind: str, extra: list[str], scratch: Path, bootstrap: str | None) -> Measure:
    return run_deltatail(table, version, sink_uri(kind, scratch, bootstrap), extra, scratch)


def _figures(runs: list[Measure]) -> str:
    """Rows, median peak and median rows/s of a side's runs, and their ranges when there are several."""
    peaks = sorted(m.peak_mib for m in runs)
    rates = sorted(m.rows / max(m.seconds, 1e-9) for m in runs)
    line = f"{runs[0].rows:>11,} {statistics.median(peaks):>7.0f} MiB {statistics.median(rates):>12,.0f}"
    if len(runs) > 1:
        line += f"  {peaks[0]:.0f}-{peaks[-1]:.0f} MiB, {rates[0]:,.0f}-{rates[-1]:,.0f}"
    return line


if __name__ == "__main__":
    raise SystemExit(main())
