"""Write a deltatail change stream from Spark onwards to Kafka: a ``foreachBatch`` helper.

Usage::

    from deltatail.sinks.spark import register
    from deltatail.sinks.spark.kafka_writer import kafka_batch_writer

    register(spark)
    query = (
        spark.readStream.format("deltatail").load("/data/events")
        .writeStream.foreachBatch(kafka_batch_writer("kafka://127.0.0.1:9092/cdc?key=id", "/data/events"))
        .option("checkpointLocation", "/chk/events-kafka")
        .start()
    )

The micro-batch is written through an internal Python data source
(``deltatail_kafka``, a :class:`~pyspark.sql.datasource.DataSourceArrowWriter`,
which needs no pandas): each executor task gets its partition as Arrow batches
and produces it with kafka-python, encoding rows with
:class:`sinks.kafka.encoding.ChangeEncoder`. The URI and message formats are those of
:class:`sinks.kafka.sink.KafkaSink` (``format``, ``key``, ``tombstones``,
``compression``, the producer and security options). Headers: ``dt.table_id``,
``dt.sink_id``, ``dt.version``, ``dt.change_type`` as the sink writes them, and
``dt.spark_batch`` (the micro-batch id). Only the tasks' message counts come
back to the driver.

Where it differs from the sink, because Spark rows carry no position:

* without ``key`` columns messages have a ``null`` key (Kafka spreads them over
  partitions) and no ``dt.position`` header; with them, the key and partition
  (murmur2 of the key) are the sink's;
* initial-snapshot rows look like inserts: Debezium ``op`` is ``c``, not ``r``, and
  ``source.index`` is ``null``;
* delivery is at least once: Spark runs a failed micro-batch again, and its
  messages are produced again (``dt.spark_batch`` tells the copies apart);
  ``exactly_once``, ``commit_topic`` and ``backend=confluent`` are refused;
* order: with ``key`` columns, each micro-batch is repartitioned by the key and
  sorted by ``(_commit_version, key, change type)`` (pre-image, delete,
  post-image, insert), so one task produces all of a key's messages in commit
  order. A Debezium ``u`` event needs both images in one Arrow batch; an update
  whose images fall on either side of a batch boundary is written as ``d`` then
  ``c`` (see :mod:`sinks.kafka.encoding`). Without ``key`` columns there is no order.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from deltatail.sinks.json_text import EncodedBatch
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.sinks.kafka.options import KafkaOptions, default_sink_id, fill_topic
from deltatail.sinks.kafka.partitioner import choose_partitions
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, SinkError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.collector import collector_paused
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.starts import table_id
from deltatail.tailer.table import table_storage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger("deltatail")

#: The internal format the micro-batches are written through.
WRITE_FORMAT = "deltatail_kafka"
#: Sort rank of change types within one commit and key: old images before new ones.
CHANGE_RANK = {"update_preimage": 0, "delete": 1, "update_postimage": 2, "insert": 3}


def table_info(path: str, name: str | None = None, storage_options: Mapping[str, str] | None = None) -> TableInfo:
    """The :class:`TableInfo` of a table: its id from commit 0 (else from the latest snapshot).

    Raises:
        TableNotFoundError: if the path holds no Delta table.
        InvalidLogError: if the log holds no ``metaData`` to take the id from.
    """
    log = DeltaLog(path, table_storage(path, storage_options))
    return TableInfo(log.table, table_id(log), name)


def kafka_batch_writer(
    uri: str,
    table_path: str,
    *,
    table_name: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> KafkaBatchWriter:
    """A ``foreachBatch`` function writing each micro-batch of a ``deltatail`` stream to Kafka.

    Args:
        uri: a ``kafka://`` URI as :class:`sinks.kafka.sink.KafkaSink` takes (without ``exactly_once``,
            ``commit_topic`` and ``backend=confluent``).
        table_path: the table the stream reads (for its id, and Debezium's ``source``).
        table_name: the table's name (topic templates, Debezium ``source.table``).
        storage_options: the table's object-store options, if it is in one (read on the driver only).

    Raises:
        ConfigError: if the URI is invalid, asks for ``exactly_once``, ``commit_topic`` or the
            confluent backend, or its topic template does not fit the table.
        TableNotFoundError: if ``table_path`` holds no Delta table.
    """
    options = KafkaOptions.from_uri(uri)
    if options.exactly_once or options.commit_topic or options.backend != "kafka-python":
        raise ConfigError(
            f"kafka URI {uri!r}: exactly_once, commit_topic and backend=confluent are not available from Spark"
        )
    table = table_info(table_path, table_name, storage_options)
    topic = fill_topic(options.topic, table)
    sink_id = options.sink_id or default_sink_id(table.table_id, topic)
    return KafkaBatchWriter(ProduceJob(uri, table, topic, sink_id), options.key_columns)


@dataclass(frozen=True, slots=True)
class ProduceJob:
    """What an executor task needs to produce its rows (picklable)."""

    uri: str
    table: TableInfo
    topic: str
    sink_id: str
    batch_id: int = -1

    def to_options(self) -> dict[str, str]:
        """As data source options (strings)."""
        t = self.table
        return {
            "uri": self.uri,
            "topic": self.topic,
            "sinkId": self.sink_id,
            "batchId": str(self.batch_id),
            "tablePath": t.path,
            "tableId": t.table_id,
            "tableName": t.name or "",
        }

    @staticmethod
    def from_options(options: Mapping[str, str]) -> ProduceJob:
        """The job of :meth:`to_options` output (keys case-insensitive, as Spark hands them over)."""
        o = {k.lower(): v for k, v in options.items()}
        table = TableInfo(o["tablepath"], o["tableid"], o["tablename"] or None)
        return ProduceJob(o["uri"], table, o["topic"], o["sinkid"], int(o["batchid"]))


class KafkaBatchWriter:
    """The callable :func:`kafka_batch_writer` returns: ``writer(micro_batch_df, batch_id)``."""

    def __init__(self, job: ProduceJob, key_columns: tuple[str, ...]) -> None:
        self.job = job
        self.key_columns = key_columns

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Produce every row of the micro-batch; returns when Kafka acknowledged all of them.

        Raises:
            Exception: Spark's error for a failed task; a task fails with :class:`SinkError` when a
                message is refused or not acknowledged (the micro-batch is then not committed).
        """
        df.sparkSession.dataSource.register(KafkaWriteSource)
        options = replace(self.job, batch_id=batch_id).to_options()
        self.ordered(df).write.format(WRITE_FORMAT).mode("append").options(**options).save()

    def ordered(self, df: DataFrame) -> DataFrame:
        """With key columns: repartitioned by key, each partition sorted into commit order (module docstring)."""
        if not self.key_columns:
            return df
        from pyspark.sql import functions as F

        rank = F.coalesce(*[F.when(F.col("_change_type") == k, F.lit(r)) for k, r in CHANGE_RANK.items()], F.lit(9))
        keys = [F.col(k) for k in self.key_columns]
        return df.repartition(*keys).sortWithinPartitions(F.col("_commit_version"), *keys, rank)


class KafkaWriteSource(DataSource):
    """Internal data source behind :class:`KafkaBatchWriter`: hands each Spark partition to Kafka as Arrow."""

    @classmethod
    def name(cls) -> str:
        """The internal format name."""
        return WRITE_FORMAT

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """A :class:`KafkaArrowWriter` for the job in the options."""
        return KafkaArrowWriter(ProduceJob.from_options(self.options))


@dataclass
class Produced(WriterCommitMessage):
    """What one task produced: its message count."""

    messages: int


class KafkaArrowWriter(DataSourceArrowWriter):
    """Runs :func:`produce_partition` in each task (on executors)."""

    def __init__(self, job: ProduceJob) -> None:
        self.job = job

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Produce one partition; raises what :func:`produce_partition` raises."""
        return Produced(produce_partition(self.job, iterator))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Every task succeeded: log the total."""
        total = sum(m.messages for m in messages if isinstance(m, Produced))
        log.info("micro-batch %d: %d messages to topic %s", self.job.batch_id, total, self.job.topic)


def version_batches(batch: pa.RecordBatch) -> Iterator[ChangeBatch]:
    """The rows of ``batch`` grouped by ``_commit_version`` (in order of first appearance), as change batches.

    The positions are placeholders (index 0): Spark rows carry none.
    """
    versions = batch.column("_commit_version")
    for version in pc.unique(versions).to_pylist():
        rows = batch.filter(pc.equal(versions, pa.scalar(version, versions.type)))
        yield ChangeBatch(Position.change(int(version), 0), rows)


def produce_partition(job: ProduceJob, batches: Iterator[pa.RecordBatch]) -> int:
    """Produce the rows of one Spark partition (on an executor); returns the message count.

    Raises:
        SinkError: if Kafka cannot be reached, refuses a message, or does not acknowledge one.
    """
    options = KafkaOptions.from_uri(job.uri)
    keyed = bool(options.key_columns)
    encoder = ChangeEncoder(
        job.table,
        format=options.format,
        key_columns=options.key_columns,
        tombstones=options.tombstones,
        events=replace(options.events, positions=False),  # Spark rows come without their positions
    )
    try:
        producer = KafkaProducer(**options.producer_config())
    except KafkaError as e:
        where = ",".join(options.bootstrap)
        raise SinkError(f"cannot connect to Kafka at {where}: {e!r}", table=job.table.path) from e
    try:
        sender = _Sender(producer, job)
        for batch in batches:
            for changes in version_batches(batch):
                sender.send(changes, encoder.encode(changes), keyed=keyed)
        sender.wait((options.delivery_timeout_ms + options.request_timeout_ms) / 1000)
    finally:
        producer.close(timeout=options.open_timeout_ms / 1000)
    return sender.count


class _Sender:
    """Sends encoded messages with the sink's headers and partitioning; :meth:`wait` checks every ack."""

    def __init__(self, producer: Any, job: ProduceJob) -> None:
        self.job = job
        self.producer = producer
        self.topic = job.topic
        self.table_path = job.table.path
        self.headers = [("dt.table_id", job.table.table_id.encode()), ("dt.sink_id", job.sink_id.encode())]
        self.partitions = len(producer.partitions_for(job.topic) or ())
        self.futures: list[Any] = []
        self.count = 0

    def send(self, changes: ChangeBatch, encoded: EncodedBatch, *, keyed: bool) -> None:
        """Queue the messages of one commit's rows.

        Raises:
            SinkError: if the producer refuses a message (too large, not connected).
        """
        version = changes.start.version
        base = [*self.headers, ("dt.version", b"%d" % version), ("dt.spark_batch", b"%d" % self.job.batch_id)]
        chosen: Iterable[int | None] = (
            choose_partitions(encoded.keys, self.partitions) if keyed and self.partitions else itertools.repeat(None)
        )
        messages = zip(encoded.keys, encoded.values, encoded.change_types, chosen, strict=False)
        with collector_paused():
            for key, value, change_type, partition in messages:
                headers = [*base, ("dt.change_type", change_type.encode())]
                try:
                    future = self.producer.send(
                        self.topic, key=key if keyed else None, value=value, headers=headers, partition=partition
                    )
                except (KafkaError, ValueError, TypeError) as e:
                    raise SinkError(
                        f"cannot send a message of version {version} to topic {self.topic}: {e!r}",
                        table=self.table_path,
                    ) from e
                self.futures.append(future)
                self.count += 1

    def wait(self, timeout_s: float) -> None:
        """Wait for every acknowledgement.

        Raises:
            SinkError: naming the first message Kafka did not acknowledge.
        """
        with contextlib.suppress(KafkaTimeoutError):  # the futures tell which messages are missing
            self.producer.flush(timeout=timeout_s)
        for future in self.futures:
            if not future.is_done or future.exception is not None:
                why = "no acknowledgement in time" if not future.is_done else repr(future.exception)
                raise SinkError(f"Kafka did not take a message to topic {self.topic}: {why}", table=self.table_path)
