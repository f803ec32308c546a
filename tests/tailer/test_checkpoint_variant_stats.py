"""Variant statistics in a Parquet checkpoint do not disturb checkpoint reading.

The ``variant-stats-*`` tables of the corpus record min/max of their variant columns in ``stats`` as
Z85-encoded variants; none of them has a checkpoint. A checkpoint of them would carry those stats as
the ``stats`` string and, with ``delta.checkpoint.writeStatsAsStruct``, as ``stats_parsed`` whose
variant bounds are ``struct<metadata: binary, value: binary>``. Such a checkpoint is written here with
pyarrow from the table's own JSON log, and read with the checkpoint reader: its files must be exactly
the log's adds (the reader projects the fields it keeps and never reads either stats column).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_table

from deltatail.state.z85 import z85_decode
from deltatail.tailer.log.checkpoint import CheckpointState, read_parquet_checkpoint_file
from deltatail.tailer.storage import LocalStorage

TABLES = [
    "delta-spark/variant-stats-no-checkpoint",
    "delta-spark/variant-stats-nested-no-checkpoint",
    "delta-spark/variant-stats-with-struct-no-checkpoint",
    "delta-spark/variant-stats-state-reconstruction",
]
_MAP = pa.map_(pa.string(), pa.string())


def _variant(z85: str) -> dict[str, bytes]:
    """A Z85 stats variant as ``{metadata, value}``: the metadata ends where its last dictionary offset says."""
    raw = z85_decode(z85)
    size = (raw[0] >> 6) + 1
    count = int.from_bytes(raw[1 : 1 + size], "little")
    strings_at = 1 + size + (count + 1) * size
    end = strings_at + int.from_bytes(raw[strings_at - size : strings_at], "little")
    return {"metadata": raw[:end], "value": raw[end:]}


def _parsed(bounds: dict[str, Any], variants: set[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in bounds.items():
        if isinstance(value, dict):
            out[key] = _parsed(value, variants)
        else:
            out[key] = _variant(value) if key in variants else value
    return out


def _adds(table: Path) -> list[dict[str, Any]]:
    adds = []
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            action = json.loads(line)
            if "add" in action:
                adds.append(action["add"])
    return adds


def _write_checkpoint(path: Path, adds: list[dict[str, Any]]) -> None:
    parsed = []
    for add in adds:
        stats = json.loads(add["stats"])
        parsed.append(
            {
                "numRecords": stats["numRecords"],
                "minValues": _parsed(stats["minValues"], {"v"}),
                "maxValues": _parsed(stats["maxValues"], {"v"}),
                "nullCount": stats["nullCount"],
            }
        )
    parsed_type = pa.array(parsed).type
    add_type = pa.struct(
        [
            ("path", pa.string()),
            ("partitionValues", _MAP),
            ("size", pa.int64()),
            ("modificationTime", pa.int64()),
            ("dataChange", pa.bool_()),
            ("stats", pa.string()),
            ("tags", _MAP),
            ("stats_parsed", parsed_type),
        ]
    )
    rows = [
        {
            "add": {
                **{k: add[k] for k in ("path", "partitionValues", "size", "modificationTime", "dataChange", "stats")},
                "tags": add.get("tags"),
                "stats_parsed": p,
            }
        }
        for add, p in zip(adds, parsed, strict=True)
    ]
    table = pa.Table.from_pylist(rows, schema=pa.schema([("add", add_type)]))
    # the variant bounds really are variant-shaped structs in the file
    assert "struct<metadata: binary, value: binary>" in str(table.schema.field("add").type)
    pq.write_table(table, path)


@pytest.mark.parametrize("name", TABLES)
def test_checkpoint_with_variant_stats_reads_the_logs_files(name: str, tmp_path: Path) -> None:
    adds = _adds(corpus_table(name))
    checkpoint = tmp_path / "00000000000000000001.checkpoint.parquet"
    _write_checkpoint(checkpoint, adds)
    state = CheckpointState()
    read_parquet_checkpoint_file(LocalStorage(), str(checkpoint), state)
    files = {(f.path, f.size, f.timestamp) for f in state.files}
    assert files == {(unquote(a["path"]), a["size"], a["modificationTime"]) for a in adds}
