"""The Kafka sink's URI and options, topic templates, and Java-compatible partition choice (see ``docs/kafka.md``)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from kafka.codec import has_gzip, has_lz4, has_snappy, has_zstd

from deltatail.sinks.kafka.avro_options import AVRO_OPTIONS, AvroOptions, avro_options
from deltatail.sinks.kafka.connect_schema import ValueModes
from deltatail.sinks.kafka.debezium import HEARTBEAT_TOPIC, EventOptions
from deltatail.sinks.kafka.pairing import pair_key
from deltatail.sinks.kafka.transactions import TRANSACTION_OPTIONS, TRANSACTION_TOPIC, transaction_options
from deltatail.state.errors import ConfigError
from deltatail.state.feed import TableInfo
from deltatail.tailer.parse import parse_bool

#: Options that may also come from ``KAFKA_<NAME>`` and the kafka-python setting each feeds.
SECURITY_OPTIONS: dict[str, str] = {
    "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism",
    "sasl_username": "sasl_plain_username",
    "sasl_password": "sasl_plain_password",
    "ssl_cafile": "ssl_cafile",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl_password": "ssl_password",
    "ssl_check_hostname": "ssl_check_hostname",
}
#: The same security options under librdkafka's names (``ssl_check_hostname`` is mapped apart).
_LIBRDKAFKA_SECURITY: dict[str, str] = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_username": "sasl.username",
    "sasl_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password",
}
#: Producer libraries: kafka-python (pure Python, always there) or confluent-kafka (librdkafka, optional).
BACKENDS = ("kafka-python", "confluent")
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_CODECS: dict[str, Callable[[], bool]] = {"gzip": has_gzip, "snappy": has_snappy, "lz4": has_lz4, "zstd": has_zstd}
_INT_OPTIONS = (
    "linger_ms",
    "batch_size",
    "max_message_bytes",
    "delivery_timeout_ms",
    "request_timeout_ms",
    "retry_backoff_ms",
    "reconnect_backoff_max_ms",
    "open_timeout_ms",
)
_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    """A parsed ``kafka://`` URI. See ``docs/kafka.md`` for the meaning of each option."""

    bootstrap: tuple[str, ...]
    topic: str
    format: str = "json"
    key_columns: tuple[str, ...] = ()
    tombstones: bool = False
    exactly_once: bool = False
    commit_topic: str | None = None
    sink_id: str | None = None
    backend: str = "kafka-python"
    linger_ms: int = 10
    batch_size: int = 262_144
    compression: str | None = None
    max_message_bytes: int = 1_048_576
    delivery_timeout_ms: int = 120_000
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    reconnect_backoff_max_ms: int = 1_000
    open_timeout_ms: int = 30_000
    security: dict[str, Any] = field(default_factory=dict)
    events: EventOptions = field(default_factory=EventOptions)
    allow_unordered: bool = False
    heartbeat_interval: float | None = None
    heartbeat_topic: str = HEARTBEAT_TOPIC
    schema_changes: bool = False
    avro: AvroOptions | None = None
    transactions: bool = False
    transaction_topic: str = TRANSACTION_TOPIC

    @property
    def pair_key(self) -> tuple[str, ...]:
        """The key columns by which the events pair update images, or ``()`` (:mod:`sinks.kafka.pairing`)."""
        return pair_key(self.format, self.key_columns, transactions=self.events.transactions)

    @staticmethod
    def from_uri(uri: str, env: Mapping[str, str] | None = None) -> KafkaOptions:
        """Parse a ``kafka://`` URI; security options missing from it are read from ``env``.

        Args:
            uri: the sink URI.
            env: the environment to read ``KAFKA_*`` variables from; ``os.environ`` if ``None``.

        Raises:
            ConfigError: on a malformed URI, an unknown or repeated option, or a bad value.
        """
        parts = urlsplit(uri)
        if parts.scheme != "kafka":
            raise ConfigError(f"not a kafka:// URI: {uri!r}")
        bootstrap = tuple(_check_host(h, uri) for h in parts.netloc.split(","))
        topic = unquote(parts.path.lstrip("/"))
        if not topic or "/" in topic:
            raise ConfigError(f"kafka URI {uri!r} needs exactly one topic after the hosts: kafka://HOST:PORT/TOPIC")
        raw = _query(parts.query, uri)
        env = os.environ if env is None else env
        for name in SECURITY_OPTIONS:
            if name not in raw and env.get(f"KAFKA_{name.upper()}"):
                raw[name] = env[f"KAFKA_{name.upper()}"]
        return replace(_build_options(bootstrap, topic, raw, uri), avro=avro_options(raw, uri, env))

    def producer_config(self) -> dict[str, Any]:
        """The settings handed to ``KafkaProducer`` (idempotence and ``acks`` set explicitly)."""
        return {
            **self._client_config(),
            "enable_idempotence": True,
            "acks": "all",
            "linger_ms": self.linger_ms,
            "batch_size": self.batch_size,
            "compression_type": self.compression,
            "max_request_size": self.max_message_bytes,
            "delivery_timeout_ms": self.delivery_timeout_ms,
            "retry_backoff_ms": self.retry_backoff_ms,
            "max_block_ms": self.open_timeout_ms,
        }

    def confluent_config(self) -> dict[str, Any]:
        """The settings handed to confluent-kafka's ``Producer`` (librdkafka names).

        ``partitioner`` is ``murmur2_random``: a message produced without a partition goes to
        :func:`choose_partition` of its key (against the partition count librdkafka knows), as
        with Kafka's Java client; only a null key would be placed at random, and the sink has none.
        ``reconnect.backoff.ms`` is kafka-python's ``reconnect_backoff_ms`` (50 ms, at most
        ``reconnect_backoff_max_ms``): librdkafka waits up to half of it (its default of 100 ms: ~50 ms)
        before the first metadata request that ``open`` makes.
        """
        security = {_LIBRDKAFKA_SECURITY[k]: v for k, v in self.security.items() if k != "ssl_check_hostname"}
        if "ssl_check_hostname" in self.security:
            security["ssl.endpoint.identification.algorithm"] = (
                "https" if self.security["ssl_check_hostname"] else "none"
            )
        return {
            "bootstrap.servers": ",".join(self.bootstrap),
            "client.id": "deltatail",
            "enable.idempotence": True,
            "acks": "all",
            "enable.gapless.guarantee": True,
            "delivery.report.only.error": True,
            "partitioner": "murmur2_random",
            "linger.ms": self.linger_ms,
            "batch.size": min(self.batch_size, self.max_message_bytes),
            "compression.type": self.compression or "none",
            "message.max.bytes": self.max_message_bytes,
            "message.timeout.ms": self.delivery_timeout_ms,
            "request.timeout.ms": self.request_timeout_ms,
            "retry.backoff.ms": self.retry_backoff_ms,
            "reconnect.backoff.ms": min(50, self.reconnect_backoff_max_ms),
            "reconnect.backoff.max.ms": self.reconnect_backoff_max_ms,
            "logger": logging.getLogger("deltatail.sinks.kafka.librdkafka"),
            **security,
        }

    def consumer_config(self) -> dict[str, Any]:
        """The settings of the consumer that reads partition tails in ``open`` (no group, no commits)."""
        return {
            **self._client_config(),
            "group_id": None,
            "enable_auto_commit": False,
            "fetch_max_wait_ms": 100,
            "max_partition_fetch_bytes": max(self.max_message_bytes, 1_048_576),
        }

    def _client_config(self) -> dict[str, Any]:
        return {
            "bootstrap_servers": list(self.bootstrap),
            "client_id": "deltatail",
            "request_timeout_ms": self.request_timeout_ms,
            "reconnect_backoff_ms": min(50, self.reconnect_backoff_max_ms),
            "reconnect_backoff_max_ms": self.reconnect_backoff_max_ms,
            "bootstrap_timeout_ms": self.open_timeout_ms,
            **{SECURITY_OPTIONS[k]: v for k, v in self.security.items()},
        }


def _check_host(host: str, uri: str) -> str:
    name, sep, port = host.rpartition(":")
    if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"kafka URI {uri!r}: {host!r} is not HOST:PORT")
    return host


def _query(query: str, uri: str) -> dict[str, str]:
    known = {
        "format", "key", "tombstones", "exactly_once", "commit_topic", "sink_id", "compression", "backend",
        "schema_changes",
        *_INT_OPTIONS, *SECURITY_OPTIONS, *_EVENT_OPTIONS, *AVRO_OPTIONS,
        *TRANSACTION_OPTIONS,
    }  # fmt: skip
    raw: dict[str, str] = {}
    for name, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if name not in known:
            raise ConfigError(f"kafka URI {uri!r}: unknown option {name!r}; known: {', '.join(sorted(known))}")
        if name in raw:
            raise ConfigError(f"kafka URI {uri!r}: option {name!r} given twice")
        raw[name] = value
    return raw


def _bool(name: str, value: str, uri: str) -> bool:
    try:
        return parse_bool(value, name=f"option {name}")
    except ConfigError as e:
        raise ConfigError(f"kafka URI {uri!r}: {e.message}") from None


def _int(name: str, value: str, uri: str) -> int:
    smallest = 0 if name == "linger_ms" else 1
    if not value.isdigit() or int(value) < smallest:
        raise ConfigError(f"kafka URI {uri!r}: option {name}={value!r} is not an integer >= {smallest}")
    return int(value)


def _build_options(bootstrap: tuple[str, ...], topic: str, raw: dict[str, str], uri: str) -> KafkaOptions:
    opts = KafkaOptions(bootstrap, topic)
    ints: dict[str, Any] = {k: _int(k, raw[k], uri) for k in _INT_OPTIONS if k in raw}
    fmt = raw.get("format", "json")
    if fmt not in ("json", "debezium", "flat"):
        raise ConfigError(f"kafka URI {uri!r}: format={fmt!r}; expected json, debezium or flat")
    keys = tuple(k.strip() for k in raw["key"].split(",")) if raw.get("key") else ()
    if any(not k for k in keys):
        raise ConfigError(f"kafka URI {uri!r}: key={raw['key']!r} has an empty column name")
    opts = replace(
        opts,
        format=fmt,
        key_columns=keys,
        tombstones=_bool("tombstones", raw.get("tombstones", "false"), uri),
        exactly_once=_bool("exactly_once", raw.get("exactly_once", "false"), uri),
        schema_changes=_bool("schema_changes", raw.get("schema_changes", "false"), uri),
        commit_topic=raw.get("commit_topic") or None,
        sink_id=raw.get("sink_id") or None,
        backend=_backend(raw.get("backend", "kafka-python"), uri),
        compression=_compression(raw.get("compression", "none"), raw.get("backend", "kafka-python"), uri),
        security=_security(raw, uri),
        **_event_options(raw, uri, fmt),
        **transaction_options(raw, uri, fmt),
        **ints,
    )
    if opts.tombstones and not opts.key_columns:
        raise ConfigError(f"kafka URI {uri!r}: tombstones=true needs key=COL,... (a position key never repeats)")
    return opts


#: Options of the debezium and flat formats and of heartbeats (see :mod:`sinks.kafka.debezium`).
_EVENT_OPTIONS = (
    "schemas", "time_mode", "decimal_mode", "server_name", "source_db", "source_schema", "source_table",
    "allow_unordered", "heartbeat_interval", "heartbeat_topic",
)  # fmt: skip


def _event_options(raw: dict[str, str], uri: str, fmt: str) -> dict[str, Any]:
    """The :class:`KafkaOptions` fields of the event options in ``raw``."""
    given = [k for k in _EVENT_OPTIONS[:7] if k in raw and k != "server_name"]
    if raw.get("encoding") == "avro":  # the json format's values follow the modes in Avro
        given = [k for k in given if k not in ("time_mode", "decimal_mode")]
    if given and fmt == "json":
        raise ConfigError(f"kafka URI {uri!r}: {', '.join(given)} apply to format=debezium or format=flat only")
    defaults = EventOptions()
    try:
        modes = ValueModes(raw.get("time_mode", "iso"), raw.get("decimal_mode", "string"))
    except ConfigError as e:
        raise ConfigError(f"kafka URI {uri!r}: {e.message}") from e
    events = EventOptions(
        schemas=_bool("schemas", raw.get("schemas", "false"), uri),
        modes=modes,
        server_name=_name("server_name", raw.get("server_name", defaults.server_name), uri),
        source_db=_name("source_db", raw.get("source_db", defaults.source_db), uri),
        source_schema=_name("source_schema", raw["source_schema"], uri) if "source_schema" in raw else None,
        source_table=_name("source_table", raw["source_table"], uri) if "source_table" in raw else None,
        transactions=_bool("transactions", raw.get("transactions", "false"), uri),
    )
    interval = None
    if "heartbeat_interval" in raw:
        try:
            interval = float(raw["heartbeat_interval"])
        except ValueError:
            interval = -1.0
        if not 0 < interval < float("inf"):
            raise ConfigError(f"kafka URI {uri!r}: heartbeat_interval={raw['heartbeat_interval']!r} is not seconds > 0")
    return {
        "events": events,
        "allow_unordered": _bool("allow_unordered", raw.get("allow_unordered", "false"), uri),
        "heartbeat_interval": interval,
        "heartbeat_topic": raw.get("heartbeat_topic") or HEARTBEAT_TOPIC,
    }


def _name(option: str, value: str, uri: str) -> str:
    if not value.strip():
        raise ConfigError(f"kafka URI {uri!r}: {option} is empty")
    return value


def _backend(name: str, uri: str) -> str:
    if name not in BACKENDS:
        raise ConfigError(f"kafka URI {uri!r}: backend={name!r}; expected one of {', '.join(BACKENDS)}")
    if name == "confluent" and importlib.util.find_spec("confluent_kafka") is None:
        raise ConfigError(f"kafka URI {uri!r}: backend=confluent needs the package confluent-kafka")
    return name


def _compression(name: str, backend: str, uri: str) -> str | None:
    if name == "none":
        return None
    if name not in _CODECS:
        raise ConfigError(f"kafka URI {uri!r}: compression={name!r}; expected none, {', '.join(_CODECS)}")
    if backend == "kafka-python" and not _CODECS[name]():  # librdkafka has every codec built in
        raise ConfigError(f"kafka URI {uri!r}: compression={name} needs a Python package that is not installed")
    return name


def _security(raw: dict[str, str], uri: str) -> dict[str, Any]:
    sec: dict[str, Any] = {k: raw[k] for k in SECURITY_OPTIONS if k in raw}
    if sec.get("security_protocol", "PLAINTEXT") not in _PROTOCOLS:
        raise ConfigError(f"kafka URI {uri!r}: security_protocol={sec['security_protocol']!r}; expected {_PROTOCOLS}")
    if sec.get("sasl_mechanism", "PLAIN") not in _MECHANISMS:
        raise ConfigError(f"kafka URI {uri!r}: sasl_mechanism={sec['sasl_mechanism']!r}; expected {_MECHANISMS}")
    if "ssl_check_hostname" in sec:
        sec["ssl_check_hostname"] = _bool("ssl_check_hostname", sec["ssl_check_hostname"], uri)
    return sec


def fill_topic(template: str, table: TableInfo, server_name: str = "deltatail") -> str:
    """Fill ``{table_name}``, ``{table_id}``, ``{server_name}`` in a topic template; check the result is a legal topic.

    Raises:
        ConfigError: if the template names another field, needs a name the table lacks, or
            yields an illegal topic name (Kafka allows ``[a-zA-Z0-9._-]``, at most 249 characters).
    """
    try:
        topic = template.format_map({"table_name": table.name, "table_id": table.table_id, "server_name": server_name})
    except (KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"topic template {template!r} is invalid: {e}", table=table.path) from e
    if "{table_name}" in template and not table.name:
        raise ConfigError(f"topic template {template!r} needs a table name, and the table has none", table=table.path)
    if not topic or len(topic) > 249 or not set(topic) <= _TOPIC_CHARS or topic in (".", ".."):
        raise ConfigError(f"topic {topic!r} (from {template!r}) is not a legal Kafka topic name", table=table.path)
    return topic


def default_sink_id(table_id: str, topic: str) -> str:
    """The sink id used when the URI names none: stable for a (table id, topic) pair."""
    return "dt-" + hashlib.sha256(f"{table_id}\0{topic}".encode()).hexdigest()[:16]
