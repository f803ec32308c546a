"""The seven variant tables of the corpus, read end to end: change rows as Spark reads the same files.

How the expectations were established (nothing here is computed by deltatail):

- **Rows**: ``tests/expectations/variant_expectations.json``, written by
  ``generate_variant_expectations.py`` with Apache Spark 4.3 (pyspark, local mode, UTC): every data file
  on disk read with the table's schema from the log, every variant rendered with Spark's ``to_json``.
  Per file it records the row count, a SHA-256 over all rows (one JSON line each, sorted keys) and the
  first rows in full; per version the ``add`` actions in log order with their ``numRecords``. Each
  version's change rows must be exactly its files' rows, file by file in log order.
- **Bytes** of the one table deltalake 1.6.6 reads (``kernel-rs/unshredded-variant``; it refuses
  ``variantShredding-preview``): its DataFusion scan gives the same variant ``metadata``/``value`` bytes
  as deltatail's initial snapshot, row for row.
- **Live files** of every version: ``snapshot_expectations.json`` (deltalake's ``get_add_actions``),
  checked by ``test_conformance.py``.
- ``delta-kernel-java/spark-variant-stable-feature-checkpoint`` logs files named
  ``test%file%prefix-part-...`` that are not on disk (the files lack the prefix, MANIFEST.md): reading
  its rows is a :class:`MissingFileError` naming the logged file, never a guess at another name.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_root
from damage import run_cli
from deltalake import DeltaTable, QueryBuilder

from deltatail.sinks.embedded import encode_jsonl
from deltatail.sinks.json_text import VECTOR_ROWS, column_texts
from deltatail.sinks.kafka.connect_schema import DEBEZIUM_JSON
from deltatail.sinks.kafka.debezium import EventOptions
from deltatail.sinks.kafka.encoding import ChangeEncoder
from deltatail.state.errors import MissingFileError
from deltatail.state.feed import CHANGE_COLUMNS, ChangeBatch, TableInfo
from deltatail.state.schema import ArrayType, DataType, MapType, StructType, is_variant
from deltatail.state.variant import VARIANT_STORAGE_TYPE, is_variant_type, variant_to_json
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions

EXPECTATIONS = Path(__file__).resolve().parents[1] / "expectations" / "variant_expectations.json"
MISSING_FILES = "delta-kernel-java/spark-variant-stable-feature-checkpoint"


@cache
def expectations() -> dict[str, Any]:
    with EXPECTATIONS.open(encoding="utf-8") as f:
        tables: dict[str, Any] = json.load(f)["tables"]
    return tables


def readable_tables() -> list[str]:
    return [name for name in expectations() if name != MISSING_FILES]


# -- rows as the generator wrote Spark's ---------------------------------------------------------------


def _values(array: pa.Array, dtype: DataType) -> list[Any]:
    """Python values of a deltatail column, variants as their JSON text (as Spark's ``to_json``), maps as dicts."""
    valid = array.is_valid().to_pylist()
    if is_variant(dtype):
        assert is_variant_type(array.type), f"a variant column arrived as {array.type}"
        pairs = zip(array.field("metadata").to_pylist(), array.field("value").to_pylist(), strict=True)
        return [variant_to_json(m, v) if ok else None for ok, (m, v) in zip(valid, pairs, strict=True)]
    if isinstance(dtype, StructType):
        children = [_values(array.field(f.name), f.type) for f in dtype.fields]
        return [
            {f.name: c[i] for f, c in zip(dtype.fields, children, strict=True)} if ok else None
            for i, ok in enumerate(valid)
        ]
    if isinstance(dtype, ArrayType | MapType):
        offsets = array.offsets.to_pylist()
        if isinstance(dtype, ArrayType):
            items = _values(array.values, dtype.element_type)
            return [items[offsets[i] : offsets[i + 1]] if ok else None for i, ok in enumerate(valid)]
        keys, values = _values(array.keys, dtype.key_type), _values(array.items, dtype.value_type)
        spans = [slice(offsets[i], offsets[i + 1]) for i in range(len(array))]
        return [dict(zip(keys[s], values[s], strict=True)) if ok else None for s, ok in zip(spans, valid, strict=True)]
    return list(array.to_pylist())


def _rows(table: pa.Table, schema: StructType) -> list[dict[str, Any]]:
    table = table.combine_chunks()
    columns = {f.name: _values(table.column(f.name).chunk(0), f.type) for f in schema.fields}
    return [{name: values[i] for name, values in columns.items()} for i in range(table.num_rows)]


def _line(row: dict[str, Any]) -> str:
    """One row as the generator hashed it."""
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)


def _version_rows(root: Path, version: int, options: ChangeOptions) -> tuple[pa.Table, StructType]:
    feed = ChangeFeed(str(root), options=options)
    batches = [b.rows for b in feed.batches(version, version)]
    schema = feed.log.snapshot(version).schema
    arrow = pa.Table.from_batches(batches) if batches else pa.table({})
    return arrow, schema


# -- change rows against Spark ---------------------------------------------------------------------------


@pytest.mark.parametrize("processes", [0, 2], ids=["in-process", "reader-processes"])
@pytest.mark.parametrize("table", readable_tables())
def test_change_rows_are_the_files_rows_as_spark_reads_them(table: str, processes: int) -> None:
    root = corpus_root() / table
    record = expectations()[table]
    checked = 0
    for v_str, adds in record["adds"].items():
        version = int(v_str)
        rows, schema = _version_rows(root, version, ChangeOptions(reader_processes=processes))
        assert rows.num_rows == sum(a["numRecords"] for a in adds), f"v{version}: row count"
        if not adds:
            continue
        assert set(rows.column("_change_type").to_pylist()) == {"insert"}
        assert set(rows.column("_commit_version").to_pylist()) == {version}
        for f in schema.fields:
            assert rows.schema.field(f.name).type == schema.to_arrow().field(f.name).type
        lines = [_line(r) for r in _rows(rows, schema)]
        start = 0
        for add in adds:  # the rows of each added file, in log order
            want = record["files"][Path(add["path"]).name]
            part = lines[start : start + add["numRecords"]]
            start += add["numRecords"]
            head = [json.loads(line) for line in part[: len(want["head"])]]
            assert head == want["head"], f"v{version} {add['path']}: first rows differ from Spark's"
            digest = hashlib.sha256("\n".join(part).encode("utf-8")).hexdigest()
            assert digest == want["sha256"], f"v{version} {add['path']}: rows differ from Spark's"
            checked += 1
    assert checked == sum(len(a) for a in record["adds"].values())


def test_unshredded_variant_bytes_equal_deltalakes_scan() -> None:
    root = corpus_root() / "kernel-rs/unshredded-variant"
    feed = ChangeFeed(str(root), options=ChangeOptions(reader_processes=0))
    ours = pa.Table.from_batches([b.rows for b in feed.batches(2, 2, initial_snapshot=True) if b.start.snapshot])
    ours = ours.drop_columns(list(CHANGE_COLUMNS)).sort_by("id")
    result = QueryBuilder().register("t", DeltaTable(str(root))).execute("select * from t order by id")
    theirs = pa.table(result.read_all())
    assert ours.num_rows == theirs.num_rows == 102
    assert ours.column_names == theirs.column_names
    for name in ours.column_names:
        assert ours.column(name).to_pylist() == theirs.column(name).to_pylist(), name


def test_missing_data_files_are_named_not_guessed() -> None:
    root = corpus_root() / MISSING_FILES
    first = expectations()[MISSING_FILES]["adds"]["0"][0]
    assert not first["on_disk"] and (root / first["path"].replace("test%file%prefix-", "")).is_file()
    feed = ChangeFeed(str(root), options=ChangeOptions(reader_processes=0))
    with pytest.raises(MissingFileError) as caught:
        list(feed.batches(0))
    assert caught.value.file == f"{root}/{first['path']}"
    assert caught.value.version == 0
    outcome = run_cli(["changes", str(root)])
    assert outcome.code == 1 and outcome.escaped is None
    err = outcome.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("deltatail: error: ") and first["path"] in err[0]


# -- outputs ---------------------------------------------------------------------------------------------


def _numbers_kept(text: str | bytes) -> Any:
    """JSON parsed with every number kept as its text (``1.0`` and ``1`` stay different)."""
    return json.loads(text, parse_float=lambda s: ("float", s), parse_int=lambda s: ("int", s))


def _spark_heads(table: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(version, Spark's head row) for the first rows of each version's first file."""
    record = expectations()[table]
    for v_str, adds in record["adds"].items():
        if adds:
            for row in record["files"][Path(adds[0]["path"]).name]["head"]:
                yield int(v_str), row


def _embedded(value: Any, dtype: DataType) -> Any:
    """Spark's row value with each variant's JSON text parsed: what a JSON line holds."""
    if value is None:
        return None
    if is_variant(dtype):
        return _numbers_kept(value)
    if isinstance(dtype, StructType):
        return {f.name: _embedded(value[f.name], f.type) for f in dtype.fields}
    if isinstance(dtype, ArrayType):
        return [_embedded(v, dtype.element_type) for v in value]
    if isinstance(dtype, MapType):
        return {k: _embedded(v, dtype.value_type) for k, v in value.items()}
    return _numbers_kept(json.dumps(value))


@pytest.mark.parametrize("table", readable_tables())
def test_json_lines_embed_each_variant_as_spark_writes_it(table: str) -> None:
    root = corpus_root() / table
    feed = ChangeFeed(str(root), options=ChangeOptions(reader_processes=0))
    heads = list(_spark_heads(table))
    for version in sorted({v for v, _ in heads}):
        want = [row for v, row in heads if v == version]
        schema = feed.log.snapshot(version).schema
        lines: list[bytes] = []
        for batch in feed.batches(version, version):
            lines += encode_jsonl(batch).splitlines()
        for got_line, spark_row in zip(lines, want, strict=False):
            got = _numbers_kept(got_line)
            expected = {f.name: _embedded(spark_row[f.name], f.type) for f in schema.fields}
            assert {k: got[k] for k in expected} == expected


def test_json_lines_of_a_long_batch_equal_the_row_path() -> None:
    """A file's 50 rows in one batch take the column-wise path: the same bytes as the row-by-row path."""
    root = corpus_root() / "kernel-rs/unshredded-variant"
    whole = next(iter(ChangeFeed(str(root), options=ChangeOptions(reader_processes=0)).batches(0, 0)))
    batch = ChangeBatch(whole.start, whole.rows.select(["id", "v", *CHANGE_COLUMNS]))  # lists and maps go row-wise
    assert len(batch) >= VECTOR_ROWS and column_texts(batch.rows) is not None
    column_wise = encode_jsonl(batch)
    row_wise = b"".join(encode_jsonl(ChangeBatch(batch.position(i), batch.rows.slice(i, 1))) for i in range(len(batch)))
    assert column_wise == row_wise


def test_kafka_formats_carry_variants() -> None:
    """``json``: the value embedded; ``debezium``/``flat``: a string of it, typed ``io.debezium.data.Json``."""
    root = corpus_root() / "delta-spark/variant-stats-no-checkpoint"
    [batch] = list(ChangeFeed(str(root), options=ChangeOptions(reader_processes=0)).batches(1, 1))
    spark = expectations()["delta-spark/variant-stats-no-checkpoint"]["files"]
    [head] = [f["head"][0] for f in spark.values()]
    info = TableInfo(str(root), "id", "variant-stats")
    [value, *_] = ChangeEncoder(info, format="json").encode(batch).values
    assert value is not None
    assert _numbers_kept(value)["v"] == _numbers_kept(head["v"])
    assert _numbers_kept(value)["nv"] == {"v": _numbers_kept(head["nv"]["v"])}
    for fmt in ("debezium", "flat"):
        encoder = ChangeEncoder(info, format=fmt, events=EventOptions(schemas=True), clock_ms=lambda: 0)
        [message, *_] = encoder.encode(batch).values
        assert message is not None
        event = orjson.loads(message)
        row = event["payload"]["after"] if fmt == "debezium" else event["payload"]
        assert row["v"] == head["v"] and row["nv"] == {"v": head["nv"]["v"]}
        fields = event["schema"]["fields"]
        if fmt == "debezium":
            fields = next(f for f in fields if f["field"] == "after")["fields"]
        v = next(f for f in fields if f["field"] == "v")
        nv = next(f for f in fields if f["field"] == "nv")
        assert (v["type"], v["name"]) == ("string", DEBEZIUM_JSON)
        assert [(f["field"], f["type"], f["name"]) for f in nv["fields"]] == [("v", "string", DEBEZIUM_JSON)]


def test_parquet_output_holds_the_variant_bytes(tmp_path: Path) -> None:
    root = corpus_root() / "delta-spark/variant-stats-nested-no-checkpoint"
    out = tmp_path / "rows.parquet"
    outcome = run_cli(["changes", str(root), "--output", str(out)])
    assert outcome.code == 0, outcome.stderr
    table = pq.read_table(out)
    variant = table.schema.field("s").type.field("v").type
    assert variant == VARIANT_STORAGE_TYPE and is_variant_type(variant)  # the marker survives the file
    texts = [variant_to_json(s["v"]["metadata"], s["v"]["value"]) for s in table.column("s").to_pylist()]
    spark = expectations()["delta-spark/variant-stats-nested-no-checkpoint"]["files"]
    want = [row["s"]["v"] for f in spark.values() for row in f["head"]]
    assert sorted(texts) == sorted(want)


@pytest.mark.slow
def test_cli_changes_prints_variants_as_json() -> None:
    root = corpus_root() / "delta-spark/variant-stats-state-reconstruction"
    done = subprocess.run(
        [sys.executable, "-m", "deltatail", "changes", str(root)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert json.loads(line)["v"] == 0  # Spark: to_json gives "0"
