"""What a user sees when a table's store fails, and secrets passed by reference, on the real command line.

- A Delta table's store failing (wrong credentials, a missing bucket, a closed port, no
  credentials at all) is reported as that table's error, naming the table and its ``_delta_log``,
  never the Lance probe's ``_versions`` directory; with no credentials the error says where they
  were looked for.
- ``-v`` shows the store's own failure (request, status, error code) without a secret or a query
  string, in text and in JSON lines (where every line is JSON).
- ``env:NAME`` and ``@FILE`` storage option values reach the store (a moto server that checks
  signatures, with an IAM user of its own), and neither the value nor the file's content appears
  in any output; a reference that cannot be resolved is a usage error naming the option.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltatail.state.errors import StorageError
from deltatail.tailer.storage.objectstore import ObjectStoreStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py (tests/ is not a package)
from objectstores import MOTO_REGION, Cloud, Server, free_port, moto_server

pytest_plugins = ("objectstore_fixtures",)

ROOT = Path(__file__).resolve().parents[3]
WRONG_SECRET = "Wr0ng-Secret-Value-0xBADBAD"
BUCKET = "authbkt"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any AWS credential, with ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, "AWS_EC2_METADATA_DISABLED": "true", **extra}


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltatail", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env or clean_env(),
    )


def flags(options: dict[str, str]) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


def rows(ids: range) -> pa.Table:
    return pa.table({"id": pa.array(list(ids), pa.int64())})


class AuthMoto:
    """A moto server that checks credentials and signatures, with one IAM user allowed everything."""

    def __init__(self, server: Server) -> None:
        self.server = server
        # moto lets the first 3 requests in unauthenticated: the user, its policy and its key
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            region_name=MOTO_REGION,
            aws_access_key_id="bootstrap",
            aws_secret_access_key="bootstrap",
        )
        iam.create_user(UserName="reader")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        self.key_id: str = key["AccessKeyId"]
        self.secret: str = key["SecretAccessKey"]
        boto3.client(
            "s3",
            endpoint_url=server.endpoint,
            region_name=MOTO_REGION,
            aws_access_key_id=self.key_id,
            aws_secret_access_key=self.secret,
        ).create_bucket(Bucket=BUCKET)

    def options(self, **overrides: str) -> dict[str, str]:
        base = {
            "aws_endpoint_url": self.server.endpoint,
            "aws_allow_http": "true",
            "aws_region": MOTO_REGION,
            "aws_access_key_id": self.key_id,
            "aws_secret_access_key": self.secret,
            "max_retries": "0",
        }
        return {**base, **overrides}

    def table(self, n: int = 5) -> str:
        uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"
        writer = {k: v for k, v in self.options().items() if k != "max_retries"}
        write_deltalake(uri, rows(range(n)), storage_options={**writer, "aws_s3_allow_unsafe_rename": "true"})
        return uri


@pytest.fixture(scope="module")
def auth_moto() -> Iterator[AuthMoto]:
    server = moto_server(env={"INITIAL_NO_AUTH_ACTION_COUNT": "3"}).start()
    try:
        yield AuthMoto(server)
    finally:
        server.close()


def assert_names_the_table(stderr: str, uri: str) -> None:
    assert f"table {uri}" in stderr and f"file {uri}/_delta_log" in stderr, stderr
    assert "_versions" not in stderr, stderr
    assert "Traceback" not in stderr, stderr


# ---------------------------------------------------------------- the table's store fails


@pytest.mark.slow
def test_wrong_credentials_name_the_table_and_its_log(auth_moto: AuthMoto, tmp_path: Path) -> None:
    uri = auth_moto.table()
    wrong = flags(auth_moto.options(aws_secret_access_key=WRONG_SECRET))
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    for command in (
        ["snapshot", uri],
        ["changes", uri],
        ["run", uri, "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up"],
    ):
        done = run_cli(*command, *wrong)
        assert done.returncode == 1, done.stderr
        assert "access denied (HTTP 403)" in done.stderr
        assert_names_the_table(done.stderr, uri)
        assert WRONG_SECRET not in done.stderr + done.stdout


def test_a_missing_bucket_names_the_table_and_its_log(s3: Cloud) -> None:
    uri = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/sales/orders"
    for command in ("snapshot", "changes"):
        done = run_cli(command, uri, *flags({**s3.options, "max_retries": "0"}))
        assert done.returncode == 1
        assert "not found (HTTP 404): no such bucket" in done.stderr
        assert_names_the_table(done.stderr, uri)


def test_an_unreachable_endpoint_names_the_table_and_its_log(s3: Cloud) -> None:
    uri = s3.uri("orders")
    dead = {**s3.options, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "max_retries": "0"}
    for command in ("snapshot", "changes"):
        done = run_cli(command, uri, *flags(dead))
        assert done.returncode == 1
        assert "cannot connect to the store (connection refused)" in done.stderr
        assert_names_the_table(done.stderr, uri)


def test_run_retrying_an_unreachable_store_names_the_table_and_shows_the_failure_with_v(
    s3: Cloud, tmp_path: Path
) -> None:
    uri = s3.uri("orders")
    port = free_port()
    dead = {**s3.options, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "max_retries": "0"}
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    done = run_cli(
        "-v", "run", uri, "--state-dir", str(state), "--sink", f"jsonl:{out}", "--sink-retries", "1", *flags(dead)
    )
    assert done.returncode == 1
    retried = [line for line in done.stderr.splitlines() if "store unavailable:" in line]
    assert len(retried) == 1 and f"table {uri}, file {uri}/_delta_log" in retried[0], done.stderr
    assert f"the store's failure: GenericError, GET http://127.0.0.1:{port}/bkt, tcp connect error" in done.stderr
    assert_names_the_table(done.stderr.splitlines()[-2] + done.stderr.splitlines()[-1], uri)


def test_no_credentials_say_where_they_were_looked_for(s3: Cloud) -> None:
    uri = s3.uri("orders")
    write_deltalake(uri, rows(range(3)), storage_options=s3.writer_options)
    # no key, no secret, no profile, and an instance metadata service that is not there
    options = {
        "aws_endpoint_url": s3.server.endpoint,
        "aws_allow_http": "true",
        "aws_region": MOTO_REGION,
        "aws_metadata_endpoint": f"http://127.0.0.1:{free_port()}",
        "max_retries": "0",
    }
    done = run_cli("snapshot", uri, *flags(options))
    assert done.returncode == 1
    stderr = done.stderr
    assert "no credentials found" in stderr, stderr
    for source in ("--storage-option", "config file", "AWS_ACCESS_KEY_ID", "aws_profile", "instance metadata"):
        assert source in stderr, (source, stderr)
    assert_names_the_table(stderr, uri)


# ---------------------------------------------------------------- -v


@pytest.mark.slow
def test_verbose_shows_the_store_failure_without_secrets(auth_moto: AuthMoto) -> None:
    uri = auth_moto.table()
    wrong = flags(auth_moto.options(aws_secret_access_key=WRONG_SECRET))
    quiet = run_cli("snapshot", uri, *wrong)
    assert "SignatureDoesNotMatch" not in quiet.stderr and "cause" not in quiet.stderr
    assert len(quiet.stderr.strip().splitlines()) == 1

    text = run_cli("-v", "snapshot", uri, *wrong)
    assert text.returncode == 1
    port = auth_moto.server.port
    assert f"GET http://127.0.0.1:{port}/{BUCKET}" in text.stderr, text.stderr
    assert "HTTP 403 Forbidden" in text.stderr and "SignatureDoesNotMatch" in text.stderr
    assert "list-type" not in text.stderr  # no query string

    js = run_cli("-v", "--log-format", "json", "snapshot", uri, *wrong)
    assert js.returncode == 1
    records = [json.loads(line) for line in js.stderr.splitlines()]  # every line is JSON
    fatal = [r for r in records if r.get("event") == "fatal"]
    assert len(fatal) == 1 and fatal[0]["level"] == "error" and fatal[0]["exit_code"] == 1
    assert fatal[0]["error"] == "StorageError" and fatal[0]["transient"] is False
    assert fatal[0]["table"] == uri and fatal[0]["file"] == f"{uri}/_delta_log"
    assert any("SignatureDoesNotMatch" in c for c in fatal[0]["causes"])
    for result in (quiet, text, js):
        assert WRONG_SECRET not in result.stderr + result.stdout
        assert auth_moto.secret not in result.stderr + result.stdout


def test_the_detail_of_a_failure_leaves_the_query_string_out() -> None:
    sas = "sv=2022-11-02&ss=b&srt=co&sp=rl&se=2099-01-01T00:00:00Z&sig=S3cretSignatureValue0123456789abcdef%3D"
    storage = ObjectStoreStorage(
        {
            "azure_storage_account_name": "acct",
            "azure_storage_sas_key": sas,
            "azure_storage_endpoint": f"http://127.0.0.1:{free_port()}/acct",
            "allow_http": "true",
            "max_retries": "0",
        }
    )
    with pytest.raises(StorageError) as e:
        storage.list_from("az://cont/t/_delta_log")
    detail = e.value.detail or ""
    assert detail.startswith("GenericError, GET "), detail  # object_store itself hides a SAS-signed URL
    assert "connection refused" in detail.lower()
    assert "S3cretSignatureValue" not in detail + str(e.value) and "sig=" not in detail


# ---------------------------------------------------------------- secrets by reference


@pytest.mark.slow
def test_secrets_by_environment_variable_and_file_reach_the_store(auth_moto: AuthMoto, tmp_path: Path) -> None:
    uri = auth_moto.table(5)
    base = auth_moto.options()
    del base["aws_secret_access_key"]
    secret_file = tmp_path / "secret"
    secret_file.write_text(f"  {auth_moto.secret}\n")  # as a mounted secret may end
    by_env = run_cli(
        "changes",
        uri,
        *flags(base),
        "--storage-option",
        "aws_secret_access_key=env:DT_TEST_SECRET",
        env=clean_env(DT_TEST_SECRET=auth_moto.secret),
    )
    by_file = run_cli("changes", uri, *flags(base), "--storage-option", f"aws_secret_access_key=@{secret_file}")
    config = tmp_path / "deltatail.toml"
    config.write_text(f'[storage]\naws_secret_access_key = "@{secret_file}"\n')
    by_toml = run_cli("-v", "audit", uri, "--config", str(config), *flags(base), "--format", "jsonl")
    for done in (by_env, by_file, by_toml):
        assert done.returncode == 0, done.stderr
        assert auth_moto.secret not in done.stderr + done.stdout
    for stdout in (by_env.stdout, by_file.stdout):
        lines = [json.loads(line) for line in stdout.splitlines()]
        assert sorted(r["id"] for r in lines) == [0, 1, 2, 3, 4]
        assert {r["_change_type"] for r in lines} == {"insert"}
    events = [json.loads(line) for line in by_toml.stdout.splitlines()]
    assert [e["version"] for e in events] == [0]

    # a wrong secret by reference: refused by the store, and neither the value nor the file is shown
    wrong_file = tmp_path / "wrong"
    wrong_file.write_text(WRONG_SECRET)
    for ref, env in (
        ("env:DT_TEST_SECRET", clean_env(DT_TEST_SECRET=WRONG_SECRET)),
        (f"@{wrong_file}", clean_env()),
    ):
        denied = run_cli(
            "-v", "changes", uri, *flags(base), "--storage-option", f"aws_secret_access_key={ref}", env=env
        )
        assert denied.returncode == 1 and "access denied (HTTP 403)" in denied.stderr
        assert WRONG_SECRET not in denied.stderr + denied.stdout


@pytest.mark.slow
def test_a_reference_that_cannot_be_resolved_is_a_usage_error_naming_the_option(
    auth_moto: AuthMoto, tmp_path: Path
) -> None:
    uri = auth_moto.table(1)
    base = auth_moto.options()
    del base["aws_secret_access_key"]
    unset = run_cli("snapshot", uri, *flags(base), "--storage-option", "aws_secret_access_key=env:DT_TEST_UNSET")
    assert unset.returncode == 2
    assert "aws_secret_access_key" in unset.stderr and "DT_TEST_UNSET, which is not set" in unset.stderr
    empty = run_cli(
        "snapshot",
        uri,
        *flags(base),
        "--storage-option",
        "aws_secret_access_key=env:DT_TEST_EMPTY",
        env=clean_env(DT_TEST_EMPTY=""),
    )
    assert empty.returncode == 2 and "DT_TEST_EMPTY, which is empty" in empty.stderr
    missing = tmp_path / "no-such-secret"
    gone = run_cli("snapshot", uri, *flags(base), "--storage-option", f"aws_secret_access_key=@{missing}")
    assert gone.returncode == 2 and f"refers to file {missing}, which cannot be read" in gone.stderr
    config = tmp_path / "deltatail.toml"
    config.write_text('[storage]\naws_secret_access_key = "env:DT_TEST_UNSET"\n')
    toml = run_cli("run", uri, "--config", str(config), "--state-dir", str(tmp_path / "s"), *flags(base))
    assert toml.returncode == 2 and "DT_TEST_UNSET" in toml.stderr and str(config) in toml.stderr
    for done in (unset, empty, gone, toml):
        assert "Traceback" not in done.stderr and auth_moto.secret not in done.stderr


@pytest.mark.parametrize("cloud", ["azure", "gcs"])
def test_no_credentials_on_azure_and_gcs_say_where_they_were_looked_for(cloud: str) -> None:
    closed = f"http://127.0.0.1:{free_port()}"  # the store and the managed-identity endpoint: nobody listens
    common = {"allow_http": "true", "connect_timeout": "2s", "max_retries": "0"}
    if cloud == "azure":
        uri, sources = "az://cont/t", ("AZURE_STORAGE_ACCOUNT_KEY", "managed-identity")
        options = {
            "azure_storage_account_name": "acct",
            "azure_storage_endpoint": f"{closed}/acct",
            "azure_msi_endpoint": f"{closed}/metadata/identity/oauth2/token",
            **common,
        }
    else:
        uri, sources = "gs://bkt/t", ("GOOGLE_APPLICATION_CREDENTIALS", "metadata server")
        options = {"google_base_url": closed, **common}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "GOOGLE_", "GCE_"))}
    program = (
        "from deltatail.tailer.storage.objectstore import ObjectStoreStorage\n"
        "from deltatail.state.errors import StorageError\n"
        "try:\n"
        f"    ObjectStoreStorage({options!r}).list_from({uri + '/_delta_log'!r})\n"
        "except StorageError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, env=env, timeout=60
    )
    assert "no credentials found" in done.stdout, done.stdout + done.stderr
    for source in ("--storage-option", "config file", *sources):
        assert source in done.stdout, (source, done.stdout)
