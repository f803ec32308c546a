"""Apache Flink's ``debezium-json`` format consumes deltatail's events and materializes the exact table.

End to end: a CDF-on Delta table is written with deltalake (appends, deletes, updates, merges,
with every column type Flink's format reads: long, string, decimal, double, boolean, timestamp,
timestamp_ntz, date, binary); deltatail tails it into a topic of the local broker; the topic is
read with kafka-python and its values written, partition by partition in offset order (tombstones
left out), to files that Flink reads through its filesystem connector with ``format =
'debezium-json'``. Flink (PyPI ``apache-flink``, in its own virtual environment: see
:mod:`tests.sinks.flink_env`) turns the events into its changelog (``+I``, ``-U``, ``+U``, ``-D``);
applying that changelog must end in exactly the rows deltalake reads from the table's last
version, value for value, and no retraction may name a row that is not there.

Cases: Flink's default timestamp settings with ``time_mode=sql``; ``time_mode=iso`` with
``timestamp-format.standard = 'ISO-8601'``; ``schemas=true`` with ``schema-include = true``;
keyed (``key=id``: updates are ``u`` events) and unkeyed (updates are a ``d`` and a ``c``)
one-partition topics, and a keyed three-partition topic. One Flink JVM serves the module.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import uuid
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

pytest.importorskip("deltalake")

from deltalake import DeltaTable, write_deltalake
from flink_env import FlinkWorker, flink_python, java_home

from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.tailer.follow.tailer import Tailer, TailerConfig

pytestmark = pytest.mark.flink

Row = tuple[str | None, ...]
COLUMNS = ("id", "name", "amount", "score", "flag", "ts", "ntz", "day", "data")
BASE = dt.datetime(2024, 1, 2, 3, 4, 5, 123456)


@pytest.fixture(scope="module")
def flink() -> Iterator[FlinkWorker]:
    java = java_home()
    if java is None:
        pytest.skip("the Flink tests need Java 17 (java on the path or JAVA_HOME)")
    worker = FlinkWorker(flink_python(), java)
    try:
        yield worker
    finally:
        worker.close()


# ---------------------------------------------------------------- the table


def zoned(i: int, bump: int) -> dt.datetime:
    return (BASE + dt.timedelta(days=i, microseconds=bump)).replace(tzinfo=dt.UTC)


def rows(ids: Iterable[int], *, bump: int = 0) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([None if i % 7 == 3 else f"nø-{i}-{bump}" for i in ids], pa.string()),
            "amount": pa.array([decimal.Decimal(i * 137 + bump) / 100 for i in ids], pa.decimal128(10, 2)),
            "score": pa.array([None if i % 11 == 4 else i * 0.1 + bump for i in ids], pa.float64()),
            "flag": pa.array([None if i % 5 == 1 else i % 2 == 0 for i in ids], pa.bool_()),
            "ts": pa.array([None if i % 6 == 2 else zoned(i, bump) for i in ids], pa.timestamp("us", tz="UTC")),
            "ntz": pa.array([BASE - dt.timedelta(hours=i * 7 + bump) for i in ids], pa.timestamp("us")),
            "day": pa.array([None if i % 9 == 5 else dt.date(2020, 1, 1) + dt.timedelta(days=i) for i in ids]),
            "data": pa.array([None if i % 8 == 7 else bytes([i % 256, bump % 256, 0]) for i in ids], pa.binary()),
        }
    )


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Appends, deletes, updates and merges (one deleting), change data feed on."""
    root = tmp_path_factory.mktemp("flink") / "orders"
    write_deltalake(str(root), rows(range(1, 31)), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(str(root), rows(range(31, 41)), mode="append")
    DeltaTable(str(root)).delete("id % 5 = 0")
    DeltaTable(str(root)).update(updates={"name": "concat(name, '-u')", "score": "score + 1.5"}, predicate="id % 3 = 0")
    merge = DeltaTable(str(root)).merge(rows(range(25, 46), bump=7), "t.id = s.id", source_alias="s", target_alias="t")
    merge.when_matched_update_all().when_not_matched_insert_all().execute()
    source = rows([2, 4, 6, 7, 50], bump=9)
    merge = DeltaTable(str(root)).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
    merge.when_matched_delete(predicate="t.id % 2 = 0").when_matched_update(
        updates={"name": "'merged'"}
    ).when_not_matched_insert_all().execute()
    DeltaTable(str(root)).update(updates={"flag": "NOT flag"}, predicate="id < 12")
    return root


def final_rows(root: Path) -> Counter[Row]:
    """The table's rows at its last version, as Flink writes each column cast to a string."""
    out: Counter[Row] = Counter()
    for r in DeltaTable(str(root)).to_pyarrow_table().to_pylist():
        out[tuple(as_flink(name, r[name]) for name in COLUMNS)] += 1
    return out


def as_flink(name: str, value: Any) -> str | None:
    """The text of Flink's ``CAST(... AS STRING)`` of a value (``TO_BASE64`` for binary), computed by hand."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return str(base64.b64encode(value).decode())
    if isinstance(value, float):
        return repr(value)
    return str(value)


# ---------------------------------------------------------------- the run


def tail_into(kafka: Any, root: Path, state: Path, partitions: int, **options: object) -> str:
    topic: str = kafka.new_topic(partitions, prefix="flink")
    config = TailerConfig(table=str(root), state_dir=str(state), until_caught_up=True)
    Tailer(config, KafkaSink(kafka.uri(topic, format="debezium", **options))).run()
    return topic


def write_partitions(kafka: Any, topic: str, where: Path) -> int:
    """Each partition's values, in offset order, one file per partition; tombstones left out. The value count."""
    where.mkdir(parents=True)
    files: dict[int, list[bytes]] = {}
    for record in kafka.consume(topic):
        files.setdefault(record.partition, [])
        if record.value is not None:
            files[record.partition].append(record.value)
    for partition, values in files.items():
        (where / f"part-{partition}.json").write_bytes(b"".join(v + b"\n" for v in values))
    return sum(len(v) for v in files.values())


def materialize(changelog: list[tuple[str, Row]]) -> Counter[Row]:
    """Apply Flink's changelog; a retraction of a row that is not there fails the test."""
    state: Counter[Row] = Counter()
    for kind, row in changelog:
        if kind in ("+I", "+U"):
            state[row] += 1
        else:
            assert kind in ("-U", "-D"), kind
            assert state[row] > 0, f"Flink retracted a row it does not hold: {kind} {row}"
            state[row] -= 1
            if not state[row]:
                del state[row]
    return state


def flink_table(flink: FlinkWorker, where: Path, options: dict[str, str]) -> Counter[Row]:
    name = "t_" + uuid.uuid4().hex[:10]
    with_options = {"connector": "filesystem", "path": str(where), "format": "debezium-json", **options}
    ddl = (
        f"CREATE TABLE {name} (`id` BIGINT, `name` STRING, `amount` DECIMAL(10, 2), `score` DOUBLE, "
        "`flag` BOOLEAN, `ts` TIMESTAMP_LTZ(6), `ntz` TIMESTAMP(6), `day` DATE, `data` BYTES) WITH ("
        + ", ".join(f"'{k}' = '{v}'" for k, v in with_options.items())
        + ")"
    )
    casts = ", ".join(f"CAST(`{c}` AS STRING)" for c in COLUMNS[:-1]) + ", TO_BASE64(`data`)"
    changelog = flink.run([ddl], f"SELECT {casts} FROM {name}")
    return Counter({normalize(row): n for row, n in materialize(changelog).items()})


def normalize(row: Row) -> Row:
    """Flink writes doubles as Java does (``1.0E20``): compare them as Python's ``repr`` of the same number."""
    score = row[3]
    return (*row[:3], None if score is None else repr(float(score)), *row[4:])


CASES: dict[str, tuple[dict[str, object], dict[str, str], int]] = {
    "keyed-sql-defaults": ({"key": "id", "time_mode": "sql"}, {}, 1),
    "unkeyed-iso": ({"time_mode": "iso"}, {"debezium-json.timestamp-format.standard": "ISO-8601"}, 1),
    "keyed-schemas": (
        {"key": "id", "time_mode": "sql", "schemas": True},
        {"debezium-json.schema-include": "true"},
        1,
    ),
    "unkeyed-schemas-iso": (
        {"time_mode": "iso", "schemas": True},
        {"debezium-json.schema-include": "true", "debezium-json.timestamp-format.standard": "ISO-8601"},
        1,
    ),
    "keyed-three-partitions": ({"key": "id", "time_mode": "sql", "tombstones": True}, {}, 3),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_flink_materializes_the_final_table(
    case: str, flink: FlinkWorker, kafka_broker: Any, table: Path, tmp_path: Path
) -> None:
    sink_options, flink_options, partitions = CASES[case]
    topic = tail_into(kafka_broker, table, tmp_path / "state", partitions, **sink_options)
    assert write_partitions(kafka_broker, topic, tmp_path / "events") > 0
    expected = final_rows(table)
    assert len(expected) > 30
    got = flink_table(flink, tmp_path / "events", flink_options)
    assert got == expected, (got - expected, expected - got)


@pytest.mark.slow
def test_flink_defaults_refuse_iso_timestamps(
    flink: FlinkWorker, kafka_broker: Any, table: Path, tmp_path: Path
) -> None:
    """Why ``time_mode=sql`` exists: Flink's default ``timestamp-format.standard`` (``SQL``) cannot read ISO-8601."""
    topic = tail_into(kafka_broker, table, tmp_path / "state", 1, key="id", time_mode="iso")
    write_partitions(kafka_broker, topic, tmp_path / "events")
    with pytest.raises(RuntimeError, match="could not be parsed"):
        flink_table(flink, tmp_path / "events", {})
