"""A giant UPDATE to Kafka in tiny batches: every row one Debezium ``u`` event, as in one batch, exactly once.

The table is written by ``deltalake`` with CDF on: 2 partitions, ``ROWS`` rows, then one UPDATE of every
row (2 cdc files; delta-rs writes each file's pre-images first, its post-images after them). The tailer
delivers that commit to the real broker (``conftest.py``) once in 7-row batches read in three key-hash
passes with a flush every 50 rows, and once in one batch; both must give the ``u`` events deltalake's
``load_cdf`` pre- and post-images say (the reference), and the same ones; so must 1,000-row batches
that the sink encodes in slices of about 63 rows (``pairing.ENCODE_ROWS``: an odd size, so that a cut
at exactly that size would fall inside pairs), never cutting between a pair's images.
``transactions=true`` pairs nothing (each event one change row) at either size; ``encoding=avro`` pairs as JSON does.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("kafka")
pytest.importorskip("fastavro")

import fastavro
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schema_registry import SchemaRegistry

from deltatail.sinks.kafka import pairing
from deltatail.sinks.kafka import sink as sink_module
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.tailer import Tailer
from deltatail.tailer.read import net_changes as net_changes_module
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions

ROOT = Path(__file__).resolve().parents[2]
ROWS = 2_000
TINY, FLUSH = 7, 50
Row = tuple[tuple[str, Any], ...]


@pytest.fixture(scope="module")
def updated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The table and the version of its UPDATE of every row."""
    root = tmp_path_factory.mktemp("giantpair") / "t"
    ids = range(ROWS)
    rows = pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array([i % 2 for i in ids], pa.int64())})
    rows = rows.append_column("v", pa.array([f"v{i}" for i in ids], pa.string()))
    write_deltalake(str(root), rows, partition_by=["p"], configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(root)).update(updates={"v": "concat(v, '+')"})
    return root, DeltaTable(str(root)).version()


@pytest.fixture
def registry() -> Iterator[SchemaRegistry]:
    server = SchemaRegistry()
    server.start()
    yield server
    server.stop()


def _row(values: dict[str, Any] | None) -> Row | None:
    return None if values is None else tuple(sorted((k, values[k]) for k in ("id", "p", "v")))


def _reference(root: Path, version: int) -> tuple[dict[int, Row | None], dict[int, Row | None]]:
    """deltalake's pre- and post-image of every id in ``version``."""
    table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=version, ending_version=version).read_all())
    pre = {r["id"]: _row(r) for r in table.to_pylist() if r["_change_type"] == "update_preimage"}
    post = {r["id"]: _row(r) for r in table.to_pylist() if r["_change_type"] == "update_postimage"}
    assert len(pre) == len(post) == ROWS
    return pre, post


def _deliver(root: Path, version: int, state: Path, uri: str, *, batch_size: int, flush_rows: int) -> None:
    feed = ChangeFeed(str(root), options=ChangeOptions(batch_size=batch_size, read_ahead=0))
    config = TailerConfig(str(root), str(state), starting_version=version, until_caught_up=True, flush_rows=flush_rows)
    Tailer(config, KafkaSink(uri), feed=feed).run()


def _three_passes(root: Path, version: int, monkeypatch: pytest.MonkeyPatch) -> int:
    """Make the commit three key-hash passes; returns the pass size in bytes."""
    plan = next(ChangeFeed(str(root)).plans(version, version))
    size = -(-sum(t.size or 0 for t in plan.tasks) // 3)
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", size)
    assert net_changes_module.net_passes(plan.tasks) == 3
    return size


def _avro(url: str, data: bytes) -> Any:
    """A Confluent wire-format value decoded by fastavro with the writer schema the registry gives for its id."""
    assert data[0] == 0
    with urllib.request.urlopen(f"{url}/schemas/ids/{int.from_bytes(data[1:5], 'big')}") as answer:
        schema = fastavro.parse_schema(json.loads(json.loads(answer.read())["schema"]))
    return fastavro.schemaless_reader(io.BytesIO(data[5:]), schema, None)


def _events(kafka: Any, topic: str, decode: Any = json.loads) -> list[tuple[str, Row | None, Row | None]]:
    out = []
    for record in kafka.consume(topic):
        event = decode(record.value)
        out.append((event["op"], _row(event["before"]), _row(event["after"])))
    return out


def _updates(root: Path, version: int) -> Counter[Hashable]:
    pre, post = _reference(root, version)
    return Counter(("u", pre[i], post[i]) for i in range(ROWS))


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["json", "avro"])
def test_a_giant_update_in_tiny_batches_is_the_same_u_events_as_in_one_batch(
    kafka_broker: Any,
    updated: tuple[Path, int],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    encoding: str,
) -> None:
    root, version = updated
    options: dict[str, Any] = {"format": "debezium", "key": "id"}
    decode: Any = json.loads
    if encoding == "avro":
        url = request.getfixturevalue("registry").url
        options |= {"encoding": "avro", "registry": url}
        decode = lambda data: _avro(url, data)  # noqa: E731
    whole, tiny, sliced = kafka_broker.new_topic(), kafka_broker.new_topic(), kafka_broker.new_topic()
    _deliver(root, version, tmp_path / "whole", kafka_broker.uri(whole, **options), batch_size=65_536, flush_rows=10**6)
    _three_passes(root, version, monkeypatch)
    _deliver(root, version, tmp_path / "tiny", kafka_broker.uri(tiny, **options), batch_size=TINY, flush_rows=FLUSH)
    slices = _slices_seen(monkeypatch, size=63)
    _deliver(
        root, version, tmp_path / "sliced", kafka_broker.uri(sliced, **options), batch_size=1_000, flush_rows=FLUSH
    )
    assert max(slices) < 1_000 and len(slices) > 2 * ROWS // 1_000, "the sink encoded no batch in slices"
    expected = _updates(root, version)
    assert Counter(_events(kafka_broker, whole, decode)) == expected
    assert Counter(_events(kafka_broker, tiny, decode)) == expected
    assert Counter(_events(kafka_broker, sliced, decode)) == expected


def _slices_seen(monkeypatch: pytest.MonkeyPatch, *, size: int) -> list[int]:
    """Make the sink encode batches in slices of about ``size`` rows; returns the sizes of the slices it encodes."""
    seen: list[int] = []

    def spy(batch: Any, pair_key: Any) -> Iterator[Any]:
        for part in pairing.encoding_slices(batch, pair_key):
            seen.append(len(part))
            yield part

    monkeypatch.setattr(pairing, "ENCODE_ROWS", size)
    monkeypatch.setattr(sink_module, "encoding_slices", spy)
    return seen


@pytest.mark.slow
def test_with_transactions_every_image_is_its_own_event_at_any_batch_size(
    kafka_broker: Any, updated: tuple[Path, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, version = updated
    pre, post = _reference(root, version)
    expected = Counter([("d", pre[i], None) for i in range(ROWS)] + [("c", None, post[i]) for i in range(ROWS)])
    found = []
    for name, batch_size in (("whole", 65_536), ("tiny", TINY)):
        if batch_size == TINY:
            _three_passes(root, version, monkeypatch)
        topic, tx_topic = kafka_broker.new_topic(), kafka_broker.new_topic(1)
        uri = kafka_broker.uri(topic, format="debezium", key="id", transactions=True, transaction_topic=tx_topic)
        _deliver(root, version, tmp_path / name, uri, batch_size=batch_size, flush_rows=FLUSH)
        found.append(Counter(_events(kafka_broker, topic)))
    assert found[0] == found[1] == expected


PROGRAM = """
import sys
from deltatail.sinks.kafka import pairing
from deltatail.sinks.kafka import sink as sink_module
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.tailer import Tailer
from deltatail.tailer.read import net_changes
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions

root, state, uri, version, pass_bytes, batch, flush = sys.argv[1:]
net_changes.NET_PASS_BYTES = int(pass_bytes)
feed = ChangeFeed(root, options=ChangeOptions(batch_size=int(batch), read_ahead=0))
config = TailerConfig(root, state, starting_version=int(version), until_caught_up=True, flush_rows=int(flush))
Tailer(config, KafkaSink(uri), feed=feed).run()
"""


@pytest.mark.slow
def test_kills_inside_the_giant_update_resume_exactly_once(
    kafka_broker: Any, updated: tuple[Path, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL after the 40th batch sent (rows sent past the last flush), then after the 5th flush and
    the 120th batch of the next runs; a clean run ends it. Every key is one ``u`` event, once."""
    root, version = updated
    topic, state = kafka_broker.new_topic(), tmp_path / "state"
    uri = kafka_broker.uri(topic, format="debezium", key="id", exactly_once=True)
    pass_bytes = _three_passes(root, version, monkeypatch)
    args = [sys.executable, "-c", PROGRAM, str(root), str(state), uri, str(version), str(pass_bytes), str(TINY)]
    args.append(str(FLUSH))
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
    cursors = []
    for spec in ("after_write:40", "after_flush:5", "after_write:120"):
        killed = subprocess.run(args, cwd=ROOT, env={**env, "DELTATAIL_CRASH_AT": spec}, capture_output=True)
        assert killed.returncode == -9, killed.stderr.decode()[-2000:]
        saved = StateStore(str(state)).load()
        assert saved is not None
        cursors.append(saved.cursor)
    assert all(c.version == version and 0 < c.index < 2 * ROWS for c in cursors), cursors
    assert cursors == sorted(cursors) and len(set(cursors)) == 3
    subprocess.run(args, cwd=ROOT, env=env, capture_output=True, check=True)
    events = _events(kafka_broker, topic)
    assert Counter(events) == _updates(root, version)
    assert len(events) == ROWS
