"""Sink URIs reach their sinks through the ``deltatail.sinks`` entry points, as an installed distribution declares them.

The command line imports no sink (tests/test_layers.py): these tests check that the distribution's
own entry points are the ones pyproject.toml declares, and that a package of one's own registering a
scheme is found the same way (a real ``.dist-info`` directory on ``sys.path``, read by
``importlib.metadata``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from deltatail.sinks.embedded import JsonLinesSink, ParquetDirSink
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.errors import ConfigError
from deltatail.tailer.cli import sink_uri
from deltatail.tailer.cli.sink_uri import ENTRY_POINTS, open_sink

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution of one's own on ``sys.path``, registering the schemes its ``entry_points.txt`` names."""
    dist = tmp_path / "my_sinks-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-sinks\nVersion: 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    sink_uri._openers.cache_clear()
    yield dist
    sink_uri._openers.cache_clear()


def test_the_installed_entry_points_are_those_pyproject_declares() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][ENTRY_POINTS]
    assert {name: entry.value for name, entry in sink_uri._openers().items()} == declared
    assert declared == {
        "jsonl": "deltatail.sinks.uris:jsonl_sink",
        "parquet": "deltatail.sinks.uris:parquet_sink",
        "kafka": "deltatail.sinks.kafka.uri:kafka_sink",
    }


def test_each_scheme_reaches_its_sink() -> None:
    assert isinstance(open_sink("-"), JsonLinesSink)
    assert isinstance(open_sink("jsonl"), JsonLinesSink)
    assert isinstance(open_sink("kafka://127.0.0.1:9/topic"), KafkaSink)


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("nosuch:x", "unknown sink URI 'nosuch:x'"),
        ("plain-path.jsonl", "unknown sink URI 'plain-path.jsonl'"),
        ("kafka:topic", "sink URI 'kafka:topic' is not kafka://HOST:PORT/TOPIC"),
        ("jsonl:", "sink URI 'jsonl:' has no path"),
    ],
)
def test_bad_uris_are_refused_by_name(uri: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_sink(uri)


def test_a_registered_scheme_of_another_package_is_found(plugin: Path, tmp_path: Path) -> None:
    (plugin / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\nmine = deltatail.sinks.uris:parquet_sink\n")
    assert isinstance(open_sink("mine:/tmp/out"), ParquetDirSink)


def test_an_entry_point_that_makes_no_sink_is_refused(plugin: Path) -> None:
    (plugin / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\nnotasink = builtins:len\n")
    with pytest.raises(ConfigError, match="entry point 'builtins:len' made no sink for 'notasink:x'"):
        open_sink("notasink:x")
