"""The Kafka sink's producer backends: kafka-python and confluent-kafka behind one small protocol."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import time
from collections.abc import Callable
from typing import Any, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

from sinks.kafka_options import KafkaOptions
from state.errors import SinkUnavailableError

# A stamp orders a sink's messages: (version, snapshot_rank, index, 0 for an event / 1 for its tombstone).
Stamp = tuple[int, int, int, int]
#: Pending futures are pruned of acknowledged ones whenever this many accumulate.
_COMPACT_EVERY = 100_000

# ---------------------------------------------------------------- producers --

#: Called (from any thread) for each message Kafka did not acknowledge: its stamp and why.
OnError = Callable[[Stamp, str], None]


class SendRefused(Exception):
    """A producer refused one message on the spot; ``too_large`` when the size limit was the cause."""

    def __init__(self, detail: str, *, too_large: bool) -> None:
        super().__init__(detail)
        self.detail = detail
        self.too_large = too_large


class Producer(Protocol):
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


class PythonProducer:
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
        """See :meth:`Producer.partitions`."""
        try:
            return len(self._producer.partitions_for(topic) or ())
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot get the partitions of topic {topic}: {e!r}") from e

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: list[Any], partition: int, stamp: Stamp
    ) -> None:
        """See :meth:`Producer.send`."""
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
        """See :meth:`Producer.wait`."""
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
        """See :meth:`Producer.close`."""
        try:
            self._producer.close(timeout=timeout_s)
        except KafkaError:
            self.abort()

    def abort(self) -> None:
        """See :meth:`Producer.abort`."""
        sender = self._sender_force_close()
        if sender is not None:
            sender.join(self._join_s)
        with contextlib.suppress(KafkaError):
            self._producer.close(timeout=0)


class ConfluentProducer:
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
        """See :meth:`Producer.partitions`."""
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
        """See :meth:`Producer.send`."""
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
        """See :meth:`Producer.wait`."""
        remaining = self._producer.flush(timeout_s)
        if self._failures:
            return min(self._failures)  # stamps grow in send order
        if remaining and self._first is not None:
            return self._first, f"{remaining} message(s) from here on not acknowledged in time"
        self._first = None
        return None

    def close(self, timeout_s: float) -> None:
        """See :meth:`Producer.close`."""
        if self._producer.flush(timeout_s):
            self.abort()
        else:
            self._producer.close()

    def abort(self) -> None:
        """See :meth:`Producer.abort`."""
        self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._producer.flush(0)
        self._producer.close()
