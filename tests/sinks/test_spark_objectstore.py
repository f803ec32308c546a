"""The Spark source over an object store: ``readStream.format("deltatail").load("s3://...")`` against moto.

One local Spark session (``local[2]``: a driver that plans, and Python workers that read partitions
as executors do, through the ``storage.*`` options the query carries). The oracle is the standalone
:class:`~tailer.read.feed.ChangeFeed` over the same S3 table (the ``deltatail changes`` output),
compared over every column, ``_commit_timestamp`` included (both read the same objects' times), and
deltalake's ``load_cdf`` on the same store. The checkpoint location, which holds Spark's offsets,
must never hold the secret given as a ``storage.*`` option.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

pytest.importorskip("pyspark")
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import DataFrame, SparkSession

from deltatail.sinks.spark import register
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.storage.objectstore import ObjectStoreStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # cdf_helpers (tests/ is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: objectstores.py
from cdf_helpers import assert_same_rows
from objectstores import Cloud

pytest_plugins = ("objectstore_fixtures",)

CDF = {"delta.enableChangeDataFeed": "true"}
SECRET = "Sup3r-Secret-Value-0xC0FFEE"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The tests' local Spark session (the same one ``test_spark.py`` makes, if it is running already)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Spark needs Java: no java on PATH and no JAVA_HOME")
    shared = SparkSession.getActiveSession()  # test_spark.py's, when the whole suite runs: not stopped here
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors must import deltatail from this venv
    session = (
        SparkSession.builder.master("local[2]")
        .appName("deltatail-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    if shared is None:
        session.stop()


def ids(values: list[int], part: str) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(values, pa.int64()),
            "v": pa.array([f"x{i}" for i in values]),
            "p": pa.array([part] * len(values)),
        }
    )


def storage_options(cloud: Cloud) -> dict[str, str]:
    """The source's ``storage.*`` options; the secret key is one moto accepts."""
    return {f"storage.{k.lower()}": v for k, v in {**cloud.options, "AWS_SECRET_ACCESS_KEY": SECRET}.items()}


@pytest.mark.slow
def test_spark_stream_from_s3_equals_the_standalone_feed(spark: SparkSession, s3: Cloud, tmp_path: Path) -> None:
    uri = s3.uri("spark")
    w = s3.writer_options
    data = pa.concat_tables([ids([0, 1], "a"), ids([2, 3], "b"), ids([4, 5], "c")])
    write_deltalake(uri, data, storage_options=w, partition_by=["p"], configuration=CDF)
    stream = spark.readStream.format("deltatail").option("startingVersion", 0).options(**storage_options(s3)).load(uri)
    checkpoint = tmp_path / "ck"
    query = stream.writeStream.format("memory").queryName("s3feed").option("checkpointLocation", str(checkpoint))
    running = query.start()
    try:
        running.processAllAvailable()
        write_deltalake(uri, ids([6, 7], "a"), storage_options=w, mode="append")
        DeltaTable(uri, storage_options=w).update({"v": "'changed'"}, predicate="id = 2")
        running.processAllAvailable()
        DeltaTable(uri, storage_options=w).delete("id = 4")
        (
            DeltaTable(uri, storage_options=w)
            .merge(ids([1, 9], "a"), "s.id = t.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        running.processAllAvailable()
        progress = json.dumps(running.recentProgress, default=str)
    finally:
        running.stop()
    got: pa.Table = spark.table("s3feed").toArrow()

    standalone = ChangeFeed(uri, ObjectStoreStorage(s3.options), ChangeOptions(reader_processes=0)).read_table(0)
    assert got.num_rows == standalone.num_rows > 0
    assert_same_rows(got, standalone, drop=())
    assert_same_rows(got, pa.table(DeltaTable(uri, storage_options=w).load_cdf(starting_version=0).read_all()))

    assert SECRET not in progress
    files = [p for p in checkpoint.rglob("*") if p.is_file()]
    assert any("offsets" in p.parts for p in files)
    for path in files:
        assert SECRET.encode() not in path.read_bytes(), f"the secret is in {path}"


@pytest.mark.slow
def test_spark_batch_read_from_s3_equals_the_standalone_feed(spark: SparkSession, s3: Cloud) -> None:
    uri = s3.uri("sparkbatch")
    w = s3.writer_options
    write_deltalake(uri, ids([0, 1, 2], "a"), storage_options=w, partition_by=["p"], configuration=CDF)
    write_deltalake(uri, ids([3], "b"), storage_options=w, mode="append")
    DeltaTable(uri, storage_options=w).delete("id = 1")
    df: DataFrame = (
        spark.read.format("deltatail")
        .option("startingVersion", 1)
        .option("endingVersion", 2)
        .options(**storage_options(s3))
        .load(uri)
    )
    standalone = ChangeFeed(uri, ObjectStoreStorage(s3.options), ChangeOptions(reader_processes=0)).read_table(1, 2)
    assert_same_rows(df.toArrow(), standalone, drop=())
