"""Kafka across schema changes: plain JSON, Debezium with Connect schemas, and the schema change topic.

``deltatail run`` with default settings follows each corpus table with a non-additive schema change
(and the generated one of ``tests/tailer/schema_change_tables.py``) into a real broker (tansu):

- ``format=json``: every message is a reference row (deltalake or pyarrow reads), under the field
  names of its own version;
- ``format=debezium&schemas=true``: each event's Connect value schema (``before``/``after``) names
  exactly the columns of its row's version, and the row's image is the reference row;
- ``schema_changes=true``: the ``server_name`` topic holds one Debezium schema-change event per
  version whose columns (names or types, read from the JSON log by the test) differ from the
  version before, ``CREATE`` for version 0, keyed by ``databaseName``, ``tableChanges`` listing the
  columns after the change.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("kafka")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # tests/tailer: schema_change_tables.py
from corpus import corpus_root
from schema_change_tables import CORPUS, Row, log_actions, reference_rows, row_key, write_evolving_table

from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.errors import ConfigError
from deltatail.state.feed import TableInfo
from deltatail.tailer.cli.main import main

TABLES = [*sorted(CORPUS), "generated"]


def table_path(name: str, tmp_path: Path) -> Path:
    if name == "generated":
        return write_evolving_table(tmp_path / "generated")
    return corpus_root() / CORPUS[name][0]


def last_version(table: Path) -> int:
    return max(int(p.stem) for p in (table / "_delta_log").glob("*.json"))


def schemas_by_version(table: Path, last: int) -> dict[int, list[tuple[str, str]]]:
    """Each version's columns as (name, Delta type text), from the JSON log (the last ``metaData`` up to it)."""
    out: dict[int, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for v in range(last + 1):
        for a in log_actions(table, v):
            if "metaData" in a:
                fields = json.loads(a["metaData"]["schemaString"])["fields"]
                current = [(f["name"], json.dumps(f["type"], sort_keys=True)) for f in fields]
        out[v] = current
    return out


def single_precision(rows: Counter[Row]) -> Counter[Row]:
    """``rows`` with every float at 6 significant digits: Connect writes a FLOAT32 at its own precision
    (``3.4``), Python reads it as a double (``3.4000000953674316``)."""

    def rounded(value: Any) -> Any:
        if isinstance(value, float):
            return float(f"{value:.6g}")
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, list):
            return [rounded(v) for v in value]
        return value

    out: Counter[Row] = Counter()
    for (version, kind, text), n in rows.items():
        out[(version, kind, json.dumps(rounded(json.loads(text)), sort_keys=True))] += n
    return out


def run(table: Path, state: Path, uri: str) -> None:
    args = ["run", str(table), "--state-dir", str(state), "--sink", uri, "--until-caught-up"]
    assert main([*args, "--reader-processes", "0"]) == 0


@pytest.mark.parametrize("name", TABLES)
def test_plain_json_messages_carry_each_versions_field_names(name: str, kafka_broker: Any, tmp_path: Path) -> None:
    table = table_path(name, tmp_path)
    topic = kafka_broker.new_topic(1)
    run(table, tmp_path / "state", kafka_broker.uri(topic))
    values = [orjson.loads(r.value) for r in kafka_broker.consume(topic)]
    delivered = Counter(row_key(v["_commit_version"], v["_change_type"], v) for v in values)
    assert delivered == reference_rows(table, last_version(table))


@pytest.mark.parametrize("name", TABLES)
def test_debezium_schemas_follow_the_table_and_schema_changes_are_events(
    name: str, kafka_broker: Any, tmp_path: Path
) -> None:
    table = table_path(name, tmp_path)
    last = last_version(table)
    topic, server = kafka_broker.new_topic(1), kafka_broker.new_topic(1, prefix="server")
    options = {"format": "debezium", "schemas": True, "schema_changes": True, "server_name": server}
    run(table, tmp_path / "state", kafka_broker.uri(topic, **options))
    columns = schemas_by_version(table, last)
    delivered: Counter[Row] = Counter()
    for record in kafka_broker.consume(topic):
        event = orjson.loads(record.value)
        payload, version = event["payload"], event["payload"]["source"]["commit_version"]
        image_field = "after" if payload["op"] in ("c", "r") else "before"
        image = next(f for f in event["schema"]["fields"] if f["field"] == image_field)
        names = [f["field"] for f in image["fields"]]
        change_type = "insert" if image_field == "after" else "delete"
        assert names in ([n for n, _ in columns[version]], [n for n, _ in columns.get(version - 1, [])])
        delivered[row_key(version, change_type, payload[image_field])] += 1
    assert single_precision(delivered) == single_precision(reference_rows(table, last))

    changed = [v for v in range(last + 1) if v == 0 or columns[v] != columns[v - 1]]
    events = kafka_broker.consume(server)
    assert [orjson.loads(r.key) for r in events] == [{"databaseName": "delta"}] * len(changed)
    values = [orjson.loads(r.value) for r in events]
    assert [v["source"]["commit_version"] for v in values] == changed
    assert [v["tableChanges"][0]["type"] for v in values] == ["CREATE"] + ["ALTER"] * (len(changed) - 1)
    for v in values:
        after = [c["name"] for c in v["tableChanges"][0]["table"]["columns"]]
        assert after == [n for n, _ in columns[v["source"]["commit_version"]]]
        assert v["databaseName"] == "delta" and v["ddl"] is None
    kind = CORPUS[name][1] if name in CORPUS else "dropped"
    assert any(v["tableChanges"][0]["deltaChanges"][kind] for v in values[1:])


def test_the_schema_change_topic_must_be_its_own() -> None:
    sink = KafkaSink("kafka://127.0.0.1:1/cdc?format=debezium&schema_changes=true&server_name=cdc")
    with pytest.raises(ConfigError, match="schema change topic cdc"):
        sink.open(TableInfo("/t", "id-1", "t"))
    with pytest.raises(ConfigError, match="schema_changes"):
        KafkaSink("kafka://127.0.0.1:1/cdc?schema_changes=maybe")
