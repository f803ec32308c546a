"""The service docker-compose.yml runs, run here without Docker: deploy/deltatail.toml with only
its addresses and paths pointed at this machine (a tansu broker, a temporary lake), and the
compose healthcheck's own command run against it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from deltalake import DeltaTable, write_deltalake
from kafka.admin import NewTopic

ROOT = Path(__file__).resolve().parents[2]


def _config(lake: Path, state: Path, bootstrap: str) -> str:
    text = (ROOT / "deploy" / "deltatail.toml").read_text()
    for old, new in [
        ('root = "/data/lake"', f'root = "{lake}"'),
        ('state_root = "/state"', f'state_root = "{state}"'),
        ('listen = "0.0.0.0:9108"', 'listen = "127.0.0.1:0"'),
        ("kafka://kafka:9092/", f"kafka://{bootstrap}/"),
    ]:
        assert text.count(old) == 1, f"deploy/deltatail.toml no longer has {old!r}"
        text = text.replace(old, new)
    return text


def _healthcheck(port: int) -> list[str]:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    test = compose["services"]["deltatail"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "python"
    assert "127.0.0.1:9108/healthz" in test[-1]
    return [sys.executable, *test[2:-1], test[-1].replace(":9108/", f":{port}/")]


def _wait_events(kafka: Any, topic: str, count: int, timeout: float = 90.0) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout
    events: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            events = [json.loads(r.value) for r in kafka.consume(topic, timeout=10) if r.value is not None]
        except Exception:  # the topic is created by the first send; until then reading it fails
            events = []
        if len(events) >= count:
            return events
        time.sleep(0.5)
    raise AssertionError(f"{topic}: {len(events)} of {count} events")


@pytest.mark.slow
def test_the_compose_service_config_follows_a_lake_into_debezium_topics(tmp_path: Path, kafka_broker: Any) -> None:
    lake, state = tmp_path / "lake", tmp_path / "state"
    for name in ("orders", "customers"):
        write_deltalake(
            str(lake / name),
            pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}),
            configuration={"delta.enableChangeDataFeed": "true"},  # a delete is then exactly its rows
        )
    # The broker of docker-compose.yml auto-creates topics with KAFKA_NUM_PARTITIONS partitions;
    # the tansu broker here does not read that setting, so the topics are made as it would make them.
    kafka_env = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["kafka"]["environment"]
    partitions = int(kafka_env["KAFKA_NUM_PARTITIONS"])
    kafka_broker.admin().create_topics(
        [NewTopic(f"cdc.{name}", num_partitions=partitions, replication_factor=1) for name in ("orders", "customers")]
    )
    config = tmp_path / "deltatail.toml"
    config.write_text(_config(lake, state, kafka_broker.bootstrap))
    log = tmp_path / "serve.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)], cwd=ROOT, stderr=log.open("ab")
    )
    try:
        port = 0
        deadline = time.monotonic() + 60
        while not port:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            found = re.search(rb"metrics and health on http://127\.0\.0\.1:(\d+)/", log.read_bytes())
            port = int(found.group(1)) if found else 0
            time.sleep(0.1)
        assert subprocess.run(_healthcheck(port), timeout=30).returncode == 0

        # initial_snapshot: the live rows first, as Debezium reads ("op": "r").
        for name in ("orders", "customers"):
            events = _wait_events(kafka_broker, f"cdc.{name}", 3)
            assert sorted((e["op"], e["after"]["id"]) for e in events) == [  # type: ignore[index]
                ("r", 1),
                ("r", 2),
                ("r", 3),
            ]
        DeltaTable(str(lake / "orders")).delete("id = 2")
        events = _wait_events(kafka_broker, "cdc.orders", 4)
        deleted = [e for e in events if e["op"] == "d"]
        assert [(d["before"]["id"], d["after"]) for d in deleted] == [(2, None)]  # type: ignore[index]
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, log.read_text()
    # Stopped: the healthcheck fails, so an orchestrator would restart the container.
    assert subprocess.run(_healthcheck(port), timeout=30, capture_output=True).returncode != 0
