"""The Spark source on an Iceberg table: refused with a clear error (not read yet), for every entry point."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest

from sinks.spark.formats import IcebergSpark, spark_format
from sinks.spark.options import SourceOptions
from state.errors import ConfigError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # tests/tailer: iceberg_tables.py
from iceberg_tables import new_table, rows, table_dir


def test_the_spark_source_refuses_iceberg_tables(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1]))
    options = SourceOptions(table_dir(t))
    found = spark_format(options)
    assert isinstance(found, IcebergSpark)
    for call in (
        lambda: found.schema(options, None),
        lambda: found.planner(options, pa.schema([]), None),
        lambda: found.batch_partitions(options, pa.schema([]), None),
    ):
        with pytest.raises(ConfigError, match="does not read Iceberg tables yet") as e:
            call()
        assert e.value.table == table_dir(t)
