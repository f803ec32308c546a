"""What a topic already holds of a Kafka sink: the partition tails that exactly-once resume reads and checks.

With ``exactly_once`` (docs/kafka.md), :meth:`KafkaSink.open <sinks.kafka.sink.KafkaSink.open>`
reads the first and last message of every partition (:class:`TailReader`) and checks that the
last one is this sink's own, written with the same partition count, and that ``dt.seq`` shows no
message lost since the first (:class:`TailCheck`); the tail's stamp is where the sink resumes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from deltatail.sinks.kafka.options import KafkaOptions
from deltatail.sinks.kafka.producers import Stamp
from deltatail.state.cursor import Position
from deltatail.state.errors import SinkError, SinkUnavailableError, StateError
from deltatail.state.feed import TableInfo


@dataclass(frozen=True, slots=True)
class Tail:
    """What one partition holds of this sink: its last message's stamp and sequence number."""

    stamp: Stamp
    seq: int
    version: int


def position_header(start: Position) -> bytes:
    """The ``dt.position`` header of rows from ``start`` on, waiting for the row's index (``%d``)."""
    snapshot = b"true" if start.snapshot else b"false"
    return b'{"version":%d,"index":%%d,"snapshot":%s}' % (start.version, snapshot)


def header_map(headers: list[tuple[str, bytes]] | None) -> dict[str, bytes]:
    """A record's headers by name (none: empty)."""
    return dict(headers or ())


def tail_of(where: str, offset: int, value: bytes | None, headers: dict[str, bytes]) -> Tail:
    """Parse the deltatail headers of one message; ``where`` names it in errors."""
    try:
        pos = Position.from_json(orjson.loads(headers["dt.position"]))
        seq = int(headers.get("dt.seq", b"-1"))
    except (KeyError, ValueError, orjson.JSONDecodeError, StateError) as e:
        raise SinkError(f"{where} holds a message at offset {offset} without valid deltatail headers: {e}") from e
    stamp = (pos.version, pos.snapshot_rank, pos.index, 1 if value is None else 0)
    return Tail(stamp, seq, pos.version)


class TailReader:
    """Reads the first and last message of partitions with one assigned consumer (no group)."""

    def __init__(self, options: KafkaOptions) -> None:
        self._deadline = time.monotonic() + options.open_timeout_ms / 1000
        self._timeout_ms = options.open_timeout_ms
        try:
            self._consumer = KafkaConsumer(**options.consumer_config())
        except KafkaError as e:
            raise SinkUnavailableError(f"cannot connect to Kafka at {','.join(options.bootstrap)}: {e!r}") from e

    def close(self) -> None:
        """Close the consumer."""
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


@dataclass(frozen=True, slots=True)
class TailCheck:
    """Checks the partition tails of ``topic`` against this sink: its table, its id, its partition count."""

    table: TableInfo
    sink_id: str
    topic: str
    partitions: int

    def check_partition(self, partition: int, first: Any | None, last: Any) -> Tail:
        """The tail of ``partition``, from its ``first`` (if read) and ``last`` records.

        Raises:
            SinkError: if the last message is not this sink's (no deltatail headers, another
                table or sink id), was written without ``exactly_once`` or with another partition
                count, or ``dt.seq`` shows messages lost since the first.
        """
        where = f"topic {self.topic} partition {partition}"
        headers = header_map(last.headers)
        self._check_owner(where, last.offset, headers)
        if "dt.partitions" not in headers or "dt.seq" not in headers:
            raise SinkError(
                f"{where} was written without exactly_once=true (offset {last.offset} has no dt.seq); "
                "exactly-once resume needs a topic written with it from the start",
                table=self.table.path,
            )
        if int(headers["dt.partitions"]) != self.partitions:
            raise SinkError(
                f"{where} was written with {headers.get('dt.partitions', b'?').decode()} partitions and now has "
                f"{self.partitions}: keys moved between partitions, exactly-once resume is impossible",
                table=self.table.path,
            )
        tail = tail_of(where, last.offset, last.value, headers)
        self._check_no_loss(where, first, last, tail)
        return tail

    def _check_no_loss(self, where: str, first: Any | None, last: Any, tail: Tail) -> None:
        """Offsets are contiguous, so ``dt.seq`` growing faster than offsets means messages went missing."""
        head_headers = header_map(first.headers if first is not None else None)
        if first is None or head_headers.get("dt.sink_id") != self.sink_id.encode() or "dt.seq" not in head_headers:
            return  # the partition starts with another writer's messages: nothing to compare with
        head = tail_of(where, first.offset, first.value, head_headers)
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
