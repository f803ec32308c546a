"""Sinks by URI: ``jsonl:-`` (default), ``jsonl:PATH``, ``parquet:DIR``, ``kafka://...``."""

from __future__ import annotations

from sinks.embedded import JsonLinesSink, ParquetDirSink
from sinks.kafka.shared import ProducerPool
from sinks.kafka.sink import KafkaSink
from state.errors import ConfigError
from tailer.follow.sink import Sink


def open_sink(uri: str, producers: ProducerPool | None = None) -> Sink:
    """The sink a URI names (not yet opened); a Kafka sink takes its producer from ``producers`` if given.

    Raises:
        ConfigError: if the URI's scheme is unknown or its path is empty.
    """
    if uri in ("jsonl:-", "-", "jsonl"):
        return JsonLinesSink(None)
    if uri.startswith("jsonl:"):
        return JsonLinesSink(_path(uri, "jsonl:"))
    if uri.startswith("parquet:"):
        return ParquetDirSink(_path(uri, "parquet:"))
    if uri.startswith("kafka://"):
        return KafkaSink(uri, producers=producers)
    raise ConfigError(f"unknown sink URI {uri!r}; expected jsonl:-, jsonl:PATH, parquet:DIR or kafka://HOST:PORT/TOPIC")


def _path(uri: str, prefix: str) -> str:
    path = uri[len(prefix) :]
    if not path:
        raise ConfigError(f"sink URI {uri!r} has no path")
    return path
