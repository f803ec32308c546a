"""A Lance dataset followed into Kafka: a topic named by ``{table_id}`` is a legal topic, and every row arrives once."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lance
import pytest

pytest.importorskip("kafka")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # helpers (tests/ is not a package)
from lance_datasets import rows

from deltatail.tailer.cli.main import main


def test_run_into_a_topic_named_by_the_lance_table_id(tmp_path: Path, kafka_broker: Any) -> None:
    ds = str(tmp_path / "ds.lance")
    lance.write_dataset(rows(range(10)), ds)
    lance.dataset(ds).delete("id < 3")
    uri = kafka_broker.uri("cdc.{table_id}", exactly_once=True)
    args = ["run", ds, "--state-dir", str(tmp_path / "state"), "--sink", uri, "--until-caught-up"]
    assert main(args) == 0
    topics = [t for t in kafka_broker.admin().list_topics() if t.startswith("cdc.lance-")]
    assert len(topics) == 1
    events = [json.loads(r.value) for r in kafka_broker.consume(topics[0])]
    assert sorted((e["_change_type"], e["id"]) for e in events) == sorted(
        [("insert", i) for i in range(10)] + [("delete", i) for i in range(3)]
    )
    assert main(args) == 0  # a restart repeats nothing
    assert len(kafka_broker.consume(topics[0])) == len(events)
