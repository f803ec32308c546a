"""Iceberg change rows: catch-up over a long snapshot history and per-snapshot follow cost, next to pyiceberg.

Run ``.venv/bin/python -m benchmarks.iceberg`` (a 200-snapshot table, written once with pyiceberg's SQL
catalog to ``benchmarks/.data/iceberg-200`` and reused), ``--snapshots 1000`` for the issue's 1,000-snapshot
history, or ``--quick`` (100 snapshots, in a temporary directory).

The history: appends of 20 rows, and every tenth snapshot a copy-on-write delete of 3 rows (a data
file rewritten without them). pyiceberg writes ``--per-commit`` (10) of them in one transaction
(``with table.transaction() as tx: tx.append(...)``): each append or delete is still its own snapshot,
child of the one before, with its own manifest list, but the transaction writes one metadata file
and one catalog update. The tailer reads the same snapshots, manifest lists, manifests and data files
either way; only the number of metadata files differs. The first snapshots take well under a second
each; pyiceberg's cost per snapshot then grows with the history (a fast append carries every earlier
manifest over, a delete looks through them), so a 1,000-snapshot build still takes an hour or more
on a loaded machine. A build that was stopped goes on where its last transaction left the table.

The peer is what a pyiceberg user does for a change feed, since pyiceberg has no changelog scan:
scan the new snapshot (``table.scan(snapshot_id=...).to_arrow()``) and diff it with the previous
snapshot's rows (a multiset kept in memory from the last scan: the peer's best case).

1. Catch-up: deltatail's ``IcebergFeed.batches()`` over the whole history, from nothing opened to every
   change row in hand, per snapshot; the peer on a sample of ``--sample`` snapshots spread over the
   history (scanning every snapshot of a 1,000-snapshot table grows with the table: minutes), per snapshot.
2. Following: ``--follow`` times, one append is committed, then each side gets that snapshot's rows:
   deltatail with a feed kept from the catch-up (the newest metadata looked up, the snapshot planned
   against its parent, its files read: what a tailer's step does), the peer by one scan and a diff
   with the previous scan. Median and max.

Target: deltatail at least 10x faster per followed snapshot.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import DoubleType, LongType, NestedField, StringType

from deltatail.tailer.iceberg.feed import IcebergFeed

DATA = Path(__file__).resolve().parent / ".data"
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "score", DoubleType()),
    identifier_field_ids=[1],
)


def rows(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table(
        {"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids], "score": [i * 0.5 for i in ids]},
        schema=SCHEMA.as_arrow(),
    )


def open_catalog(root: Path) -> SqlCatalog:
    root.mkdir(parents=True, exist_ok=True)
    return SqlCatalog("bench", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")


def build(root: Path, snapshots: int, per_commit: int) -> Table:
    """The table with ``snapshots`` snapshots, ``per_commit`` to a transaction (reused when it is there).

    A build that was stopped goes on from the snapshots its committed transactions wrote.
    """
    cat = open_catalog(root)
    if (root / "done").exists():
        return cat.load_table("db.t")
    if cat.table_exists("db.t"):
        t = cat.load_table("db.t")
    else:
        cat.create_namespace_if_not_exists("db")
        t = cat.create_table("db.t", SCHEMA, properties={"format-version": "2"})
    done = len(t.snapshots())
    nxt = 20 * (done - done // 10)  # snapshot i is a delete when i % 10 == 9, else an append of 20 rows
    for first in range(done, snapshots, per_commit):
        with t.transaction() as tx:  # one metadata file, but each append or delete its own snapshot
            for i in range(first, min(first + per_commit, snapshots)):
                if i % 10 == 9:
                    tx.delete(f"id in ({nxt - 30}, {nxt - 50}, {nxt - 70})")
                else:
                    tx.append(rows(nxt, nxt + 20))
                    nxt += 20
        print(f"  {min(first + per_commit, snapshots)} snapshots written", flush=True)
    t = t.refresh()
    if len(t.snapshots()) != snapshots:
        raise SystemExit(f"pyiceberg wrote {len(t.snapshots())} snapshots, not {snapshots}")
    (root / "done").write_text(str(nxt))
    return t


def table_dir(t: Table) -> str:
    return t.metadata_location.split("://", 1)[-1].rsplit("/metadata/", 1)[0]


def ours_catch_up(t: Table) -> tuple[float, int, int]:
    started = time.perf_counter()
    feed = IcebergFeed(table_dir(t))
    count = sum(len(b) for b in feed.batches())
    return time.perf_counter() - started, count, len(feed.current()[1].versions)


def multiset(table: pa.Table) -> Counter[tuple[Any, ...]]:
    return Counter(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))


def peer_diff(t: Table, before: Counter[tuple[Any, ...]], snapshot_id: int) -> tuple[Counter[tuple[Any, ...]], int]:
    after = multiset(t.scan(snapshot_id=snapshot_id).to_arrow())
    return after, sum(((before - after) + (after - before)).values())


def peer_sample(t: Table, sample: int) -> list[float]:
    snaps = t.snapshots()
    step = max(1, len(snaps) // sample)
    times = []
    for i in range(step, len(snaps), step):
        parent = multiset(t.scan(snapshot_id=snaps[i - 1].snapshot_id).to_arrow())
        started = time.perf_counter()
        peer_diff(t, parent, snaps[i].snapshot_id)
        times.append(time.perf_counter() - started)
    return times


def follow(t: Table, times: int, nxt: int) -> tuple[list[float], list[float]]:
    feed = IcebergFeed(table_dir(t))
    for _ in feed.batches():  # warm: a tailer that caught up
        pass
    head = t.current_snapshot()
    assert head is not None
    previous = multiset(t.scan(snapshot_id=head.snapshot_id).to_arrow())
    ours, peer = [], []
    for i in range(times):
        t.append(rows(nxt + i * 20, nxt + i * 20 + 20))
        head = t.current_snapshot()
        assert head is not None and head.sequence_number is not None
        started = time.perf_counter()
        state, ancestry, where = feed.current()
        index = ancestry.index_of_version(head.sequence_number)
        got = feed.plan_table(feed.plan(state, ancestry, index, where)).num_rows
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        previous, changed = peer_diff(t, previous, head.snapshot_id)
        peer.append(time.perf_counter() - started)
        assert got == changed == 20, (got, changed)
    return ours, peer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 snapshots in a temporary directory")
    parser.add_argument("--snapshots", type=int, default=200, help="snapshots in the history (default 200)")
    parser.add_argument("--sample", type=int, default=20, help="snapshots the peer catches up on")
    parser.add_argument("--follow", type=int, default=10, help="followed snapshots")
    parser.add_argument(
        "--per-commit", type=int, default=10, help="snapshots pyiceberg writes in one transaction (default 10)"
    )
    args = parser.parse_args()
    snapshots = 100 if args.quick else args.snapshots
    root = Path(tempfile.mkdtemp()) if args.quick else DATA / f"iceberg-{snapshots}"
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}")
    started = time.perf_counter()
    t = build(root, snapshots, args.per_commit)
    print(f"table: {len(t.snapshots())} snapshots ({time.perf_counter() - started:.1f} s to build or open)")
    total, count, versions = ours_catch_up(t)
    print(
        f"catch-up, deltatail: {total:.2f} s for {versions} snapshots, {count} rows: "
        f"{total / versions * 1e3:.2f} ms a snapshot"
    )
    sampled = peer_sample(t, args.sample)
    print(
        f"catch-up, pyiceberg scan + diff: {statistics.median(sampled) * 1e3:.1f} ms a snapshot "
        f"(median of {len(sampled)} sampled; max {max(sampled) * 1e3:.1f} ms)"
    )
    nxt = int((root / "done").read_text()) if (root / "done").exists() else 10**9
    ours, peer = follow(t.refresh(), args.follow, nxt + 10**7)
    ratio = statistics.median(peer) / statistics.median(ours)
    print(
        f"follow, per snapshot: deltatail {statistics.median(ours) * 1e3:.2f} ms (max {max(ours) * 1e3:.2f}), "
        f"pyiceberg {statistics.median(peer) * 1e3:.1f} ms (max {max(peer) * 1e3:.1f}): {ratio:.0f}x"
    )
    if args.quick:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
