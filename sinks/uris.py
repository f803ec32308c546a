"""Sinks by URI: ``jsonl:-`` (default), ``jsonl:PATH``, ``parquet:DIR``, ``kafka://...``.

Each function here makes the sink of one URI scheme (``shared``: the sink may share process-wide
resources with the other sinks of a ``deltatail serve``; only Kafka's does). They are registered under the
``deltatail.sinks`` entry points of the distribution (``pyproject.toml``), by scheme, which is how
the command line finds them (:mod:`tailer.cli.sink_uri`) without importing this package.
"""

from __future__ import annotations

from deltatail.sinks.embedded import JsonLinesSink, ParquetDirSink
from deltatail.sinks.kafka.shared import ProducerPool
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.errors import ConfigError
from deltatail.tailer.sink import Sink

#: The Kafka producers of a process's shared sinks (``deltatail serve``): one per cluster and producer
#: settings (docs/serve.md). ``None``: every sink makes its own.
PRODUCERS: ProducerPool | None = ProducerPool()


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


def kafka_sink(uri: str, *, shared: bool = False) -> Sink:
    """``kafka://HOST:PORT/TOPIC?...``: a Kafka topic (options: :mod:`sinks.kafka.options`).

    With ``shared``, its producer comes from :data:`PRODUCERS` (shared with the process's other
    Kafka sinks of the same cluster and producer settings).

    Raises:
        ConfigError: if the URI does not start with ``kafka://``, or as :class:`KafkaSink` refuses it.
    """
    if not uri.startswith("kafka://"):
        raise ConfigError(f"sink URI {uri!r} is not kafka://HOST:PORT/TOPIC")
    return KafkaSink(uri, producers=PRODUCERS if shared else None)


def _path(uri: str, prefix: str) -> str:
    path = uri[len(prefix) :]
    if not path:
        raise ConfigError(f"sink URI {uri!r} has no path")
    return path
