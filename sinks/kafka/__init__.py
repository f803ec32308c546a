"""The Kafka sink and everything only it uses: options, producers, partitions, message encodings.

A ``kafka://`` URI (:mod:`sinks.kafka.options`) becomes a :class:`~sinks.kafka.sink.KafkaSink`,
which encodes each change batch into message keys and values (:mod:`sinks.kafka.encoding`: the
``json`` format, or Debezium's envelope and flat row from :mod:`sinks.kafka.debezium`, with Kafka
Connect schemas from :mod:`sinks.kafka.connect_schema` and column texts from
:mod:`sinks.kafka.event_columns`), chooses each message's partition as Java clients do
(:mod:`sinks.kafka.partitioner`), sends through kafka-python or confluent-kafka
(:mod:`sinks.kafka.producers`) and, for exactly-once resume, reads what the topic already holds
(:mod:`sinks.kafka.tails`). The Spark Kafka writer (:mod:`sinks.spark.kafka_writer`) shares the
options, the encoder and the partitioner. JSON texts shared with the embedded sinks stay in
:mod:`sinks.json_text`. Options and guarantees: ``docs/kafka.md``.
"""
