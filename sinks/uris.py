"""Sinks by URI: ``jsonl:-`` (default), ``jsonl:PATH``, ``parquet:DIR`` (``kafka://...``: :mod:`sinks.kafka.uri`).

Each function here makes the sink of one URI scheme (``shared``: the sink may share process-wide
resources with the other sinks of a ``deltatail serve``; only Kafka's does). They are registered under the
``deltatail.sinks`` entry points of the distribution (``pyproject.toml``), by scheme, which is how
the command line finds them (:mod:`tailer.cli.sink_uri`) without importing this package. The Kafka
sink's maker lives with the Kafka sink, so that a JSON-lines or Parquet sink does not import kafka-python.
"""

from __future__ import annotations

from deltatail.sinks.embedded import JsonLinesSink, ParquetDirSink
from deltatail.state.errors import ConfigError
from deltatail.tailer.sink import Sink


def jsonl_sink(uri: str, *, shared: bool = False) -> Sink:
    """``jsonl:-`` (or ``-``, ``jsonl``): JSON lines on standard output; ``jsonl:PATH``: to a file.

    Raises:
        ConfigError: if ``jsonl:`` has no path.
    """
    if uri in ("jsonl:-", "-", "jsonl"):
        return JsonLinesSink(None)
    return JsonLinesSink(_path(uri, "jsonl:"))


def parquet_sink(uri: str, *, shared: bool = False) -> Sink:
    """``parquet:DIR``: Parquet files in a directory.

    Raises:
        ConfigError: if the URI has no directory.
    """
    return ParquetDirSink(_path(uri, "parquet:"))


def _path(uri: str, prefix: str) -> str:
    path = uri[len(prefix) :]
    if not path:
        raise ConfigError(f"sink URI {uri!r} has no path")
    return path
