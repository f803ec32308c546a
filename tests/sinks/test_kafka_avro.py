"""``encoding=avro``: Avro in Confluent's wire format with a Schema Registry, read back by real consumers.

The registry is the stand-in of ``schema_registry.py`` (no registry server can be installed here); the
broker is tansu (``conftest.py``). Every message the tests read is decoded twice, and both must agree:
by confluent-kafka's ``AvroDeserializer`` with its ``SchemaRegistryClient`` pointed at the registry,
and by fastavro from the schema the registry returns for the message's id. The decoded events are
turned back into change rows and compared with deltalake's ``load_cdf`` of the same table.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import io
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("kafka")
pytest.importorskip("deltalake")
pytest.importorskip("fastavro")
pytest.importorskip("confluent_kafka.schema_registry")

import fastavro
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from schema_registry import SchemaRegistry

from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.registry import RegistryClient
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError, SinkUnavailableError
from deltatail.state.feed import ChangeBatch, CommitEvent, TableInfo
from deltatail.tailer.runtime.transient import is_transient

ROOT = Path(__file__).resolve().parents[2]
CDF = {"delta.enableChangeDataFeed": "true"}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@pytest.fixture
def registry() -> Iterator[SchemaRegistry]:
    server = SchemaRegistry()
    server.start()
    yield server
    server.stop()


# ---------------------------------------------------------------- reading Avro back


class AvroReader:
    """Decodes wire-format messages with confluent-kafka's deserializer and with fastavro; both must agree."""

    def __init__(self, url: str, conf: dict[str, str] | None = None) -> None:
        self.url = url
        self.client = SchemaRegistryClient({"url": url, **(conf or {})})
        self.deserializer = AvroDeserializer(self.client)
        self.headers = {} if not conf else {"Authorization": _basic(conf["basic.auth.user.info"])}

    def decode(self, topic: str, data: bytes | None, field: str) -> Any:
        if data is None:
            return None
        assert data[0] == 0, "magic byte"
        schema_id = int.from_bytes(data[1:5], "big")
        request = urllib.request.Request(f"{self.url}/schemas/ids/{schema_id}", headers=self.headers)
        with urllib.request.urlopen(request) as answer:
            schema = fastavro.parse_schema(json.loads(json.loads(answer.read())["schema"]))
        by_fastavro = fastavro.schemaless_reader(io.BytesIO(data[5:]), schema, None)
        context = SerializationContext(topic, MessageField.KEY if field == "key" else MessageField.VALUE)
        by_confluent = self.deserializer(data, context)
        assert by_confluent == by_fastavro
        return by_fastavro

    def records(self, kafka: Any, topic: str) -> list[tuple[Any, Any, dict[str, bytes]]]:
        return [
            (self.decode(topic, r.key, "key"), self.decode(topic, r.value, "value"), dict(r.headers))
            for r in kafka.consume(topic)
        ]


def _basic(user_info: str) -> str:
    return "Basic " + base64.b64encode(user_info.encode()).decode()


# ---------------------------------------------------------------- the table and what deltalake says

DECIMAL = pa.decimal128(10, 2)
INNER = pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])


def typed_rows(ids: list[int]) -> pa.Table:
    """A row per id with a column of every Delta type the JSON formats cover (variant apart: see below)."""
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "tiny": pa.array([i % 100 - 50 for i in ids], pa.int8()),
            "small": pa.array([i * 300 for i in ids], pa.int16()),
            "int": pa.array([None if i == 2 else i * 70_000 for i in ids], pa.int32()),
            "real": pa.array([i + 0.5 for i in ids], pa.float32()),
            "dbl": pa.array([i / 8 for i in ids], pa.float64()),
            "flag": pa.array([i % 2 == 0 for i in ids], pa.bool_()),
            "text": pa.array([f"nø-{i}" for i in ids], pa.string()),
            "blob": pa.array([bytes([i, 0, 255]) for i in ids], pa.binary()),
            "price": pa.array([decimal.Decimal(f"{i * 11}.{i:02d}") * (-1) ** i for i in ids], DECIMAL),
            "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i * 40) for i in ids], pa.date32()),
            "at": pa.array(
                [dt.datetime(2024, 1, 2, 3, 4, 5, 123456 + i, tzinfo=dt.UTC) for i in ids], pa.timestamp("us", "UTC")
            ),
            "local": pa.array([dt.datetime(2023, 5, 6, 7, 8, 9, i * 1000) for i in ids], pa.timestamp("us")),
            "inner": pa.array([{"a": i, "b": None if i == 1 else f"b{i}"} for i in ids], INNER),
            "tags": pa.array([list(range(i)) for i in ids], pa.list_(pa.int64())),
            "attrs": pa.array([[(f"k{j}", j) for j in range(i % 3)] for i in ids], pa.map_(pa.string(), pa.int64())),
        }
    )


def typed_table(root: Path) -> None:
    """Version 0: ids 1-4; 1: an update of id 2; 2: a delete of id 3; 3: ids 5-6 appended."""
    write_deltalake(str(root), typed_rows([1, 2, 3, 4]), configuration=CDF)
    DeltaTable(str(root)).update(updates={"text": "'changed'", "dbl": "dbl + 1"}, predicate="id = 2")
    DeltaTable(str(root)).delete("id = 3")
    write_deltalake(str(root), typed_rows([5, 6]), mode="append")


def freeze(value: Any) -> Hashable:
    if isinstance(value, dict):
        return tuple(sorted((k, freeze(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(freeze(v) for v in value)
    return value  # type: ignore[no-any-return]


def micros(value: dt.datetime) -> int:
    aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return (aware - EPOCH) // dt.timedelta(microseconds=1)


def expected_value(column: str, value: Any, time_mode: str, decimal_mode: str) -> Any:
    """What a ``load_cdf`` value is after Avro under the modes (Debezium's and Connect's rules, by hand)."""
    if value is None:
        return None
    if column == "attrs":
        return dict(value)
    if isinstance(value, decimal.Decimal):
        return value if decimal_mode == "precise" else str(value)
    if isinstance(value, dt.datetime):
        if time_mode == "micros":
            return micros(value)
        if time_mode == "connect":
            aware = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
            return aware.replace(microsecond=aware.microsecond // 1000 * 1000)
        text = value.strftime("%Y-%m-%dT%H:%M:%S.%f")
        return text + "Z" if value.tzinfo else text
    if isinstance(value, dt.date):
        if time_mode == "micros":
            return (value - dt.date(1970, 1, 1)).days
        return value if time_mode == "connect" else value.isoformat()
    return value


def expected_changes(root: Path, time_mode: str, decimal_mode: str) -> Counter[Hashable]:
    rows = pa.table(DeltaTable(str(root)).load_cdf(starting_version=0).read_all()).to_pylist()
    out: Counter[Hashable] = Counter()
    for row in rows:
        image = {
            k: expected_value(k, v, time_mode, decimal_mode) for k, v in row.items() if not k.startswith("_commit")
        }
        out[freeze({**image, "_commit_version": row["_commit_version"]})] += 1
    return out


def debezium_changes(records: list[tuple[Any, Any, dict[str, bytes]]]) -> Counter[Hashable]:
    """Change rows of decoded Debezium events (a ``u`` is its two images), tombstones checked and left out."""
    out: Counter[Hashable] = Counter()
    previous: Any = None
    for key, value, _ in records:
        if value is None:
            assert previous is not None and previous["op"] == "d" and key == {"id": previous["before"]["id"]}
            continue
        version = value["source"]["commit_version"]
        images = {
            "c": [("insert", value["after"])],
            "r": [("insert", value["after"])],
            "d": [("delete", value["before"])],
            "u": [("update_preimage", value["before"]), ("update_postimage", value["after"])],
        }[value["op"]]
        for change_type, image in images:
            assert key == {"id": image["id"]}
            out[freeze({**image, "_change_type": change_type, "_commit_version": version})] += 1
        previous = value
    return out


def run_until_caught_up(table: Path, state: Path, sink: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    script = Path(sys.executable).parent / "deltatail"
    args = [str(script), "run", str(table), "--state-dir", str(state), "--sink", sink, "--until-caught-up"]
    return subprocess.run(args, cwd=ROOT, env={**os.environ, **env}, capture_output=True, timeout=120)


# ---------------------------------------------------------------- every type, every format


@pytest.mark.slow
@pytest.mark.parametrize(
    ("time_mode", "decimal_mode"), [("micros", "precise"), ("connect", "double"), ("iso", "string")]
)
def test_debezium_events_of_every_type_decode_to_the_tables_changes(
    kafka_broker: Any, registry: SchemaRegistry, tmp_path: Path, time_mode: str, decimal_mode: str
) -> None:
    typed_table(tmp_path / "t")
    topic = kafka_broker.new_topic(1)
    sink = kafka_broker.uri(
        topic,
        format="debezium",
        key="id",
        tombstones=True,
        encoding="avro",
        registry=registry.url,
        time_mode=time_mode,
        decimal_mode=decimal_mode,
    )
    done = run_until_caught_up(tmp_path / "t", tmp_path / "state", sink)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    records = AvroReader(registry.url).records(kafka_broker, topic)
    actual = debezium_changes(records)
    if decimal_mode == "double":  # a double of the decimal (Arrow's cast): compare to the cent
        expected = expected_changes(tmp_path / "t", time_mode, "precise")
        expected = Counter({_in_cents(row): n for row, n in expected.items()})
        actual = Counter({_in_cents(row): n for row, n in actual.items()})
    else:
        expected = expected_changes(tmp_path / "t", time_mode, decimal_mode)
    assert actual == expected
    assert [v is None for _, v, _ in records].count(True) == 1  # the tombstone of id 3
    assert sorted(registry.subjects) == [f"{topic}-key", f"{topic}-value"]
    value_schema = json.loads(registry.schemas[registry.subjects[f"{topic}-value"][0] - 1])
    assert value_schema["name"] == "Envelope" and value_schema["namespace"] == "deltatail.delta.t"
    key_schema = json.loads(registry.schemas[registry.subjects[f"{topic}-key"][0] - 1])
    assert (key_schema["namespace"], key_schema["name"]) == ("deltatail.delta.t", "Key")


def _in_cents(row: Hashable) -> Hashable:
    assert isinstance(row, tuple)
    return tuple((k, round(float(v) * 100) if k == "price" else v) for k, v in row)


@pytest.mark.slow
def test_flat_and_json_rows_decode_to_the_tables_changes(
    kafka_broker: Any, registry: SchemaRegistry, tmp_path: Path
) -> None:
    typed_table(tmp_path / "t")
    reader = AvroReader(registry.url)
    # flat: each event's row with __op/__deleted; an update is its post-image only
    flat = kafka_broker.new_topic(1)
    uri = kafka_broker.uri(flat, format="flat", key="id", encoding="avro", registry=registry.url, time_mode="micros")
    assert run_until_caught_up(tmp_path / "t", tmp_path / "s1", uri).returncode == 0
    rows = [v for _, v, _ in reader.records(kafka_broker, flat)]
    assert [(r["id"], r["__op"], r["__deleted"], r["__commit_version"]) for r in rows] == [
        (1, "c", "false", 0), (2, "c", "false", 0), (3, "c", "false", 0), (4, "c", "false", 0),
        (2, "u", "false", 1), (3, "d", "true", 2), (5, "c", "false", 3), (6, "c", "false", 3),
    ]  # fmt: skip
    expected = expected_changes(tmp_path / "t", "micros", "string")
    images = Counter(
        freeze({k: v for k, v in r.items() if not k.startswith("__")} | {"_commit_version": r["__commit_version"]})
        for r in rows
        if r["__op"] != "u"
    )
    wanted: Counter[Hashable] = Counter()
    for row, n in expected.items():
        fields = dict(row)  # type: ignore[call-overload]
        if fields.pop("_change_type") in ("insert", "delete"):
            wanted[freeze(fields)] += n
    assert images == wanted
    # json: every column, the change columns included, keys by position
    plain = kafka_broker.new_topic(1)
    uri = kafka_broker.uri(plain, format="json", encoding="avro", registry=registry.url, decimal_mode="precise")
    assert run_until_caught_up(tmp_path / "t", tmp_path / "s2", uri).returncode == 0
    records = reader.records(kafka_broker, plain)
    assert [(k["v"], k["i"], k["s"]) for k, _, _ in records] == [
        (v, i, False) for v, n in ((0, 4), (1, 2), (2, 1), (3, 2)) for i in range(n)
    ]
    got = Counter(freeze({k: x for k, x in v.items() if k != "_commit_timestamp"}) for _, v, _ in records)
    assert got == expected_changes(tmp_path / "t", "iso", "precise")
    assert all(isinstance(v["_commit_timestamp"], str) for _, v, _ in records)


@pytest.mark.slow
def test_variants_arrive_as_debezium_json_strings(kafka_broker: Any, registry: SchemaRegistry, tmp_path: Path) -> None:
    """Variant columns (at any depth) are ``io.debezium.data.Json`` strings holding Spark's ``to_json`` text."""
    name = "kernel-rs/unshredded-variant"
    root = ROOT.parent / "shared" / "delta-tables" / name
    if not root.is_dir():
        pytest.skip(f"corpus table {name} is not here")
    topic = kafka_broker.new_topic(1)
    uri = kafka_broker.uri(topic, format="debezium", encoding="avro", registry=registry.url)
    done = run_until_caught_up(root, tmp_path / "state", uri)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    events = [v for _, v, _ in AvroReader(registry.url).records(kafka_broker, topic)]
    expectations = json.loads((ROOT / "tests" / "expectations" / "variant_expectations.json").read_text())
    files = expectations["tables"][name]["files"]
    assert len(events) == sum(f["rows"] for f in files.values())
    by_id = {e["after"]["id"]: e["after"] for e in events}
    heads = [row for f in files.values() for row in f["head"]]
    assert heads and all(by_id[row["id"]] == row for row in heads)
    schema = json.loads(registry.schemas[registry.subjects[f"{topic}-value"][0] - 1])
    before, after = (next(f for f in schema["fields"] if f["name"] == n)["type"][1] for n in ("before", "after"))
    assert after == "deltatail.delta.unshredded_variant.Value"  # the record of before, by name
    v = next(f for f in before["fields"] if f["name"] == "v")["type"][1]
    assert v == {"type": "string", "connect.version": 1, "connect.name": "io.debezium.data.Json"}


# ---------------------------------------------------------------- schema changes, outages, the cache

TABLE = TableInfo("/data/orders", "tid-orders", "orders")
TS = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)


def batch(version: int, ids: list[int], required: tuple[str, ...] = (), **columns: pa.Array) -> ChangeBatch:
    """Insert rows of ``ids`` and ``columns`` (nullable unless ``required``) at ``version``."""
    n = len(ids)
    rows = pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            **columns,
            "_change_type": pa.array(["insert"] * n),
            "_commit_version": pa.array([version] * n, pa.int64()),
            "_commit_timestamp": pa.array([TS] * n, pa.timestamp("us", tz="UTC")),
        }
    )
    schema = pa.schema([f.with_nullable(f.name not in required) for f in rows.schema])
    return ChangeBatch(Position.change(version, 0), rows.cast(schema))


def test_schema_ids_are_cached_and_a_compatible_change_is_a_new_version(
    kafka_broker: Any, registry: SchemaRegistry
) -> None:
    topic = kafka_broker.new_topic(1)
    sink = KafkaSink(kafka_broker.uri(topic, format="debezium", key="id", encoding="avro", registry=registry.url))
    sink.open(TABLE)
    for version in range(5):
        sink.write(batch(version, [version * 10 + i for i in range(20)], name=pa.array(["x"] * 20)))
    # a new nullable column: BACKWARD compatible (its Avro field is optional with a null default)
    sink.write(batch(5, [100], name=pa.array(["y"]), note=pa.array([None], pa.string())))
    sink.flush()
    sink.close()
    posts = [path for method, path, _ in registry.requests if method == "POST"]
    value, key = f"/subjects/{topic}-value/versions", f"/subjects/{topic}-key/versions"
    assert posts == [value, key, value]  # one per new schema (the key's did not change), never one per message
    assert len(registry.subjects[f"{topic}-value"]) == 2 and len(registry.subjects[f"{topic}-key"]) == 1
    events = [v for _, v, _ in AvroReader(registry.url).records(kafka_broker, topic)]
    assert len(events) == 101
    assert events[-1]["after"] == {"id": 100, "name": "y", "note": None}
    assert events[0]["after"] == {"id": 0, "name": "x"}


def test_an_incompatible_change_names_the_column_and_the_rule(kafka_broker: Any, registry: SchemaRegistry) -> None:
    topic = kafka_broker.new_topic(1)
    sink = KafkaSink(kafka_broker.uri(topic, format="flat", key="id", encoding="avro", registry=registry.url))
    sink.open(TABLE)
    sink.write(batch(1, [1], ("amount",), amount=pa.array([5], pa.int64())))
    with pytest.raises(SinkError, match=r"BACKWARD and the table's schema changed: column 'amount' changed type "
                       r"from long to string") as caught:  # fmt: skip
        sink.write(batch(2, [2], amount=pa.array(["five"])))
    assert caught.value.version == 2 and caught.value.table == TABLE.path
    assert not isinstance(caught.value, SinkUnavailableError)
    with pytest.raises(SinkError, match=r"column 'qty' was added without a default \(a NOT NULL column\)"):
        sink.write(batch(2, [2], ("amount", "qty"), amount=pa.array([6], pa.int64()), qty=pa.array([1], pa.int32())))
    registry.config[f"{topic}-value"] = "FORWARD"  # old readers must read new data: a removed NOT NULL column breaks
    with pytest.raises(SinkError, match=r"rule is FORWARD .*column 'amount' was removed"):
        sink.write(batch(3, [3]))
    sink.flush()
    sink.close()
    assert len(kafka_broker.consume(topic)) == 1  # nothing of the refused batches was sent


def test_a_registry_down_mid_stream_holds_the_batch_and_a_new_run_sends_it_once(
    kafka_broker: Any, registry: SchemaRegistry
) -> None:
    topic = kafka_broker.new_topic(1)
    uri = kafka_broker.uri(
        topic, format="debezium", key="id", encoding="avro", registry=registry.url, exactly_once=True
    )
    sink = KafkaSink(uri)
    sink.open(TABLE)
    sink.write(batch(1, [1, 2]))
    sink.flush()
    registry.stop()
    with pytest.raises(SinkUnavailableError, match=f"cannot reach the Schema Registry at {registry.url}") as caught:
        sink.write(batch(2, [3], extra=pa.array([1.5])))  # a new schema: the registry is needed
    assert is_transient(caught.value) and caught.value.version == 2
    sink.close()
    registry.start()  # the same port; the service's next run resends from the cursor (version 1 again)
    again = KafkaSink(uri)
    again.open(TABLE)
    again.write(batch(1, [1, 2]))
    again.write(batch(2, [3], extra=pa.array([1.5])))
    again.flush()
    again.close()
    events = [v for _, v, _ in AvroReader(registry.url).records(kafka_broker, topic)]
    assert [e["after"] for e in events] == [{"id": 1}, {"id": 2}, {"id": 3, "extra": 1.5}]


@pytest.mark.slow
def test_a_registry_down_at_start_is_retried_and_nothing_is_lost_or_repeated(
    kafka_broker: Any, registry: SchemaRegistry, tmp_path: Path
) -> None:
    """``deltatail run`` against a registry that is down waits and retries; once it is up, every change arrives once.

    The registry asks for basic auth (user from a file, password from the environment): neither the
    password nor the user appears in the logs, the status or the state directory.
    """
    typed_table(tmp_path / "t")
    registry.user, registry.password = "deltatail-user", "s3cr3t-Pa55"
    (tmp_path / "user.txt").write_text("deltatail-user\n")
    registry.stop()  # down before the run starts (the port is kept)
    topic = kafka_broker.new_topic(1)
    uri = kafka_broker.uri(
        topic,
        format="debezium",
        key="id",
        exactly_once=True,
        encoding="avro",
        registry=registry.url,
        registry_user=f"@{tmp_path / 'user.txt'}",
        registry_password="env:REGISTRY_PW",
    )
    script = Path(sys.executable).parent / "deltatail"
    args = [str(script), "run", str(tmp_path / "t"), "--state-dir", str(tmp_path / "state"), "--sink", uri]
    err_file = tmp_path / "run.err"
    with err_file.open("wb") as err_out:
        process = subprocess.Popen(
            [*args, "--until-caught-up"],
            cwd=ROOT,
            env={**os.environ, "REGISTRY_PW": "s3cr3t-Pa55"},
            stdout=subprocess.PIPE,
            stderr=err_out,
        )
    try:
        deadline = time.monotonic() + 120
        while f"cannot reach the Schema Registry at {registry.url}".encode() not in err_file.read_bytes():
            assert time.monotonic() < deadline and process.poll() is None, err_file.read_bytes().decode()[-2000:]
            time.sleep(0.1)
        assert process.poll() is None, err_file.read_bytes().decode()[-2000:]  # a failed attempt, and it waits
        registry.start()
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    err = err_file.read_bytes()
    assert process.returncode == 0, err.decode()[-3000:]
    logs = out.decode() + err.decode()
    assert f"cannot reach the Schema Registry at {registry.url}" in logs
    reader = AvroReader(registry.url, {"basic.auth.user.info": "deltatail-user:s3cr3t-Pa55"})
    records = reader.records(kafka_broker, topic)
    assert debezium_changes(records) == expected_changes(tmp_path / "t", "iso", "string")
    assert all(auth == _basic("deltatail-user:s3cr3t-Pa55") for _, _, auth in registry.requests)
    # a second run finds everything delivered (exactly once across runs)
    again = subprocess.run([*args, "--until-caught-up"], cwd=ROOT, env={**os.environ, "REGISTRY_PW": "s3cr3t-Pa55"},
                           capture_output=True, timeout=120)  # fmt: skip
    assert again.returncode == 0 and len(kafka_broker.consume(topic)) == len(records)
    logs += again.stdout.decode() + again.stderr.decode()
    state = b"".join(p.read_bytes() for p in (tmp_path / "state").rglob("*") if p.is_file())
    for secret in ("s3cr3t-Pa55", "deltatail-user", base64.b64encode(b"deltatail-user:s3cr3t-Pa55").decode()):
        assert secret not in logs and secret.encode() not in state


def test_wrong_credentials_stop_the_sink_without_showing_them(kafka_broker: Any, registry: SchemaRegistry) -> None:
    registry.user, registry.password = "u", "right-one"
    topic = kafka_broker.new_topic(1)
    uri = kafka_broker.uri(
        topic, format="flat", key="id", encoding="avro", registry=registry.url,
        registry_user="u", registry_password="env:PW",
    )  # fmt: skip
    sink = KafkaSink(uri, env={"PW": "wrong-one"})
    sink.open(TABLE)
    with pytest.raises(SinkError, match=r"refused the credentials \(401\)") as caught:
        sink.write(batch(1, [1]))
    sink.close()
    assert "wrong-one" not in str(caught.value) and not isinstance(caught.value, SinkUnavailableError)
    assert "wrong-one" not in repr(sink.options)


@pytest.mark.parametrize(
    ("options", "env", "message"),
    [
        ({"encoding": "avro"}, {}, "encoding=avro needs registry=http://HOST:PORT"),
        ({"encoding": "xml"}, {}, "encoding='xml'; expected json or avro"),
        ({"registry": "http://r:1"}, {}, "registry apply to encoding=avro only"),
        ({"encoding": "avro", "registry": "ftp://r:1"}, {}, "registry must be the http:// or https:// URL"),
        ({"encoding": "avro", "registry": "http://u:pw@r:1"}, {}, "without credentials"),
        ({"encoding": "avro", "registry": "http://r:1", "registry_password": "hunter2"}, {}, "must be a reference"),
        ({"encoding": "avro", "registry": "http://r:1", "registry_password": "env:NOPE"}, {}, "NOPE, which is not set"),
        (
            {"encoding": "avro", "registry": "http://r:1", "registry_password": "@/no/such"},
            {},
            "/no/such, which cannot",
        ),
        ({"encoding": "avro", "registry": "http://r:1", "registry_timeout_ms": "0"}, {}, "registry_timeout_ms='0'"),
    ],
)
def test_avro_options_are_checked(options: dict[str, str], env: dict[str, str], message: str) -> None:
    uri = "kafka://127.0.0.1:9092/t?" + "&".join(f"{k}={v}" for k, v in options.items())
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        KafkaOptions.from_uri(uri, env)
    assert "hunter2" not in str(caught.value) and ":pw@" not in str(caught.value)


def test_time_and_decimal_modes_apply_to_json_rows_in_avro_only() -> None:
    with pytest.raises(ConfigError, match="time_mode apply to format=debezium or format=flat only"):
        KafkaOptions.from_uri("kafka://127.0.0.1:9092/t?time_mode=micros")
    opts = KafkaOptions.from_uri("kafka://127.0.0.1:9092/t?time_mode=micros&encoding=avro&registry=http://r:1")
    assert opts.events.modes.time == "micros" and opts.avro is not None and opts.avro.registry == "http://r:1"


def test_avro_without_fastavro_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastavro", None)  # as if not installed: importing it raises ImportError
    sink = KafkaSink("kafka://127.0.0.1:1/t?encoding=avro&registry=http://127.0.0.1:1&open_timeout_ms=1")
    with pytest.raises(ConfigError, match=r"encoding=avro needs the package fastavro"):
        sink.open(TABLE)


def test_transaction_events_are_avro_too(kafka_broker: Any, registry: SchemaRegistry) -> None:
    topic, tx_topic = kafka_broker.new_topic(1), kafka_broker.new_topic(1, prefix="tx")
    uri = kafka_broker.uri(
        topic, format="debezium", key="id", encoding="avro", registry=registry.url,
        transactions=True, transaction_topic=tx_topic,
    )  # fmt: skip
    sink = KafkaSink(uri)
    sink.open(TABLE)
    sink.write(batch(7, [1, 2]))
    sink.commit_event(CommitEvent(7, 1_700_000_000_000, "WRITE"))
    sink.flush()
    sink.close()
    reader = AvroReader(registry.url)
    events = [v for _, v, _ in reader.records(kafka_broker, topic)]
    assert [e["transaction"] for e in events] == [
        {"id": "tid-orders:7", "total_order": k, "data_collection_order": k} for k in (1, 2)
    ]
    boundaries = reader.records(kafka_broker, tx_topic)
    assert [(k, v["status"], v["event_count"], v["data_collections"]) for k, v, _ in boundaries] == [
        ({"id": "tid-orders:7"}, "BEGIN", None, None),
        ({"id": "tid-orders:7"}, "END", 2, [{"data_collection": "delta.orders", "event_count": 2}]),
    ]
    value_schema = json.loads(registry.schemas[registry.subjects[f"{tx_topic}-value"][0] - 1])
    assert (value_schema["namespace"], value_schema["name"]) == ("deltatail", "TransactionMetadataValue")


def test_column_names_are_made_avro_safe_and_a_clash_or_a_misfit_is_refused(
    kafka_broker: Any, registry: SchemaRegistry
) -> None:
    topic = kafka_broker.new_topic(1)
    sink = KafkaSink(kafka_broker.uri(topic, format="flat", key="id", encoding="avro", registry=registry.url))
    sink.open(TABLE)
    sink.write(batch(1, [1], **{"unit price": pa.array([2.5]), "3d": pa.array(["x"])}))
    with pytest.raises(SinkError, match=r"the columns 'a-b' and 'a_b' both become the Avro field name 'a_b'"):
        sink.write(batch(2, [2], **{"a-b": pa.array([1]), "a_b": pa.array([2])}))
    # NaN of a NOT NULL double is null in Connect JSON, which its Avro field cannot hold
    registry.config[f"{topic}-value"] = "NONE"
    with pytest.raises(SinkError, match=r"a row of the batch at 3:0 does not fit its Avro schema") as caught:
        sink.write(batch(3, [3], ("x",), x=pa.array([float("nan")])))
    assert caught.value.version == 3
    sink.flush()
    sink.close()
    (row,) = [v for _, v, _ in AvroReader(registry.url).records(kafka_broker, topic)]
    assert (row["unit_price"], row["_3d"], row["__op"]) == (2.5, "x", "c")


def test_a_registry_url_with_credentials_is_refused_by_the_client() -> None:
    with pytest.raises(SinkError, match="must not carry credentials"):
        RegistryClient("http://user:pw@127.0.0.1:1")
    with pytest.raises(SinkError, match="must be an http"):
        RegistryClient("ftp://127.0.0.1:1")
