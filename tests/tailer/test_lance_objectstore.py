"""Lance datasets on an object store (issue #22): ``changes``, ``run`` and the Spark reader on ``s3://`` in moto.

A dataset is written by pylance locally, then its files are uploaded unchanged to moto's S3 server
(the session's ``moto_server`` of ``tests/objectstore_fixtures.py``, on 127.0.0.1, with a bucket made by a fixture
of this module): the same versions, files and timestamps on both sides, so the output on ``s3://``
must equal the output on the local copy row for row (the oracle; the local reads are checked
against pylance's scans in ``test_lance_changes.py``).

deltatail's storage options are delta-rs's spelling; pylance gets them through
:func:`tailer.lance.store.pylance_options`, so these tests pass the options a delta-rs user would
(``aws_endpoint_url``, ``max_retries``, ``retry_timeout``...). The secret key is a marked string that
must never appear in any output, error or log.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import lance
import obstore
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lance_datasets import rows
from obstore.store import S3Store

from deltatail.sinks.spark import DeltaTailBatchReader, DeltaTailDataSource
from deltatail.sinks.spark.lance import version_schema
from deltatail.sinks.spark.schema import arrow_target
from deltatail.state.errors import ConfigError, DataFileError, MissingFileError
from deltatail.tailer.cli.main import main
from deltatail.tailer.lance.feed import LanceFeed
from deltatail.tailer.lance.rows import LanceRows
from deltatail.tailer.lance.store import pylance_options, scrub
from deltatail.tailer.storage.factory import storage_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: objectstores.py (not a package)
from objectstores import Server, create_s3_bucket

pytest_plugins = ("objectstore_fixtures",)

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "lance-bkt"
KEY_ID = "deltatail-test"
#: moto accepts any credentials; this one is marked so that a leak is easy to find.
SECRET = "SECRET-d3lta-ta1l-never-shown"
REGION = "us-east-1"


@pytest.fixture(scope="module")
def moto(moto: Server) -> str:  # the session's moto server (objectstore_fixtures), with this module's bucket
    """moto's S3 server on 127.0.0.1 with one bucket for these tests; its endpoint URL."""
    create_s3_bucket(moto.endpoint, BUCKET)
    return moto.endpoint


def options(endpoint: str) -> dict[str, str]:
    """Storage options in delta-rs's spelling (what ``--storage-option`` takes)."""
    return {
        "aws_endpoint_url": endpoint,
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_region": REGION,
        "allow_http": "true",
        "max_retries": "2",
        "retry_timeout": "5s",
    }


def option_args(endpoint: str) -> list[str]:
    return [a for k, v in options(endpoint).items() for a in ("--storage-option", f"{k}={v}")]


def s3_store(endpoint: str) -> S3Store:
    return S3Store(
        BUCKET, endpoint=endpoint, access_key_id=KEY_ID, secret_access_key=SECRET, region=REGION, allow_http=True
    )


def upload(local: Path, endpoint: str) -> str:
    """Every file of ``local`` to a fresh prefix of the bucket; the dataset's ``s3://`` URI."""
    prefix = f"ds-{uuid.uuid4().hex[:8]}"
    store = s3_store(endpoint)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        obstore.put(store, f"{prefix}/{path.relative_to(local).as_posix()}", path.read_bytes())
    return f"s3://{BUCKET}/{prefix}"


def build(root: Path) -> Path:
    """Versions 1..5 with stable row ids: a create, an append, a delete, an update, a merge-insert."""
    uri = str(root)
    lance.write_dataset(rows(range(300)), uri, enable_stable_row_ids=True, max_rows_per_file=100)
    lance.write_dataset(rows(range(300, 330)), uri, mode="append")
    lance.dataset(uri).delete("id % 11 = 4")
    lance.dataset(uri).update({"score": "score + 100"}, where="id < 30")
    source = pa.concat_tables([rows(range(50, 55), tag="m"), rows(range(500, 503), tag="m")])
    lance.dataset(uri).merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(source)
    return root


@pytest.fixture(scope="module")
def dataset(moto: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    local = build(tmp_path_factory.mktemp("lance-s3") / "ds")
    return local, upload(local, moto)


def lines(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def no_secret(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text


# ---------------------------------------------------------------- options --


def test_pylance_gets_translated_options() -> None:
    given = {
        **options("http://127.0.0.1:1"),
        "azure_storage_account_key": "x",
        "aws_s3_locking_provider": "dynamodb",
        "backoff_config.base": "3",
    }
    got = pylance_options("s3://b/ds", given)
    assert got == {
        "aws_endpoint_url": "http://127.0.0.1:1",
        "aws_access_key_id": KEY_ID,
        "aws_secret_access_key": SECRET,
        "aws_region": REGION,
        "allow_http": "true",
        "client_max_retries": "2",
        "client_retry_timeout": "5",
    }
    assert pylance_options("s3://b/ds", {"retry_timeout": "1500ms"})["client_retry_timeout"] == "2"
    assert pylance_options("s3://b/ds", {})["client_max_retries"] == "10"  # deltatail's defaults
    assert pylance_options("/local/ds", {}) == {}
    assert pylance_options("abfss://c@acct.dfs.core.windows.net/ds", {})["azure_storage_account_name"] == "acct"
    assert "aws_region" not in pylance_options("gs://b/ds", {"aws_region": "x", "google_service_account": "f"})


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"aws_profile": "dev"}, "AWS_PROFILE"),
        ({"max_retries": "many"}, "max_retries"),
        ({"retry_timeout": "soon"}, "retry_timeout"),
    ],
)
def test_options_pylance_cannot_take_are_config_errors(given: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        pylance_options("s3://b/ds", given)


def test_scrub_hides_secret_values_and_signatures() -> None:
    message = f"GET http://h/b?X-Amz-Signature=abc123&x=1 failed for key {SECRET} in us-east-1"
    out = scrub(message, {"aws_secret_access_key": SECRET, "aws_region": "us-east-1"})
    assert SECRET not in out and "abc123" not in out and "us-east-1" in out


# ---------------------------------------------------------------- the feed and the command line --


def test_feed_on_s3_equals_the_local_copy(dataset: tuple[Path, str], moto: str) -> None:
    local, uri = dataset
    remote = LanceFeed(uri, storage_options=options(moto))
    assert remote.dataset.storage.remote and remote.dataset.latest_version() == 5
    got, want = remote.read_table(1), LanceFeed(str(local)).read_table(1)
    assert got.equals(want)
    assert set(got.column("_change_type").to_pylist()) == {"insert", "delete", "update_preimage", "update_postimage"}


def test_changes_on_s3_equals_the_local_copy(
    dataset: tuple[Path, str], moto: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    local, uri = dataset
    out_s3, out_local = tmp_path / "s3.jsonl", tmp_path / "local.jsonl"
    assert main(["changes", uri, "--starting-version", "1", "--output", str(out_s3), *option_args(moto)]) == 0
    assert main(["changes", str(local), "--starting-version", "1", "--output", str(out_local)]) == 0
    assert lines(out_s3) == lines(out_local) and len(lines(out_s3)) > 300
    parquet_s3, parquet_local = tmp_path / "s3.parquet", tmp_path / "local.parquet"
    assert main(["changes", f"lance://{uri}", "--output", str(parquet_s3), *option_args(moto)]) == 0
    assert main(["changes", str(local), "--output", str(parquet_local)]) == 0
    assert pq.read_table(parquet_s3).equals(pq.read_table(parquet_local))
    captured = capsys.readouterr()
    no_secret(captured.out, captured.err, out_s3.read_text())


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DELTATAIL_", "AWS_"))}
    return subprocess.run(
        [sys.executable, "-m", "deltatail", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_run_until_caught_up_on_s3_equals_the_local_copy(dataset: tuple[Path, str], moto: str, tmp_path: Path) -> None:
    local, uri = dataset
    outputs = []
    for name, table, extra in (("s3", uri, option_args(moto)), ("local", str(local), [])):
        out = tmp_path / f"{name}.jsonl"
        state = tmp_path / f"state-{name}"
        done = run_cli("run", table, "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up", *extra)
        assert done.returncode == 0, done.stderr[-3000:]
        no_secret(done.stdout, done.stderr, (state / "cursor.json").read_text())
        cursor = orjson.loads((state / "cursor.json").read_bytes())["state"]["cursor"]
        assert (cursor["version"], cursor["index"]) == (6, 0)
        outputs.append(lines(out))
    assert outputs[0] == outputs[1] and len(outputs[0]) > 300


@pytest.mark.slow
def test_run_on_s3_resumes_after_new_versions(moto: str, tmp_path: Path) -> None:
    """A second ``run`` on the same state directory delivers only the versions uploaded since."""
    local = build(tmp_path / "ds")
    uri = upload(local, moto)
    prefix = uri.removeprefix(f"s3://{BUCKET}/")
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    args = ("run", uri, "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up", *option_args(moto))
    assert run_cli(*args).returncode == 0
    first = len(lines(out))
    lance.dataset(str(local)).delete("id >= 500")
    lance.write_dataset(rows(range(900, 905)), str(local), mode="append")
    # Upload the two new versions' files (data, deletion, transaction and manifest files).
    store = s3_store(moto)
    existing = {m["path"] for batch in obstore.list(store, prefix=prefix) for m in batch}
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        key = f"{prefix}/{path.relative_to(local).as_posix()}"
        if key not in existing and not path.name.endswith(".manifest"):
            obstore.put(store, key, path.read_bytes())
    for path in sorted(local.glob("_versions/*.manifest")):  # manifests last, as a writer commits
        key = f"{prefix}/{path.relative_to(local).as_posix()}"
        if key not in existing:
            obstore.put(store, key, path.read_bytes())
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    new = lines(out)[first:]
    assert [r["_commit_version"] for r in new] == [6] * 3 + [7] * 5
    assert [r["_change_type"] for r in new] == ["delete"] * 3 + ["insert"] * 5


@pytest.mark.slow
def test_errors_on_s3_name_the_file_and_show_no_secret(moto: str, tmp_path: Path) -> None:
    local = build(tmp_path / "ds")
    uri = upload(local, moto)
    feed = LanceFeed(uri, storage_options=options(moto))
    plan = next(feed.plans(1, 1))
    store = s3_store(moto)
    data = plan.tasks[0].fragment.files[0].path
    obstore.delete(store, f"{uri.removeprefix(f's3://{BUCKET}/')}/data/{data}")
    with pytest.raises(MissingFileError) as missing:
        list(LanceFeed(uri, storage_options=options(moto)).batches(1, 1))
    assert missing.value.file is not None and missing.value.file.endswith(data)
    no_secret(str(missing.value), repr(missing.value))
    wrong = {**options(moto), "aws_endpoint_url": "http://127.0.0.1:9"}  # nothing listens there
    with pytest.raises(DataFileError) as unreachable:
        LanceFeed(uri, storage_options=wrong).rows.dataset(1)
    assert "max_retries: 2, retry_timeout: 5s" in str(unreachable.value)  # pylance took the translated options
    no_secret(str(unreachable.value))
    with pytest.raises(DataFileError) as spark_side:
        version_schema(LanceFeed(uri, storage_options=wrong).rows, 1)
    no_secret(str(spark_side.value))
    with pytest.raises(ConfigError, match="aws_profile"):
        LanceRows(uri, storage_for(uri, options(moto)), storage_options={**options(moto), "aws_profile": "dev"})


# ---------------------------------------------------------------- the Spark reader --


def test_spark_batch_reader_on_s3_equals_the_local_copy(dataset: tuple[Path, str], moto: str) -> None:
    local, uri = dataset
    spark_options = {"path": uri, "startingVersion": "1", **{f"storage.{k}": v for k, v in options(moto).items()}}
    ds = DeltaTailDataSource(spark_options)
    reader = ds.reader(ds.schema())
    assert isinstance(reader, DeltaTailBatchReader)
    remote = pickle.loads(pickle.dumps(reader))  # as executors get it
    parts = reader.partitions()
    batches = [b for p in parts for b in remote.read(pickle.loads(pickle.dumps(p)))]
    got = pa.Table.from_batches(batches, schema=arrow_target(reader.schema))
    want = LanceFeed(str(local)).read_table(1)
    assert got.to_pylist() == want.cast(got.schema).to_pylist()
    no_secret(*(repr(p) for p in parts))
