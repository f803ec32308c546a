"""docker-compose.yml is checked as far as this machine allows (no Docker engine here): it parses,
names the services the README describes, and its deltatail command is one the CLI accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tailer.cli.main import build_parser
from tailer.cli.sink_uri import open_sink

ROOT = Path(__file__).resolve().parents[1]


def _compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_a_kraft_kafka_and_a_deltatail_built_from_the_project() -> None:
    services = _compose()["services"]
    assert set(services) == {"kafka", "deltatail"}
    kafka_env = services["kafka"]["environment"]
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert kafka_env["KAFKA_PROCESS_ROLES"] == "broker,controller"  # KRaft, no ZooKeeper
    assert services["deltatail"]["build"] == "."
    assert (ROOT / "Dockerfile").exists()
    assert services["deltatail"]["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_compose_command_is_accepted_by_the_cli() -> None:
    command = _compose()["services"]["deltatail"]["command"]
    args = build_parser().parse_args(command)
    assert args.command == "run"
    assert args.table == "/data/table"
    assert args.state_dir == "/state"
    sink = open_sink(args.sink)  # parses the Kafka URI without connecting
    assert type(sink).__name__ == "KafkaSink"


def test_compose_mounts_the_table_read_only_and_keeps_state_in_a_volume() -> None:
    compose = _compose()
    volumes = compose["services"]["deltatail"]["volumes"]
    assert "./table:/data/table:ro" in volumes
    assert any(v.startswith("deltatail-state:/state") for v in volumes)
    assert "deltatail-state" in compose["volumes"]
