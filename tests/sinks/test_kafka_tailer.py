"""The Kafka sink end to end through the tailer: ``deltatail run`` into a real Kafka-protocol broker.

Every test runs the real command line (``deltatail run TABLE --state-dir DIR --sink kafka://...``) as a
subprocess against tansu (memory-only, 127.0.0.1; fixtures in ``conftest.py``), for each producer
backend (kafka-python and confluent-kafka), reads the whole topic back with a plain consumer and
compares it with what deltalake says the changes are:

- the expected rows are deltalake 1.6.6's ``load_cdf`` of the same versions, as a multiset over every
  column but ``_commit_timestamp`` (deltatail derives that one from the commit file's time, as Delta
  Spark does; delta-rs reports ``commitInfo.timestamp``);
- for a table with the change data feed off, the expected rows are ``load_cdf`` of a twin table that
  got the same operations with the feed on, compared with ``--net-changes --key id`` output; without
  ``--net-changes`` each version's inserts minus deletes must equal the difference of deltalake's
  snapshot scans before and after it.

What the tests prove:

``test_json_*``
    ``format=json``, keyed (``key=id``) and unkeyed (position keys): every expected change row arrives
    once, its headers agree with its body, its key is what the URI asks for, the partition is Kafka's
    murmur2 of the key, every version's positions are ``0..n-1``, each key's events are in commit
    order, and commit timestamps rise strictly from version to version.
``test_debezium_*``
    ``format=debezium&key=id&tombstones=true``: op codes ``c``/``u``/``d`` match the change types in
    the headers, ``before``/``after`` carry the right images (turned back into change rows they equal
    ``load_cdf``), every update pair is one ``u`` event, a tombstone with the same key follows each
    delete in its partition, and ``source`` names the table and version.
``test_kills_*``
    ``deltatail run`` SIGKILLed at 30+ distinct points (crash points ``after_write``/``after_flush``/
    ``after_snapshot``/``after_save``, and random instants, which also land while messages are sent
    but not yet acknowledged) and restarted on the same state directory, over small commits and a
    64,000-row commit of 32 batches: with ``exactly_once=true`` the topic holds every expected change
    exactly once; with ``exactly_once=false`` at least once, repeats being exact copies. The
    exactly-once campaign runs on 1-partition topics for both backends, and on 3 partitions, where it
    fails today because of the bug below.
``test_exactly_once_reopens_a_busy_topic``
    the bug on its own, with no crash: a second ``exactly_once=true`` run cannot open a topic whose
    partitions hold more than 500 messages (``KafkaSink.open`` times out reading the partition tails).
``test_broker_outage_*``
    the broker dies while the tailer follows a table that is being written: the tailer stops with a
    ``SinkError`` (exit 1) and its saved cursor never passes what the broker had acknowledged; after a
    new, empty broker comes up, a restart re-delivers everything after the saved cursor.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

pytest.importorskip("kafka")
pytest.importorskip("deltalake")

from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: crash.py (tests/ is not a package)
from crash import POINTS, run_campaign, strike
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic
from kafka.partitioner.default import murmur2 as kafka_murmur2
from launcher import popen

from deltatail.tailer.read.feed import ChangeFeed

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}
WAIT = 90.0
PARTITIONS = 3
Row = tuple[tuple[str, Hashable], ...]
Pos = tuple[int, int]  # version, index (change rows only: these tests never take an initial snapshot)


# ---------------------------------------------------------------- tables written by deltalake


def data(ids: Iterable[int], *, bump: float = 0.0, partitions: int = 8) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array([i % partitions for i in ids], pa.int64()),
            "name": pa.array([None if i % 7 == 3 else f"nø-{i}" for i in ids], pa.string()),
            "score": pa.array([i * 0.5 + bump for i in ids], pa.float64()),
            "flag": pa.array([None if i % 5 == 1 else i % 2 == 0 for i in ids], pa.bool_()),
        }
    )


def mixed_history(root: Path, *, cdf: bool, steps: int = 79) -> int:
    """Version 0 creates the table; then appends, deletes, updates and merges (some merges delete).
    Deterministic, so that a CDF-on and a CDF-off twin get the same commits. Returns the latest version."""
    rng = random.Random(11)
    write_deltalake(str(root), data(range(60)), configuration=CDF if cdf else {"delta.enableChangeDataFeed": "false"})
    next_id = 60
    for step in range(steps):
        table = DeltaTable(str(root))
        lo = rng.randrange(next_id)
        kind = step % 5
        if kind == 0:
            write_deltalake(str(root), data(range(next_id, next_id + 12)), mode="append")
            next_id += 12
        elif kind == 1:
            table.delete(f"id >= {lo} AND id < {lo + 5}")
        elif kind == 2:
            table.update(updates={"score": f"score + {step}.25", "flag": "NOT flag"}, predicate=f"id % 9 = {step % 9}")
        elif kind == 3:
            source = data([lo, lo + 1, lo + 2, next_id, next_id + 1], bump=100.0 + step)
            next_id += 2
            merge = table.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
            merge.when_matched_update_all().when_not_matched_insert_all().execute()
        else:
            source = data([lo, lo + 3, next_id], bump=500.0 + step)
            next_id += 1
            merge = table.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
            merge.when_matched_delete(predicate="t.id % 2 = 0").when_matched_update(
                updates={"name": "'merged'"}
            ).when_not_matched_insert_all().execute()
    return DeltaTable(str(root)).version()


LARGE_ROWS = 64_000
LARGE_FILES = 32


def large_history(root: Path) -> int:
    """Version 1 is one 64,000-row commit of 32 files (one per partition value), which the tailer reads
    as 32 batches of 2,000 rows; then a partition delete, an update and a few small commits."""
    write_deltalake(
        str(root), data(range(LARGE_FILES * 4), partitions=LARGE_FILES), partition_by=["p"], configuration=CDF
    )
    write_deltalake(str(root), data(range(1000, 1000 + LARGE_ROWS), partitions=LARGE_FILES), mode="append")
    DeltaTable(str(root)).delete("p = 5")
    DeltaTable(str(root)).update(updates={"score": "score + 1.0"}, predicate="id % 1000 = 7")
    for step in range(6):
        if step % 2:
            DeltaTable(str(root)).delete(f"id >= {2000 + 997 * step} AND id < {2040 + 997 * step}")
        else:
            ids = range(900_000 + 50 * step, 900_050 + 50 * step)
            write_deltalake(str(root), data(ids, partitions=LARGE_FILES), mode="append")
    return DeltaTable(str(root)).version()


@dataclass(frozen=True)
class Table:
    root: Path
    latest: int
    table_id: str

    @staticmethod
    def of(root: Path) -> Table:
        table = DeltaTable(str(root))
        return Table(root, table.version(), str(table.metadata().id))


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Table]:
    base = tmp_path_factory.mktemp("tables")
    assert mixed_history(base / "mixed", cdf=True) == mixed_history(base / "mixed-off", cdf=False)
    large_history(base / "large")
    return {name: Table.of(base / name) for name in ("mixed", "mixed-off", "large")}


# ---------------------------------------------------------------- what deltalake says


def canon(row: Mapping[str, Any]) -> Row:
    return tuple(sorted((k, v) for k, v in row.items() if k != "_commit_timestamp"))


def load_cdf(root: Path, start: int = 0, end: int | None = None) -> list[dict[str, Any]]:
    reader = DeltaTable(str(root)).load_cdf(starting_version=start, ending_version=end)
    rows: list[dict[str, Any]] = pa.table(reader.read_all()).to_pylist()
    return rows


def expected_rows(root: Path, start: int = 0, end: int | None = None) -> Counter[Row]:
    return Counter(canon(r) for r in load_cdf(root, start, end))


def per_version(rows: Counter[Row]) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for row, n in rows.items():
        version = dict(row)["_commit_version"]
        assert isinstance(version, int)
        counts[version] += n
    return dict(counts)


def all_positions(rows: Counter[Row]) -> set[Pos]:
    return {(v, i) for v, n in per_version(rows).items() for i in range(n)}


def live_rows(root: Path, version: int) -> Counter[Row]:
    if version < 0:
        return Counter()
    scan = pa.RecordBatchReader.from_stream(DeltaTable(str(root), version=version).scan()).read_all()
    return Counter(canon(r) for r in scan.to_pylist())


def assert_rows(actual: Counter[Row], expected: Counter[Row]) -> None:
    missing, extra = expected - actual, actual - expected
    assert not missing and not extra, (
        f"missing {sum(missing.values())} rows, e.g. {list(missing)[:3]}; "
        f"extra {sum(extra.values())}, e.g. {list(extra)[:3]}"
    )


# ---------------------------------------------------------------- running deltatail


def deltatail() -> list[str]:
    script = Path(sys.executable).parent / "deltatail"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "deltatail"]


def run_args(table: Path, state: Path, sink: str, *extra: str) -> list[str]:
    return [*deltatail(), "run", str(table), "--state-dir", str(state), "--sink", sink, *extra]


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}, **extra}


def run_until_caught_up(table: Path, state: Path, sink: str, *extra: str) -> None:
    done = subprocess.run(
        run_args(table, state, sink, "--until-caught-up", *extra),
        cwd=ROOT,
        env=clean_env(),
        capture_output=True,
        timeout=WAIT,
    )
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def saved_cursor(state: Path) -> Pos | None:
    try:
        raw = orjson.loads((state / "cursor.json").read_bytes())
    except FileNotFoundError:
        return None
    cursor = raw["state"]["cursor"]
    assert cursor["snapshot"] is False
    return (int(cursor["version"]), int(cursor["index"]))


# ---------------------------------------------------------------- reading the topic


@dataclass(frozen=True)
class Msg:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]

    @property
    def position(self) -> Pos:
        raw = orjson.loads(self.headers["dt.position"])
        assert raw["snapshot"] is False
        return (int(raw["version"]), int(raw["index"]))

    @property
    def tombstone(self) -> bool:
        return self.value is None

    def body(self) -> dict[str, Any]:
        assert self.value is not None
        loaded: dict[str, Any] = orjson.loads(self.value)
        return loaded

    def header(self, name: str) -> str:
        return self.headers[name].decode()


def to_msgs(records: Iterable[Any]) -> list[Msg]:
    return [Msg(r.partition, r.offset, r.key, r.value, dict(r.headers)) for r in records]


def read_topic(kit: Any, topic: str) -> list[Msg]:
    """Every message of ``topic``, by partition then offset."""
    return to_msgs(kit.consume(topic, timeout=WAIT))


def new_topic(bootstrap: str, partitions: int = PARTITIONS, prefix: str = "tail") -> str:
    """A fresh topic."""
    return create_topic(bootstrap, f"{prefix}-{os.urandom(6).hex()}", partitions)


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> str:
    """Create topic ``name`` (with its own admin client: brokers in these tests come and go)."""
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="tests")
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    finally:
        admin.close()
    return name


def json_row(msg: Msg) -> Row:
    return canon(msg.body())


def partition_of(key: bytes, partitions: int = PARTITIONS) -> int:
    return int((kafka_murmur2(key) & 0x7FFFFFFF) % partitions)


def check_common(msgs: list[Msg], table: Table, topic: str) -> None:
    """Headers name the table and one sink; partitions follow the keys; each partition is in position order."""
    assert msgs, "the topic is empty"
    table_id = table.table_id
    assert {m.header("dt.table_id") for m in msgs} == {table_id}
    (sink_id,) = {m.header("dt.sink_id") for m in msgs}
    assert sink_id.startswith("dt-")
    for m in msgs:
        assert m.key is not None
        assert m.partition == partition_of(m.key), f"{m.key!r} is in partition {m.partition}"
        assert int(m.header("dt.version")) == m.position[0]
    for partition in range(PARTITIONS):
        mine = [(m.position, m.tombstone) for m in msgs if m.partition == partition]
        assert mine == sorted(mine), f"partition {partition} is not in position order"


def check_keys_in_commit_order(msgs: list[Msg]) -> None:
    """A consumer applying events by key sees each key's changes in commit order."""
    by_key: dict[bytes | None, list[Pos]] = {}
    for m in msgs:
        by_key.setdefault(m.key, []).append(m.position)
    for key, positions in by_key.items():
        assert positions == sorted(positions), f"key {key!r} out of order: {positions}"


def check_commit_timestamps(msgs: list[Msg]) -> None:
    """``_commit_timestamp``: ISO-8601 UTC, one per version, strictly rising with the version."""
    stamps: dict[int, set[str]] = {}
    for m in msgs:
        body = m.body()
        stamps.setdefault(body["_commit_version"], set()).add(body["_commit_timestamp"])
    ordered = []
    for version in sorted(stamps):
        (stamp,) = stamps[version]
        assert stamp.endswith("Z") and len(stamp) == len("2024-01-02T03:04:05.123456Z"), stamp
        ordered.append(dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")))
    assert all(a < b for a, b in itertools.pairwise(ordered))


# ---------------------------------------------------------------- format=json


@pytest.mark.slow
@pytest.mark.parametrize("keyed", [True, False], ids=["key=id", "position-key"])
def test_json_delivers_every_change_once(kafka: Any, tables: dict[str, Table], tmp_path: Path, keyed: bool) -> None:
    table = tables["mixed"]
    topic = new_topic(kafka.bootstrap)
    uri = kafka.uri(topic, **({"key": "id"} if keyed else {}))
    run_until_caught_up(table.root, tmp_path / "state", uri)
    assert saved_cursor(tmp_path / "state") == (table.latest + 1, 0)
    msgs = read_topic(kafka, topic)
    expected = expected_rows(table.root)
    check_common(msgs, table, topic)
    assert not any(m.tombstone for m in msgs)
    assert Counter(m.position for m in msgs) == Counter(all_positions(expected))  # each position once
    assert_rows(Counter(json_row(m) for m in msgs), expected)
    for m in msgs:
        body = m.body()
        assert (body["_commit_version"], body["_change_type"]) == (m.position[0], m.header("dt.change_type"))
        if keyed:
            assert m.key == b'{"id":%d}' % body["id"]
        else:
            assert orjson.loads(m.key or b"") == {"v": m.position[0], "i": m.position[1], "s": False}
    if keyed:
        check_keys_in_commit_order(msgs)
    check_commit_timestamps(msgs)
    kinds = Counter(dict(r)["_change_type"] for r in expected.elements())
    assert set(kinds) == {"insert", "delete", "update_preimage", "update_postimage"}, kinds


@pytest.mark.slow
def test_json_from_a_table_without_change_data_feed(kafka: Any, tables: dict[str, Table], tmp_path: Path) -> None:
    """CDF off: with ``--net-changes --key id`` the topic holds exactly what deltalake's ``load_cdf`` gives
    for a CDF-on twin of the table; without, every version's inserts minus deletes are the difference of
    deltalake's snapshots (copy-on-write rewrites show as a delete and an insert of the same row)."""
    off, twin = tables["mixed-off"], tables["mixed"]
    topic = new_topic(kafka.bootstrap)
    run_until_caught_up(off.root, tmp_path / "net", kafka.uri(topic, key="id"), "--net-changes", "--key", "id")
    msgs = read_topic(kafka, topic)
    check_common(msgs, off, topic)
    check_keys_in_commit_order(msgs)
    expected = expected_rows(twin.root)
    assert Counter(m.position for m in msgs) == Counter(all_positions(expected))
    assert_rows(Counter(json_row(m) for m in msgs), expected)

    raw_topic = new_topic(kafka.bootstrap)
    run_until_caught_up(off.root, tmp_path / "raw", kafka.uri(raw_topic))
    raw = read_topic(kafka, raw_topic)
    check_common(raw, off, raw_topic)
    by_version: dict[int, list[dict[str, Any]]] = {}
    for m in raw:
        by_version.setdefault(m.position[0], []).append(m.body())
    snapshots = [live_rows(off.root, v) for v in range(-1, off.latest + 1)]  # snapshots[v + 1]: at version v
    for version in range(off.latest + 1):
        rows = by_version.get(version, [])
        assert sorted(m.position[1] for m in raw if m.position[0] == version) == list(range(len(rows)))
        inserted = Counter(data_row(r) for r in rows if r["_change_type"] == "insert")
        deleted = Counter(data_row(r) for r in rows if r["_change_type"] == "delete")
        assert {r["_change_type"] for r in rows} <= {"insert", "delete"}
        before, after = snapshots[version], snapshots[version + 1]
        assert inserted - deleted == after - before, f"version {version}"
        assert deleted - inserted == before - after, f"version {version}"


def data_row(body: Mapping[str, Any]) -> Row:
    return canon({k: v for k, v in body.items() if not k.startswith("_")})


# ---------------------------------------------------------------- format=debezium


def image_row(image: Mapping[str, Any], change_type: str, version: int) -> Row:
    return canon({**image, "_change_type": change_type, "_commit_version": version})


def debezium_rows(msgs: list[Msg], table: Table) -> Counter[Row]:
    """The change rows the events stand for (a ``u`` event is a pre-image and a post-image); checks each
    event's op, images, key and ``source`` against its headers on the way."""
    rows: Counter[Row] = Counter()
    for m in msgs:
        if m.tombstone:
            continue
        event, version, kind = m.body(), m.position[0], m.header("dt.change_type")
        source = event["source"]
        assert (source["connector"], source["table_id"], source["commit_version"]) == (
            "deltatail",
            table.table_id,
            version,
        )
        assert source["snapshot"] == "false" and source["table_path"] == str(table.root)
        assert source["index"] == m.position[1]
        # The tailer hands each commit's Delta operation over before its rows.
        assert source["operation"] in ("WRITE", "DELETE", "UPDATE", "MERGE"), source["operation"]
        before, after, op = event["before"], event["after"], event["op"]
        image = after if after is not None else before
        assert m.key == b'{"id":%d}' % image["id"]

        if op == "u":
            assert kind == "update" and before is not None and after is not None
            assert before["id"] == after["id"]
            rows[image_row(before, "update_preimage", version)] += 1
            rows[image_row(after, "update_postimage", version)] += 1
        elif op == "c":
            assert kind in ("insert", "update_postimage") and before is None and after is not None
            rows[image_row(after, kind, version)] += 1
        else:
            assert op == "d" and kind in ("delete", "update_preimage"), (op, kind)
            assert before is not None and after is None
            rows[image_row(before, kind, version)] += 1
    return rows


@pytest.mark.slow
def test_debezium_keyed_with_tombstones(kafka: Any, tables: dict[str, Table], tmp_path: Path) -> None:
    table = tables["mixed"]
    topic = new_topic(kafka.bootstrap)
    run_until_caught_up(table.root, tmp_path / "state", kafka.uri(topic, format="debezium", key="id", tombstones=True))
    msgs = read_topic(kafka, topic)
    expected = expected_rows(table.root)
    check_common(msgs, table, topic)
    check_keys_in_commit_order(msgs)
    assert_rows(debezium_rows(msgs, table), expected)
    # The op codes and how many events of each there are.
    kinds = Counter(dict(r)["_change_type"] for r in expected.elements())
    events = [m for m in msgs if not m.tombstone]
    ops = Counter(m.body()["op"] for m in events)
    assert ops == {"c": kinds["insert"], "u": kinds["update_postimage"], "d": kinds["delete"]}, (ops, kinds)
    assert kinds["update_preimage"] == kinds["update_postimage"] > 0  # so every update pair became one "u" event
    # A tombstone right after each delete, in the same partition, with the same key and position.
    for partition in range(PARTITIONS):
        mine = [m for m in msgs if m.partition == partition]
        for i, m in enumerate(mine):
            if m.tombstone:
                assert i > 0 and mine[i - 1].body()["op"] == "d", f"tombstone at offset {m.offset} follows no delete"
                assert (mine[i - 1].key, mine[i - 1].position) == (m.key, m.position)
                assert m.header("dt.change_type") == "delete"
            elif m.body()["op"] == "d":
                assert i + 1 < len(mine) and mine[i + 1].tombstone, f"delete at offset {m.offset} has no tombstone"
    assert sum(m.tombstone for m in msgs) == kinds["delete"]
    # Positions: each event once; a "u" sits at the later of its two rows.
    positions = Counter(m.position for m in events)
    assert max(positions.values()) == 1 and set(positions) <= all_positions(expected)
    assert len(positions) == len(all_positions(expected)) - kinds["update_preimage"]


# ---------------------------------------------------------------- kills and restarts


class TopicWatch:
    """Reads a topic incrementally (one assigned consumer, no group) and tells its size cheaply."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        self.tps = [TopicPartition(topic, p) for p in range(partitions)]
        self.consumer.assign(self.tps)
        self.consumer.seek_to_beginning(*self.tps)
        self.msgs: list[Msg] = []

    def size(self) -> int:
        return int(sum(self.consumer.end_offsets(self.tps).values()))

    def catch_up(self) -> list[Msg]:
        """The messages added since the last call."""
        new: list[Any] = []
        deadline = time.monotonic() + WAIT
        while True:
            for batch in self.consumer.poll(timeout_ms=100).values():
                new.extend(batch)
            if all(self._caught_up(tp) for tp in self.tps):
                break
            assert time.monotonic() < deadline, "timed out reading the topic"
        msgs = to_msgs(new)
        self.msgs += msgs
        return msgs

    def _caught_up(self, tp: Any) -> bool:
        high = self.consumer.highwater(tp)
        return high is not None and self.consumer.position(tp) >= high

    def close(self) -> None:
        self.consumer.close()


@dataclass(frozen=True)
class Kill:
    spec: str
    cursor_before: Pos | None
    cursor_after: Pos | None
    sent_past_cursor: int  # messages this run got into the topic at or after the cursor it left saved
    partial_batch: bool  # the topic then held some but not all rows of one of the tailer's batches


@dataclass
class Campaign:
    """Runs of ``deltatail run --until-caught-up`` on one table, state directory and topic, mostly killed."""

    table: Table
    state: Path
    uri: str
    watch: TopicWatch
    rng: random.Random
    log: Path
    edges: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # batch ranges of large versions
    kills: dict[tuple[Hashable, ...], Kill] = field(default_factory=dict)
    specs: list[str] = field(default_factory=list)
    terms: int = 0

    def args(self) -> list[str]:
        extra = ("--until-caught-up", "--checkpoint-commits", "1", "--snapshot-commits", "2")
        return run_args(self.table.root, self.state, self.uri, *extra)

    def _progress_since(self, cursor: Pos | None, size: int) -> Callable[[], bool]:
        """Whether the run has shown progress: a new saved cursor or new messages in the topic."""
        return lambda: saved_cursor(self.state) != cursor or self.watch.size() != size

    def run(self, spec: str) -> int:
        """``<point>:<k>`` (``DELTATAIL_CRASH_AT``), ``kill:<s>`` / ``term:<s>`` (SIGKILL / SIGTERM at a
        random instant up to ``s`` seconds after the run first shows progress), or ``clean``."""
        kind = spec.partition(":")[0]
        before, size = saved_cursor(self.state), self.watch.size()
        env = clean_env(**({"DELTATAIL_CRASH_AT": spec} if kind in POINTS else {}))
        with self.log.open("ab") as log:  # forked by the launcher (tests/launcher.py); the other tests start it anew
            proc = popen(self.args(), cwd=ROOT, env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        try:
            strike(proc, spec, self.rng, self._progress_since(before, size), wait=WAIT, tick=0.005)
            proc.wait(WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        new = self.watch.catch_up()
        self.specs.append(spec)
        if proc.returncode == -signal.SIGKILL:
            after = saved_cursor(self.state)
            past = sum(1 for m in new if after is None or m.position >= after)
            # A crash point at a given cursor is one place in the code; a random instant is told apart
            # by how far delivery had got when it struck.
            point: tuple[Hashable, ...] = (spec, before) if kind in POINTS else ("kill", before, len(self.watch.msgs))
            partial = any(partly_delivered(self.watch.msgs, v, edges) for v, edges in self.edges.items())
            self.kills[point] = Kill(spec, before, after, past, partial)
        else:
            tail = self.log.read_bytes()[-3000:].decode(errors="replace")
            assert proc.returncode == 0, f"{spec}: exit {proc.returncode}: {tail}"
            self.terms += kind == "term"
        return int(proc.returncode)

    def campaign(self, kills_wanted: int, *, max_runs: int, delay: float, first: Sequence[str] = ()) -> None:
        """Crash runs until ``kills_wanted`` distinct kill points were hit, then a clean run (tests/crash.py)."""
        run_campaign(
            self.run,
            self.kills,
            self.rng,
            kills_wanted=kills_wanted,
            max_runs=max_runs,
            delay=delay,
            first=first,
            kill_share=0.3,
            term_share=0.06,
        )
        assert saved_cursor(self.state) == (self.table.latest + 1, 0)


def crash_topic(
    kafka: Any, table: Table, tmp_path: Path, name: str, partitions: int, **options: object
) -> tuple[str, Campaign]:
    topic = new_topic(kafka.bootstrap, partitions, prefix=f"crash-{name}")
    uri = kafka.uri(topic, key="id", open_timeout_ms=10_000, **options)
    watch = TopicWatch(kafka.bootstrap, topic, partitions)
    rng = random.Random(f"{name}-{kafka.backend}-{options}")
    return topic, Campaign(table, tmp_path / f"state-{name}", uri, watch, rng, tmp_path / f"{name}.log")


def batch_edges(table: Table, version: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` position ranges of the batches the tailer writes for ``version``."""
    feed = ChangeFeed(str(table.root))
    (plan,) = feed.plans(version, version)
    return [(b.start.index, b.end.index) for b in feed.plan_batches(plan)]


def partly_delivered(msgs: Iterable[Msg], version: int, edges: list[tuple[int, int]]) -> bool:
    """Whether the topic holds some but not all rows of one of the version's batches."""
    held = {m.position[1] for m in msgs if m.position[0] == version}
    return any(0 < len(held & set(range(a, b))) < b - a for a, b in edges)


def assert_exactly_once(msgs: list[Msg], expected: Counter[Row]) -> None:
    positions = Counter(m.position for m in msgs)
    repeated = {p: n for p, n in positions.items() if n > 1}
    assert not repeated, f"{len(repeated)} positions delivered more than once, e.g. {list(repeated.items())[:5]}"
    assert set(positions) == all_positions(expected)
    assert_rows(Counter(json_row(m) for m in msgs), expected)
    for partition in {m.partition for m in msgs}:  # each partition in position order, dt.seq 0, 1, 2, ...
        mine = [m for m in msgs if m.partition == partition]
        assert [m.position for m in mine] == sorted(m.position for m in mine)
        assert [int(m.header("dt.seq")) for m in mine] == list(range(len(mine)))


def assert_at_least_once(msgs: list[Msg], expected: Counter[Row]) -> int:
    """Every expected row at least once, and a repeated position repeats the same key and row; returns
    the number of repeats."""
    first: dict[Pos, tuple[bytes | None, Row]] = {}
    for m in msgs:
        got = (m.key, json_row(m))
        assert first.setdefault(m.position, got) == got, f"position {m.position} repeated with another row"
    assert set(first) == all_positions(expected)
    assert_rows(Counter(row for _, row in first.values()), expected)
    return len(msgs) - len(first)


@pytest.mark.parametrize(
    ("backend", "partitions"),
    [("kafka-python", 1), ("confluent", 1), ("kafka-python", 3)],
    ids=["kafka-python-1-partition", "confluent-1-partition", "kafka-python-3-partitions"],
)
@pytest.mark.slow
def test_kills_and_restarts_deliver_exactly_once(
    kafka: Any, tables: dict[str, Table], tmp_path: Path, backend: str, partitions: int
) -> None:
    """``exactly_once=true``: 30+ distinct SIGKILLs over a table of small commits and one with a 64,000-row
    commit (32 batches), each followed by a restart on the same state directory; the topic ends up with
    every expected change exactly once (positions from the headers, row contents against ``load_cdf``).
    With 3 partitions each partition ends up holding more than 500 messages, which once stalled the
    sink's ``open`` (see ``test_exactly_once_reopens_a_busy_topic``)."""
    if backend == "confluent":
        pytest.importorskip("confluent_kafka")
    kills: dict[tuple[Hashable, ...], Kill] = {}
    for name, wanted, first in (
        ("mixed", 28, ("after_write:2", "kill:0.02", "after_flush:1")),
        ("large", 9, ("after_save:1", "after_write:5", "kill:0.1", "after_write:20", "kill:0.3", "after_flush:1")),
    ):
        table = tables[name]
        topic, c = crash_topic(kafka, table, tmp_path, name, partitions, exactly_once=True)
        if name == "large":  # the large commit is version 1; the first specs after the first land inside it
            c.edges = {1: batch_edges(table, 1)}
            assert len(c.edges[1]) == LARGE_FILES
        try:
            c.campaign(wanted, max_runs=60, delay=0.02 if name == "mixed" else 0.3, first=first)
        finally:
            c.watch.close()
        kills |= {(name, *point): kill for point, kill in c.kills.items()}
        assert_exactly_once(read_topic(kafka, topic), expected_rows(table.root))
    assert len(kills) >= 30, f"only {len(kills)} distinct kill points: {sorted(kills, key=str)}"
    kinds = {kill.spec.partition(":")[0] for kill in kills.values()}
    assert {*POINTS, "kill"} <= kinds, f"kill points hit: {kinds}"
    assert len({kill.spec for kill in kills.values() if kill.spec.startswith("after_write")}) >= 3
    # Some random kills struck while messages were on their way: the broker held rows the tailer had
    # sent but not yet seen acknowledged and checkpointed; and some left a batch of the large commit half sent.
    assert any(k.spec.startswith("kill") and k.sent_past_cursor for k in kills.values())
    assert any(k.partial_batch for k in kills.values()), "no kill left a batch of the large commit partly delivered"


@pytest.mark.slow
def test_kills_and_restarts_deliver_at_least_once(kafka: Any, tables: dict[str, Table], tmp_path: Path) -> None:
    """``exactly_once=false``: after kills and restarts every expected change is in the topic, repeats
    (rows after the last saved cursor, sent again) are exact copies, and nothing is lost."""
    for name, wanted, first in (
        ("mixed", 8, ("after_flush:1", "kill:0.05")),
        ("large", 4, ("after_save:1", "after_write:9", "kill:0.4")),
    ):
        table = tables[name]
        topic, c = crash_topic(kafka, table, tmp_path, name, PARTITIONS, exactly_once=False)
        try:
            c.campaign(wanted, max_runs=20, delay=0.3 if name == "large" else 0.05, first=first)
        finally:
            c.watch.close()
        assert len(c.kills) >= wanted // 2
        repeats = assert_at_least_once(read_topic(kafka, topic), expected_rows(table.root))
        if name == "mixed":  # after_flush:1 killed it between a flush and the cursor save: version 0 came twice
            assert repeats > 0, name
        # (on "large" a kill may land before the producer sent anything it had queued: no repeat is owed)


@pytest.mark.slow
def test_exactly_once_reopens_a_busy_topic(kafka: Any, tables: dict[str, Table], tmp_path: Path) -> None:
    """A second ``exactly_once=true`` run over a topic whose partitions hold more than 500 messages each
    (kafka-python's ``max_poll_records``) must open, find nothing new and exit 0.

    A regression test: pausing part of a multi-partition assignment once left kafka-python holding
    fetched records it never returned, so ``open`` timed out reading the partition tails and the tailer
    could not restart once a partition held that many messages."""
    table = tables["large"]
    topic = new_topic(kafka.bootstrap)
    uri = kafka.uri(topic, key="id", exactly_once=True, open_timeout_ms=5000)
    run_until_caught_up(table.root, tmp_path / "state", uri)
    sizes = Counter(m.partition for m in read_topic(kafka, topic))
    assert len(sizes) == PARTITIONS and min(sizes.values()) > 500
    run_until_caught_up(table.root, tmp_path / "state", uri)  # nothing new: reads the tails, sends nothing
    assert_exactly_once(read_topic(kafka, topic), expected_rows(table.root))


# ---------------------------------------------------------------- the broker goes away


class Writer(threading.Thread):
    """Commits to a table (appends, deletes, updates) every few milliseconds until stopped."""

    def __init__(self, root: Path, limit: int = 400) -> None:
        super().__init__(daemon=True)
        self.root, self.limit = root, limit
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            next_id = 40
            for step in range(self.limit):
                if self.halt.is_set():
                    return
                table = DeltaTable(str(self.root))
                if step % 3 == 0:
                    table.delete(f"id % 31 = {step % 31}")
                elif step % 3 == 1:
                    table.update(updates={"score": "score + 1.0"}, predicate=f"id % 29 = {step % 29}")
                else:
                    write_deltalake(str(self.root), data(range(next_id, next_id + 300)), mode="append")
                    next_id += 300
                time.sleep(0.05)
        except BaseException as e:
            self.error = e


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@dataclass
class Outage:
    """``deltatail run`` following a table that a :class:`Writer` keeps changing, into an exactly-once topic
    of a broker that the test will stop (short Kafka timeouts, a checkpoint after every commit)."""

    root: Path
    state: Path
    log: Path
    topic: str
    uri: str
    writer: Writer
    tailer: subprocess.Popen[bytes]

    @classmethod
    def start(cls, kit: Any, tmp_path: Path, open_timeout_ms: int, *extra: str) -> Outage:
        root, state, log = tmp_path / "table", tmp_path / "state", tmp_path / "deltatail.tailer.log"
        write_deltalake(str(root), data(range(40)), configuration=CDF)
        topic = new_topic(kit.bootstrap)
        uri = kit.uri(
            topic,
            key="id",
            exactly_once=True,
            request_timeout_ms=1000,
            delivery_timeout_ms=3000,
            reconnect_backoff_max_ms=200,
            open_timeout_ms=open_timeout_ms,
        )
        writer = Writer(root)
        writer.start()
        args = run_args(root, state, uri, "--checkpoint-commits", "1", "--poll-interval", "0.05", *extra)
        try:
            with log.open("wb") as out:
                env = clean_env()
                tailer = subprocess.Popen(args, cwd=ROOT, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
        except BaseException:
            writer.halt.set()
            writer.join(WAIT)
            raise
        return cls(root, state, log, topic, uri, writer, tailer)

    def stop(self) -> None:
        """Kill the tailer if it still runs and stop the writer (safe to call twice)."""
        if self.tailer.poll() is None:
            self.tailer.kill()
            self.tailer.wait()
        self.writer.halt.set()
        self.writer.join(WAIT)


@pytest.mark.slow
def test_broker_outage_keeps_the_cursor_and_a_new_broker_gets_the_rest(broker_factory: Any, tmp_path: Path) -> None:
    """The broker dies while ``deltatail run`` follows a table that a writer keeps committing to.

    What the code does with ``--sink-retries 0``: the producer retries for ``delivery_timeout_ms``, then
    the message fails, the sink stops, and the next ``write``/``flush`` raises ``SinkUnavailableError``;
    the run ends with the error (``deltatail: error: ...``, exit code 1) and the cursor stays at the last
    checkpoint, whose flush had succeeded. (By default the tailer restarts itself from that cursor
    instead: see the next test.)

    The tailer is frozen (SIGSTOP) just before the broker is stopped, so that what the broker holds can
    be read first; then it goes on (SIGCONT) against a dead broker. Its saved cursor must never pass
    what the broker held (acknowledged).

    The broker is memory-only, so the one started next on the same port is a new, EMPTY broker. This
    proves that resuming from the saved cursor re-delivers every row after it (the new topic holds
    exactly the rows at and after the cursor, each once): nothing after the cursor is lost, and the rows
    before it were all on the old broker."""
    kit = broker_factory()
    run = Outage.start(kit, tmp_path, 5000, "--sink-retries", "0")
    root, state, topic, uri, tailer = run.root, run.state, run.topic, run.uri, run.tailer
    try:
        wait_for("the tailer to deliver ten versions", lambda: (saved_cursor(state) or (0, 0)) >= (10, 0))
        # Freeze it, preferably while the broker holds rows past the saved cursor (sent, not yet checkpointed).
        watch = TopicWatch(kit.bootstrap, topic, PARTITIONS)
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                cursor = saved_cursor(state)
                if cursor is not None and any(m.position >= cursor for m in watch.catch_up()):
                    break
        finally:
            watch.close()
        tailer.send_signal(signal.SIGSTOP)
        time.sleep(0.5)  # requests already sent reach the broker and are stored
        held = read_topic(kit, topic)
        frozen_at = saved_cursor(state)
        kit.broker.stop()
        tailer.send_signal(signal.SIGCONT)
        assert tailer.wait(WAIT) == 1
    finally:
        run.stop()
    assert run.writer.error is None, run.writer.error
    output = run.log.read_text(errors="replace")
    assert "deltatail: error:" in output, output[-3000:]
    error = output.split("deltatail: error:")[1]
    assert "Kafka did not acknowledge" in error or "stopped after an earlier failure" in error, error
    cursor = saved_cursor(state)
    assert frozen_at is not None and cursor is not None and cursor >= frozen_at
    expected = expected_rows(root)
    latest = DeltaTable(str(root)).version()
    assert cursor < (latest + 1, 0), "the outage came after the writer's last commit"
    # Never past what the broker acknowledged: every row before the saved cursor was on the old broker.
    held_positions = Counter(m.position for m in held)
    assert max(held_positions.values()) == 1
    assert {p for p in all_positions(expected) if p < cursor} <= set(held_positions)

    kit.broker.start()  # memory-only: a new, empty broker on the same port
    assert new_topic(kit.bootstrap, prefix="probe") and read_topic(kit, new_topic(kit.bootstrap)) == []
    create_topic(kit.bootstrap, topic)
    run_until_caught_up(root, state, uri)
    resent = read_topic(kit, topic)
    assert Counter(m.position for m in resent) == Counter(p for p in all_positions(expected) if p >= cursor)
    before_cursor = Counter(json_row(m) for m in held if m.position < cursor)
    assert_rows(before_cursor + Counter(json_row(m) for m in resent), expected)


@pytest.mark.slow
def test_broker_outage_is_waited_out_and_the_tailer_resumes_by_itself(broker_factory: Any, tmp_path: Path) -> None:
    """By default the tailer waits out an unavailable broker: it holds its cursor, says so in its status
    line, and starts again from the saved cursor when the broker is back, without exiting.

    The broker is memory-only, so the one that comes back is empty: it must end up holding every row at
    and after the cursor saved when the outage began (resent from the saved state), each once, and the
    rows before that cursor must all have been on the old broker."""
    kit = broker_factory()
    run = Outage.start(kit, tmp_path, 3000)
    root, state, log, topic, writer, tailer = run.root, run.state, run.log, run.topic, run.writer, run.tailer
    try:
        wait_for("the tailer to deliver ten versions", lambda: (saved_cursor(state) or (0, 0)) >= (10, 0))
        tailer.send_signal(signal.SIGSTOP)
        time.sleep(0.5)
        held = read_topic(kit, topic)
        kit.broker.stop()
        tailer.send_signal(signal.SIGCONT)
        wait_for("the tailer to report the outage", lambda: "sink unavailable" in log.read_text(errors="replace"))
        writer.halt.set()
        writer.join(WAIT)
        at_outage = saved_cursor(state)
        assert tailer.poll() is None, "the tailer exited instead of waiting for the broker"
        # Paused while the broker comes back, so the tailer's producer cannot auto-create the topic
        # (with the broker's default partition count) before the test makes it as it was.
        tailer.send_signal(signal.SIGSTOP)
        kit.broker.start()  # memory-only: a new, empty broker on the same port
        create_topic(kit.bootstrap, topic)
        tailer.send_signal(signal.SIGCONT)
        latest = DeltaTable(str(root)).version()
        wait_for("the tailer to catch up on the new broker", lambda: (saved_cursor(state) or (0, 0)) >= (latest + 1, 0))
        tailer.send_signal(signal.SIGTERM)
        assert tailer.wait(WAIT) == 0
    finally:
        run.stop()
    assert writer.error is None, writer.error
    assert at_outage is not None
    expected = expected_rows(root)
    resent = read_topic(kit, topic)
    held_positions = {m.position for m in held}
    assert {p for p in all_positions(expected) if p < at_outage} <= held_positions
    assert Counter(m.position for m in resent) == Counter(p for p in all_positions(expected) if p >= at_outage)


# ---------------------------------------------------------------- what a rerun reports


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["json", "debezium"])
def test_an_exactly_once_rerun_reports_rows_held_not_delivered(kafka: Any, tmp_path: Path, fmt: str) -> None:
    """A run with a fresh state directory over a topic that holds its rows: "0 rows delivered, N already held".

    Issue 27: an ``exactly_once=true`` run that produced nothing said "22 rows delivered". Then the table
    grows: a third fresh run delivers exactly the new rows and reports the old ones as held (with
    ``format=debezium`` an update pair is one message: both rows count).
    """
    root = tmp_path / "t"
    latest = mixed_history(root, cdf=True, steps=8)
    topic = new_topic(kafka.bootstrap)
    uri = kafka.uri(topic, key="id", exactly_once=True, format=fmt)
    run_until_caught_up(root, tmp_path / "first", uri)
    old = sum(expected_rows(root).values())
    assert per_version(expected_rows(root)).keys() <= set(range(latest + 1)) and old > 0

    def fresh_run(state: str) -> str:
        done = subprocess.run(
            run_args(root, tmp_path / state, uri, "--until-caught-up"),
            cwd=ROOT,
            env=clean_env(),
            capture_output=True,
            timeout=WAIT,
        )
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        return done.stderr.decode()

    assert f"0 rows delivered, {old} already held by the sink" in fresh_run("second")
    write_deltalake(str(root), data(range(1000, 1007)), mode="append")
    assert f"7 rows delivered, {old} already held by the sink" in fresh_run("third")
    if fmt == "json":
        assert_exactly_once(read_topic(kafka, topic), expected_rows(root))
