"""Sinks by URI: ``jsonl:-`` (default), ``jsonl:PATH``, ``parquet:DIR``, ``kafka://...``.

Each function here makes the sink of one URI scheme. They are registered under the
``deltatail.sinks`` entry points of the distribution (``pyproject.toml``), by scheme, which is how
the command line finds them (:mod:`tailer.cli.sink_uri`) without importing this package.
"""

from __future__ import annotations

from sinks.embedded import JsonLinesSink, ParquetDirSink
from sinks.kafka.sink import KafkaSink
from state.errors import ConfigError
from tailer.sink import Sink


def jsonl_sink(uri: str) -> Sink:
    """``jsonl:-`` (or ``-``, ``jsonl``): JSON lines on standard output; ``jsonl:PATH``: to a file.

    Raises:
        ConfigError: if ``jsonl:`` has no path.
    """
    if uri in ("jsonl:-", "-", "jsonl"):
        return JsonLinesSink(None)
    return JsonLinesSink(_path(uri, "jsonl:"))


def parquet_sink(uri: str) -> Sink:
    """``parquet:DIR``: Parquet files in a directory.

    Raises:
        ConfigError: if the URI has no directory.
    """
    return ParquetDirSink(_path(uri, "parquet:"))


def kafka_sink(uri: str) -> Sink:
    """``kafka://HOST:PORT/TOPIC?...``: a Kafka topic (options: :mod:`sinks.kafka.options`).

    Raises:
        ConfigError: if the URI does not start with ``kafka://``, or as :class:`KafkaSink` refuses it.
    """
    if not uri.startswith("kafka://"):
        raise ConfigError(f"sink URI {uri!r} is not kafka://HOST:PORT/TOPIC")
    return KafkaSink(uri)


def _path(uri: str, prefix: str) -> str:
    path = uri[len(prefix) :]
    if not path:
        raise ConfigError(f"sink URI {uri!r} has no path")
    return path
