"""The tailer as a PySpark data source (:mod:`sinks.spark.source`), and a Kafka writer for Spark jobs.

A front end, like the command line: Spark drives it, and no class here implements the sink contract.
It sits under ``sinks/`` as the product's layout places it, the outermost layer: it imports ``tailer``
and nothing imports it.

``from deltatail.sinks.spark import register; register(spark)`` makes
``spark.readStream.format("deltatail")`` available.
"""

from deltatail.sinks.spark.source import DeltaTailBatchReader, DeltaTailDataSource, DeltaTailStreamReader, register

__all__ = ["DeltaTailBatchReader", "DeltaTailDataSource", "DeltaTailStreamReader", "register"]
