"""docker-compose.yml is checked as far as this machine allows (no Docker engine here): it parses,
names the services the README describes, its deltatail command is one the CLI accepts and the
service configuration it mounts loads (tests/sinks/test_compose_service.py runs that configuration)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from deltatail.tailer.cli.main import build_parser
from deltatail.tailer.cli.serve import load_serve_config
from deltatail.tailer.cli.sink_uri import open_sink

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


def test_compose_command_is_accepted_by_the_cli_and_its_config_loads() -> None:
    service = _compose()["services"]["deltatail"]
    args = build_parser().parse_args(service["command"])
    assert args.command == "serve"
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}  # container path -> host path
    config = load_serve_config(str(ROOT / mounts[args.config]))  # the file the container reads
    assert config.state_root == "/state" and [d.root for d in config.discover] == ["/data/lake"]
    sink = open_sink(config.defaults.sink)  # parses the Kafka URI without connecting
    assert type(sink).__name__ == "KafkaSink"
    host, _, port = str(config.listen).rpartition(":")
    assert host == "0.0.0.0" and f"{port}:{port}" in service["ports"]  # metrics reachable from outside
    assert f":{port}/healthz" in service["healthcheck"]["test"][-1]


def test_compose_mounts_the_lake_read_only_and_keeps_state_in_a_volume() -> None:
    compose = _compose()
    volumes = compose["services"]["deltatail"]["volumes"]
    assert "./lake:/data/lake:ro" in volumes
    assert any(v.startswith("deltatail-state:/state") for v in volumes)
    assert "deltatail-state" in compose["volumes"]
