"""``deltatail demo``: watch a table change and see its change rows stream out.

Copies the bundled sample table (``tailer/cli/sample/orders``, written by delta-rs)
to a temporary directory, starts a small writer thread that keeps changing it
(appends, updates, deletes, merges, one commit a second), and runs the tailer
on it into the embedded default sink (JSON lines on stdout), watching the log.
When the writer is done the tailer catches up and exits. The writer needs the
``deltalake`` package (``pip install 'deltatail[demo]'``).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

from deltatail.state.errors import ConfigError
from deltatail.tailer.cli.process import stop_on_signals
from deltatail.tailer.cli.sink_uri import open_sink
from deltatail.tailer.follow.tailer import Tailer, TailerConfig

log = logging.getLogger("deltatail")

SAMPLE = "orders"
SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("region", pa.string()),
        ("customer", pa.string()),
        ("amount", pa.decimal128(10, 2)),
        ("placed_at", pa.timestamp("us", tz="UTC")),
    ]
)
REGIONS = ("emea", "amer", "apac")


def orders(first: int, count: int, region: str) -> pa.Table:
    """``count`` deterministic orders with ids from ``first`` in ``region``."""
    ids = list(range(first, first + count))
    return pa.table(
        {
            "order_id": ids,
            "region": [region] * count,
            "customer": [f"customer-{i % 7}" for i in ids],
            "amount": [Decimal(f"{(i * 37) % 500}.{i % 100:02d}") for i in ids],
            "placed_at": [datetime(2026, 1, 1, 12, i % 60, tzinfo=UTC) for i in ids],
        },
        schema=SCHEMA,
    )


def _deltalake() -> Any:
    try:
        import deltalake
    except ImportError as e:
        raise ConfigError("the demo's writer needs deltalake: pip install 'deltatail[demo]'") from e
    return deltalake


def write_sample(target: Path) -> None:
    """Write the bundled sample table from scratch (appends, delete, update, merge, checkpoint)."""
    dl = _deltalake()
    shutil.rmtree(target, ignore_errors=True)
    config = {"delta.enableChangeDataFeed": "true"}
    dl.write_deltalake(target, orders(1, 5, "emea"), partition_by=["region"], configuration=config)
    dl.write_deltalake(target, orders(6, 5, "amer"), mode="append")
    dl.write_deltalake(target, orders(11, 3, "apac"), mode="append")
    dt = dl.DeltaTable(target)
    dt.delete("order_id = 3")
    dt.update(updates={"customer": "'customer-vip'"}, predicate="order_id = 7")
    _merge(dt, orders(12, 4, "apac"))
    dt.create_checkpoint()
    dl.write_deltalake(target, orders(16, 2, "emea"), mode="append")


def _merge(dt: Any, source: pa.Table) -> None:
    (
        dt.merge(source, predicate="t.order_id = s.order_id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )


def keep_changing(table: Path, commits: int, interval: float, stop: threading.Event) -> None:
    """Commit ``commits`` changes to ``table``, one every ``interval`` seconds, cycling through kinds."""
    dl = _deltalake()
    next_id = 1000
    for i in range(commits):
        if stop.wait(interval):
            return
        dt = dl.DeltaTable(table)
        kind = i % 4
        if kind == 0:
            dl.write_deltalake(table, orders(next_id, 3, REGIONS[i % 3]), mode="append")
            next_id += 3
        elif kind == 1:
            dt.update(updates={"customer": f"'customer-upgraded-{i}'"}, predicate=f"order_id = {next_id - 2}")
        elif kind == 2:
            dt.delete(f"order_id = {next_id - 1}")
        else:
            _merge(dt, orders(next_id - 3, 2, REGIONS[i % 3]))
        log.info("demo writer: commit %d of %d (%s)", i + 1, commits, ("append", "update", "delete", "merge")[kind])


def run_demo(commits: int = 8, interval: float = 1.0) -> int:
    """Run the demo; returns the number of change rows delivered."""
    _deltalake()
    with tempfile.TemporaryDirectory(prefix="deltatail-demo-") as tmp:
        table = Path(tmp) / SAMPLE
        shutil.copytree(Path(__file__).parent / "sample" / SAMPLE, table)
        log.info("demo: tailing a copy of the sample table at %s; a writer changes it every %.1fs", table, interval)
        config = TailerConfig(table=str(table), state_dir=str(Path(tmp) / "state"), poll_interval=0.5)
        tailer = Tailer(config, open_sink("jsonl:-"))
        stop_on_signals(tailer.stop)
        stop = threading.Event()

        def writer() -> None:
            try:
                keep_changing(table, commits, interval, stop)
            finally:
                time.sleep(interval)
                config.until_caught_up = True  # the loop rereads it: exit once everything is delivered

        thread = threading.Thread(target=writer, name="demo-writer", daemon=True)
        thread.start()
        try:
            progress = tailer.run()
        finally:
            stop.set()
            thread.join(timeout=30)
        return progress.rows
