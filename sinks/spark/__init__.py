"""The tailer as a PySpark data source (:mod:`sinks.spark.source`), and a Kafka writer for Spark jobs.

``from sinks.spark import register; register(spark)`` makes ``spark.readStream.format("deltatail")`` available.
"""

from deltatail.sinks.spark.source import DeltaTailBatchReader, DeltaTailDataSource, DeltaTailStreamReader, register

__all__ = ["DeltaTailBatchReader", "DeltaTailDataSource", "DeltaTailStreamReader", "register"]
