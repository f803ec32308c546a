"""A sink that publishes change rows to a Kafka topic.

URI::

    kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?OPTION=VALUE&...]

``TOPIC`` may be a template filled from the table: ``{table_name}`` and
``{table_id}`` (``kafka://broker:9092/cdc.{table_name}``). Options:

=========================== =========================================================
``format``                  ``json`` (default) or ``debezium`` (see :mod:`sinks.encoding`)
``key``                     ``COL,COL...``: key columns; default: the row's position
``tombstones``              ``true``: a null-valued message after each delete (needs ``key``)
``exactly_once``            ``true``: resume without duplicates (below); default ``false``
``commit_topic``            topic (template) for one event per commit, via :meth:`KafkaSink.commit_event`
``sink_id``                 names this sink in headers; default derived from table id and topic
``backend``                 ``kafka-python`` (default) or ``confluent`` (confluent-kafka, ~3x faster)
``linger_ms``               producer linger, default 10
``batch_size``              producer batch size in bytes, default 262144
``compression``             ``none`` (default), ``gzip``, ``snappy``, ``lz4``, ``zstd``
``max_message_bytes``       largest message accepted, default 1048576 (Kafka's broker default)
``delivery_timeout_ms``     how long the producer retries a message, default 120000
``request_timeout_ms``      one request's timeout, default 30000
``retry_backoff_ms``        pause before a retried request, default 100
``reconnect_backoff_max_ms`` cap of the exponential reconnect backoff, default 1000
``open_timeout_ms``         bound for connecting and reading topic tails in ``open``, default 30000
security                    ``security_protocol``, ``sasl_mechanism``, ``sasl_username``,
                            ``sasl_password``, ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``,
                            ``ssl_password``, ``ssl_check_hostname``
=========================== =========================================================

Each security option may instead come from the environment as ``KAFKA_`` plus
its upper-cased name (``KAFKA_SASL_PASSWORD``); the URI wins. Secrets belong in
the environment. They are handed to kafka-python unchanged, and to librdkafka
under its own names (``sasl.username``, ``ssl.ca.location``...). The tails read
by ``open`` always use kafka-python.

Delivery. The producer is idempotent with ``acks=all`` and retries every
request, with backoff, for up to ``delivery_timeout_ms``; :meth:`KafkaSink.flush`
waits for every message and raises :class:`~state.errors.SinkError` naming the
position of the first one (in send order) that was not acknowledged. The first
failure stops the sink: the producer is stopped from sending anything queued
(kafka-python: its sender thread is force-closed from the failure callback;
librdkafka: the queue is purged, and ``enable.gapless.guarantee`` is on), every
later call raises, and :meth:`KafkaSink.close` drops what is still queued.
Requests already on the wire may still land; ``dt.seq`` catches a gap they
leave (below). Reopen a new sink to go on.

Every message's partition is chosen by the sink: murmur2 of the key bytes
modulo the partition count, which is what Kafka's Java client does for keyed
records. Headers on every message (values are UTF-8):

=================== =======================================================
``dt.table_id``     the table's id
``dt.sink_id``      the sink id
``dt.version``      commit version
``dt.position``     ``{"version", "index", "snapshot"}`` (:meth:`Position.to_json`)
``dt.change_type``  the row's change type, or ``update`` for a paired ``u`` event
``dt.seq``          (exactly-once) this sink's message count in the partition, from 0
``dt.partitions``   (exactly-once) the topic's partition count when sent
=================== =======================================================

Exactly once without transactions (``exactly_once=true``). Messages go to each
partition in position order, so a partition's last message tells how far the
sink got there. ``open`` reads the last message of every partition (and the
first, to check ``dt.seq`` against offsets for lost messages) and ``write``
skips every message that is not after what its partition already holds. This
is exact when the tailer replays from any cursor at or before the end of what
was delivered. ``open`` returns ``None``: rows before the tailer's cursor may
still be missing from some partitions, so the skipping is per partition. It
refuses (``SinkError``) a topic whose partitions end with messages without
deltatail headers, of another table or sink id, written with another partition
count, or whose ``dt.seq`` shows a message missing. Not covered: other
producers writing to the topic in between (their messages make it refuse),
partitions added later (refused), and a tailer that replays with different
batch boundaries than before, which can turn a paired ``u`` event into a ``d``
plus ``c`` (see :mod:`sinks.encoding`). Commit events are deduplicated only
against the last message of their partition of the commit topic.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import importlib.util
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol
from urllib.parse import parse_qsl, unquote, urlsplit

import orjson
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.codec import has_gzip, has_lz4, has_snappy, has_zstd
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

from sinks.base import ChangeBatch, CommitEvent, Sink, TableInfo
from sinks.encoding import ChangeEncoder
from state.cursor import Position
from state.errors import ConfigError, SinkError, SinkUnavailableError, StateError

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

# A stamp orders a sink's messages: (version, snapshot_rank, index, 0 for an event / 1 for its tombstone).
Stamp = tuple[int, int, int, int]
_BEFORE_ALL: Stamp = (-1, 0, 0, 0)
#: Pending futures are pruned of acknowledged ones whenever this many accumulate.
_COMPACT_EVERY = 100_000


@dataclass(frozen=True, slots=True)
class KafkaOptions:
    """A parsed ``kafka://`` URI. See the module docstring for the meaning of each field."""

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
        return _build_options(bootstrap, topic, raw, uri)

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
        """The settings handed to confluent-kafka's ``Producer`` (librdkafka names)."""
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
            "linger.ms": self.linger_ms,
            "batch.size": min(self.batch_size, self.max_message_bytes),
            "compression.type": self.compression or "none",
            "message.max.bytes": self.max_message_bytes,
            "message.timeout.ms": self.delivery_timeout_ms,
            "request.timeout.ms": self.request_timeout_ms,
            "retry.backoff.ms": self.retry_backoff_ms,
            "reconnect.backoff.max.ms": self.reconnect_backoff_max_ms,
            "logger": logging.getLogger("sinks.kafka.librdkafka"),
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
        *_INT_OPTIONS, *SECURITY_OPTIONS,
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
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ConfigError(f"kafka URI {uri!r}: option {name}={value!r} is not true or false")


def _int(name: str, value: str, uri: str) -> int:
    smallest = 0 if name == "linger_ms" else 1
    if not value.isdigit() or int(value) < smallest:
        raise ConfigError(f"kafka URI {uri!r}: option {name}={value!r} is not an integer >= {smallest}")
    return int(value)


def _build_options(bootstrap: tuple[str, ...], topic: str, raw: dict[str, str], uri: str) -> KafkaOptions:
    opts = KafkaOptions(bootstrap, topic)
    ints: dict[str, Any] = {k: _int(k, raw[k], uri) for k in _INT_OPTIONS if k in raw}
    fmt = raw.get("format", "json")
    if fmt not in ("json", "debezium"):
        raise ConfigError(f"kafka URI {uri!r}: format={fmt!r}; expected json or debezium")
    keys = tuple(k.strip() for k in raw["key"].split(",")) if raw.get("key") else ()
    if any(not k for k in keys):
        raise ConfigError(f"kafka URI {uri!r}: key={raw['key']!r} has an empty column name")
    opts = replace(
        opts,
        format=fmt,
        key_columns=keys,
        tombstones=_bool("tombstones", raw.get("tombstones", "false"), uri),
        exactly_once=_bool("exactly_once", raw.get("exactly_once", "false"), uri),
        commit_topic=raw.get("commit_topic") or None,
        sink_id=raw.get("sink_id") or None,
        backend=_backend(raw.get("backend", "kafka-python"), uri),
        compression=_compression(raw.get("compression", "none"), raw.get("backend", "kafka-python"), uri),
        security=_security(raw, uri),
        **ints,
    )
    if opts.tombstones and not opts.key_columns:
        raise ConfigError(f"kafka URI {uri!r}: tombstones=true needs key=COL,... (a position key never repeats)")
    return opts


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


def fill_topic(template: str, table: TableInfo) -> str:
    """Fill ``{table_name}`` / ``{table_id}`` in a topic template and check the result is a legal topic.

    Raises:
        ConfigError: if the template names another field, needs a name the table lacks, or
            yields an illegal topic name (Kafka allows ``[a-zA-Z0-9._-]``, at most 249 characters).
    """
    try:
        topic = template.format_map({"table_name": table.name, "table_id": table.table_id})
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


def choose_partition(key: bytes, partitions: int) -> int:
    """The partition of a key: positive murmur2 modulo the count, as Kafka's Java client does."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_MURMUR_M, _MASK32 = 0x5BD1E995, 0xFFFFFFFF
_WORDS = struct.Struct("<I").iter_unpack


def murmur2(data: bytes) -> int:
    """32-bit MurmurHash2 with Kafka's seed, as an unsigned int (Java's ``Utils.murmur2`` reads it signed)."""
    n = len(data)
    h = 0x9747B28C ^ n
    end = n & ~3
    for (k,) in _WORDS(data[:end]):
        k = (k * _MURMUR_M) & _MASK32
        k = ((k ^ (k >> 24)) * _MURMUR_M) & _MASK32
        h = ((h * _MURMUR_M) & _MASK32) ^ k
    if end != n:  # the last 1-3 bytes, little-endian
        h = ((h ^ int.from_bytes(data[end:], "little")) * _MURMUR_M) & _MASK32
    h = ((h ^ (h >> 13)) * _MURMUR_M) & _MASK32
    return h ^ (h >> 15)


# ---------------------------------------------------------------- tails --


@dataclass(frozen=True, slots=True)
class Tail:
    """What one partition holds of this sink: its last message's stamp and sequence number."""

    stamp: Stamp
    seq: int
    version: int


def _header_map(headers: list[tuple[str, bytes]] | None) -> dict[str, bytes]:
    return dict(headers or ())


def _tail_of(where: str, offset: int, value: bytes | None, headers: dict[str, bytes]) -> Tail:
    """Parse the deltatail headers of one message; ``where`` names it in errors."""
    try:
        pos = Position.from_json(orjson.loads(headers["dt.position"]))
        seq = int(headers.get("dt.seq", b"-1"))
    except (KeyError, ValueError, orjson.JSONDecodeError, StateError) as e:
        raise SinkError(f"{where} holds a message at offset {offset} without valid deltatail headers: {e}") from e
    stamp = (pos.version, pos.snapshot_rank, pos.index, 1 if value is None else 0)
    return Tail(stamp, seq, pos.version)


class _TailReader:
    """Reads the first and last message of partitions with one assigned consumer (no group)."""

    def __init__(self, options: KafkaOptions) -> None:
        self._deadline = time.monotonic() + options.open_timeout_ms / 1000
        self._timeout_ms = options.open_timeout_ms
        try:
            self._consumer = KafkaConsumer(**options.consumer_config())
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot connect to Kafka at {','.join(options.bootstrap)}: {e!r}") from e

    def close(self) -> None:
        self._consumer.close()

    def ends(self, topic: str, partitions: list[int]) -> dict[int, tuple[Any | None, Any]]:
        """``partition -> (first record or None, last record)`` of each non-empty partition.

        Raises:
            SinkError: if the offsets cannot be read, the reads time out, or a non-empty partition
                yields no record at its end (e.g. it ends with a transaction marker).
        """
        tps = [TopicPartition(topic, p) for p in partitions]
        try:
            self._consumer.assign(tps)
            begin = self._consumer.beginning_offsets(tps, timeout_ms=self._timeout_ms)
            end = self._consumer.end_offsets(tps, timeout_ms=self._timeout_ms)
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot read the offsets of topic {topic}: {e!r}") from e
        busy = [tp for tp in tps if end[tp] > begin[tp]]
        firsts = self._read(busy, {tp: begin[tp] for tp in busy}, first=True)
        # Seek one before the end and read to the high watermark: some brokers (tansu) report the
        # last batch's base offset + 1 as the end, so the last record may be further on.
        lasts = self._read(busy, {tp: end[tp] - 1 for tp in busy}, first=False)
        for tp in busy:
            if tp not in lasts:
                raise SinkError(f"topic {topic} partition {tp.partition} ends with no readable message")
        return {tp.partition: (firsts.get(tp), lasts[tp]) for tp in busy}

    def _read(self, tps: list[Any], start: dict[Any, int], *, first: bool) -> dict[Any, Any]:
        """Per partition, the first record from ``start`` on (``first``) or the last one up to the high watermark.

        One partition at a time, each alone in the assignment: pausing some partitions of a
        multi-partition assignment leaves kafka-python holding fetched records it never hands
        back, and the read would stall.
        """
        found: dict[Any, Any] = {}
        for tp in tps:
            self._consumer.assign([tp])
            self._consumer.seek(tp, start[tp])
            while not ((first and tp in found) or self._caught_up(tp)):
                if time.monotonic() > self._deadline:
                    raise SinkUnavailableError(
                        f"timed out after {self._timeout_ms} ms reading the end of partition {tp.topic}[{tp.partition}]"
                    )
                records = self._consumer.poll(timeout_ms=200).get(tp)
                if records and not (first and tp in found):
                    found[tp] = records[0] if first else records[-1]
        return found

    def _caught_up(self, tp: Any) -> bool:
        high = self._consumer.highwater(tp)
        return high is not None and self._consumer.position(tp) >= high


# ---------------------------------------------------------------- producers --

#: Called (from any thread) for each message Kafka did not acknowledge: its stamp and why.
OnError = Callable[[Stamp, str], None]


class SendRefused(Exception):
    """A producer refused one message on the spot; ``too_large`` when the size limit was the cause."""

    def __init__(self, detail: str, *, too_large: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.too_large = too_large


class _Producer(Protocol):
    """What the sink needs from a producer library."""

    def partitions(self, topic: str) -> int:
        """The partition count of ``topic`` (created by the broker if it auto-creates topics)."""

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: list[Any], partition: int, stamp: Stamp
    ) -> None:
        """Queue one message; raises :class:`SendRefused`."""

    def wait(self, timeout_s: float) -> tuple[Stamp, str] | None:
        """Wait for every queued message; the first one (in send order) not acknowledged, and why."""

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued within ``timeout_s``, else drop it; release everything."""

    def abort(self) -> None:
        """Stop at once: drop what is queued, send nothing more, release everything."""


class _PythonProducer:
    """The kafka-python backend: every message's future is kept until :meth:`wait`."""

    def __init__(self, options: KafkaOptions, on_error: OnError) -> None:
        try:
            self._producer = KafkaProducer(**options.producer_config())
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot connect to Kafka at {','.join(options.bootstrap)}: {e!r}") from e
        self._on_error = on_error
        self._join_s = options.open_timeout_ms / 1000
        self._futures: list[Any] = []
        self._stamps: list[Stamp] = []
        self._compact_at = _COMPACT_EVERY

    def partitions(self, topic: str) -> int:
        try:
            return len(self._producer.partitions_for(topic) or ())
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot get the partitions of topic {topic}: {e!r}") from e

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: list[Any], partition: int, stamp: Stamp
    ) -> None:
        try:
            future = self._producer.send(topic, value=value, key=key, headers=headers, partition=partition)
        except MessageSizeTooLargeError as e:
            raise SendRefused(str(e), too_large=True) from e
        except (KafkaError, ValueError, TypeError) as e:
            raise SendRefused(repr(e), too_large=False) from e
        future.add_errback(self._failed, stamp)
        self._futures.append(future)
        self._stamps.append(stamp)
        if len(self._futures) >= self._compact_at:
            self._compact()

    def _failed(self, stamp: Stamp, error: BaseException) -> None:
        # Producer thread. kafka-python would go on draining queued batches (it even bumps its epoch
        # to recover), which could put later rows after a gap: force-close the sender right here.
        self._on_error(stamp, repr(error))
        self._sender_force_close()

    def _sender_force_close(self) -> Any:
        sender = getattr(self._producer, "_sender", None)  # kafka-python has no public abort
        if sender is not None:
            sender.force_close()
        return sender

    def _compact(self) -> None:
        """Drop acknowledged futures so that long runs between flushes keep little memory."""
        kept = [(f, s) for f, s in zip(self._futures, self._stamps, strict=True) if not f.succeeded()]
        self._futures, self._stamps = [f for f, _ in kept], [s for _, s in kept]
        self._compact_at = max(_COMPACT_EVERY, 2 * len(self._futures))

    def wait(self, timeout_s: float) -> tuple[Stamp, str] | None:
        with contextlib.suppress(KafkaTimeoutError):  # the futures tell which messages are missing
            self._producer.flush(timeout=timeout_s)
        for future, stamp in zip(self._futures, self._stamps, strict=True):
            if not future.is_done:
                return stamp, "not acknowledged in time"
            if future.exception is not None:
                return stamp, repr(future.exception)
        self._futures, self._stamps = [], []
        return None

    def close(self, timeout_s: float) -> None:
        try:
            self._producer.close(timeout=timeout_s)
        except KafkaError:
            self.abort()

    def abort(self) -> None:
        sender = self._sender_force_close()
        if sender is not None:
            sender.join(self._join_s)
        with contextlib.suppress(KafkaError):
            self._producer.close(timeout=0)


class _ConfluentProducer:
    """The confluent-kafka (librdkafka) backend.

    Only failures are reported back (``delivery.report.only.error``), which keeps Python out of
    the path of every acknowledged message; ``flush`` returning with an empty queue and no
    failure reported means every message was acknowledged. librdkafka runs with
    ``enable.gapless.guarantee``: an error that could leave a gap is fatal and fails every later
    message. Reports are served by ``poll``/``flush`` in the caller's thread.
    """

    def __init__(self, options: KafkaOptions, on_error: OnError) -> None:
        self._ck = importlib.import_module("confluent_kafka")
        try:
            self._producer = self._ck.Producer(options.confluent_config())
        except self._ck.KafkaException as e:
            raise SinkUnavailableError(f"cannot create a Kafka producer for {','.join(options.bootstrap)}: {e}") from e
        self._options = options
        self._on_error = on_error
        self._first: Stamp | None = None  # the first message sent since the last successful wait
        self._failures: list[tuple[Stamp, str]] = []
        self._sent = 0

    def partitions(self, topic: str) -> int:
        deadline = time.monotonic() + self._options.open_timeout_ms / 1000
        while True:
            try:
                meta = self._producer.list_topics(topic, timeout=max(0.1, deadline - time.monotonic()))
            except self._ck.KafkaException as e:
                raise SinkUnavailableError(
                    f"cannot connect to Kafka at {','.join(self._options.bootstrap)}: {e}"
                ) from e
            found = meta.topics.get(topic)
            if found is not None and found.error is None and found.partitions:
                return len(found.partitions)
            if time.monotonic() > deadline:
                why = found.error if found is not None else "not in the metadata"
                raise SinkUnavailableError(f"cannot get the partitions of topic {topic}: {why}")
            time.sleep(0.1)  # an auto-created topic appears after a moment

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: list[Any], partition: int, stamp: Stamp
    ) -> None:
        report = functools.partial(self._failed, stamp)
        deadline = None
        while True:
            try:
                self._producer.produce(topic, value, key, partition, on_delivery=report, headers=headers)
                break
            except BufferError:  # the local queue is full: serve reports until there is room
                deadline = deadline or time.monotonic() + self._options.delivery_timeout_ms / 1000
                if time.monotonic() > deadline:
                    raise SendRefused("the producer queue stayed full", too_large=False) from None
                self._producer.poll(0.05)
            except self._ck.KafkaException as e:
                error = e.args[0]
                raise SendRefused(str(error), too_large=error.code() == self._ck.KafkaError.MSG_SIZE_TOO_LARGE) from e
        if self._first is None:
            self._first = stamp
        self._sent += 1
        if not self._sent % 1024:
            self._producer.poll(0)

    def _failed(self, stamp: Stamp, error: Any, message: Any) -> None:
        if error is None:  # not expected with delivery.report.only.error
            return
        if not self._failures:  # send nothing more; purged messages report failures of their own
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)
        self._failures.append((stamp, str(error)))
        self._on_error(stamp, str(error))

    def wait(self, timeout_s: float) -> tuple[Stamp, str] | None:
        remaining = self._producer.flush(timeout_s)
        if self._failures:
            return min(self._failures)  # stamps grow in send order
        if remaining and self._first is not None:
            return self._first, f"{remaining} message(s) from here on not acknowledged in time"
        self._first = None
        return None

    def close(self, timeout_s: float) -> None:
        if self._producer.flush(timeout_s):
            self.abort()
        else:
            self._producer.close()

    def abort(self) -> None:
        self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._producer.flush(0)
        self._producer.close()


# ---------------------------------------------------------------- sink --


class KafkaSink(Sink):
    """Publishes change rows to Kafka; see the module docstring for the URI and guarantees.

    Args:
        uri: a ``kafka://`` URI.
        env: environment for ``KAFKA_*`` security variables; ``os.environ`` if ``None``.
        clock_ms: encoding time for Debezium ``ts_ms`` (injectable for reproducible output).

    Raises:
        ConfigError: if the URI is invalid.
    """

    def __init__(
        self, uri: str, *, env: Mapping[str, str] | None = None, clock_ms: Callable[[], int] | None = None
    ) -> None:
        self.options = KafkaOptions.from_uri(uri, env)
        self._clock_ms = clock_ms
        self._producer: _Producer | None = None
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        """Forget everything of a previous opening."""
        self._failure: SinkError | None = None
        self._tails: dict[int, Tail] = {}
        self._sent: dict[int, Stamp] = {}
        self._seq: dict[int, int] = {}
        self._last_commit_version = -1

    # -- life cycle --------------------------------------------------------

    def open(self, table: TableInfo) -> Position | None:
        """Connect, resolve the topic and, with ``exactly_once``, read what every partition holds.

        Returns:
            Always ``None``: with ``exactly_once`` the sink skips rows per partition in
            :meth:`write` instead (module docstring); without it, it cannot tell.

        Raises:
            ConfigError: if the topic template does not fit the table.
            SinkError: if the sink is already open, Kafka cannot be reached within
                ``open_timeout_ms``, or (``exactly_once``) the topic holds messages of
                another table or sink, of another partition count, or has lost a message.
        """
        if self._producer is not None:
            raise SinkError("the Kafka sink is already open", table=table.path)
        opts = self.options
        self._reset()
        self.table = table
        self.topic = fill_topic(opts.topic, table)
        self.commit_topic = fill_topic(opts.commit_topic, table) if opts.commit_topic else None
        self.sink_id = opts.sink_id or default_sink_id(table.table_id, self.topic)
        clock = {} if self._clock_ms is None else {"clock_ms": self._clock_ms}
        self._encoder = ChangeEncoder(
            table, format=opts.format, key_columns=opts.key_columns, tombstones=opts.tombstones, **clock
        )
        self._fixed_headers = [("dt.table_id", table.table_id.encode()), ("dt.sink_id", self.sink_id.encode())]
        try:
            producer = self._connect()
        except SinkError as e:
            raise e.at(table=table.path) from e.__cause__
        try:
            self._partitions = self._partition_count(producer, self.topic)
            self._commit_partitions = self._partition_count(producer, self.commit_topic) if self.commit_topic else 0
            if opts.exactly_once:
                self._read_tails()
        except BaseException as e:
            producer.abort()
            if isinstance(e, SinkError):
                raise e.at(table=table.path) from e.__cause__
            raise
        self._producer = producer
        return None

    def close(self) -> None:
        """Stop the producer; never raises, and closing twice is harmless.

        Does not flush: queued messages are still delivered within ``open_timeout_ms`` unless the
        sink has failed, in which case they are dropped at once.
        """
        producer, self._producer = self._producer, None
        if producer is None:
            return
        if self._failure is not None:
            producer.abort()
        else:
            producer.close(self.options.open_timeout_ms / 1000)

    def _connect(self) -> _Producer:
        if self.options.backend == "confluent":
            return _ConfluentProducer(self.options, self._on_error)
        return _PythonProducer(self.options, self._on_error)

    def _partition_count(self, producer: _Producer, topic: str) -> int:
        count = producer.partitions(topic)
        if not count:
            raise SinkError(f"topic {topic} has no partitions (does it exist?)", table=self.table.path)
        return count

    # -- exactly once ---------------------------------------------------------

    def _read_tails(self) -> None:
        reader = _TailReader(self.options)
        try:
            ends = reader.ends(self.topic, list(range(self._partitions)))
            for partition, (first, last) in ends.items():
                self._tails[partition] = self._check_partition(partition, first, last)
            if self.commit_topic:
                self._read_commit_tail(reader)
        finally:
            reader.close()
        self._sent = {p: t.stamp for p, t in self._tails.items()}
        self._seq = {p: t.seq + 1 for p, t in self._tails.items()}

    def _check_partition(self, partition: int, first: Any | None, last: Any) -> Tail:
        where = f"topic {self.topic} partition {partition}"
        headers = _header_map(last.headers)
        self._check_owner(where, last.offset, headers)
        if "dt.partitions" not in headers or "dt.seq" not in headers:
            raise SinkError(
                f"{where} was written without exactly_once=true (offset {last.offset} has no dt.seq); "
                "exactly-once resume needs a topic written with it from the start",
                table=self.table.path,
            )
        if int(headers["dt.partitions"]) != self._partitions:
            raise SinkError(
                f"{where} was written with {headers.get('dt.partitions', b'?').decode()} partitions and now has "
                f"{self._partitions}: keys moved between partitions, exactly-once resume is impossible",
                table=self.table.path,
            )
        tail = _tail_of(where, last.offset, last.value, headers)
        self._check_no_loss(where, first, last, tail)
        return tail

    def _check_no_loss(self, where: str, first: Any | None, last: Any, tail: Tail) -> None:
        """Offsets are contiguous, so ``dt.seq`` growing faster than offsets means messages went missing."""
        head_headers = _header_map(first.headers if first is not None else None)
        if first is None or head_headers.get("dt.sink_id") != self.sink_id.encode() or "dt.seq" not in head_headers:
            return  # the partition starts with another writer's messages: nothing to compare with
        head = _tail_of(where, first.offset, first.value, head_headers)
        lost = (tail.seq - head.seq) - (last.offset - first.offset)
        if lost > 0:
            raise SinkError(
                f"{where} lost {lost} message(s) of sink {self.sink_id} between offsets {first.offset} and "
                f"{last.offset} (dt.seq {head.seq}..{tail.seq}); exactly-once resume would skip them",
                table=self.table.path,
            )

    def _check_owner(self, where: str, offset: int, headers: dict[str, bytes]) -> None:
        table_id, sink_id = headers.get("dt.table_id"), headers.get("dt.sink_id")
        if table_id is None or sink_id is None:
            raise SinkError(
                f"{where} ends with a message not written by deltatail (offset {offset}); refusing to write to it",
                table=self.table.path,
            )
        if table_id.decode(errors="replace") != self.table.table_id:
            raise SinkError(
                f"{where} holds changes of another table (id {table_id.decode(errors='replace')}, "
                f"offset {offset}); refusing to mix tables",
                table=self.table.path,
            )
        if sink_id.decode(errors="replace") != self.sink_id:
            raise SinkError(
                f"{where} was written by sink {sink_id.decode(errors='replace')} (offset {offset}), this is "
                f"{self.sink_id}; set sink_id= to continue that sink",
                table=self.table.path,
            )

    def _read_commit_tail(self, reader: _TailReader) -> None:
        assert self.commit_topic is not None
        partition = choose_partition(self.table.table_id.encode(), self._commit_partitions)
        ends = reader.ends(self.commit_topic, [partition])
        if partition in ends:
            headers = _header_map(ends[partition][1].headers)
            ours = headers.get("dt.sink_id") == self.sink_id.encode()
            if ours and headers.get("dt.table_id") == self.table.table_id.encode():
                self._last_commit_version = int(headers.get("dt.version", b"-1"))

    # -- writing ---------------------------------------------------------------

    def write(self, batch: ChangeBatch) -> None:
        """Encode and send ``batch``; delivery is confirmed by :meth:`flush`.

        With ``exactly_once``, messages not after what their partition holds are skipped.

        Raises:
            SinkError: if the sink is not open or has failed; if a row cannot be encoded (nothing
                of the batch was sent); or if a message is over ``max_message_bytes`` or refused by
                the producer (the rows before it were queued, and the sink stops). The error names
                the row's position.
        """
        self._check_usable()
        encoded = self._encoder.encode(batch)
        if not len(encoded):
            return
        start, eo = batch.start, self.options.exactly_once
        version, rank, base = start.version, start.snapshot_rank, start.index
        headers_base = [*self._fixed_headers, ("dt.version", b"%d" % version)]
        position_fmt = b'{"version":%d,"index":%%d,"snapshot":%s}' % (version, b"true" if start.snapshot else b"false")
        for row, key, value, change_type in zip(
            encoded.rows, encoded.keys, encoded.values, encoded.change_types, strict=True
        ):
            partition = choose_partition(key, self._partitions)
            stamp: Stamp = (version, rank, base + row, 0 if value is not None else 1)
            headers = [
                *headers_base,
                ("dt.position", position_fmt % (base + row)),
                ("dt.change_type", change_type.encode()),
            ]
            if eo:
                if stamp <= self._sent.get(partition, _BEFORE_ALL):
                    continue
                self._sent[partition] = stamp
                seq = self._seq.get(partition, 0)
                self._seq[partition] = seq + 1
                headers += [("dt.seq", b"%d" % seq), ("dt.partitions", b"%d" % self._partitions)]
            self._send(self.topic, key, value, headers, partition, stamp)

    def commit_event(self, event: CommitEvent) -> None:
        """Publish ``event`` to the commit topic, if one is configured; delivery is confirmed by :meth:`flush`.

        The value is a JSON object with ``table_path``, ``table_id``, ``table``, ``sink_id``,
        ``version``, ``timestamp_ms``, ``operation``, ``operation_metrics`` and ``row_counts``;
        the key is the table id. With ``exactly_once``, a version not after the last one in the
        commit topic's partition is skipped.

        Raises:
            SinkError: if the sink is not open or has failed, or the event cannot be sent.
        """
        self._check_usable()
        if self.commit_topic is None:
            return
        if self.options.exactly_once and event.version <= self._last_commit_version:
            return
        self._last_commit_version = event.version
        key = self.table.table_id.encode()
        value = self._commit_value(event)
        headers = [*self._fixed_headers, ("dt.version", b"%d" % event.version), ("dt.change_type", b"commit")]
        partition = choose_partition(key, self._commit_partitions)
        self._send(self.commit_topic, key, value, headers, partition, (event.version, 2, -1, 0))

    def _commit_value(self, event: CommitEvent) -> bytes:
        body = {
            "table_path": self.table.path,
            "table_id": self.table.table_id,
            "table": self.table.name,
            "sink_id": self.sink_id,
            "version": event.version,
            "timestamp_ms": event.timestamp_ms,
            "operation": event.operation,
            "operation_metrics": event.operation_metrics,
            "row_counts": event.row_counts,
        }
        try:
            return orjson.dumps(body)
        except TypeError as e:
            raise SinkError(f"commit event is not JSON-serialisable: {e}", table=self.table.path) from e

    def _send(
        self, topic: str, key: bytes, value: bytes | None, headers: list[Any], partition: int, stamp: Stamp
    ) -> None:
        if self._failure is not None:  # a message failed meanwhile (producer thread): send nothing after it
            self._check_usable()
        assert self._producer is not None
        try:
            self._producer.send(topic, key, value, headers, partition, stamp)
        except SendRefused as e:
            if e.too_large:
                size = len(key) + len(value or b"")
                message = (
                    f"the message for {_describe(stamp)} is too large ({size} bytes of key and value, "
                    f"max_message_bytes={self.options.max_message_bytes}): {e.detail}"
                )
            else:
                message = f"cannot send the message for {_describe(stamp)} to {topic}: {e.detail}"
            raise self._fail(message, stamp) from e

    def _on_error(self, stamp: Stamp, detail: str) -> None:
        """Called by the producer for each unacknowledged message; the first one stops the sink."""
        self._fail(f"Kafka did not acknowledge the message for {_describe(stamp)}: {detail}", stamp, unavailable=True)

    def _fail(self, message: str, stamp: Stamp, *, unavailable: bool = False) -> SinkError:
        with self._lock:
            if self._failure is None:
                version = stamp[0] if stamp[0] >= 0 else None
                kind = SinkUnavailableError if unavailable else SinkError
                self._failure = kind(message, table=self.table.path, version=version)
            return self._failure

    def _check_usable(self) -> None:
        if self._producer is None:
            raise SinkError("the Kafka sink is not open")
        if self._failure is not None:
            raise type(self._failure)(
                f"the Kafka sink stopped after an earlier failure: {self._failure.message}",
                table=self.table.path,
                version=self._failure.version,
            )

    # -- flushing --------------------------------------------------------------

    def flush(self) -> None:
        """Wait until Kafka acknowledged every message sent since the last flush.

        The producer retries with backoff for up to ``delivery_timeout_ms``; this waits that long
        plus ``request_timeout_ms`` at most.

        Raises:
            SinkError: if the sink is not open or has failed, or any message could not be delivered;
                the error names the first undelivered position, and the sink stops.
        """
        self._check_usable()
        assert self._producer is not None
        opts = self.options
        undelivered = self._producer.wait((opts.delivery_timeout_ms + opts.request_timeout_ms) / 1000)
        if undelivered is not None:
            stamp, why = undelivered
            message = f"Kafka did not acknowledge the message for {_describe(stamp)}: {why}"
            self._fail(message, stamp, unavailable=True)  # stops the sink unless an earlier failure already did
            raise SinkUnavailableError(message, table=self.table.path, version=stamp[0])  # first in send order


def _describe(stamp: Stamp) -> str:
    version, rank, index, sub = stamp
    if rank == 2:
        return f"the commit event of version {version}"
    what = "tombstone" if sub else "row"
    return f"{what} at position {Position(version, rank, index)}"
