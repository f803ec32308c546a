"""The Spark source's format table: each format it reads has an entry; a format without one is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from deltatail.sinks.spark.formats import SPARK_FORMATS, DeltaSpark, LanceSpark, spark_format
from deltatail.sinks.spark.options import SourceOptions
from deltatail.state.errors import ConfigError
from deltatail.tailer.formats.registry import format_names


def test_every_format_has_a_spark_entry_and_one_without_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sorted(SPARK_FORMATS) == list(format_names())
    assert isinstance(spark_format(SourceOptions(str(tmp_path), table_format="lance")), LanceSpark)
    assert isinstance(spark_format(SourceOptions(str(tmp_path))), DeltaSpark)  # no layout: Delta, the fallback
    monkeypatch.delitem(SPARK_FORMATS, "lance")
    with pytest.raises(ConfigError, match="does not read lance tables"):
        spark_format(SourceOptions(str(tmp_path), table_format="lance"))
