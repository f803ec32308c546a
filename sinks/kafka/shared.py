"""One producer per Kafka cluster and producer settings, shared by the sinks of one process (``serve``).

:class:`ProducerPool` hands each :class:`~sinks.kafka.sink.KafkaSink` a lease on a library
producer (kafka-python's ``KafkaProducer`` or confluent-kafka's ``Producer``): sinks whose
options give the same producer settings (brokers, security, batching, timeouts, backend) share
one, so 200 tables into one cluster are one producer and its few connections, not 200.

What stays each table's own, and what does not (``docs/serve.md``):

- every lease tracks its own messages: :meth:`Producer.wait` reports the first message *of this
  sink* not acknowledged, and the sink's failure is its own (:class:`~state.errors.SinkError`
  through its ``on_error``); per-table order and exactly-once are the sink's, unchanged;
- a message refused on the spot (over ``max_message_bytes``) and a topic that cannot be opened
  (missing, holding another table's messages) fail that table only: nothing else of the
  producer is touched;
- a message the brokers did not acknowledge breaks the shared producer: it stops sending at
  once (as an unshared one does, so that no later message of that table lands after a gap),
  every sink on it fails with :class:`~state.errors.SinkUnavailableError` and holds its cursor,
  and the pool opens a new producer for the next lease; the tables resume from their cursors.

The library producer is closed (delivering what is queued within the closing sink's timeout)
when its last lease is released.
"""

from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaError

from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.producers import ConfluentProducer, OnError, Producer, PythonProducer, Stamp
from deltatail.state.errors import SinkUnavailableError


@dataclass(slots=True, eq=False)
class _Client:
    """One library producer and the leases on it."""

    key: str
    backend: str
    client: Any
    users: int = 0
    broken: bool = False
    closed: bool = False


class ProducerPool:
    """Library producers by cluster and settings; thread-safe. See the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}  # what new leases get
        self._open: set[_Client] = set()  # those and the broken ones their sinks still hold
        #: Library producers created since the pool was made (a shared one counts once).
        self.created = 0

    @property
    def live(self) -> int:
        """Library producers open now (a broken one until its last sink lets it go)."""
        with self._lock:
            return len(self._open)

    def lease(self, options: KafkaOptions, on_error: OnError) -> Producer:
        """A producer for one sink over the pool's library producer for ``options``' settings.

        ``close`` and ``abort`` on the lease release it (the last release closes the library
        producer); ``on_error`` is called for this sink's unacknowledged messages.

        Raises:
            SinkUnavailableError: if a library producer cannot be created.
        """
        config = _settings(options)
        key = f"{options.backend}|{sorted(config.items())!r}"  # kept in memory only: it holds secrets
        entry = self._existing(key)
        if entry is None:  # connecting may take open_timeout_ms: not under the lock other tables need
            made = _Client(key, options.backend, _new_client(options, config))
            entry = self._add(made)
            if entry is not made:  # another table made one meanwhile
                _close_client(made, 0)
        return self._bind(entry, options, on_error)

    def _existing(self, key: str) -> _Client | None:
        """Lease the pool's producer for ``key``, if it has one."""
        with self._lock:
            entry = self._clients.get(key)
            if entry is not None:
                entry.users += 1
            return entry

    def _add(self, made: _Client) -> _Client:
        """Lease the pool's producer for ``made``'s key; ``made`` becomes it unless another was added meanwhile."""
        with self._lock:
            entry = self._clients.setdefault(made.key, made)
            if entry is made:
                self.created += 1
                self._open.add(made)
            entry.users += 1
            return entry

    def _bind(self, entry: _Client, options: KafkaOptions, on_error: OnError) -> Producer:
        lease = _Lease(self, entry, options.open_timeout_ms / 1000)

        def failed(stamp: Stamp, detail: str) -> None:
            self._break(entry)
            on_error(stamp, detail)

        if entry.backend == "confluent":
            return ConfluentProducer(options, failed, lease=lease)
        return PythonProducer(options, failed, lease=lease)

    def _break(self, entry: _Client) -> None:
        """A message was not acknowledged: no new lease gets this producer."""
        with self._lock:
            entry.broken = True
            if self._clients.get(entry.key) is entry:
                del self._clients[entry.key]

    def give_back(self, entry: _Client, timeout_s: float) -> None:
        """A lease on ``entry`` ended; the last one closes its library producer."""
        with self._lock:
            entry.users -= 1
            last = entry.users <= 0 and not entry.closed
            if last:
                entry.closed = True
                self._open.discard(entry)
                if self._clients.get(entry.key) is entry:
                    del self._clients[entry.key]
        if last:
            _close_client(entry, timeout_s)


class _Lease:
    """One sink's hold on a pooled library producer (a :class:`~sinks.kafka.producers.Lease`)."""

    def __init__(self, pool: ProducerPool, entry: _Client, timeout_s: float) -> None:
        self._pool = pool
        self._entry = entry
        self._timeout_s = timeout_s
        self._released = False

    @property
    def client(self) -> Any:
        """See :attr:`sinks.kafka.producers.Lease.client`."""
        return self._entry.client

    @property
    def broken(self) -> bool:
        """See :attr:`sinks.kafka.producers.Lease.broken`."""
        return self._entry.broken

    def release(self) -> None:
        """See :meth:`sinks.kafka.producers.Lease.release`."""
        if not self._released:
            self._released = True
            self._pool.give_back(self._entry, self._timeout_s)


def _settings(options: KafkaOptions) -> dict[str, Any]:
    """The library producer's settings for ``options``; a shared confluent producer reports every delivery."""
    if options.backend == "confluent":
        return {**options.confluent_config(), "delivery.report.only.error": False}
    return options.producer_config()


def _new_client(options: KafkaOptions, config: dict[str, Any]) -> Any:
    where = ",".join(options.bootstrap)
    if options.backend == "confluent":
        ck = importlib.import_module("confluent_kafka")
        try:
            return ck.Producer(config)
        except ck.KafkaException as e:
            raise SinkUnavailableError(f"cannot create a Kafka producer for {where}: {e}") from e
    try:
        return KafkaProducer(**config)
    except KafkaError as e:
        raise SinkUnavailableError(f"cannot connect to Kafka at {where}: {e!r}") from e


def _close_client(entry: _Client, timeout_s: float) -> None:
    """Close a library producer: deliver what is queued within ``timeout_s`` unless it is broken."""
    client = entry.client
    if entry.backend == "confluent":
        if entry.broken or client.flush(timeout_s):
            client.purge(in_queue=True, in_flight=True, blocking=True)
            client.flush(0)
        client.close()
        return
    try:
        client.close(timeout=0 if entry.broken else timeout_s)
    except KafkaError:
        client.close(timeout=0)
