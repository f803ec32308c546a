"""``deltatail serve`` with Lance datasets (issue #22): Lance datasets and Delta tables followed by one service.

The service runs as ``deltatail serve --config FILE`` in another process, following a Delta table
and a Lance dataset it discovers under one root and a Lance dataset named in ``[[tables]]`` (by
``format = "lance"``), while this test writes new versions to all three. Each output must hold every
change row exactly once and equal the standalone feed of its table: ``ChangeFeed(path).read_table``
for the Delta table, ``LanceFeed(path).read_table`` for the Lance datasets (each checked against its
format's own reader elsewhere). The service is then stopped, a version is written to each, and a
restart delivers only those.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import lance
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from lance_datasets import rows

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.errors import ConfigError, TableNotFoundError
from deltatail.state.filters import ChangeFilter
from deltatail.tailer.cli.model import ServeTableSettings
from deltatail.tailer.cli.serve import check_tables, load_serve_config, source
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.lance.dataset import is_lance_dataset
from deltatail.tailer.lance.feed import LanceFeed, LanceOptions
from deltatail.tailer.lance.follow import LanceTailer, lance_state_id
from deltatail.tailer.read.feed import ChangeFeed
from deltatail.tailer.serve.discovery import find_tables

ROOT = Path(__file__).resolve().parents[2]
Row = tuple[Any, ...]


def delta_rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def make_lake(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A lake with a Delta table and a Lance dataset, and a Lance dataset outside it."""
    lake = tmp_path / "lake"
    orders, vectors, other = lake / "orders", lake / "ml" / "vectors", tmp_path / "elsewhere" / "docs"
    write_deltalake(str(orders), delta_rows([1, 2, 3]))
    lance.write_dataset(rows(range(100)), str(vectors), enable_stable_row_ids=True, max_rows_per_file=40)
    lance.write_dataset(rows(range(50)), str(other))
    return lake, orders, vectors, other


def write_versions(orders: Path, vectors: Path, other: Path, step: int) -> None:
    base = 1000 * (step + 1)
    write_deltalake(str(orders), delta_rows([base, base + 1]), mode="append")
    DeltaTable(str(orders)).delete(f"id = {base}")
    lance.write_dataset(rows(range(base, base + 20)), str(vectors), mode="append")
    lance.dataset(str(vectors)).update({"score": "score + 1"}, where=f"id % 9 = {step}")
    lance.dataset(str(vectors)).delete(f"id % 13 = {step}")
    lance.dataset(str(other)).delete(f"id = {step}")
    lance.write_dataset(rows([base]), str(other), mode="append")


def lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def keyed(records: list[dict[str, Any]], columns: list[str]) -> Counter[Row]:
    return Counter(tuple(r[c] for c in [*columns, "_change_type", "_commit_version"]) for r in records)


def expected_delta(path: Path) -> Counter[Row]:
    return keyed(ChangeFeed(str(path)).read_table(0).to_pylist(), ["id", "v"])


def expected_lance(path: Path) -> Counter[Row]:
    return keyed(LanceFeed(str(path)).read_table(1).to_pylist(), ["id", "name", "score"])


def start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    before = log.stat().st_size if log.exists() else 0
    err = log.open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "deltatail", "serve", "--config", str(config)], cwd=ROOT, stderr=err)
    deadline = time.monotonic() + 60
    while not re.search(rb"following table \S+", log.read_bytes()[before:]):
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "the service did not start: " + log.read_text()[-3000:]
        time.sleep(0.1)
    return proc


def wait_until_equal(out: Path, lake: Path, other: Path, log: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        got = {name: lines(out / f"{name}.jsonl") for name in ("orders", "ml.vectors", "docs")}
        done = (
            keyed(got["orders"], ["id", "v"]) == expected_delta(lake / "orders")
            and keyed(got["ml.vectors"], ["id", "name", "score"]) == expected_lance(lake / "ml" / "vectors")
            and keyed(got["docs"], ["id", "name", "score"]) == expected_lance(other)
        )
        if done:
            for name, records in got.items():
                positions = [tuple(r["_position"]) for r in records]
                assert len(positions) == len(set(positions)), f"{name}: rows repeated"
            return
        assert time.monotonic() < deadline, f"outputs never matched their feeds: {log.read_text()[-3000:]}"
        time.sleep(0.3)


@pytest.mark.slow
def test_one_service_follows_delta_and_lance_tables(tmp_path: Path) -> None:
    lake, orders, vectors, other = make_lake(tmp_path)
    out, state = tmp_path / "out", tmp_path / "state"
    config = tmp_path / "serve.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [service]
            state_root = "{state}"
            listen = "off"
            discover_seconds = 0.5

            [defaults]
            sink = "jsonl:{out}/{{table_name}}.jsonl"
            checkpoint_seconds = 0.3
            poll_interval = 0.2

            [[tables]]
            path = "{other}"
            format = "lance"

            [[discover]]
            root = "{lake}"
            """
        )
    )
    out.mkdir()
    log = tmp_path / "serve.log"
    proc = start(config, log)
    try:
        for step in range(3):
            write_versions(orders, vectors, other, step)
            time.sleep(0.3)
        wait_until_equal(out, lake, other, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
    assert (state / lance_state_id(str(vectors)) / "cursor.json").exists()
    status = json.loads((state / lance_state_id(str(other)) / "status.json").read_text())
    assert status["state"] == "stopped" and status["delivered_version"] == lance.dataset(str(other)).version

    write_versions(orders, vectors, other, 3)  # while stopped: a restart delivers these, and nothing again
    proc = start(config, log)
    try:
        wait_until_equal(out, lake, other, log)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def test_discovery_finds_lance_datasets_and_delta_tables(tmp_path: Path) -> None:
    lake, orders, vectors, _ = make_lake(tmp_path)
    (lake / "empty" / "_versions").mkdir(parents=True)  # no manifest: not a dataset
    (lake / "empty" / "_versions" / "latest_version_hint.json").write_text("{}")
    assert find_tables(str(lake)) == [str(vectors), str(orders)]
    assert is_lance_dataset(vectors) and not is_lance_dataset(orders) and not is_lance_dataset(lake / "empty")


def serve_config(tmp_path: Path, body: str) -> Path:
    config = tmp_path / "serve.toml"
    config.write_text(f'[service]\nstate_root = "{tmp_path / "state"}"\n' + body)
    return config


def test_table_formats_in_the_configuration(tmp_path: Path) -> None:
    _, orders, vectors, other = make_lake(tmp_path)
    body = (
        f'[[tables]]\npath = "lance://{other}"\n'  # by prefix
        f'[[tables]]\npath = "{vectors}"\n'  # by layout
        f'[[tables]]\npath = "{orders}"\nformat = "delta"\n'
    )
    config = load_serve_config(str(serve_config(tmp_path, body)))
    sources = [source(name, settings) for name, settings in config.tables]
    assert [(s.name, s.table_format, s.config.table) for s in sources] == [
        ("docs", "lance", str(other)),
        ("vectors", "lance", str(vectors)),
        ("orders", "delta", str(orders)),
    ]
    check_tables(sources)
    twice = load_serve_config(str(serve_config(tmp_path, body + f'[[tables]]\nname = "again"\npath = "{other}"\n')))
    with pytest.raises(ConfigError, match="same table"):
        check_tables([source(name, settings) for name, settings in twice.tables])


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('format = "hudi"', "format must be one of delta, iceberg, lance"),
        ('format = "lance"\nnet_changes = true', "Lance dataset: net_changes apply to Delta tables only"),
        ('format = "lance"\nwhere = "nope > 1"', "nope"),
    ],
)
def test_lance_table_errors_name_the_table(tmp_path: Path, entry: str, message: str) -> None:
    _, _, vectors, _ = make_lake(tmp_path)
    with pytest.raises(ConfigError, match=message):
        config = load_serve_config(str(serve_config(tmp_path, f'[[tables]]\npath = "{vectors}"\n{entry}\n')))
        check_tables([source(name, settings) for name, settings in config.tables])
    with pytest.raises(ConfigError, match="lance:// path, but format is delta"):
        source("x", ServeTableSettings(path=f"lance://{vectors}", format="delta"))
    with pytest.raises(TableNotFoundError):
        LanceFeed(str(tmp_path), options=LanceOptions(filter=ChangeFilter(where="id > 1"))).check_filter()


def test_lance_tailer_steps_and_keeps_stats(tmp_path: Path) -> None:
    """The step interface the service uses: open, step (bounded), rest, checkpoint, close; figures as it goes."""
    root = tmp_path / "ds"
    lance.write_dataset(rows(range(10)), str(root))
    for i in range(4):
        lance.write_dataset(rows([100 + i]), str(root), mode="append")
    stats = TableStats(str(root), "ds")
    config = TailerConfig(table=str(root), state_dir=str(tmp_path / "state"), checkpoint_seconds=3600)
    out = tmp_path / "out.jsonl"
    tailer = LanceTailer(config, JsonLinesSink(str(out)), stats=stats)
    tailer.open()
    try:
        assert tailer.step(2) == 2 and stats.state.value == "catching_up"
        assert (stats.delivered_version, stats.newest_version, stats.commits) == (2, 5, 2)
        assert tailer.step(10) == 3 and tailer.step(10) == 0
        tailer.rest()
        assert stats.state is TableState.FOLLOWING and stats.versions_behind == 0
        assert stats.rows["insert"] == 14 and stats.bytes["insert"] > 0
        assert 0 < tailer.idle_timeout(5.0) <= 5.0
        tailer.checkpoint()
        assert stats.last_checkpoint is not None
    finally:
        tailer.close()
    assert stats.state.value == "stopped"
    assert [r["id"] for r in lines(out)] == [*range(10), 100, 101, 102, 103]
