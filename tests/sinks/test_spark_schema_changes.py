"""The Spark source across schema changes: widened types evolve, renames and drops stop with a way out.

A query's schema is fixed when it starts (the table's latest schema then). Rows of a version whose
types the query's schema widens (Delta type widening) are read cast up, as Delta reads old files;
a rename or a drop stops the query at the version, and the message's recipe (a batch read up to the
change, a new stream from it) reads every row. Readers are driven as Spark drives them (helpers of
``test_spark.py``); expected rows come from pyarrow reads of the files and deltalake reads.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # test_spark's reader helpers
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # schema_change_tables
from corpus import corpus_root
from schema_change_tables import CORPUS, log_actions
from test_spark import all_rows, run_batches, source, stream_reader

from deltatail.sinks.spark.schema import arrow_target
from deltatail.state.errors import SchemaChangeError


def added_files(table: Path, version: int) -> pa.Table:
    return pa.concat_tables(
        [pq.read_table(table / a["add"]["path"]) for a in log_actions(table, version) if "add" in a]
    )


@pytest.mark.parametrize("name", ["kernel-rs/type-widening", "delta-golden/type-widening-nested"])
def test_a_stream_reads_rows_of_narrower_versions_cast_to_the_widened_types(name: str) -> None:
    table = corpus_root() / CORPUS[name][0]
    reader = stream_reader(table, startingVersion=0)
    rows = all_rows(run_batches(reader, reader.initialOffset()), arrow_target(reader.schema))
    assert rows.column("_commit_version").to_pylist() == [0, 2]
    first, second = added_files(table, 0), added_files(table, 2)
    for column in first.column_names:
        wide = rows.schema.field(column).type
        assert rows.column(column)[0].as_py() == first.column(column).cast(wide)[0].as_py(), column
        assert rows.column(column)[1].as_py() == second.column(column).cast(wide)[0].as_py(), column


def test_a_rename_stops_the_stream_and_the_recipe_in_the_message_reads_every_row() -> None:
    table = corpus_root() / CORPUS["delta-rs/table_with_partitioning_mapping"][0]
    reader = stream_reader(table, startingVersion=0)
    with pytest.raises(SchemaChangeError, match=r"version 0\b") as failure:
        run_batches(reader, reader.initialOffset())
    message = str(failure.value)
    assert "'id' is not in the query's schema" in message and "endingVersion" in message
    assert "startingVersion=the version of the change" in message
    batch = source(table, startingVersion=0, endingVersion=2)  # before the rename (version 3): the old name
    old = batch.reader(batch.schema())
    old_rows = pa.Table.from_batches([b for p in old.partitions() for b in old.read(p)])
    assert old_rows.select(["id", "description"]).to_pylist() == [{"id": 1, "description": "Initial data"}]
    after = stream_reader(table, startingVersion=3)
    new_rows = all_rows(run_batches(after, after.initialOffset()), arrow_target(after.schema))
    assert new_rows.select(["newid", "description"]).to_pylist() == [{"newid": 2, "description": "Additional data"}]


def test_a_drop_stops_the_stream_at_its_version() -> None:
    table = corpus_root() / CORPUS["dat/with_schema_change"][0]
    reader = stream_reader(table, startingVersion=0)
    with pytest.raises(SchemaChangeError, match=r"'letter' is not in the query's schema.*version 0"):
        run_batches(reader, reader.initialOffset())
