"""Lance change rows per second and per-version follow latency: deltatail next to Lance's own tools.

Run ``.venv/bin/python -m benchmarks.lance`` (a few minutes on two cores; the 10,000,000-row dataset
is written once to ``benchmarks/.data/lance-10m`` and reused) or ``--quick`` (1,000,000 rows).

1. Change rows per second for one version of a 10,000,000-row dataset with stable row ids (ten
   fragments of 1,000,000 rows): an append of 100,000 rows, and a delete of 1,000 rows spread over
   every fragment. deltatail (``LanceFeed.batches(v, v)``: manifests, deletion files, planning, rows
   with their change columns) against

   - Lance's ``DatasetDelta`` (``ds.delta(begin_version=v-1, end_version=v)``): ``get_inserted_rows``
     for the append; for the delete, ``get_deleted_row_ids`` gives ids only, so the rows are then
     taken at ``v-1`` by those ids (``_take_rows``), to compare like with like;
   - a version-to-version scan: both versions read whole with ``_rowid``, rows whose id is only on
     one side kept (``pyarrow.compute.is_in``).

   Every side is timed from nothing opened to every row in hand; median of ``--runs`` interleaved runs.
2. Per-version follow latency: a :class:`~tailer.lance.follow.LanceTailer` follows a dataset (watching
   ``_versions/`` with inotify) into the JSON lines file sink, whose flushes are time-stamped; a
   writer in this process appends 10 rows every ``--cadence`` seconds. Latency is the flush time minus
   the time ``write_dataset`` returned (the manifest is in place by then): p50, p99, max.

Target: deltatail at least as fast as the faster peer in section 1.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.feed import ChangeBatch
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.lance.feed import LanceFeed
from deltatail.tailer.lance.follow import LanceTailer

DATA = Path(__file__).resolve().parent / ".data"


def table(lo: int, hi: int) -> pa.Table:
    ids = pa.array(np.arange(lo, hi, dtype=np.int64))
    return pa.table({"id": ids, "name": pc.cast(ids, pa.string()), "score": pc.multiply(ids.cast(pa.float64()), 0.5)})


def build(root: Path, rows: int) -> tuple[int, int]:
    """The dataset (reused when there): returns the versions of the append and of the delete."""
    marker = root / "benchmark-versions"
    if marker.exists():
        append, delete = map(int, marker.read_text().split())
        return append, delete
    shutil.rmtree(root, ignore_errors=True)
    step = 1_000_000
    for lo in range(0, rows, step):
        lance.write_dataset(
            table(lo, min(lo + step, rows)),
            str(root),
            mode="append" if lo else "create",
            enable_stable_row_ids=True,
            max_rows_per_file=step,
        )
    lance.write_dataset(table(rows, rows + 100_000), str(root), mode="append")
    append = lance.dataset(str(root)).version
    stride = rows // 1000
    lance.dataset(str(root)).delete(f"id < {rows} AND id % {stride} = 7")
    delete = lance.dataset(str(root)).version
    marker.write_text(f"{append} {delete}")
    return append, delete


def deltatail_rows(root: Path, version: int) -> int:
    return sum(len(b) for b in LanceFeed(str(root)).batches(version, version))


def delta_rows(root: Path, version: int, kind: str) -> int:
    ds = lance.dataset(str(root), version=version)
    delta = ds.delta(begin_version=version - 1, end_version=version)
    if kind == "append":
        return int(delta.get_inserted_rows().read_all().num_rows)
    ids = delta.get_deleted_row_ids().read_all().column("_rowid")
    before = lance.dataset(str(root), version=version - 1)
    return int(before._take_rows(ids.combine_chunks()).num_rows)


def scan_rows(root: Path, version: int) -> int:
    before = lance.dataset(str(root), version=version - 1).to_table(with_row_id=True)
    after = lance.dataset(str(root), version=version).to_table(with_row_id=True)
    gone = before.filter(pc.invert(pc.is_in(before["_rowid"], value_set=after["_rowid"])))
    new = after.filter(pc.invert(pc.is_in(after["_rowid"], value_set=before["_rowid"])))
    return int(gone.num_rows + new.num_rows)


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    n = fn()
    return time.perf_counter() - start, n


def rates(root: Path, runs: int) -> None:
    append, delete = build(root, ROWS)
    print(f"dataset   {root}: {lance.dataset(str(root), version=append - 1).count_rows():,} rows before the append")
    print(f"{'version':<28}{'side':<34}{'rows':>9}{'median s':>11}{'rows/s':>14}")
    for label, version, kind in (
        ("append of 100,000 rows", append, "append"),
        ("delete of 1,000 rows", delete, "delete"),
    ):
        sides: dict[str, Callable[[], int]] = {
            "deltatail LanceFeed": functools.partial(deltatail_rows, root, version),
            "DatasetDelta" + (" (ids + take)" if kind == "delete" else ""): functools.partial(
                delta_rows, root, version, kind
            ),
            "version-to-version scan": functools.partial(scan_rows, root, version),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        counts: dict[str, int] = {}
        for _ in range(runs):
            for name, fn in sides.items():
                seconds, n = timed(fn)
                times[name].append(seconds)
                counts[name] = n
        for name in sides:
            med = statistics.median(times[name])
            print(f"{label:<28}{name:<34}{counts[name]:>9,}{med:>11.4f}{counts[name] / med:>14,.0f}")


class StampedSink(JsonLinesSink):
    """The JSON lines file sink, recording when each flush returned and how many rows it held."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.flushes: list[tuple[float, int]] = []
        self.rows = 0

    def write(self, batch: ChangeBatch) -> None:
        super().write(batch)
        self.rows += len(batch)

    def flush(self) -> None:
        super().flush()
        self.flushes.append((time.monotonic(), self.rows))


def latency(commits: int, cadence: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ds"
        lance.write_dataset(table(0, 1000), str(root), enable_stable_row_ids=True)
        sink = StampedSink(str(Path(tmp) / "out.jsonl"))
        config = TailerConfig(
            table=str(root), state_dir=str(Path(tmp) / "state"), poll_interval=1.0, checkpoint_seconds=5.0
        )
        tailer = LanceTailer(config, sink)
        thread = threading.Thread(target=tailer.run)
        thread.start()
        while sink.rows < 1000:
            time.sleep(0.01)
        written: list[tuple[float, int]] = []
        rows = 1000
        for i in range(commits):
            lance.write_dataset(table(10_000 + 10 * i, 10_010 + 10 * i), str(root), mode="append")
            rows += 10
            written.append((time.monotonic(), rows))
            time.sleep(cadence)
        deadline = time.monotonic() + 30
        while sink.rows < rows and time.monotonic() < deadline:
            time.sleep(0.01)
        tailer.stop()
        thread.join(30)
        lat = []
        for at, total in written:
            flushed = next(t for t, n in sink.flushes if n >= total)
            lat.append((flushed - at) * 1000)
        lat.sort()
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        print(
            f"follow latency, {commits} appends every {cadence}s (write_dataset returned -> rows flushed): "
            f"p50 {statistics.median(lat):.1f} ms, p99 {p99:.1f} ms, max {lat[-1]:.1f} ms"
        )


ROWS = 10_000_000


def main() -> None:
    global ROWS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000,000 rows, 2 runs, 20 commits")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--cadence", type=float, default=0.2)
    args = parser.parse_args()
    if args.quick:
        ROWS, args.runs, args.commits = 1_000_000, 2, 20
    print(
        f"machine   {platform.processor() or platform.machine()}, nproc {os.cpu_count()}, python "
        f"{platform.python_version()}, pyarrow {pa.__version__}, pylance {lance.__version__}"
    )
    rates(DATA / f"lance-{ROWS // 1_000_000}m", args.runs)
    latency(args.commits, args.cadence)


if __name__ == "__main__":
    main()
