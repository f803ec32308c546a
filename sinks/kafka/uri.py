"""The ``kafka://`` sink URI: the maker registered under the ``deltatail.sinks`` entry point ``kafka``.

A module of its own (the other schemes' makers are in :mod:`sinks.uris`), so that kafka-python is
imported by a command that writes to Kafka and not by every command that opens a sink.
"""

from __future__ import annotations

from deltatail.sinks.kafka.shared import ProducerPool
from deltatail.sinks.kafka.sink import KafkaSink
from deltatail.state.errors import ConfigError
from deltatail.tailer.sink import Sink

#: The Kafka producers of a process's shared sinks (``deltatail serve``): one per cluster and producer
#: settings (docs/serve.md). ``None``: every sink makes its own.
PRODUCERS: ProducerPool | None = ProducerPool()


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
