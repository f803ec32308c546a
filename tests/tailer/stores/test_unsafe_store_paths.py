"""On S3 (moto), a commit naming another bucket's object is refused, not read with the table's credentials.

The table is written by deltalake into the bucket the fixtures give; the hostile commit is put
next to it by hand; the marker file sits in another bucket of the same server. The command line
runs in a child process, with the table's options as ``--storage-option``.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import obstore as obs
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake
from obstore.store import S3Store

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py
from objectstores import MOTO_KEY_ID, MOTO_REGION, MOTO_SECRET, Cloud, create_s3_bucket

pytest_plugins = ("objectstore_fixtures",)

MARKER = "MARKER-other-bucket"
OTHER = "otherbucket"


def _deltatail(cloud: Cloud, *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from deltatail.tailer.cli.main import main; sys.exit(main(sys.argv[1:]))"
    options = [a for k, v in cloud.options.items() for a in ("--storage-option", f"{k}={v}")]
    return subprocess.run(
        [sys.executable, "-c", code, *args, *options], capture_output=True, text=True, timeout=300, check=False
    )


def _hostile_table(cloud: Cloud) -> str:
    uri = cloud.uri("t")
    write_deltalake(uri, pa.table({"id": pa.array([1, 2], pa.int64())}), storage_options=cloud.writer_options)
    create_s3_bucket(cloud.server.endpoint, OTHER)
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array([666], pa.int64()), "name": [MARKER]}), buf)
    secret = buf.getvalue()
    other = S3Store(
        OTHER,
        endpoint=cloud.server.endpoint,
        access_key_id=MOTO_KEY_ID,
        secret_access_key=MOTO_SECRET,
        region=MOTO_REGION,
        client_options={"allow_http": True},
    )
    obs.put(other, "secret.parquet", secret)
    add = {
        "add": {
            "path": f"s3://{OTHER}/secret.parquet",
            "partitionValues": {},
            "size": len(secret),
            "modificationTime": 1_700_000_000_000,
            "dataChange": True,
        }
    }
    cloud.put("t/_delta_log/00000000000000000001.json", (json.dumps(add) + "\n").encode())
    return uri


def test_another_buckets_object_is_refused(s3: Cloud) -> None:
    uri = _hostile_table(s3)
    out = _deltatail(s3, "changes", uri)
    assert out.returncode == 1, out.stderr
    assert MARKER not in out.stdout
    assert "refused before reading" in out.stderr and f"s3://{OTHER}/secret.parquet" in out.stderr
    assert "version 1" in out.stderr


def test_another_bucket_is_read_when_listed(s3: Cloud) -> None:
    uri = _hostile_table(s3)
    out = _deltatail(s3, "changes", uri, "--external-root", f"s3://{OTHER}")
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(line)["id"] for line in out.stdout.splitlines()) == [1, 2, 666]
