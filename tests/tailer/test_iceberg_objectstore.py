"""Iceberg tables on an object store: pyiceberg writes a table into moto's S3 server (which accepts any
credentials; its SQL catalog on SQLite, its warehouse an ``s3://`` bucket), and deltatail reads it
through its own storage with delta-rs-spelled options. Oracle: pyiceberg's scans of every snapshot,
read from the same bucket. The secret key is a marked string that must never appear in any output or error.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from iceberg_tables import SCHEMA, rows
from pyiceberg.catalog.sql import SqlCatalog

from deltatail.tailer.cli.main import main

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: objectstores.py (not a package)
from objectstores import Server, create_s3_bucket

pytest_plugins = ("objectstore_fixtures",)

BUCKET = "iceberg-bkt"
KEY_ID = "deltatail-test"
SECRET = "SECRET-1ceberg-never-shown"
REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto(moto: Server) -> str:
    """moto's S3 server on 127.0.0.1 with one bucket for these tests; its endpoint URL."""
    create_s3_bucket(moto.endpoint, BUCKET)
    return moto.endpoint


def option_args(endpoint: str) -> list[str]:
    options = {
        "aws_endpoint_url": endpoint,
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_region": REGION,
        "allow_http": "true",
        "max_retries": "2",
    }
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


@pytest.mark.slow
def test_changes_on_s3_equal_pyiceberg_scans(moto: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cat = SqlCatalog(
        "s3test",
        uri=f"sqlite:///{tmp_path}/catalog.db",
        warehouse=f"s3://{BUCKET}/wh",
        **{"s3.endpoint": moto, "s3.access-key-id": KEY_ID, "s3.secret-access-key": SECRET, "s3.region": REGION},
    )
    cat.create_namespace("db")
    t = cat.create_table("db.t", SCHEMA, properties={"format-version": "2"})
    t.append(rows([1, 2, 3]))
    t.delete("id == 2")
    t.upsert(rows([3, 4], tag="u"))
    t = t.refresh()
    location = t.metadata_location.rsplit("/metadata/", 1)[0]
    assert location.startswith(f"s3://{BUCKET}/")
    assert main(["changes", location, *option_args(moto)]) == 0
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    found = [orjson.loads(line) for line in out.splitlines()]
    by_version: dict[int, list[dict[str, Any]]] = {}
    for r in found:
        by_version.setdefault(r["_commit_version"], []).append(r)
    parent: Counter[tuple[Any, ...]] = Counter()
    for snap in t.snapshots():
        now = Counter((r["id"], r["name"]) for r in t.scan(snapshot_id=snap.snapshot_id).to_arrow().to_pylist())
        got = by_version.get(snap.sequence_number or 0, [])
        gone = Counter((r["id"], r["name"]) for r in got if r["_change_type"] in ("delete", "update_preimage"))
        came = Counter((r["id"], r["name"]) for r in got if r["_change_type"] in ("insert", "update_postimage"))
        assert (gone, came) == (parent - now, now - parent)
        parent = now
    # no table at a prefix: an error naming it, without the secret
    assert main(["changes", f"{location}-gone", *option_args(moto), "--format", "iceberg"]) == 1
    out, err = capsys.readouterr()
    assert SECRET not in out + err and f"{location}-gone" in err and "no Iceberg table" in err
