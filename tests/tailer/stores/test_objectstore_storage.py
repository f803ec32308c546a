"""``ObjectStoreStorage`` against real servers on 127.0.0.1: moto (S3), Azurite (Azure Blob), fake-gcs-server (GCS).

Request counts are read from two witnesses: the storage's own :class:`RequestCounter`, and a
:class:`~objectstores.CountingProxy` in front of the server, which sees what actually went over the
wire. Expected values are facts the tests wrote themselves (the bytes they put, the names they
listed), never computed with the code under test.
"""

from __future__ import annotations

import base64
import io
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.state.errors import ConfigError, DeltaTailError, MissingFileError, StorageError
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import LogFollower
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.reader_pool import ReaderPool
from deltatail.tailer.storage import LocalStorage
from deltatail.tailer.storage.factory import storage_for
from deltatail.tailer.storage.objectstore import ObjectStoreStorage, RequestCounter
from deltatail.tailer.storage.options import merge_options, parse_option_pairs, redacted, retry_config
from deltatail.tailer.storage.prefetch import UNKNOWN_SIZE, Prefetcher
from deltatail.tailer.storage.uris import ObjectUri, is_object_uri, parse_uri, root_of

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py (tests/ is not a package)
from objectstores import (
    AZURITE_ACCOUNT,
    BUCKET,
    Cloud,
    CountingProxy,
    Server,
    azure_options,
    free_port,
    kind,
    listing_start,
    s3_options,
)

pytest_plugins = ("objectstore_fixtures",)

SECRET = "Sup3r-Secret-Value-0xC0FFEE"


def log_names(versions: range) -> list[str]:
    return [f"{v:020d}.json" for v in versions]


@pytest.fixture
def proxy_for() -> Iterator[Callable[[Server], CountingProxy]]:
    """Starts counting proxies in front of servers; stops them after the test."""
    started: list[CountingProxy] = []

    def start(server: Server) -> CountingProxy:
        started.append(CountingProxy(server.endpoint).start())
        return started[-1]

    yield start
    for p in started:
        p.stop()


def no_secret(e: BaseException, *secrets: str) -> None:
    for s in (SECRET, *secrets):
        assert s not in str(e) and s not in repr(e), f"a secret in {e!r}"


# ---------------------------------------------------------------- URIs and options (no server)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bkt/t/_delta_log/0.json", ObjectUri("s3", "s3", "bkt", None, "t/_delta_log/0.json")),
        ("S3A://bkt/t", ObjectUri("s3", "s3a", "bkt", None, "t")),
        ("gs://b/a b%20c/x=1/é.parquet", ObjectUri("gcs", "gs", "b", None, "a b%20c/x=1/é.parquet")),
        ("az://cont/t/", ObjectUri("azure", "az", "cont", None, "t")),
        ("azure://cont/t", ObjectUri("azure", "azure", "cont", None, "t")),
        ("abfss://cont@acct.dfs.core.windows.net/t", ObjectUri("azure", "abfss", "cont", "acct", "t")),
        ("abfs://cont@acct.blob.core.windows.net/", ObjectUri("azure", "abfs", "cont", "acct", "")),
        ("s3://bkt/k?x#y", ObjectUri("s3", "s3", "bkt", None, "k?x#y")),
    ],
)
def test_parse_uri(uri: str, expected: ObjectUri) -> None:
    assert parse_uri(uri) == expected
    assert is_object_uri(uri)


@pytest.mark.parametrize(
    "uri",
    ["/local/path", "file:///x", "hdfs://nn/x", "s3:///key", "abfss://acct.dfs.core.windows.net/t", "abfs://@a/t"],
)
def test_parse_uri_rejects_what_it_does_not_serve(uri: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_uri(uri)
    assert e.value.file == uri


def test_root_of_names_the_bucket_and_account() -> None:
    assert root_of(parse_uri("s3a://bkt/t/x")) == "s3a://bkt"
    assert root_of(parse_uri("abfss://c@acct.dfs.core.windows.net/t")) == "abfss://c@acct"


def test_storage_for_picks_by_location(tmp_path: Path) -> None:
    assert isinstance(storage_for(str(tmp_path)), LocalStorage)
    assert isinstance(storage_for(f"file://{tmp_path}"), LocalStorage)
    for uri in ("s3://b/t", "s3a://b/t", "gs://b/t", "az://c/t", "azure://c/t", "abfss://c@a.dfs.core.windows.net/t"):
        assert isinstance(storage_for(uri, {"aws_region": "us-east-1"}), ObjectStoreStorage)
    with pytest.raises(ConfigError) as e:
        storage_for(str(tmp_path), {"aws_secret_access_key": SECRET})
    assert str(tmp_path) in str(e.value)
    no_secret(e.value)
    with pytest.raises(ConfigError):
        storage_for("s3://b/t", {"max_retries": "many"})


def test_options_merge_later_layers_win_and_keys_fold_case() -> None:
    toml = {"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://a"}
    cli = {"aws_region": "us-east-2"}
    assert merge_options(toml, None, cli) == {"aws_region": "us-east-2", "aws_endpoint_url": "http://a"}


def test_option_pairs_and_a_malformed_one_never_echo_its_text() -> None:
    assert parse_option_pairs(["AWS_REGION=us-east-1", "k=a=b"]) == {"aws_region": "us-east-1", "k": "a=b"}
    for bad in (f"AWS_SECRET_ACCESS_KEY{SECRET}", f"={SECRET}"):
        with pytest.raises(ConfigError) as e:
            parse_option_pairs([bad])
        no_secret(e.value)
        assert "KEY=VALUE" in str(e.value)


def test_redacted_hides_secret_looking_values() -> None:
    options = {
        "aws_secret_access_key": "s",
        "aws_session_token": "t",
        "azure_storage_sas_token": "t",
        "azure_storage_account_key": "k",
        "azure_client_secret": "c",
        "google_service_account_key": "k",
        "aws_region": "r",
        "aws_endpoint_url": "http://e",
    }
    assert redacted(options) == {
        **{k: "***" for k in options},
        "aws_region": "r",
        "aws_endpoint_url": "http://e",
    }
    storage = ObjectStoreStorage({"aws_secret_access_key": SECRET, "azure_storage_sas_token": SECRET + "x"})
    assert SECRET not in repr(storage)
    assert "aws_secret_access_key" in repr(storage)


def test_retry_options_use_delta_rs_keys() -> None:
    rc = retry_config(
        {
            "max_retries": "3",
            "retry_timeout": "2s",
            "backoff_config.init_backoff": "50ms",
            "backoff_config.max_backoff": "1m",
            "backoff_config.base": "3",
        }
    )
    assert rc["max_retries"] == 3
    assert rc["retry_timeout"].total_seconds() == 2
    assert rc["backoff"]["init_backoff"].total_seconds() == 0.05
    assert rc["backoff"]["max_backoff"].total_seconds() == 60
    assert rc["backoff"]["base"] == 3.0
    for bad in ({"retry_timeout": "soon"}, {"max_retries": "many"}, {"backoff_config.base": "x"}):
        with pytest.raises(ConfigError):
            retry_config(bad)
        with pytest.raises(ConfigError):
            ObjectStoreStorage(bad)  # malformed retry options fail when the storage is made


@pytest.mark.slow
def test_unknown_option_is_a_config_error_naming_the_key_not_the_value(s3: Cloud) -> None:
    storage = ObjectStoreStorage({**s3.options, "aws_no_such_option": SECRET})
    with pytest.raises(ConfigError) as e:
        storage.exists(s3.uri("x"))
    assert "aws_no_such_option" in str(e.value)
    assert e.value.file == "s3://bkt"
    no_secret(e.value)


def test_a_value_the_client_cannot_parse_is_a_config_error_without_the_value(s3: Cloud) -> None:
    storage = ObjectStoreStorage({**s3.options, "aws_skip_signature": SECRET})
    with pytest.raises(ConfigError) as e:
        storage.read(s3.uri("x"))
    assert "cannot configure the s3 client" in str(e.value)
    no_secret(e.value)


@pytest.mark.parametrize("endpoint", ["http://", "not a url", f"ftp://{SECRET}@127.0.0.1:9", f"{SECRET}"])
def test_a_malformed_endpoint_is_a_config_error_naming_the_key(endpoint: str) -> None:
    # object_store panics (a Rust panic, not an exception) on some of these when it signs a request
    storage = ObjectStoreStorage({**s3_options("http://127.0.0.1:1"), "AWS_ENDPOINT_URL": endpoint})
    with pytest.raises(ConfigError) as e:
        storage.read("s3://bkt/x")
    assert "aws_endpoint_url must be an http:// or https:// URL" in str(e.value)
    no_secret(e.value)
    azure = ObjectStoreStorage({**azure_options("http://127.0.0.1:1"), "azure_storage_endpoint": endpoint})
    with pytest.raises(ConfigError) as e:
        azure.read("az://bkt/x")
    assert "azure_storage_endpoint" in str(e.value)


def test_writer_only_delta_rs_options_are_accepted(s3: Cloud) -> None:
    storage = ObjectStoreStorage(
        {**s3.options, "AWS_S3_ALLOW_UNSAFE_RENAME": "true", "AWS_S3_LOCKING_PROVIDER": "dynamodb"}
    )
    assert storage.exists(s3.uri("nothing")) is False


@pytest.mark.slow
def test_aws_profile_from_the_shared_files(s3: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``aws_profile`` takes credentials from the AWS files (boto3); an unknown profile is a ConfigError."""
    s3.put("profile/x.json", b"{}")
    (tmp_path / "credentials").write_text(
        f"[tester]\naws_access_key_id = AKIDPROFILE\naws_secret_access_key = {SECRET}\n"
    )
    (tmp_path / "config").write_text("[profile tester]\nregion = us-east-1\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    base = {"aws_endpoint_url": s3.endpoint, "aws_allow_http": "true", "aws_region": "us-east-1"}
    assert ObjectStoreStorage({**base, "aws_profile": "tester"}).read(s3.uri("profile/x.json")) == b"{}"
    with pytest.raises(ConfigError) as e:
        ObjectStoreStorage({**base, "aws_profile": "nobody"}).read(s3.uri("profile/x.json"))
    assert "aws_profile" in str(e.value)
    monkeypatch.setitem(sys.modules, "boto3", None)  # as if boto3 were not installed
    with pytest.raises(ConfigError) as e:
        ObjectStoreStorage({**base, "aws_profile": "tester"}).read(s3.uri("profile/x.json"))
    assert "needs boto3" in str(e.value)


def test_environment_credentials_are_read_and_options_override_them(s3: Cloud, monkeypatch: pytest.MonkeyPatch) -> None:
    s3.put("env/x.json", b"{}")
    for k, v in s3.options.items():
        monkeypatch.setenv(k.upper(), v)
    assert ObjectStoreStorage({}).read(s3.uri("env/x.json")) == b"{}"  # everything from the environment
    dead = f"http://127.0.0.1:{free_port()}"
    storage = ObjectStoreStorage({"aws_endpoint_url": dead, "max_retries": "0"})  # an option beats the environment
    with pytest.raises(StorageError):
        storage.read(s3.uri("env/x.json"))


# ---------------------------------------------------------------- listing


@pytest.mark.slow
def test_list_from_lists_files_in_order_after_the_start(cloud: Cloud) -> None:
    cloud.put_all((f"t/_delta_log/{n}", b"{}\n") for n in log_names(range(6)))
    cloud.put("t/_delta_log/00000000000000000004.checkpoint.parquet", b"PAR1")
    cloud.put("t/_delta_log/_last_checkpoint", b"{}")
    cloud.put("t/_delta_log/_sidecars/aaa.parquet", b"x")
    cloud.put("t/_delta_log/_staged_commits/00000000000000000006.uuid.json", b"x")
    cloud.put("t/_delta_logx/00000000000000000009.json", b"x")  # a sibling prefix, not in the directory
    storage = ObjectStoreStorage(cloud.options)

    names = [f.name for f in storage.list_from(cloud.uri("t/_delta_log"))]
    expected = [*log_names(range(4)), "00000000000000000004.checkpoint.parquet", *log_names(range(4, 6))]
    assert names == [*expected, "_last_checkpoint"]

    after = storage.list_from(cloud.uri("t/_delta_log"), "00000000000000000003.~")
    assert [f.name for f in after] == [
        "00000000000000000004.checkpoint.parquet",
        "00000000000000000004.json",
        "00000000000000000005.json",
        "_last_checkpoint",
    ]
    assert (after[0].size, after[1].size) == (4, 3)
    now_ms = time.time() * 1000
    assert all(abs(f.modification_time - now_ms) < 10 * 60_000 and f.modification_time % 1000 == 0 for f in after)
    assert storage.list_from(cloud.uri("t/_delta_log"), "_last_checkpoint") == []


@pytest.mark.slow
@pytest.mark.parametrize("which", ["s3", "azure"])
def test_listing_after_a_key_is_one_request_for_the_new_files_only(
    which: str, request: pytest.FixtureRequest, proxy_for: Callable[[Server], CountingProxy]
) -> None:
    """300 commits; listed after version 289: the server is asked once, from the start key, for 10 objects."""
    cloud: Cloud = request.getfixturevalue(which)
    cloud.put_all((f"t/_delta_log/{n}", b"{}\n") for n in log_names(range(300)))
    proxy = proxy_for(cloud.server)
    storage = ObjectStoreStorage(cloud.via(proxy.endpoint).options)
    got = storage.list_from(cloud.uri("t/_delta_log"), f"{289:020d}.~")
    assert [f.name for f in got] == log_names(range(290, 300))
    assert storage.counter.requests() == 1  # one listing call of one page: one request, not two
    assert storage.counter.take() == {"list": 1, "list_page": 1, "listed": 10}
    sent = proxy.take()
    assert [kind(r) for r in sent] == ["LIST"]
    assert listing_start(sent[0]) == cloud.key(f"t/_delta_log/{289:020d}.~")


def test_listing_after_a_key_on_gcs_is_filtered_here(gcs: Cloud) -> None:
    """fake-gcs-server ignores ``start-after`` (real GCS documents it): the storage drops what it returns before."""
    gcs.put_all((f"t/_delta_log/{n}", b"{}\n") for n in log_names(range(30)))
    storage = ObjectStoreStorage(gcs.options)
    got = storage.list_from(gcs.uri("t/_delta_log"), f"{26:020d}.~")
    assert [f.name for f in got] == log_names(range(27, 30))
    assert storage.counter.take()["list"] == 1


def test_list_from_jumps_over_a_subdirectory(s3: Cloud) -> None:
    s3.put("t/_delta_log/00000000000000000000.json", b"{}")
    s3.put_all((f"t/_delta_log/_sidecars/{i:04d}.parquet", b"x") for i in range(30))
    s3.put("t/_delta_log/_zzz", b"z")
    storage = ObjectStoreStorage(s3.options)
    got = [f.name for f in storage.list_from(s3.uri("t/_delta_log"), "00000000000000000000.json")]
    assert got == ["_zzz"]
    counts = storage.counter.take()
    assert counts["list"] == 2  # one listing, and one more that starts after "_sidecars/"
    assert counts["listed"] <= 1 + 30 + 1


def test_list_from_a_missing_directory(cloud: Cloud) -> None:
    storage = ObjectStoreStorage(cloud.options)
    with pytest.raises(MissingFileError) as e:
        storage.list_from(cloud.uri("nothing/_delta_log"))
    assert e.value.file == cloud.uri("nothing/_delta_log")
    assert storage.list_from(cloud.uri("nothing/_delta_log"), "00000000000000000003.~") == []


def test_listing_a_missing_bucket_is_not_found_not_transient(moto: Server) -> None:
    storage = ObjectStoreStorage(s3_options(moto.endpoint))
    with pytest.raises(StorageError) as e:
        storage.list_from("s3://no-such-bucket/t/_delta_log")
    assert not e.value.transient
    assert "no such bucket" in str(e.value) and e.value.file == "s3://no-such-bucket/t/_delta_log"


# ---------------------------------------------------------------- reads


def test_read_whole_and_ranges(cloud: Cloud) -> None:
    data = bytes(range(256)) * 4
    cloud.put("f.bin", data)
    storage = ObjectStoreStorage(cloud.options)
    uri = cloud.uri("f.bin")
    assert storage.read(uri) == data
    assert storage.read(uri, 10, 20) == data[10:30]
    assert storage.read(uri, 1000) == data[1000:]
    assert storage.read(uri, 5, 0) == b""
    assert storage.read(uri, 1020, 100) == data[1020:]
    assert storage.counter.take() == {"get": 1, "get_range": 4}


def test_missing_objects_are_missing_file_errors(cloud: Cloud) -> None:
    storage = ObjectStoreStorage(cloud.options)
    uri = cloud.uri("no/such.json")
    ops: list[Callable[[], object]] = [
        lambda: storage.read(uri),
        lambda: storage.read(uri, 3, 4),
        lambda: storage.read(uri, 3),
        lambda: storage.stat(uri),
        lambda: storage.open_input(uri),
        lambda: storage.open_input(uri, size=100).read(10),  # with a size: found on the first read
        lambda: storage.read_many([uri]),
        lambda: storage.open_object(uri, size=100).prefetch([(0, 10)]),
        lambda: storage.read(cloud.root.split("/", 3)[0] + f"//{BUCKET}"),  # a bucket is not an object
    ]
    for op in ops:
        with pytest.raises(MissingFileError) as e:
            op()
        assert e.value.file is not None and e.value.file.endswith(("no/such.json", BUCKET))
    assert storage.exists(uri) is False


def test_an_invalid_key_is_named(s3: Cloud) -> None:
    storage = ObjectStoreStorage(s3.options)
    with pytest.raises(DeltaTailError) as e:
        storage.read(s3.uri("a/../b.json"))
    assert "not a valid object key" in str(e.value) and e.value.file == s3.uri("a/../b.json")


def test_stat_and_exists_cost_one_head_each(cloud: Cloud, proxy_for: Callable[[Server], CountingProxy]) -> None:
    cloud.put("d/00000000000000000007.json", b"12345")
    proxy = proxy_for(cloud.server)
    storage = ObjectStoreStorage(cloud.via(proxy.endpoint).options)
    info = storage.stat(cloud.uri("d/00000000000000000007.json"))
    assert (info.name, info.size) == ("00000000000000000007.json", 5)
    assert abs(info.modification_time - time.time() * 1000) < 10 * 60_000
    assert storage.exists(cloud.uri("d/00000000000000000007.json"))
    assert not storage.exists(cloud.uri("d/00000000000000000008.json"))
    assert storage.counter.take() == {"head": 3}
    assert [(kind(r), r[2]) for r in proxy.take()] == [("HEAD", 200), ("HEAD", 200), ("HEAD", 404)]


@pytest.mark.parametrize(
    "key", ["p=a b/x%20y.parquet", "p=é/ü+&=,;@$.json", "x/a%2Fb.json", "q/with?query#frag.json", "p=%25/a.json"]
)
def test_keys_with_special_characters_round_trip(cloud: Cloud, key: str) -> None:
    cloud.put(key, b"payload")
    storage = ObjectStoreStorage(cloud.options)
    assert storage.read(cloud.uri(key)) == b"payload"
    assert storage.stat(cloud.uri(key)).size == 7
    directory, _, name = cloud.uri(key).rpartition("/")
    assert [f.name for f in storage.list_from(directory)] == [name]


def test_read_many_keeps_order_and_names_the_missing_file(cloud: Cloud) -> None:
    cloud.put_all((f"m/{i:03d}.json", f"{i}".encode()) for i in range(40))
    storage = ObjectStoreStorage(cloud.options, concurrency=8)
    uris = [cloud.uri(f"m/{i:03d}.json") for i in reversed(range(40))]
    assert storage.read_many(uris) == [f"{i}".encode() for i in reversed(range(40))]
    assert storage.counter.take()["get"] == 40
    with pytest.raises(MissingFileError) as e:
        storage.read_many([uris[0], cloud.uri("m/missing.json"), uris[1]])
    assert e.value.file == cloud.uri("m/missing.json")
    assert storage.read_many([]) == []


def parquet_bytes(rows: int, row_groups: int = 4) -> tuple[bytes, pa.Table]:
    table = pa.table(
        {
            "id": pa.array(range(rows), pa.int64()),
            "s": pa.array([f"row-{i}" for i in range(rows)]),
            "f": pa.array([i / 3 for i in range(rows)]),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=max(1, rows // row_groups))
    return sink.getvalue(), table


@pytest.mark.slow
def test_open_input_reads_parquet_columns_by_ranges(cloud: Cloud, proxy_for: Callable[[Server], CountingProxy]) -> None:
    data, table = parquet_bytes(200_000)
    cloud.put("p/big.parquet", data)
    proxy = proxy_for(cloud.server)
    storage = ObjectStoreStorage(cloud.via(proxy.endpoint).options, tail_bytes=64 << 10)
    with storage.open_input(cloud.uri("p/big.parquet"), size=len(data)) as f:
        assert f.size() == len(data)
        got = pq.ParquetFile(f).read(columns=["id", "f"])
    assert got.equals(table.select(["id", "f"]))
    counts = storage.counter.take()
    assert "head" not in counts  # the size was given
    assert "get" not in counts  # never the whole object
    assert 1 <= counts["get_range"] <= 1 + 4 * 2  # the tail, then at most one range per needed column chunk
    ranges = list(proxy.ranges)
    sent = proxy.take()
    assert {kind(r) for r in sent} == {"GET"} and len(sent) == len(ranges) == counts["get_range"]
    # what was fetched: the footer's tail and the "id" and "f" chunks, never the "s" column's chunks
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    s_chunks = [meta.row_group(i).column(1) for i in range(meta.num_row_groups)]
    for chunk in s_chunks:
        start = chunk.dictionary_page_offset or chunk.data_page_offset
        end = start + chunk.total_compressed_size - 1
        assert not any(a <= end and start <= b for a, b in ranges), "a range of the unread column was fetched"
    fetched = sum(b - a + 1 for a, b in ranges)
    assert fetched < len(data) - sum(c.total_compressed_size for c in s_chunks) + (64 << 10)


def test_open_input_without_size_costs_one_head(cloud: Cloud) -> None:
    data, table = parquet_bytes(100)
    cloud.put("p/small.parquet", data)
    storage = ObjectStoreStorage(cloud.options)
    with storage.open_input(cloud.uri("p/small.parquet")) as f:
        got = pq.read_table(f)
    assert got.equals(table)
    assert storage.counter.take() == {"head": 1, "get_range": 1}  # a small file lies wholly in the tail read


def test_object_file_prefetch_serves_later_reads(s3: Cloud) -> None:
    data = bytes(range(256)) * 1000
    s3.put("r.bin", data)
    storage = ObjectStoreStorage(s3.options, tail_bytes=1024)
    f = storage.open_object(s3.uri("r.bin"), size=len(data))
    f.prefetch([(1000, 500), (50_000, 100), (len(data) + 5, 10), (7, 0)])  # ranges past the end or empty: none
    assert storage.counter.requests() == 1  # the call is counted once, its two ranges not again
    assert storage.counter.take() == {"get_ranges": 1, "get_range": 2}
    f.seek(1100)
    assert f.read(300) == data[1100:1400]
    f.seek(50_010)
    assert f.read(50) == data[50_010:50_060]
    f.seek(-10, io.SEEK_END)
    assert f.readall() == data[-10:]
    f.seek(10)
    buf = bytearray(5)
    assert f.readinto(buf) == 5 and bytes(buf) == data[10:15]
    assert f.tell() == 15 and f.size() == len(data)
    assert storage.counter.take() == {"get_range": 2}  # the tail read, and the range at 10; the rest was in hand


# ---------------------------------------------------------------- the prefetcher


def test_storage_prefetch_serves_the_read_from_memory_once(s3: Cloud) -> None:
    s3.put("pf/a.json", b"A" * 10)
    s3.put("pf/b.parquet", parquet_bytes(10)[0])
    storage = ObjectStoreStorage(s3.options)
    storage.prefetch([(s3.uri("pf/a.json"), 10), (s3.uri("pf/b.parquet"), None)])
    time.sleep(0.5)
    s3.delete("pf/a.json")  # what is read now can only come from the prefetch
    assert storage.read(s3.uri("pf/a.json")) == b"A" * 10
    with storage.open_input(s3.uri("pf/b.parquet")) as f:
        assert isinstance(f, pa.BufferReader)
        assert pq.read_table(f).num_rows == 10
    assert storage.counter.take() == {"get": 2}
    with pytest.raises(MissingFileError):  # handed out once: a second read asks the store
        storage.read(s3.uri("pf/a.json"))


def test_a_failed_prefetch_is_read_again_and_raises_the_genuine_error(s3: Cloud) -> None:
    storage = ObjectStoreStorage(s3.options)
    missing = s3.uri("pf/missing.json")
    storage.prefetch([(missing, None)])  # never raises
    with pytest.raises(MissingFileError) as e:
        storage.read(missing)
    assert e.value.file == missing
    assert storage.counter.take() == {"get": 2}  # the prefetch, and the read on demand


def test_prefetcher_is_bounded_by_bytes(s3: Cloud) -> None:
    for name in "abcd":
        s3.put(f"pf/{name}", name.encode() * 60)
    storage = ObjectStoreStorage(s3.options)
    pf = Prefetcher(storage.read, max_bytes=150)
    pf.prefetch([(s3.uri(f"pf/{n}"), 60) for n in "abcd"])
    assert pf.held == 2  # a third would pass 150 bytes: it and everything after it are not fetched ahead
    assert pf.take(s3.uri("pf/c")) is None
    assert pf.take(s3.uri("pf/a")) == b"a" * 60
    pf.prefetch([(s3.uri("pf/c"), 60), (s3.uri("pf/d"), 60)])  # room again for one
    assert pf.held == 2
    pf.prefetch([(s3.uri("pf/x"), None)])  # an unknown size counts as UNKNOWN_SIZE
    assert pf.held == 2 and UNKNOWN_SIZE > 150
    pf.close()
    assert pf.held == 0 and pf.take(s3.uri("pf/b")) is None


def test_prefetcher_drops_entries_nobody_takes(s3: Cloud) -> None:
    s3.put("pf/old", b"old")
    s3.put("pf/new", b"new")
    now = [0.0]
    pf = Prefetcher(ObjectStoreStorage(s3.options).read, stale_seconds=60.0, clock=lambda: now[0])
    pf.prefetch([(s3.uri("pf/old"), 3)])
    now[0] = 30.0
    pf.prefetch([(s3.uri("pf/new"), 3)])
    assert pf.held == 2
    now[0] = 61.0
    pf.prefetch([])
    assert pf.held == 1  # the one from t=0 is stale and dropped
    assert pf.take(s3.uri("pf/old")) is None
    assert pf.take(s3.uri("pf/new")) == b"new"
    pf.close()


# ---------------------------------------------------------------- errors and secrets


def dead_s3(**extra: str) -> dict[str, str]:
    return {
        **s3_options(f"http://127.0.0.1:{free_port()}", secret=SECRET),
        "aws_session_token": SECRET + "-token",
        "max_retries": "2",
        "retry_timeout": "3s",
        "backoff_config.init_backoff": "10ms",
        **extra,
    }


def test_connection_refused_is_a_transient_storage_error_without_secrets() -> None:
    storage = ObjectStoreStorage(dead_s3())
    uri = "s3://bkt/t/x.json"
    ops: list[tuple[str, Callable[[], object]]] = [
        ("stat", lambda: storage.stat(uri)),
        ("stat", lambda: storage.exists(uri)),
        ("stat", lambda: storage.open_input(uri)),
        ("list", lambda: storage.list_from("s3://bkt/t/_delta_log")),
        ("read", lambda: storage.read(uri)),
        ("read", lambda: storage.read(uri, 5, 5)),
        ("read", lambda: storage.read(uri, 5)),
        ("read", lambda: storage.read_many([uri])),
        ("read", lambda: storage.open_input(uri, 10).read(1)),
        ("read", lambda: storage.open_object(uri, 10).prefetch([(0, 5)])),
    ]
    started = time.monotonic()
    for op, call in ops:
        with pytest.raises(StorageError) as e:
            call()
        assert e.value.transient
        assert str(e.value).startswith(f"cannot {op}: cannot connect to the store (connection refused)")
        assert e.value.file is not None and e.value.file.startswith("s3://bkt/t/")
        no_secret(e.value, SECRET + "-token")
    assert time.monotonic() - started < 30
    assert SECRET not in repr(storage)


def test_an_azure_sas_token_never_shows(moto: Server) -> None:
    """obstore's own message carries the request URL, where a SAS token travels: it is never passed on."""
    sas = f"sv=2022-11-02&ss=b&srt=co&sp=rl&se=2099-01-01T00:00:00Z&sig={SECRET}"
    storage = ObjectStoreStorage(
        {
            "azure_storage_account_name": AZURITE_ACCOUNT,
            "azure_storage_sas_token": sas,
            "azure_storage_endpoint": f"http://127.0.0.1:{free_port()}/{AZURITE_ACCOUNT}",
            "allow_http": "true",
            "max_retries": "0",
        }
    )
    for call in (lambda: storage.read("az://bkt/x"), lambda: storage.list_from("az://bkt/t")):
        with pytest.raises(StorageError) as e:
            call()
        assert e.value.transient
        no_secret(e.value)
    assert SECRET not in repr(storage)


def test_wrong_azure_key_is_access_denied_not_transient(azure: Cloud) -> None:
    azure.put("x.json", b"{}")
    wrong = base64.b64encode(SECRET.encode() * 2).decode()
    storage = ObjectStoreStorage({**azure.options, "AZURE_STORAGE_ACCOUNT_KEY": wrong, "max_retries": "0"})
    for call in (
        lambda: storage.read(azure.uri("x.json")),
        lambda: storage.stat(azure.uri("x.json")),
        lambda: storage.list_from(azure.uri("")),
    ):
        with pytest.raises(StorageError) as e:
            call()
        assert not e.value.transient
        assert "access denied (HTTP 403)" in str(e.value)
        no_secret(e.value, wrong)


@pytest.mark.parametrize(
    ("status", "phrase", "transient"),
    [
        (503, "throttling requests (HTTP 503)", True),
        (429, "throttling requests (HTTP 429)", True),
        (500, "the store failed (HTTP 500)", True),
        (403, "access denied (HTTP 403)", False),
        (401, "access denied (HTTP 401)", False),
        (400, "refused the request (HTTP 400)", False),
    ],
)
def test_http_failures_are_named_and_classed(
    s3: Cloud, proxy_for: Callable[[Server], CountingProxy], status: int, phrase: str, transient: bool
) -> None:
    s3.put("h/x.json", b"{}")
    proxy = proxy_for(s3.server)
    options = {**s3.via(proxy.endpoint).options, "max_retries": "2", "backoff_config.init_backoff": "10ms"}
    storage = ObjectStoreStorage(options)
    proxy.fail_next(100, status)
    with pytest.raises(StorageError) as e:
        storage.read(s3.uri("h/x.json"))
    assert phrase in str(e.value) and e.value.transient is transient
    no_secret(e.value)
    tries = len(proxy.take())
    assert tries == (3 if transient else 1)  # transient failures are retried (max_retries 2), others are not


def test_throttling_that_passes_is_retried_transparently(
    s3: Cloud, proxy_for: Callable[[Server], CountingProxy]
) -> None:
    s3.put("throttle/x.json", b"{}")
    proxy = proxy_for(s3.server)
    storage = ObjectStoreStorage({**s3.via(proxy.endpoint).options, "backoff_config.init_backoff": "10ms"})
    proxy.fail_next(2, 503)
    assert storage.read(s3.uri("throttle/x.json")) == b"{}"
    assert [r[2] for r in proxy.take()] == [503, 503, 200]


def test_a_store_that_does_not_answer_in_time(s3: Cloud, proxy_for: Callable[[Server], CountingProxy]) -> None:
    proxy = proxy_for(s3.server)
    proxy.delay(2.0)
    storage = ObjectStoreStorage(
        {**s3.via(proxy.endpoint).options, "timeout": "300ms", "max_retries": "1", "retry_timeout": "1s"}
    )
    with pytest.raises(StorageError) as e:
        storage.stat(s3.uri("slow.json"))
    assert e.value.transient and "did not answer in time" in str(e.value)
    proxy.delay(0)


# ---------------------------------------------------------------- pickling, reader processes


def test_storage_pickles_as_its_options(cloud: Cloud) -> None:
    cloud.put("pk.json", b"{}")
    storage = ObjectStoreStorage(cloud.options, tail_bytes=1234, concurrency=3)
    storage.read(cloud.uri("pk.json"))
    clone = pickle.loads(pickle.dumps(storage))
    assert isinstance(clone, ObjectStoreStorage)
    assert (clone.options, clone.tail_bytes, clone.concurrency) == (storage.options, 1234, 3)
    assert clone.read(cloud.uri("pk.json")) == b"{}"
    assert isinstance(clone.counter, RequestCounter) and clone.counter.requests() == 1


def write_history(uri: str, options: dict[str, str]) -> None:
    """Six versions written by deltalake: create (partitioned, CDF on), append, delete, update, merge, overwrite."""
    df = pa.table(
        {"id": pa.array(range(20), pa.int64()), "v": [f"v{i}" for i in range(20)], "p": [i % 3 for i in range(20)]}
    )
    cdf = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(uri, df, storage_options=options, partition_by=["p"], configuration=cdf)
    more = df.slice(0, 5).set_column(0, "id", pa.array(range(100, 105), pa.int64()))
    write_deltalake(uri, more, storage_options=options, mode="append")
    DeltaTable(uri, storage_options=options).delete("id < 3")
    DeltaTable(uri, storage_options=options).update(predicate="id = 5", updates={"v": "'five'"})
    src = pa.table({"id": pa.array([6, 7, 500], pa.int64()), "v": ["m6", "m7", "m500"], "p": [0, 1, 2]})
    (
        DeltaTable(uri, storage_options=options)
        .merge(src, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    write_deltalake(uri, df.slice(0, 2), storage_options=options, mode="overwrite")


CHILD = """
import pickle, sys
storage = pickle.loads(sys.stdin.buffer.read())
sys.stdout.buffer.write(storage.read(sys.argv[1]) + repr(storage.counter.snapshot()).encode())
"""


@pytest.mark.slow
def test_storage_pickled_into_another_process_reads_there(cloud: Cloud, tmp_path: Path) -> None:
    """What a reader process or a Spark executor gets: the storage by pickle, rebuilt on the other side."""
    cloud.put("child/x.json", b"from-the-store")
    storage = ObjectStoreStorage(cloud.options)
    child = subprocess.run(
        [sys.executable, "-c", CHILD, cloud.uri("child/x.json")],
        input=pickle.dumps(storage),
        capture_output=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert child.returncode == 0, child.stderr.decode()
    assert child.stdout == b"from-the-store{'get': 1}"


@pytest.mark.slow
def test_reader_processes_are_not_used_on_a_remote_store(s3: Cloud) -> None:
    """Small files on a store are fetched ahead concurrently and decoded here; the rows are the same."""
    uri = s3.uri("procs")
    write_history(uri, s3.writer_options)
    storage = ObjectStoreStorage(s3.options)
    in_process = ChangeFeed(uri, storage, ChangeOptions(reader_processes=0)).read_table(0)
    pool = ReaderPool(2)
    try:
        with_pool = ChangeFeed(uri, storage, ChangeOptions(reader_processes=2), pool=pool).read_table(0)
        assert pool.files_sent == 0
    finally:
        pool.close()
    assert with_pool.equals(in_process) and in_process.num_rows > 0


@pytest.mark.slow
@pytest.mark.parametrize("which", ["s3", "azure"])
def test_a_backlog_on_a_store_is_found_by_listing_not_one_request_per_commit(
    which: str, request: pytest.FixtureRequest, proxy_for: Callable[[Server], CountingProxy]
) -> None:
    """300 commits after the cursor: two are found by name (GETs, kept for their reads), the other 298 in one
    listing request."""
    cloud: Cloud = request.getfixturevalue(which)
    cloud.put_all((f"t/_delta_log/{n}", b"{}\n") for n in log_names(range(301)))
    proxy = proxy_for(cloud.server)
    log = DeltaLog(cloud.uri("t"), ObjectStoreStorage(cloud.via(proxy.endpoint).options))
    found = log.discover_commits(0)
    assert [v for v, _ in found] == list(range(1, 301))
    assert all(info.size == 3 for _, info in found)
    assert [kind(r) for r in proxy.take()] == ["GET", "GET", "LIST"]
    assert log.read_commit(1).version == 1 and proxy.take() == []  # the probe's bytes: no second request
    assert [v for v, _ in log.discover_commits(0, limit=100)] == list(range(1, 101))  # a limit holds
    assert [v for v, _ in log.discover_commits(299)] == [300]  # one new commit: found by name, 301 is not there
    assert [kind(r) for r in proxy.take()] == ["GET", "GET", "LIST", "GET", "GET"]


@pytest.mark.parametrize("deferred", [False, True], ids=["checked-at-once", "checked-alongside"])
def test_following_a_store_costs_one_request_per_idle_poll_and_two_round_trips_to_rows_of_a_commit(
    s3: Cloud, proxy_for: Callable[[Server], CountingProxy], deferred: bool
) -> None:
    """Idle: one GET (not found). A commit lands: the GET finds it (its bytes are the read) and the head commit
    is checked (recreated tables) with a HEAD, at once or (deferred, as the tailer does) on a thread while the
    data is read, awaited before delivery; the call after lists the log once from the head's own commit (more
    commits, or a gap; the head checked from the listing, no HEAD) instead of probing.
    """
    uri = s3.uri("f")
    write_deltalake(uri, pa.table({"id": [1, 2]}), storage_options=s3.writer_options)
    proxy = proxy_for(s3.server)
    log = DeltaLog(uri, ObjectStoreStorage(s3.via(proxy.endpoint).options))
    follower = LogFollower(log, log.snapshot(0), gap_check_seconds=3600)
    follower.defer_checks = deferred
    proxy.take()  # the snapshot's reads
    assert follower.discover() == []  # the first call probes, then lists the log (a gap check, the head checked)
    assert [kind(r) for r in proxy.take()] == ["GET", "LIST"]
    assert follower.discover() == [] and [kind(r) for r in proxy.take()] == ["GET"]
    write_deltalake(uri, pa.table({"id": [3]}), mode="append", storage_options=s3.writer_options)
    write_deltalake(uri, pa.table({"id": [4]}), mode="append", storage_options=s3.writer_options)
    assert follower.discover() == [1]  # one commit by name, delivered before the next is looked for
    if deferred:
        assert follower.plan(1).plan.tasks  # planned (and its data read) while the check is in flight
        follower.confirm_not_recreated()
        assert sorted(kind(r) for r in proxy.take()) == ["GET", "HEAD"]
    else:
        assert [kind(r) for r in proxy.take()] == ["GET", "HEAD"]
        assert follower.plan(1).plan.tasks and [kind(r) for r in proxy.take()] == []  # the commit came with the GET
    assert follower.discover() == [2]  # the rest by one listing, which holds the head's commit: no HEAD
    listed = proxy.take()
    assert [kind(r) for r in listed] == ["LIST"] and listing_start(listed[0]) == s3.key(f"f/_delta_log/{0:020d}.~")
    follower.plan(2)
    proxy.take()
    assert follower.discover() == [] and [kind(r) for r in proxy.take()] == ["LIST"]  # nothing more: listed once
    assert follower.discover() == [] and [kind(r) for r in proxy.take()] == ["GET"]  # idle again
