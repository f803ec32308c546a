"""A sink that publishes change rows to a Kafka topic: ``kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?OPTION=VALUE&...]``.

Options, delivery rules, partitions, headers, exactly-once resume and heartbeats: ``docs/kafka.md``;
the ``debezium`` and ``flat`` formats: ``docs/debezium.md``. The producer is idempotent with ``acks=all``;
:meth:`KafkaSink.flush` raises :class:`~state.errors.SinkError` naming the first position Kafka did not
acknowledge, and the first failure stops the sink. Every message goes to its key's partition (murmur2, as
Java clients do). With ``exactly_once``, ``open`` reads every partition's tail (:mod:`sinks.kafka.tails`)
and ``write`` skips each message not after what its partition holds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

import orjson

from deltatail.sinks.json_text import CHANGE_TYPES, UPDATE, EncodedBatch
from deltatail.sinks.kafka import transactions as txn
from deltatail.sinks.kafka.avro import AvroEncoder, avro_encoder
from deltatail.sinks.kafka.debezium import check_ordering, heartbeat_message
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.kafka.options import KafkaOptions, default_sink_id, fill_topic
from deltatail.sinks.kafka.pairing import encoding_slices
from deltatail.sinks.kafka.partitioner import choose_partition, choose_partitions
from deltatail.sinks.kafka.producers import (
    COMMIT_RANK,
    HEARTBEAT_RANK,
    ConfluentProducer,
    Headers,
    Outgoing,
    Producer,
    PythonProducer,
    SendRefused,
    Stamp,
    describe_stamp,
    held_rows,
    refusal_text,
)
from deltatail.sinks.kafka.schema_changes import schema_change_message
from deltatail.sinks.kafka.shared import ProducerPool
from deltatail.sinks.kafka.tails import Tail, TailCheck, TailReader, header_map, position_header
from deltatail.state.audit import AuditEvent
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError, SinkUnavailableError
from deltatail.state.feed import ChangeBatch, CommitEvent, FollowStatus, TableInfo
from deltatail.state.schema import StructType
from deltatail.state.schema_diff import SchemaDiff
from deltatail.tailer.collector import collector_paused
from deltatail.tailer.sink import Sink

_BEFORE_ALL: Stamp = (-1, 0, 0, 0)
#: The ``dt.change_type`` header of each change type the encoder emits.
_CHANGE_TYPE_HEADERS: dict[str, tuple[str, bytes]] = {
    t: ("dt.change_type", t.encode()) for t in (*CHANGE_TYPES, UPDATE)
}


class KafkaSink(Sink):
    """Publishes change rows to Kafka; see ``docs/kafka.md`` for the URI and guarantees.

    Args:
        uri: a ``kafka://`` URI.
        env: environment for ``KAFKA_*`` security variables; ``os.environ`` if ``None``.
        clock_ms: encoding time for Debezium ``ts_ms`` (injectable for reproducible output).
        producers: a pool whose producer the sink shares with the other sinks of the same
            producer settings (``serve``, :mod:`sinks.kafka.shared`); ``None``: a producer of its own.

    Raises:
        ConfigError: if the URI is invalid.
    """

    def __init__(
        self,
        uri: str,
        *,
        env: Mapping[str, str] | None = None,
        clock_ms: Callable[[], int] | None = None,
        producers: ProducerPool | None = None,
    ) -> None:
        self.options = KafkaOptions.from_uri(uri, env)
        self.key_columns = tuple(self.options.key_columns)  # an on-demand snapshot's chunks are keyed by them
        self._clock_ms = clock_ms
        self._pool = producers
        self._producer: Producer | None = None
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        """Forget everything of a previous opening."""
        self._failure: SinkError | None = None
        self._tails: dict[int, Tail] = {}
        self._sent: dict[int, Stamp] = {}
        self._seq: dict[int, int] = {}
        self._last_commit_version = -1
        self._operation: tuple[int, str | None] = (-1, None)
        self._last_heartbeat: float | None = None
        self._held = 0

    @property
    def rows_held(self) -> int:
        """Rows given to :meth:`write` since :meth:`open` whose messages every partition already held (skipped).

        Only ``exactly_once`` skips; a row without a message of its own (the earlier image of an
        update sent as one event) goes with the row of the next message.
        """
        return self._held

    @property
    def location(self) -> str | None:
        """``topic TOPIC`` once open."""
        topic = getattr(self, "topic", None)
        return None if topic is None else f"topic {topic}"

    # -- life cycle --------------------------------------------------------

    def open(self, table: TableInfo) -> Position | None:
        """Connect, resolve the topic and, with ``exactly_once``, read what every partition holds.

        Returns:
            Always ``None``: with ``exactly_once`` the sink skips rows per partition in
            :meth:`write` instead (``docs/kafka.md``); without it, it cannot tell.

        Raises:
            ConfigError: if a topic template does not fit the table, the heartbeat topic is the change
                or commit topic, or ``format`` is ``debezium``/``flat`` without ``key`` on a topic of
                several partitions and without ``allow_unordered`` (see
                :func:`sinks.kafka.debezium.check_ordering`).
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
        self.heartbeat_topic = self.schema_topic = self.transaction_topic = None
        beats, schemas, tx = opts.heartbeat_interval is not None, opts.schema_changes, opts.transactions
        self.heartbeat_topic = self._own_topic(table, opts.heartbeat_topic if beats else None, "heartbeat_topic")
        self.schema_topic = self._own_topic(table, opts.events.server_name if schemas else None, "schema change topic")
        self.transaction_topic = self._own_topic(table, opts.transaction_topic if tx else None, "transaction_topic")
        self.sink_id = opts.sink_id or default_sink_id(table.table_id, self.topic)
        self._tx = txn.TransactionLog(table.table_id, self.sink_id) if opts.transactions else None
        clock = {} if self._clock_ms is None else {"clock_ms": self._clock_ms}
        self._encoder: ChangeEncoder | AvroEncoder = ChangeEncoder(
            table,
            format=opts.format,
            key_columns=opts.key_columns,
            tombstones=opts.tombstones,
            events=opts.events,
            **clock,
        )
        if opts.avro is not None:
            self._encoder = avro_encoder(table, self.topic, opts, opts.avro, self._clock_ms)
        self._fixed_headers = (("dt.table_id", table.table_id.encode()), ("dt.sink_id", self.sink_id.encode()))
        try:
            producer = self._connect()
        except SinkError as e:
            raise e.at(table=table.path) from e.__cause__
        try:
            self._partitions = self._partition_count(producer, self.topic)
            self._commit_partitions = self._partition_count(producer, self.commit_topic) if self.commit_topic else 0
            check_ordering(
                opts.format,
                opts.key_columns,
                self._partitions,
                allow_unordered=opts.allow_unordered,
                topic=self.topic,
                table=table.path,
            )
            self._heartbeat_partitions = (
                self._partition_count(producer, self.heartbeat_topic) if self.heartbeat_topic else 0
            )
            self._schema_partitions = self._partition_count(producer, self.schema_topic) if self.schema_topic else 0
            self._tx_partitions = (
                self._partition_count(producer, self.transaction_topic) if self.transaction_topic else 0
            )
            if opts.exactly_once:
                self._read_tails()
        except BaseException as e:
            producer.abort()
            if isinstance(e, SinkError):
                raise e.at(table=table.path) from e.__cause__
            raise
        # Without exactly_once nothing here needs a message's partition: leave it to the producer when its
        # keyed choice is the same (see Producer.key_partitioner) and cheaper.
        self._by_producer = producer.key_partitioner and not opts.exactly_once
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

    def _own_topic(self, table: TableInfo, template: str | None, option: str) -> str | None:
        """The topic of one kind of event (``option`` names it in errors), ``None`` when that kind is off.

        Raises:
            ConfigError: if it is the topic of changes or of another kind of event: each needs its own.
        """
        if template is None:
            return None
        topic = fill_topic(template, table, self.options.events.server_name)
        taken = (self.topic, self.commit_topic, self.heartbeat_topic, self.schema_topic, self.transaction_topic)
        if topic in taken:
            raise ConfigError(
                f"{option} {topic} is the topic of changes or commit events, or of other events (heartbeats, "
                "schema changes, transactions); each needs a topic of its own",
                table=table.path,
            )
        return topic

    def _connect(self) -> Producer:
        if self._pool is not None:
            return self._pool.lease(self.options, self._on_error)
        if self.options.backend == "confluent":
            return ConfluentProducer(self.options, self._on_error)
        return PythonProducer(self.options, self._on_error)

    def _partition_count(self, producer: Producer, topic: str) -> int:
        count = producer.partitions(topic)
        if not count:
            raise SinkError(f"topic {topic} has no partitions (does it exist?)", table=self.table.path)
        return count

    # -- exactly once ---------------------------------------------------------

    def _read_tails(self) -> None:
        reader = TailReader(self.options)
        check = TailCheck(self.table, self.sink_id, self.topic, self._partitions)
        try:
            ends = reader.ends(self.topic, list(range(self._partitions)))
            for partition, (first, last) in ends.items():
                self._tails[partition] = check.check_partition(partition, first, last)
            if self.commit_topic:
                self._read_commit_tail(reader)
            if self._tx is not None:
                self._read_transaction_tail(reader)
        finally:
            reader.close()
        self._sent = {p: t.stamp for p, t in self._tails.items()}
        self._seq = {p: t.seq + 1 for p, t in self._tails.items()}

    def _read_commit_tail(self, reader: TailReader) -> None:
        assert self.commit_topic is not None
        headers = self._last_headers(reader, self.commit_topic, self._commit_partitions)
        if headers is not None:
            ours = headers.get("dt.sink_id") == self.sink_id.encode()
            if ours and headers.get("dt.table_id") == self.table.table_id.encode():
                self._last_commit_version = int(headers.get("dt.version", b"-1"))

    def _read_transaction_tail(self, reader: TailReader) -> None:
        assert self._tx is not None and self.transaction_topic is not None
        for tail in self._tails.values():  # rows of a commit already held count in its END
            version, rank, index, _ = tail.stamp
            if rank < COMMIT_RANK and index >= 0:
                self._tx.seen(version, index + 1)
        headers = self._last_headers(reader, self.transaction_topic, self._tx_partitions)
        if headers is not None:
            self._tx.resume(headers)

    def _last_headers(self, reader: TailReader, topic: str, partitions: int) -> dict[str, bytes] | None:
        """The headers of the last message in this table's partition of ``topic``; ``None`` if it is empty."""
        partition = choose_partition(self.table.table_id.encode(), partitions)
        ends = reader.ends(topic, [partition])
        return header_map(ends[partition][1].headers) if partition in ends else None

    # -- writing ---------------------------------------------------------------

    def write(self, batch: ChangeBatch) -> None:
        """Encode and send ``batch``; delivery is confirmed by :meth:`flush`.

        With ``exactly_once``, messages not after what their partition holds are skipped.

        Raises:
            SinkError: if the sink is not open or has failed; if a row cannot be encoded (nothing of
                the batch was sent if it is in the first slice of ``pairing.ENCODE_ROWS`` rows, else the slices
                before were queued, and the sink stops); or if a message is over ``max_message_bytes``
                or refused by the producer (the rows before it were queued, and the sink stops). The
                error names the row's position. With ``encoding=avro``: if the Schema Registry refuses
                a new schema (:mod:`sinks.kafka.avro`).
            SinkUnavailableError: (``encoding=avro``) if the Schema Registry cannot be reached (as above).
        """
        self._check_usable()
        if self._tx is not None and not batch.start.snapshot and len(batch):
            self._transaction_event(batch.start.version, "BEGIN", txn.commit_ms(batch.rows.column("_commit_timestamp")))
            self._tx.seen(batch.start.version, batch.end.index)
        version, operation = self._operation
        with collector_paused():
            parts = [batch] if self._tx is not None else encoding_slices(batch, self.options.pair_key)
            send = self._exactly_once if self.options.exactly_once else self._outgoing
            for i, part in enumerate(parts):
                try:
                    encoded = self._encoder.encode(part, operation if version == part.start.version else None)
                except SinkError as e:  # slices before this one were queued: the sink stops
                    if i == 0:
                        raise
                    at, down = part.start, isinstance(e, SinkUnavailableError)
                    raise self._fail(e.message, (at.version, at.snapshot_rank, at.index, 0), unavailable=down) from e
                if len(encoded):
                    self._send_many(send(part, encoded))

    def _outgoing(self, batch: ChangeBatch, encoded: EncodedBatch) -> Outgoing:
        """Every message of ``batch``; the producer chooses the partitions if its choice is the same and cheaper.

        The headers are built as the producer takes them: each list is dropped once its message is
        queued, instead of a batch of them piling up for the garbage collector to scan.
        """
        start, rows, keys = batch.start, encoded.rows, encoded.keys
        table_id, sink_id = self._fixed_headers
        version, base, position = ("dt.version", b"%d" % start.version), start.index, position_header(batch.start)
        headers = (
            [table_id, sink_id, version, ("dt.position", position % (base + row)), _CHANGE_TYPE_HEADERS[change_type]]
            for row, change_type in zip(rows, encoded.change_types, strict=True)
        )
        partitions = None if self._by_producer else choose_partitions(keys, self._partitions)
        return Outgoing(
            self.topic, keys, encoded.values, headers, partitions, start.version, start.snapshot_rank, base, rows
        )

    def _exactly_once(self, batch: ChangeBatch, encoded: EncodedBatch) -> Outgoing:
        """The messages of ``batch`` after what their partition holds, with ``dt.seq`` and ``dt.partitions``."""
        start, count, sent, seqs = batch.start, self._partitions, self._sent, self._seq
        table_id, sink_id = self._fixed_headers
        version, rank, base = start.version, start.snapshot_rank, start.index
        version_header, position = ("dt.version", b"%d" % version), position_header(batch.start)
        partitions_header = ("dt.partitions", b"%d" % count)
        keys: list[bytes] = []
        values: list[bytes | None] = []
        headers: list[Headers] = []
        partitions: list[int] = []
        rows: list[int] = []
        for row, key, value, change_type, partition in zip(
            encoded.rows,
            encoded.keys,
            encoded.values,
            encoded.change_types,
            choose_partitions(encoded.keys, count),
            strict=True,
        ):
            stamp: Stamp = (version, rank, base + row, 0 if value is not None else 1)
            if stamp <= sent.get(partition, _BEFORE_ALL):
                continue
            sent[partition] = stamp
            seq = seqs.get(partition, 0)
            seqs[partition] = seq + 1
            keys.append(key)
            values.append(value)
            headers.append(
                [
                    table_id,
                    sink_id,
                    version_header,
                    ("dt.position", position % (base + row)),
                    _CHANGE_TYPE_HEADERS[change_type],
                    ("dt.seq", b"%d" % seq),
                    partitions_header,
                ]
            )
            partitions.append(partition)
            rows.append(row)
        if len(rows) < len(encoded.rows):
            self._held += held_rows(len(batch), encoded.rows, rows)
        return Outgoing(self.topic, keys, values, headers, partitions, version, rank, base, rows)

    @property
    def wants_audit_events(self) -> bool:
        """True with a ``commit_topic`` (its messages are the commits' audit events) or ``schema_changes``."""
        return bool(self.options.commit_topic) or self.options.schema_changes

    @property
    def update_pair_key(self) -> tuple[str, ...]:
        """The key columns by which ``debezium``/``flat`` events pair update images (:mod:`sinks.kafka.pairing`)."""
        return self.options.pair_key

    def commit_event(self, event: CommitEvent) -> None:
        """Publish the commit's audit event to the commit topic, if one is configured.

        With ``transactions=true``, first the commit's ``BEGIN`` (if no row sent it) and ``END`` events
        (:mod:`sinks.kafka.transactions`).

        The value is exactly the audit event's dict form
        (:meth:`AuditEvent.to_json <state.audit.AuditEvent.to_json>`, format
        ``deltatail.audit.commit/1``) plus two keys: ``table_id`` (the followed table's id)
        and ``sink_id``. The key is the table id; headers ``dt.table_id``, ``dt.sink_id``,
        ``dt.version`` and ``dt.change_type: commit``. With ``exactly_once``, a version not
        after the last one in the commit topic's partition is skipped. Delivery is confirmed
        by :meth:`flush`.

        Raises:
            SinkError: if the sink is not open or has failed, the event carries no audit event
                (``CommitEvent.audit``: the tailer builds it because :attr:`wants_audit_events`),
                or it cannot be sent.
        """
        self._check_usable()
        if self._tx is not None:
            self._transaction_event(event.version, "BEGIN", event.timestamp_ms)
            self._transaction_event(event.version, "END", event.timestamp_ms)
        if self.commit_topic is None and self.schema_topic is None:
            return
        if event.audit is None:
            raise SinkError(
                f"the commit event of version {event.version} carries no audit event; the commit topic "
                "publishes audit events (the tailer builds them for a sink whose wants_audit_events is true)",
                table=self.table.path,
                version=event.version,
            )
        diff = event.audit.schema_change
        if self.schema_topic is not None and diff and event.schema is not None:
            created = event.audit.table_created
            self._send_schema_change(self.schema_topic, event, event.schema, diff, created=created)
        if self.commit_topic is None or (self.options.exactly_once and event.version <= self._last_commit_version):
            return
        self._last_commit_version = event.version
        key = self.table.table_id.encode()
        value = self._commit_value(event.audit)
        headers = [*self._fixed_headers, ("dt.version", b"%d" % event.version), ("dt.change_type", b"commit")]
        partition = None if self._by_producer else choose_partition(key, self._commit_partitions)
        stamp = (event.version, COMMIT_RANK, -1, 0)
        self._send(self.commit_topic, key, value, headers, partition, stamp)

    def _send_schema_change(
        self, topic: str, event: CommitEvent, schema: StructType, diff: SchemaDiff, *, created: bool
    ) -> None:
        """Send the Debezium schema-change event of ``event``'s version (:mod:`sinks.kafka.schema_changes`).

        At least once (repeats told by ``source.table_id`` and ``source.commit_version``): the topic is
        shared by every table of the server, so its tail says nothing about one table.
        """
        key, value = schema_change_message(
            self.table,
            self.options.events,
            version=event.version,
            timestamp_ms=event.timestamp_ms,
            schema=schema,
            diff=diff,
            created=created,
            key_columns=self.options.key_columns,
        )
        headers = [*self._fixed_headers, ("dt.version", b"%d" % event.version), ("dt.change_type", b"schema_change")]
        partition = None if self._by_producer else choose_partition(key, self._schema_partitions)
        stamp = (event.version, COMMIT_RANK, -1, 1)
        self._send(topic, key, value, headers, partition, stamp)

    def _transaction_event(self, version: int, status: str, ts_ms: int | None) -> None:
        """Send the ``BEGIN`` or ``END`` of commit ``version`` unless it was sent (:mod:`sinks.kafka.transactions`)."""
        tx, topic = self._tx, self.transaction_topic
        assert tx is not None and topic is not None
        if (tx.begun if status == "BEGIN" else tx.ended) >= version:
            return
        events = self.options.events
        collection = txn.data_collection(events.source_db, events.source_schema, events.table_name(self.table))
        count = None if status == "BEGIN" else tx.rows.get(version, 0)
        key, value = txn.boundary_message(status, self.table.table_id, version, ts_ms, collection, count)
        if isinstance(self._encoder, AvroEncoder):
            key, value = self._encoder.encode_other(topic, txn.boundary_schemas(events.server_name), key, value)
        headers = [*self._fixed_headers, ("dt.version", b"%d" % version), ("dt.change_type", status.encode())]
        stamp = (version, COMMIT_RANK, -1, 2 if status == "BEGIN" else 3)
        partition = choose_partition(self.table.table_id.encode(), self._tx_partitions)
        if status == "BEGIN":
            tx.begun = version
        else:
            tx.ended = version
        self._send(topic, key, value, headers, partition, stamp)

    def commit_started(self, version: int, operation: str | None) -> None:
        """Remember the Delta operation of ``version`` for the ``source.operation`` of its rows (``debezium``)."""
        self._operation = (version, operation)

    def heartbeat(self, status: FollowStatus) -> None:
        """Send a heartbeat to the heartbeat topic if ``heartbeat_interval`` has passed since the last one.

        Does nothing without ``heartbeat_interval``. Delivery is confirmed by the next :meth:`flush`;
        a heartbeat Kafka did not acknowledge stops the sink as any message does.

        Raises:
            SinkError: if the sink is not open or has failed, or the heartbeat cannot be sent.
        """
        self._check_usable()
        interval = self.options.heartbeat_interval
        if interval is None or self.heartbeat_topic is None:
            return
        now = time.monotonic()
        if self._last_heartbeat is not None and now - self._last_heartbeat < interval:
            return
        self._last_heartbeat = now
        key, value = heartbeat_message(self.table, self.options.events, status, time.time_ns() // 1_000_000)
        headers = [
            *self._fixed_headers,
            ("dt.version", b"%d" % status.delivered_version),
            ("dt.change_type", b"heartbeat"),
        ]
        partition = None if self._by_producer else choose_partition(key, self._heartbeat_partitions)
        stamp = (status.delivered_version, HEARTBEAT_RANK, -1, 0)
        self._send(self.heartbeat_topic, key, value, headers, partition, stamp)

    def _commit_value(self, audit: AuditEvent) -> bytes:
        body = audit.to_json()
        body["table_id"] = self.table.table_id
        body["sink_id"] = self.sink_id
        try:
            return orjson.dumps(body)
        except TypeError as e:
            raise SinkError(f"commit event is not JSON-serialisable: {e}", table=self.table.path) from e

    def _send(
        self, topic: str, key: bytes, value: bytes | None, headers: Headers, partition: int | None, stamp: Stamp
    ) -> None:
        """Send one message (a commit, schema-change, transaction or heartbeat event); a refusal is a SinkError."""
        try:
            self._producer_for_sending().send(topic, key, value, headers, partition, stamp)
        except SendRefused as e:
            raise self._refused(e, topic, key, value, stamp) from e

    def _send_many(self, out: Outgoing) -> None:
        producer = self._producer_for_sending()
        try:
            producer.send_many(out)
        except SendRefused as e:
            raise self._refused(e, out.topic, out.keys[e.index], out.values[e.index], out.stamp(e.index)) from e

    def _refused(self, e: SendRefused, topic: str, key: bytes, value: bytes | None, stamp: Stamp) -> SinkError:
        """Stop the sink: the producer refused the message of ``stamp``."""
        size = len(key) + len(value or b"")
        return self._fail(refusal_text(e, topic, size, self.options.max_message_bytes, stamp), stamp)

    def _on_error(self, stamp: Stamp, detail: str) -> None:
        """Called by the producer for each unacknowledged message; the first one stops the sink."""
        self._fail(
            f"Kafka did not acknowledge the message for {describe_stamp(stamp)}: {detail}", stamp, unavailable=True
        )

    def _fail(self, message: str, stamp: Stamp, *, unavailable: bool = False) -> SinkError:
        with self._lock:
            if self._failure is None:
                version = stamp[0] if stamp[0] >= 0 else None
                kind = SinkUnavailableError if unavailable else SinkError
                self._failure = kind(message, table=self.table.path, version=version)
            return self._failure

    def _check_usable(self) -> Producer:
        """The producer, if the sink is open and has not failed.

        Raises:
            SinkError: if the sink is not open, or stopped after a failure (that failure's class).
        """
        if self._producer is None:
            raise SinkError("the Kafka sink is not open")
        if self._failure is not None:
            raise type(self._failure)(
                f"the Kafka sink stopped after an earlier failure: {self._failure.message}",
                table=self.table.path,
                version=self._failure.version,
            )
        return self._producer

    def _producer_for_sending(self) -> Producer:
        """The producer, unless a message failed meanwhile (producer thread): then nothing more is sent.

        Raises:
            SinkError: if the sink is not open, or stopped after a failure.
        """
        if self._failure is not None or self._producer is None:
            return self._check_usable()
        return self._producer

    # -- flushing --------------------------------------------------------------

    def flush(self) -> None:
        """Wait until Kafka acknowledged every message sent since the last flush.

        The producer retries with backoff for up to ``delivery_timeout_ms``; this waits that long
        plus ``request_timeout_ms`` at most.

        Raises:
            SinkError: if the sink is not open or has failed, or any message could not be delivered;
                the error names the first undelivered position, and the sink stops.
        """
        producer = self._check_usable()
        opts = self.options
        undelivered = producer.wait((opts.delivery_timeout_ms + opts.request_timeout_ms) / 1000)
        if undelivered is not None:
            stamp, why = undelivered
            message = f"Kafka did not acknowledge the message for {describe_stamp(stamp)}: {why}"
            self._fail(message, stamp, unavailable=True)  # stops the sink unless an earlier failure already did
            raise SinkUnavailableError(message, table=self.table.path, version=stamp[0])  # first in send order
