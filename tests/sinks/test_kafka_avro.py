"""``encoding=avro``: Avro in Confluent's wire format with a Schema Registry, read back by real consumers.

The registry is the stand-in of ``schema_registry.py`` (no registry server can be installed here); the
broker is tansu (``conftest.py``). Every message the tests read is decoded twice, and both must agree:
by confluent-kafka's ``AvroDeserializer`` with its ``SchemaRegistryClient`` pointed at the registry,
and by fastavro from the schema the registry returns for the message's id. The decoded events are
turned back into change rows and compared with deltalake's ``load_cdf`` of the same table.
"""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import logging
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
    import base64

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
    import os

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
    assert images == Counter(
        {
            freeze({k: v for k, v in dict(row).items() if k != "_change_type"}): n
            for row, n in expected.items()
            if dict(row)["_change_type"] in ("insert", "delete")
        }
    )
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
