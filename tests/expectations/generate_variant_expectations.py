"""Generate ``variant_expectations.json``: what the seven variant tables of the corpus hold, as Spark reads them.

Run from the repository root (about a minute; pyspark needs Java 17 or later, and the committed file
was made on JDK 25: Java's ``Double.toString`` prints the shortest round-trip digits only from JDK 19
on, so on JDK 17 a few doubles, such as 2e23, print longer)::

    JAVA_HOME=/usr/lib/jvm/temurin-25-jdk-amd64 .venv/bin/python tests/expectations/generate_variant_expectations.py

Nothing here imports deltatail. The values come from **Apache Spark 4.3** (pyspark, local mode), whose
own Variant code decodes the Parquet variant encoding and reconstructs shredded columns: every data
file on disk is read with ``spark.read.schema(<the table schema from the log>).parquet(<file>)`` and
each variant is rendered with ``to_json(v)`` in the UTC session time zone (``cast(v AS STRING)``
differs: it gives a string variant's bare text and a timestamp without its offset). Spark has no
Delta jars offline, so it reads the data files, not the tables; which files each version holds comes
from the log, read here with :mod:`json` (paths percent-decoded once, as the protocol says), with
each file's ``numRecords`` from its stats.

For every table the file records: the reader features; the ``add`` actions per version (decoded
path, ``numRecords``, whether the file is on disk); and per data file on disk its row count, a
SHA-256 over all rows (each row a JSON line with sorted keys, since pyspark hands maps over in hash
order: non-variant columns as Spark returns them, variants as
their JSON text, maps as objects) and the first rows in full.

It also records Spark's JSON text (or Spark's error) for hand-built variants: bytes written here one
by one from the Parquet VariantEncoding.md (``vectors``), every primitive type and container shape,
and a few malformed ones; and Spark's JSON text of the rows of small shredded Parquet files that
Spark itself writes here (``shredded``, files in ``variant_shredded/``): every shredding shape.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parents[2] / "shared" / "delta-tables"
OUT = HERE / "variant_expectations.json"
HEAD_ROWS = 12

TABLES = [
    "kernel-rs/unshredded-variant",
    "delta-spark/variant-stats-no-checkpoint",
    "delta-spark/variant-stats-nested-no-checkpoint",
    "delta-spark/variant-stats-with-struct-no-checkpoint",
    "delta-spark/variant-stats-state-reconstruction",
    "delta-kernel-java/spark-shredded-variant-preview-delta",
    "delta-kernel-java/spark-variant-stable-feature-checkpoint",
]


def _contains_variant(dtype: Any) -> bool:
    if dtype == "variant":
        return True
    if isinstance(dtype, dict):
        kind = dtype.get("type")
        if kind == "struct":
            return any(_contains_variant(f["type"]) for f in dtype["fields"])
        if kind == "array":
            return _contains_variant(dtype["elementType"])
        if kind == "map":
            return _contains_variant(dtype["valueType"]) or _contains_variant(dtype["keyType"])
    return False


def _render(expr: str, dtype: Any, depth: int = 0) -> str:
    """A Spark SQL expression that turns every variant inside ``expr`` into its JSON text."""
    if not _contains_variant(dtype):
        return expr
    if dtype == "variant":
        return f"to_json({expr})"
    kind = dtype["type"]
    var = f"x{depth}"
    if kind == "struct":
        parts = ", ".join(
            "'{}', {}".format(f["name"], _render("{}.`{}`".format(expr, f["name"]), f["type"], depth + 1))
            for f in dtype["fields"]
        )
        return f"if({expr} is null, null, named_struct({parts}))"
    if kind == "array":
        return f"transform({expr}, {var} -> {_render(var, dtype['elementType'], depth + 1)})"
    return f"transform_values({expr}, (k{depth}, {var}) -> {_render(var, dtype['valueType'], depth + 1)})"


def _log(table: Path) -> tuple[dict[str, Any], dict[str, Any], dict[int, list[dict[str, Any]]]]:
    """(last metaData, last protocol, version -> add facts) from the JSON commits."""
    metadata: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    adds: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((table / "_delta_log").glob("*.json")):
        if not path.name[:20].isdigit():
            continue
        version = int(path.name[:20])
        adds[version] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "metaData" in action:
                metadata = action["metaData"]
            if "protocol" in action:
                protocol = action["protocol"]
            if "add" in action:
                add = action["add"]
                decoded = unquote(add["path"])
                stats = json.loads(add["stats"]) if add.get("stats") else {}
                adds[version].append(
                    {
                        "path": decoded,
                        "numRecords": stats.get("numRecords"),
                        "on_disk": (table / decoded).is_file(),
                    }
                )
    return metadata, protocol, adds


# -- hand-built variants, byte by byte from VariantEncoding.md ----------------------------------------
#
# Header byte of a value: basic_type in bits 0-1, the 6-bit value_header above. Primitive: type id << 2.
# Short string: length << 2 | 1. Object: (is_large << 4 | (id_size - 1) << 2 | (offset_size - 1)) << 2 | 2.
# Array: (is_large << 2 | (offset_size - 1)) << 2 | 3. Metadata: header (version 1 | sorted << 4 |
# (offset_size - 1) << 6), dictionary size, size + 1 offsets, the UTF-8 strings.

EMPTY_METADATA = bytes([0x01, 0x00, 0x00])


def _meta(*names: str, sorted_strings: bool = False) -> bytes:
    raw = [n.encode("utf-8") for n in names]
    offsets = [0]
    for r in raw:
        offsets.append(offsets[-1] + len(r))
    return bytes([0x01 | (0x10 if sorted_strings else 0), len(raw), *offsets]) + b"".join(raw)


def _prim(type_id: int, payload: bytes = b"") -> bytes:
    return bytes([type_id << 2]) + payload


def _le(n: int, size: int) -> bytes:
    return n.to_bytes(size, "little", signed=True)


def _obj(ids: list[int], values: list[bytes]) -> bytes:
    """1-byte ids and offsets, fields laid out in the order given (ids must already be in name order)."""
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v))
    return bytes([0x02, len(ids), *ids, *offsets]) + b"".join(values)


def _arr(values: list[bytes]) -> bytes:
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v))
    return bytes([0x03, len(values), *offsets]) + b"".join(values)


def _short(text: str) -> bytes:
    raw = text.encode("utf-8")
    return bytes([len(raw) << 2 | 1]) + raw


def _long_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return _prim(16, len(raw).to_bytes(4, "little") + raw)


def _double(x: float) -> bytes:
    import struct

    return _prim(7, struct.pack("<d", x))


def _float(x: float) -> bytes:
    import struct

    return _prim(14, struct.pack("<f", x))


def _large_object() -> tuple[bytes, bytes]:
    """300 fields k000..k299 = their index: is_large, 2-byte field ids and 2-byte offsets."""
    names = [f"k{i:03d}" for i in range(300)]
    raw = [n.encode() for n in names]
    offsets = [0]
    for r in raw:
        offsets.append(offsets[-1] + len(r))
    metadata = bytes([0x01 | 1 << 6]) + (300).to_bytes(2, "little")
    metadata += b"".join(o.to_bytes(2, "little") for o in offsets) + b"".join(raw)
    values = [_prim(5, _le(i, 4)) for i in range(300)]
    data_offsets = [0]
    for v in values:
        data_offsets.append(data_offsets[-1] + len(v))
    header = ((1 << 4 | 1 << 2 | 1) << 2) | 2
    value = bytes([header]) + (300).to_bytes(4, "little")
    value += b"".join(i.to_bytes(2, "little") for i in range(300))
    value += b"".join(o.to_bytes(2, "little") for o in data_offsets) + b"".join(values)
    return metadata, value


def vectors() -> list[tuple[str, bytes, bytes]]:
    """(name, metadata, value) of every hand-built variant."""
    e = EMPTY_METADATA
    large_meta, large_value = _large_object()
    return [
        ("null", e, _prim(0)),
        ("true", e, _prim(1)),
        ("false", e, _prim(2)),
        ("int8 127", e, _prim(3, _le(127, 1))),
        ("int8 -128", e, _prim(3, _le(-128, 1))),
        ("int16 -300", e, _prim(4, _le(-300, 2))),
        ("int32 70000", e, _prim(5, _le(70000, 4))),
        ("int64 max", e, _prim(6, _le(2**63 - 1, 8))),
        ("int64 min", e, _prim(6, _le(-(2**63), 8))),
        ("double 1.0", e, _double(1.0)),
        ("double 0.1", e, _double(0.1)),
        ("double 100", e, _double(100.0)),
        ("double 1e7", e, _double(1e7)),
        ("double 9999999.5", e, _double(9999999.5)),
        ("double 0.001", e, _double(0.001)),
        ("double 0.0001", e, _double(0.0001)),
        ("double -1.5e-10", e, _double(-1.5e-10)),
        ("double 123456789.125", e, _double(123456789.125)),
        ("double 1/3", e, _double(1 / 3)),
        ("double 2e23", e, _double(2e23)),
        ("double max", e, _double(1.7976931348623157e308)),
        ("double min subnormal", e, _double(5e-324)),
        ("double -0.0", e, _double(-0.0)),
        ("double NaN", e, _double(float("nan"))),
        ("double Infinity", e, _double(float("inf"))),
        ("double -Infinity", e, _double(float("-inf"))),
        ("float 1.1", e, _float(1.1)),
        ("float 0.1", e, _float(0.1)),
        ("float 16777216", e, _float(16777216.0)),
        ("float max", e, _float(3.4028234663852886e38)),
        ("float min subnormal", e, _float(1.401298464324817e-45)),
        ("float NaN", e, _float(float("nan"))),
        ("float -Infinity", e, _float(float("-inf"))),
        ("decimal4 12.50", e, _prim(8, bytes([2]) + _le(1250, 4))),
        ("decimal4 100", e, _prim(8, bytes([0]) + _le(100, 4))),
        ("decimal4 0.00", e, _prim(8, bytes([2]) + _le(0, 4))),
        ("decimal8 -0.001", e, _prim(9, bytes([3]) + _le(-1, 8))),
        ("decimal8 1234567890.12345678", e, _prim(9, bytes([8]) + _le(123456789012345678, 8))),
        ("decimal16 big", e, _prim(10, bytes([9]) + _le(12345678901234567890123456789, 16))),
        ("date 1970-01-01", e, _prim(11, _le(0, 4))),
        ("date 2024-02-29", e, _prim(11, _le(19782, 4))),
        ("date 0001-01-01", e, _prim(11, _le(-719162, 4))),
        ("date 10000-01-01", e, _prim(11, _le(2932897, 4))),
        ("timestamp epoch", e, _prim(12, _le(0, 8))),
        ("timestamp 2024-02-29 13:45:00.5", e, _prim(12, _le(1709214300500000, 8))),
        ("timestamp -1us", e, _prim(12, _le(-1, 8))),
        ("timestamp 123456us", e, _prim(12, _le(1_000_000 + 123456, 8))),
        ("timestamp_ntz 2024-02-29 13:45:00.5", e, _prim(13, _le(1709214300500000, 8))),
        ("timestamp_ntz 1900-01-01", e, _prim(13, _le(-2208988800000000, 8))),
        ("binary", e, _prim(15, (5).to_bytes(4, "little") + b"\x00\xffabc")),
        ("malformed: binary length past the end", e, _prim(15, (5).to_bytes(4, "little") + b"\x00\xffab")),
        ("malformed: object field id beyond the dictionary", _meta("a"), _obj([1], [_prim(1)])),
        ("malformed: metadata version 2", bytes([0x02, 0x00, 0x00]), _prim(1)),
        ("malformed: unknown primitive type 31", e, _prim(31)),
        ("malformed: decimal4 beyond 9 digits", e, _prim(8, bytes([0]) + _le(10**9, 4))),
        ("malformed: array offset past its data", e, bytes([0x03, 1, 5, 1]) + _prim(1)),
        ("binary empty", e, _prim(15, (0).to_bytes(4, "little"))),
        ("string long form", e, _long_string("hello")),
        ("string escapes", e, _long_string('a"b\\c\n\t\x01\x1f\x7f/é😀\u2028')),
        ("string 70 bytes", e, _long_string("x" * 70)),
        ("short string empty", e, _short("")),
        ("short string 63 bytes", e, _short("y" * 63)),
        ("short string unicode", e, _short("Grüße")),
        ("uuid", e, _prim(20, bytes(range(0x10, 0x20)))),
        ("time 13:45:00.5", e, _prim(17, _le(49500500000, 8))),
        ("timestamp nanos", e, _prim(18, _le(1709214300123456789, 8))),
        ("timestamp_ntz nanos", e, _prim(19, _le(1709214300000000001, 8))),
        ("empty object", e, bytes([0x02, 0x00, 0x00])),
        ("empty array", e, bytes([0x03, 0x00, 0x00])),
        (
            "object a b",
            _meta("a", "b", sorted_strings=True),
            _obj([0, 1], [_prim(3, _le(1, 1)), _arr([_prim(1), _prim(0)])]),
        ),
        (
            "object stored out of value order",
            _meta("c", "b", "a"),
            # ids in name order: a (2), b (1), c (0); values laid out c, b, a
            bytes([0x02, 3, 2, 1, 0, 4, 2, 0, 6]) + _prim(3, _le(3, 1)) + _prim(3, _le(2, 1)) + _prim(3, _le(1, 1)),
        ),
        ("nested", _meta("k", "list"), _obj([1, 0], [_arr([_obj([0], [_short("v")]), _double(2.5)]), _prim(0)])),
        ("key needing escape", _meta('q"\n'), _obj([0], [_prim(1)])),
        ("large object", large_meta, large_value),
    ]


def spark_vectors(spark: Any, tmp: Path) -> list[dict[str, Any]]:
    """Spark's JSON text of every hand-built vector (or its error, for types Spark does not decode)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    results = []
    for i, (name, metadata, value) in enumerate(vectors()):
        path = tmp / f"vector-{i}.parquet"
        column = pa.StructArray.from_arrays(
            [pa.array([metadata], pa.binary()), pa.array([value], pa.binary())], names=["metadata", "value"]
        )
        pq.write_table(pa.table({"v": column}), path)
        entry: dict[str, Any] = {"name": name, "metadata": metadata.hex(), "value": value.hex()}
        try:
            [row] = spark.read.schema("v variant").parquet(str(path)).selectExpr("to_json(v) as j").collect()
            entry["spark_json"] = row["j"]
        except Exception as e:  # Spark refuses types it does not know: recorded, not fatal
            entry["spark_error"] = str(e).splitlines()[0][:200]
        results.append(entry)
    return results


# -- shredded files written by Spark ------------------------------------------------------------------
#
# Spark shreds variants when writing Parquet with spark.sql.variant.writeShredding.enabled; its
# test-only spark.sql.variant.forceShreddingSchemaForTest fixes the typed_value schema, so that every
# shredding shape can be made: objects (fully and partly shredded, fields of the wrong type), arrays,
# primitives of every type, nesting. Each case is (name, shredding schema, SQL rows of (id, v)).

SHREDDED_DIR = HERE / "variant_shredded"

_OBJECT_ROWS = [
    """{"a":1,"b":"hi","c":1.5,"d":[1.5,2,"x"],"z":true}""",
    """{"a":"no","b":null}""",
    """[1,2]""",
    """12""",
    """null""",
    """{}""",
    """{"a":2147483648,"d":[]}""",
    """{"c":1.55,"e":{"f":[1]}}""",
]

SHREDDED_CASES: list[tuple[str, str, str]] = [
    (
        "object",
        "a int, b string, c decimal(15, 1), d array<double>",
        "select id, parse_json(j) as v from values "
        + ", ".join(f"({i}, '{row}')" for i, row in enumerate(_OBJECT_ROWS))
        + f", ({len(_OBJECT_ROWS)}, null) as t(id, j)",
    ),
    (
        "array",
        "array<string>",
        """select id, parse_json(j) as v from values (0, '["a",null,"b",3]'), (1, '{"x":1}'), (2, '[]'),
           (3, null), (4, '[["nested"]]') as t(id, j)""",
    ),
    (
        "primitives",
        "e struct<x: timestamp, y: date>, f boolean, g binary, h timestamp_ntz, i float, k tinyint, l smallint, "
        "m decimal(30, 2), n decimal(5, 2), o double, p bigint, q string",
        """select 0 as id, to_variant_object(named_struct('e', named_struct('x', timestamp'2024-02-29 13:45:00.5',
           'y', date'2024-02-29'), 'f', true, 'g', X'00FF61', 'h', timestamp_ntz'2024-01-01 00:00:00',
           'i', cast(1.1 as float), 'k', cast(-5 as tinyint), 'l', cast(300 as smallint),
           'm', cast(123456789012345678901.25 as decimal(30,2)), 'n', cast(1.50 as decimal(5,2)),
           'o', cast(1e300 as double), 'p', cast(-9 as bigint), 'q', repeat('long string ', 8))) as v
           union all select 1, parse_json('{"e":{"x":"not a timestamp"},"f":"yes","k":1000,"o":1}')
           union all select 2, to_variant_object(named_struct('e',
           named_struct('x', timestamp'1969-12-31 23:59:59.999999', 'y', date'0001-01-01'),
           'i', cast('NaN' as float), 'o', cast('-Infinity' as double), 'm', cast(-0.01 as decimal(30,2))))""",
    ),
    (
        "bigint",
        "bigint",
        """select id, parse_json(j) as v from values (0, '1'), (1, '"x"'), (2, '2.5'),
        (3, 'null'), (4, null), (5, '9223372036854775807') as t(id, j)""",
    ),
    (
        "nested",
        "p struct<q: array<struct<r: int>>>, s string",
        """select id, parse_json(j) as v from values (0, '{"p":{"q":[{"r":1},{"r":"x","t":2}]},"s":"a"}'),
           (1, '{"p":5}'), (2, '{"p":{"q":[]},"u":null}'), (3, '{"p":{"q":"no"}}'),
           (4, '{"p":{"q":[{"r":null},{}]}}') as t(id, j)""",
    ),
]


def spark_shredded(spark: Any) -> list[dict[str, Any]]:
    """Write each shredded case with Spark into ``variant_shredded/<name>.parquet``; record Spark's JSON per row."""
    import shutil
    import tempfile

    SHREDDED_DIR.mkdir(exist_ok=True)
    results = []
    spark.conf.set("spark.sql.variant.writeShredding.enabled", "true")
    for name, schema, query in SHREDDED_CASES:
        spark.conf.set("spark.sql.variant.forceShreddingSchemaForTest", schema)
        with tempfile.TemporaryDirectory() as tmp:
            spark.sql(query).coalesce(1).write.mode("overwrite").parquet(f"{tmp}/out")
            [written] = glob.glob(f"{tmp}/out/*.parquet")
            target = SHREDDED_DIR / f"{name}.parquet"
            shutil.copyfile(written, target)
        rows = spark.read.parquet(str(target)).selectExpr("id", "to_json(v) as j").orderBy("id").collect()
        results.append(
            {
                "name": name,
                "file": f"variant_shredded/{name}.parquet",
                "shredding_schema": schema,
                "rows": [[r["id"], r["j"]] for r in rows],
            }
        )
    spark.conf.unset("spark.sql.variant.forceShreddingSchemaForTest")
    spark.conf.set("spark.sql.variant.writeShredding.enabled", "false")
    return results


def _row_line(row: dict[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)


def main() -> None:
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

    spark = (
        SparkSession.builder.master("local[1]")
        .appName("variant-expectations")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    out: dict[str, Any] = {
        "generator": "tests/expectations/generate_variant_expectations.py",
        "oracle": f"Apache Spark {pyspark.__version__} (pyspark, local mode): to_json(variant), UTC",
        "jvm": spark.sparkContext._jvm.java.lang.System.getProperty("java.version"),  # type: ignore[union-attr]
        "tables": {},
    }
    for name in TABLES:
        table = CORPUS / name
        metadata, protocol, adds = _log(table)
        schema_json = json.loads(metadata["schemaString"])
        schema = StructType.fromJson(schema_json)
        files: dict[str, Any] = {}
        for path in sorted(glob.glob(str(table / "*.parquet"))):
            df = spark.read.schema(schema).parquet(path)
            exprs = [
                "{} as `{}`".format(_render("`{}`".format(f["name"]), f["type"]), f["name"])
                for f in schema_json["fields"]
            ]
            rows = [r.asDict(recursive=True) for r in df.selectExpr(*exprs).collect()]
            lines = [_row_line(r) for r in rows]
            files[os.path.basename(path)] = {
                "rows": len(rows),
                "sha256": hashlib.sha256("\n".join(lines).encode("utf-8")).hexdigest(),
                "head": rows[:HEAD_ROWS],
            }
            print(f"{name}/{os.path.basename(path)}: {len(rows)} rows", file=sys.stderr)
        out["tables"][name] = {
            "reader_features": sorted(protocol.get("readerFeatures") or []),
            "schema": schema_json,
            "adds": {str(v): a for v, a in sorted(adds.items())},
            "files": files,
        }
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out["vectors"] = spark_vectors(spark, Path(tmp))
    out["shredded"] = spark_shredded(spark)
    spark.stop()
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
