"""``serve``'s Kafka signal topic: Debezium's Kafka signal channel, turned into snapshot requests.

A thread reads the topic ``signal_kafka_topic`` names (``kafka://HOST:PORT/TOPIC``). A message
whose key is the service's ``signal_kafka_key`` (Debezium's ``topic.prefix``, ``deltatail`` by
default) and whose value is an ``execute-snapshot`` signal (:func:`state.signals.debezium_snapshots`)
becomes a snapshot request in the state directory of each table it names (by name, path or id),
exactly as ``deltatail signal`` writes one (:mod:`tailer.follow.signals`); each table's tailer takes
its request between two commits. Messages of another key are not this service's and pass.

Each message is acted on once: the offset after it is saved in the state root
(``kafka-signals.json``) once its requests are written, and its requests are named after it
(``kafka-<partition>-<offset>``), so a message read again after a crash in between asks for
nothing a table already has waiting, running or ended. A new state root reads the topic from
its beginning. A message that is not a signal, or names a table the service does not follow,
is logged and passed over.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

from deltatail.state.errors import ConfigError, DeltaTailError, StateError
from deltatail.state.signals import SnapshotRequest, debezium_snapshots
from deltatail.tailer.follow import signals
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.formats.base import SIGNALS
from deltatail.tailer.formats.registry import claimed
from deltatail.tailer.runtime.files import atomic_write
from deltatail.tailer.serve.state_root import StateRoot
from deltatail.tailer.storage.local import to_local_path

log = logging.getLogger("deltatail")

OFFSETS_FILE = "kafka-signals.json"
#: The largest signal message acted on (a request holds at most a 64 KiB predicate per table).
MAX_SIGNAL_BYTES = 1 << 20


def signal_topic(uri: str) -> tuple[str, str]:
    """``(bootstrap servers, topic)`` of ``kafka://HOST:PORT[,HOST:PORT]/TOPIC``.

    Raises:
        ConfigError: if ``uri`` is not such a URI.
    """
    parts = urlsplit(uri)
    topic = parts.path.strip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic or "/" in topic or parts.query:
        raise ConfigError(f"signal_kafka_topic must be kafka://HOST:PORT/TOPIC, got {uri!r}")
    return parts.netloc, topic


class SignalTopic:
    """Reads a Kafka signal topic into the state root's tables' snapshot requests (see the module docstring).

    Args:
        uri: ``kafka://HOST:PORT/TOPIC``.
        key: the message key of this service's signals.
        root: the state root.
    """

    def __init__(self, uri: str, key: str, root: StateRoot) -> None:
        self.servers, self.topic = signal_topic(uri)
        self.key = key.encode()
        self.root = root
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="deltatail-signal-topic", daemon=True)

    def start(self) -> None:
        """Start reading (in a thread of its own)."""
        self._thread.start()

    def close(self) -> None:
        """Stop reading and wait for the thread."""
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        # kafka-python is imported by the service that reads a signal topic, not at every command's start.
        from kafka.errors import KafkaError

        while not self._stop.is_set():
            try:
                self._read()
            except (KafkaError, OSError, DeltaTailError) as e:
                log.warning("signal topic %s: %s; reading it again in 5 s", self.topic, e)
                self._stop.wait(5.0)

    def _read(self) -> None:
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.servers, group_id=None, enable_auto_commit=False)
        try:
            found = consumer.partitions_for_topic(self.topic) or ()
            partitions = [TopicPartition(self.topic, p) for p in sorted(found)]
            if not partitions:
                raise StateError(f"the signal topic {self.topic} does not exist (yet)")
            consumer.assign(partitions)
            saved = self._offsets()
            for tp in partitions:
                consumer.seek(tp, saved.get(str(tp.partition), 0))
            while not self._stop.is_set():
                for tp, records in consumer.poll(timeout_ms=500).items():
                    for record in records:
                        self._act_on(record.key, record.value, f"kafka-{tp.partition}-{record.offset}")
                        saved[str(tp.partition)] = record.offset + 1
                        self._save_offsets(saved)
        finally:
            consumer.close()

    def _act_on(self, key: bytes | None, value: bytes | None, request_id: str) -> None:
        """Write the requests of one message (logged and passed over if it is not a signal of this service)."""
        if key != self.key:
            return
        try:
            if value is None or len(value) > MAX_SIGNAL_BYTES:
                raise ConfigError(f"a signal is a JSON object of at most {MAX_SIGNAL_BYTES} bytes")
            asked = debezium_snapshots(orjson.loads(value), request_id)
        except (ConfigError, orjson.JSONDecodeError) as e:
            log.error("signal topic %s: message %s passed over: %s", self.topic, request_id, e)
            return
        for collection, request in asked:
            try:
                self._ask(collection, request)
            except DeltaTailError as e:
                log.error("signal topic %s: %s: no snapshot of %s: %s", self.topic, request_id, collection, e)

    def _ask(self, collection: str, request: SnapshotRequest) -> None:
        """Ask the table named ``collection`` for ``request``, unless it already has it (a message read again)."""
        entry = self.root.find(collection)
        directory = entry.directory
        saved = StateStore(str(directory)).load()
        waiting = signals.pending(directory)
        ended = (signals.last_end(directory) or {}).get("request") or {}
        known = {
            None if waiting is None else waiting.id,
            None if saved is None or saved.signal is None else saved.signal.id,
            ended.get("id"),
        }
        if request.id in known:
            return
        refused = _refuses_signals(entry.path)
        if refused is not None:
            reason = f"on-demand snapshots are for Delta tables, not a {refused}"
            signals.record_end(directory, request, "failed", reason)
            log.error("signal topic %s: snapshot %s of %s failed: %s", self.topic, request.id, collection, reason)
            return
        signals.ask(directory, request)
        log.info("signal topic %s: snapshot %s of %s asked for", self.topic, request.id, collection)

    def _offsets(self) -> dict[str, int]:
        try:
            raw = orjson.loads((self.root.root / OFFSETS_FILE).read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as e:
            raise StateError(
                f"cannot read the signal topic's offsets: {e}", file=str(self.root.root / OFFSETS_FILE)
            ) from None
        ok = isinstance(raw, dict) and all(type(v) is int and v >= 0 for v in raw.values())
        if not ok:
            raise StateError("the signal topic's offsets are not offsets", file=str(self.root.root / OFFSETS_FILE))
        return {str(k): v for k, v in raw.items()}

    def _save_offsets(self, offsets: dict[str, Any]) -> None:
        try:
            atomic_write(Path(self.root.root) / OFFSETS_FILE, orjson.dumps(offsets))
        except OSError as e:
            raise StateError(f"cannot save the signal topic's offsets: {e.strerror or e}") from None


def _refuses_signals(path: str) -> str | None:
    """The noun of ``path``'s format if it refuses on-demand snapshots (Lance, Iceberg), else ``None``.

    Told from the local directory (the formats :func:`~tailer.formats.registry.claimed` by
    discovery); a table on an object store is taken for a Delta table, whose tailer checks it.
    """
    local = to_local_path(path)
    found = None if "://" in local else claimed(local)
    return found.noun if found is not None and found.refused([SIGNALS]) else None
