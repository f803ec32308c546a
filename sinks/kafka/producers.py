"""The Kafka sink's producer backends: kafka-python and confluent-kafka behind one small protocol."""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.util
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError, MessageSizeTooLargeError

from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.state.cursor import Position
from deltatail.state.errors import SinkUnavailableError

# A stamp orders a sink's messages: (version, snapshot_rank, index, 0 for an event / 1 for its tombstone).
Stamp = tuple[int, int, int, int]
#: The stamp of a commit event of ``version`` is ``(version, COMMIT_RANK, -1, 0)``; 1, 2, 3 for its schema-change
#: event and its transaction BEGIN and END.
COMMIT_RANK = 2
#: The stamp of a heartbeat is ``(delivered version, HEARTBEAT_RANK, -1, 0)``.
HEARTBEAT_RANK = 3
#: Headers of one message: (name, UTF-8 value) pairs.
Headers = list[tuple[str, bytes]]
#: kafka-python: bytes (keys and values) of the messages held (sent, not known to be acknowledged) before
#: ``send`` waits for the oldest to be acknowledged, down to half of it. Java's producer bounds its queue
#: the same way (``buffer.memory``, 32 MiB by default); kafka-python 3 has no such bound, so without it a
#: flush's worth of messages (up to ``flush_rows`` rows) could pile up in its record accumulator.
QUEUED_BYTES_BOUND = 32 << 20
#: confluent-kafka: delivery reports are served (``poll``) after every this many messages.
_POLL_EVERY = 1024

# ---------------------------------------------------------------- producers --

#: Called (from any thread) for each message Kafka did not acknowledge: its stamp and why.
OnError = Callable[[Stamp, str], None]


class SendRefused(Exception):
    """A producer refused one message on the spot; ``too_large`` when the size limit was the cause.

    ``index`` is the message's index in the :class:`Outgoing` being sent (0 for a single message).
    """

    def __init__(self, detail: str, *, too_large: bool, index: int = 0) -> None:
        super().__init__(detail)
        self.detail = detail
        self.too_large = too_large
        self.index = index


@dataclass(frozen=True, slots=True)
class Outgoing:
    """Messages of one change batch for one topic, as parallel lists in send order.

    Message ``i`` carries the row at index ``base + rows[i]`` of ``version`` (``rank``: 0 in an
    initial snapshot, 1 for change rows); a ``None`` value is a tombstone. ``headers`` may be an
    iterator (taken once, in order, by :meth:`Producer.send_many`). ``partitions`` is ``None`` when
    the producer chooses each partition from the key (see :attr:`Producer.key_partitioner`).
    """

    topic: str
    keys: Sequence[bytes]
    values: Sequence[bytes | None]
    headers: Iterable[Headers]
    partitions: Sequence[int] | None
    version: int
    rank: int
    base: int
    rows: Sequence[int]

    def __len__(self) -> int:
        return len(self.keys)

    def stamp(self, i: int) -> Stamp:
        """The stamp of message ``i``."""
        return (self.version, self.rank, self.base + self.rows[i], 0 if self.values[i] is not None else 1)


class Lease(Protocol):
    """A library producer shared with other sinks (:mod:`sinks.kafka.shared`), leased to one backend object."""

    @property
    def client(self) -> Any:
        """The library producer (``KafkaProducer`` or confluent-kafka's ``Producer``)."""

    @property
    def broken(self) -> bool:
        """Whether a message of any sink on it was not acknowledged: it sends nothing more."""

    def release(self) -> None:
        """Give the library producer back (idempotent); the last release closes it."""


#: Why a sink on a broken shared producer sends nothing more.
BROKEN_SHARED = "the producer shared with other tables stopped after a message was not acknowledged"


class Producer(Protocol):
    """What the sink needs from a producer library."""

    #: ``True`` if the producer's own choice for a message sent without a partition is Kafka's
    #: keyed partitioner (:func:`sinks.kafka.partitioner.choose_partition`, against the partition count
    #: it knows) and is cheaper than choosing it in Python.
    key_partitioner: ClassVar[bool]

    def partitions(self, topic: str) -> int:
        """The partition count of ``topic`` (created by the broker if it auto-creates topics)."""

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: Headers, partition: int | None, stamp: Stamp
    ) -> None:
        """Queue one message (``partition`` ``None``: the producer's keyed choice); raises :class:`SendRefused`."""

    def send_many(self, out: Outgoing) -> None:
        """Queue every message of ``out`` in order; raises :class:`SendRefused` naming the refused one.

        The messages before the refused one are queued, none after it.
        """

    def wait(self, timeout_s: float) -> tuple[Stamp, str] | None:
        """Wait for every queued message; the first one (in send order) not acknowledged, and why."""

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued within ``timeout_s``, else drop it; release everything."""

    def abort(self) -> None:
        """Stop at once: drop what is queued, send nothing more, release everything."""


class PythonProducer:
    """The kafka-python backend: a message's future is kept until it and every message before it are acknowledged.

    The messages held (sent, and not known to be acknowledged with every message sent before them)
    are at most ``queued_bound`` bytes of keys and values plus one message: past it, :meth:`send`
    waits for the oldest messages' acknowledgements (at most ``delivery_timeout_ms`` each) until half
    of the bound is left; a message that fails meanwhile stops the sink as always. Acknowledged
    messages at the head are released after every send, so what is held does not grow with the
    messages sent between two :meth:`wait` calls (a kafka-python future with its errback is ~1 KB).
    """

    key_partitioner: ClassVar[bool] = False  # kafka-python's murmur2 is slower than the sink's

    def __init__(
        self,
        options: KafkaOptions,
        on_error: OnError,
        *,
        lease: Lease | None = None,
        queued_bound: int = QUEUED_BYTES_BOUND,
    ) -> None:
        self._lease = lease
        try:
            self._producer = KafkaProducer(**options.producer_config()) if lease is None else lease.client
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot connect to Kafka at {','.join(options.bootstrap)}: {e!r}") from e
        self._on_error = on_error
        self._join_s = options.open_timeout_ms / 1000
        self._ack_wait_s = options.delivery_timeout_ms / 1000
        # (future, stamp, size) of each message held, in send order; the head is not yet acknowledged.
        self._held: collections.deque[tuple[Any, Stamp, int]] = collections.deque()
        self._queued_bound = queued_bound
        self.queued_bytes = 0  # keys and values of the messages held

    def partitions(self, topic: str) -> int:
        """See :meth:`Producer.partitions`."""
        try:
            return len(self._producer.partitions_for(topic) or ())
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot get the partitions of topic {topic}: {e!r}") from e

    def send(
        self, topic: str, key: bytes, value: bytes | None, headers: Headers, partition: int | None, stamp: Stamp
    ) -> None:
        """See :meth:`Producer.send`."""
        if self._lease is not None and self._lease.broken:
            self._on_error(stamp, BROKEN_SHARED)
            return
        try:
            future = self._producer.send(topic, value=value, key=key, headers=headers, partition=partition)
        except MessageSizeTooLargeError as e:
            raise SendRefused(str(e), too_large=True) from e
        except (KafkaError, ValueError, TypeError) as e:
            raise SendRefused(repr(e), too_large=False) from e
        future.add_errback(self._failed, stamp)
        size = len(key) + len(value or b"")
        held = self._held
        held.append((future, stamp, size))
        self.queued_bytes += size
        while held and held[0][0].succeeded():
            self.queued_bytes -= held.popleft()[2]
        if self.queued_bytes > self._queued_bound:
            self._wait_for_room()

    @property
    def held(self) -> int:
        """How many messages are held: sent, and not known to be acknowledged with every one before them."""
        return len(self._held)

    def _wait_for_room(self) -> None:
        """Wait for the oldest messages' acknowledgements until at most half the bound is queued.

        Waits on the newest of the messages that must go first (acknowledgements of one partition
        come in order, so the ones before it are mostly in by then), then on each of them. Stops
        early when a message failed (its errback has already stopped the sink) or was not
        acknowledged within ``delivery_timeout_ms``: :meth:`wait` reports it at the next flush.
        """
        needed, left = 0, self.queued_bytes
        for _, _, size in self._held:
            if left <= self._queued_bound // 2:
                break
            left -= size
            needed += 1
        if needed == 0 or not self._acknowledged(self._held[needed - 1][0]):
            return
        for _ in range(needed):
            if not self._acknowledged(self._held[0][0]):
                return
            self.queued_bytes -= self._held.popleft()[2]

    def _acknowledged(self, future: Any) -> bool:
        """Whether ``future``'s message is acknowledged, waiting up to ``delivery_timeout_ms`` for it."""
        if not future.is_done:
            with contextlib.suppress(Exception):  # a failure is the errback's to report (_failed)
                future.get(timeout=self._ack_wait_s)
        return bool(future.succeeded())

    def send_many(self, out: Outgoing) -> None:
        """See :meth:`Producer.send_many`."""
        if self._lease is not None and self._lease.broken and len(out):
            self._on_error(out.stamp(0), BROKEN_SHARED)  # the sink fails as unavailable and holds its cursor
            return
        partitions = itertools.repeat(None) if out.partitions is None else out.partitions
        messages = zip(out.keys, out.values, out.headers, partitions, strict=False)
        for i, (key, value, headers, partition) in enumerate(messages):
            try:
                self.send(out.topic, key, value, headers, partition, out.stamp(i))
            except SendRefused as e:
                e.index = i
                raise

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

    def wait(self, timeout_s: float) -> tuple[Stamp, str] | None:
        """See :meth:`Producer.wait`."""
        with contextlib.suppress(KafkaTimeoutError):  # the futures tell which messages are missing
            self._producer.flush(timeout=timeout_s)
        for future, stamp, _ in self._held:
            if not future.is_done:
                return stamp, "not acknowledged in time"
            if future.exception is not None:
                return stamp, repr(future.exception)
        self._held.clear()
        self.queued_bytes = 0
        return None

    def close(self, timeout_s: float) -> None:
        """See :meth:`Producer.close`; a leased producer is released instead."""
        if self._lease is not None:
            self._lease.release()
            return
        try:
            self._producer.close(timeout=timeout_s)
        except KafkaError:
            self.abort()

    def abort(self) -> None:
        """See :meth:`Producer.abort`; a leased producer is released instead (other sinks use it)."""
        if self._lease is not None:
            self._lease.release()
            return
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
    message. Reports are served by ``poll``/``flush`` in the caller's thread. The messages of one
    :meth:`send_many` share one report callback (:class:`_Reports`), which finds a failed message's
    stamp from its key and value: nothing is allocated per message in Python. A message sent
    without a partition goes where librdkafka's ``murmur2_random`` partitioner puts it: the
    Java-compatible murmur2 of its (never null) key modulo the partition count librdkafka knows.

    On a leased producer (shared with other sinks, :mod:`sinks.kafka.shared`) ``flush`` would
    wait for every sink's messages, which other threads keep adding: there every delivery is
    reported, this object counts its own, and :meth:`wait` serves reports until they are all in.
    """

    key_partitioner: ClassVar[bool] = True

    def __init__(self, options: KafkaOptions, on_error: OnError, *, lease: Lease | None = None) -> None:
        self._ck = importlib.import_module("confluent_kafka")
        try:
            self._producer = self._ck.Producer(options.confluent_config()) if lease is None else lease.client
        except self._ck.KafkaException as e:
            raise SinkUnavailableError(f"cannot create a Kafka producer for {','.join(options.bootstrap)}: {e}") from e
        self._options = options
        self._on_error = on_error
        self._lease = lease
        self._first: Stamp | None = None  # the first message sent since the last successful wait
        self._failures: list[tuple[Stamp, str]] = []
        self._unpolled = 0  # messages sent since the last poll
        self._counts = _Counts() if lease is not None else None

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
        self, topic: str, key: bytes, value: bytes | None, headers: Headers, partition: int | None, stamp: Stamp
    ) -> None:
        """See :meth:`Producer.send`."""
        if self._lease is not None and self._lease.broken:
            self._on_error(stamp, BROKEN_SHARED)
            return
        report = _Reports(self._failed, lambda key, value: stamp, self._counts)
        self._produce(topic, key, value, headers, -1 if partition is None else partition, report, 0)
        if self._counts is not None:
            self._counts.sent += 1
        if self._first is None:
            self._first = stamp
        self._unpolled += 1
        if self._unpolled >= _POLL_EVERY:
            self._poll()

    def send_many(self, out: Outgoing) -> None:
        """See :meth:`Producer.send_many`."""
        if not len(out):
            return
        if self._lease is not None and self._lease.broken:
            self._on_error(out.stamp(0), BROKEN_SHARED)  # the sink fails as unavailable and holds its cursor
            return
        if self._first is None:
            self._first = out.stamp(0)
        if self._counts is not None:
            self._send_counted(out, self._counts)
            return
        self._send_all(out, _Reports(self._failed, _Finder(out)))

    def _send_counted(self, out: Outgoing, counts: _Counts) -> None:
        """:meth:`send_many` on a leased producer: count the messages queued (those before a refused one)."""
        try:
            self._send_all(out, _Reports(self._failed, _Finder(out), counts))
        except SendRefused as e:
            counts.sent += e.index
            raise
        counts.sent += len(out)

    def _send_all(self, out: Outgoing, report: _Reports) -> None:
        produce, topic = self._producer.produce, out.topic
        partitions = itertools.repeat(-1) if out.partitions is None else out.partitions  # -1: librdkafka chooses
        messages = zip(out.keys, out.values, out.headers, partitions, strict=False)
        due = _POLL_EVERY - 1 - self._unpolled  # the index of the next message after which reports are served
        for i, (key, value, headers, partition) in enumerate(messages):
            try:
                produce(topic, value, key, partition, on_delivery=report, headers=headers)
            except (BufferError, self._ck.KafkaException):
                self._produce(topic, key, value, headers, partition, report, i)  # waits for room and retries, or raises
            if i == due:
                self._poll()
                due += _POLL_EVERY
        self._unpolled = len(out) - 1 - (due - _POLL_EVERY)  # those after the last poll

    def _produce(
        self,
        topic: str,
        key: bytes,
        value: bytes | None,
        headers: Headers,
        partition: int,
        report: _Reports,
        index: int,
    ) -> None:
        """Produce one message, serving reports while the local queue is full; raises :class:`SendRefused`."""
        deadline = None
        while True:
            try:
                self._producer.produce(topic, value, key, partition, on_delivery=report, headers=headers)
                return
            except BufferError:  # the local queue is full: serve reports until there is room
                deadline = deadline or time.monotonic() + self._options.delivery_timeout_ms / 1000
                if time.monotonic() > deadline:
                    raise SendRefused("the producer queue stayed full", too_large=False, index=index) from None
                self._producer.poll(0.05)
            except self._ck.KafkaException as e:
                error = e.args[0]
                too_large = error.code() == self._ck.KafkaError.MSG_SIZE_TOO_LARGE
                raise SendRefused(str(error), too_large=too_large, index=index) from e

    def _poll(self) -> None:
        self._producer.poll(0)
        self._unpolled = 0

    def _failed(self, stamp: Stamp, error: Any) -> None:
        if not self._failures:  # send nothing more; purged messages report failures of their own
            self._producer.purge(in_queue=True, in_flight=False, blocking=False)
        self._failures.append((stamp, str(error)))
        self._on_error(stamp, str(error))

    def wait(self, timeout_s: float) -> tuple[Stamp, str] | None:
        """See :meth:`Producer.wait`."""
        counts = self._counts
        remaining = self._producer.flush(timeout_s) if counts is None else self._wait_counted(counts, timeout_s)
        self._unpolled = 0
        if self._failures:
            return min(self._failures)  # stamps grow in send order
        if remaining and self._first is not None:
            return self._first, f"{remaining} message(s) from here on not acknowledged in time"
        self._first = None
        return None

    def _wait_counted(self, counts: _Counts, timeout_s: float) -> int:
        """Serve reports until every message of this sink got one or ``timeout_s`` passed; how many did not."""
        deadline = time.monotonic() + timeout_s
        while counts.reported < counts.sent:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            self._producer.poll(min(left, 0.1))
        return counts.sent - counts.reported

    def close(self, timeout_s: float) -> None:
        """See :meth:`Producer.close`; a leased producer is released instead."""
        if self._lease is not None:
            self._lease.release()
        elif self._producer.flush(timeout_s):
            self.abort()
        else:
            self._producer.close()

    def abort(self) -> None:
        """See :meth:`Producer.abort`; a leased producer is released instead (other sinks use it)."""
        if self._lease is not None:
            self._lease.release()
            return
        self._producer.purge(in_queue=True, in_flight=True, blocking=True)
        self._producer.flush(0)
        self._producer.close()


class _Finder:
    """The stamp of a message of ``out`` from its key and value (the first such message of ``out``)."""

    def __init__(self, out: Outgoing) -> None:
        self._out = replace(out, headers=())  # kept until every message is delivered: only what is needed
        self._index: dict[tuple[bytes, bytes | None], int] | None = None

    def __call__(self, key: bytes | None, value: bytes | None) -> Stamp:
        out = self._out
        if self._index is None:  # built at the first failure, not before
            self._index = {}
            for i, message in enumerate(zip(out.keys, out.values, strict=True)):
                self._index.setdefault(message, i)
        found = self._index.get((key or b"", value))
        return out.stamp(0 if found is None else found)  # not found (never expected): the first one


class _Counts:
    """Messages one sink queued on a shared producer, and how many of them got a delivery report."""

    __slots__ = ("_lock", "reported", "sent")

    def __init__(self) -> None:
        self.sent = 0  # only the sink's own thread adds to it
        self.reported = 0
        self._lock = threading.Lock()  # reports are served by whichever thread polls the shared producer

    def report(self) -> None:
        with self._lock:
            self.reported += 1


class _Reports:
    """The delivery report callback of a group of messages; calls ``failed(stamp, error)`` for each failure.

    With ``delivery.report.only.error`` it is only called for failures. A failed message's stamp is
    ``find(key, value)``: for a message identical (key and value) to an earlier one of its group,
    that earlier one's, which is at or before it in send order. With ``counts`` (a shared producer,
    which reports every delivery), each report is counted there.
    """

    __slots__ = ("_counts", "_failed", "_find")

    def __init__(
        self,
        failed: Callable[[Stamp, Any], None],
        find: Callable[[bytes | None, bytes | None], Stamp],
        counts: _Counts | None = None,
    ) -> None:
        self._failed = failed
        self._find = find
        self._counts = counts

    def __call__(self, error: Any, message: Any) -> None:
        if error is not None:
            self._failed(self._find(message.key(), message.value()), error)
        if self._counts is not None:
            self._counts.report()


def held_rows(count: int, message_rows: list[int], sent_rows: list[int]) -> int:
    """Rows of a batch of ``count`` rows none of whose messages were sent.

    A row without a message of its own goes with the next row that has one (the later image of a
    paired update carries both); rows after the last message go with it.
    """
    sent = set(sent_rows)
    held, previous = 0, -1
    for row in sorted(set(message_rows)):
        if row not in sent:
            held += row - previous
        previous = row
    if previous not in sent:
        held += count - 1 - previous
    return held


def describe_stamp(stamp: Stamp) -> str:
    """What a stamped message is, for an error: a row, a tombstone, or an event (commit, schema, transaction...)."""
    version, rank, index, sub = stamp
    if rank == COMMIT_RANK:
        kind = ("commit", "schema-change", "transaction BEGIN", "transaction END")[sub]
        return f"the {kind} event of version {version}"
    if rank == HEARTBEAT_RANK:
        return f"the heartbeat at version {version}"
    what = "tombstone" if sub else "row"
    return f"{what} at position {Position(version, rank, index)}"


def refusal_text(e: SendRefused, topic: str, size: int, max_message_bytes: int, stamp: Stamp) -> str:
    """Why the producer refused the message of ``stamp`` (``size`` bytes of key and value) to ``topic``."""
    if e.too_large:
        return (
            f"the message for {describe_stamp(stamp)} is too large ({size} bytes of key and value, "
            f"max_message_bytes={max_message_bytes}): {e.detail}"
        )
    return f"cannot send the message for {describe_stamp(stamp)} to {topic}: {e.detail}"
