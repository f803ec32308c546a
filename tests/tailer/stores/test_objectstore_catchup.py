"""Catching up on an object store with requests in flight, through a latency proxy that fails requests at random.

The store is moto's S3 server; between deltatail and moto runs the tests' own latency proxy
(``tests/latency_proxy.py``, a process of its own), adding first-byte latency to every request and
answering a share of them with ``503 Slow Down`` at random. Expectations never come from the code under
test: deltalake's ``load_cdf`` over the same table straight from moto, and deltatail's sequential reader
(no read-ahead) straight from moto, must both equal what the concurrent reader delivers through the
failing proxy (the order too, for the sequential reader). A store that keeps failing is reported as today:
a :class:`~state.errors.StorageError` naming the object, never rows lost or repeated.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import obstore as obs
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.state.errors import ConfigError, StateError, StorageError
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import LogFollower
from deltatail.tailer.read import prefetch
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.read_ahead import ReadAheadReader
from deltatail.tailer.storage import Storage
from deltatail.tailer.storage.local import LocalStorage
from deltatail.tailer.storage.objectstore import ObjectStoreStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/tailer: cdf_helpers (tests/ is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py, latency_proxy.py
from cdf_helpers import assert_same_rows, corpus_table
from latency_proxy import LatencyProxy, read_trace
from objectstores import BUCKET, Cloud, raw_store

pytest_plugins = ("objectstore_fixtures",)

CDF = {"delta.enableChangeDataFeed": "true"}
#: Retried quickly: a request the proxy fails costs milliseconds, not object_store's default 100 ms.
FAST_RETRY = {"max_retries": "12", "backoff_config.init_backoff": "5ms", "backoff_config.max_backoff": "50ms"}
SEQUENTIAL = ChangeOptions(read_ahead=0, reader_processes=0)
CONCURRENT = ChangeOptions(reader_processes=0)


@pytest.fixture
def failing(s3: Cloud) -> Iterator[LatencyProxy]:
    """A proxy in front of moto adding 5 ms to each request and failing about one request in five."""
    with LatencyProxy(s3.server.endpoint, delay_ms=5, fail_rate=0.2, seed=31) as proxy:
        yield proxy


def write_backlog(uri: str, options: dict[str, str], appends: int) -> int:
    """A backlog of many small commits (appends) and every kind of change (delete, update, merge); its last version."""
    write_deltalake(uri, pa.table({"id": [0, 1, 2], "v": ["a", "b", "c"]}), storage_options=options, configuration=CDF)
    for i in range(appends):
        write_deltalake(uri, pa.table({"id": [10 + i], "v": [f"n{i}"]}), storage_options=options, mode="append")
    dt = DeltaTable(uri, storage_options=options)
    dt.delete("id = 1")
    dt.update(predicate="id = 10", updates={"v": "'ten'"})
    src = pa.table({"id": [2, 99], "v": ["m2", "m99"]})
    dt.merge(
        src, "t.id = s.id", source_alias="s", target_alias="t"
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    return DeltaTable(uri, storage_options=options).version()


def test_the_proxy_adds_latency_and_fails_requests_it_forwards_to_the_real_server(s3: Cloud, tmp_path: Path) -> None:
    """What the proxy serves is moto's answer; at a failure rate of 1 every answer is a 503 (nothing forwarded).

    Its trace has a line per request answered, in order (arrival, moto's answer, the answer sent); the
    client, timing each read on its own clock, waited at least the delay for each.
    """
    s3.put("hello.txt", b"hello through the proxy")
    path = f"/{BUCKET}/{s3.key('hello.txt')}"
    trace = tmp_path / "trace"
    with LatencyProxy(s3.server.endpoint, delay_ms=20, trace=trace) as proxy:
        storage = ObjectStoreStorage(s3.via(proxy.endpoint).options)
        storage.read(s3.uri("hello.txt"), 0, 1)  # the client's connection, set up outside the timed reads
        waited: list[float] = []
        for start, length, expected in ((0, None, b"hello through the proxy"), (6, 7, b"through")):
            sent = time.monotonic()
            got = storage.read(s3.uri("hello.txt"), start, length)
            waited.append(time.monotonic() - sent)
            assert got == expected
    traced = read_trace(trace, 20)
    assert len(traced) == storage.counter.requests() == 3
    assert all(start <= server <= answered for start, server, answered in traced)
    assert min(waited) >= 0.02  # seen from the client: the proxy held each answer back by its delay
    with LatencyProxy(s3.server.endpoint, delay_ms=1, fail_rate=1.0) as proxy:
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(proxy.endpoint + path, timeout=30)
        assert failed.value.code == 503
    assert proxy.failures == 1


@pytest.mark.slow
def test_concurrent_catch_up_through_failing_requests_equals_load_cdf_and_the_sequential_reader(
    s3: Cloud, failing: LatencyProxy
) -> None:
    """Forty-odd commits read ahead 16 requests at a time while a fifth of the requests fail: the same rows."""
    uri = s3.uri("backlog")
    last = write_backlog(uri, s3.writer_options, appends=40)
    expected = pa.table(DeltaTable(uri, storage_options=s3.writer_options).load_cdf(0, last).read_all())
    sequential = ChangeFeed(uri, ObjectStoreStorage(s3.options), SEQUENTIAL).read_table(0, last)
    storage = ObjectStoreStorage({**s3.via(failing.endpoint).options, **FAST_RETRY})
    concurrent = ChangeFeed(uri, storage, CONCURRENT).read_table(0, last)
    assert (
        concurrent.num_rows == expected.num_rows == 3 + 40 + 1 + 2 + 3
    )  # inserts, a delete, an update, a merge (update + insert)
    assert_same_rows(concurrent, expected)
    assert concurrent.equals(sequential)  # the same rows in the same order
    assert storage.counter.snapshot()["get"] >= last  # read through the failing proxy, fetched ahead whole
    failing.stop()
    assert failing.failures > 10  # requests did fail, and were retried


@pytest.mark.slow
def test_deletion_vector_and_cdc_files_read_through_failing_requests_equal_the_local_sequential_read(
    s3: Cloud, failing: LatencyProxy
) -> None:
    """Deletion-vector files (ranged reads at packed offsets) and cdc files, a fifth of the requests failing."""
    local = corpus_table("kernel-rs/cdf-table-with-cdc-and-dvs")
    uri = s3.upload_dir(local, "dvs")
    expected = ChangeFeed(str(local), options=SEQUENTIAL).read_table(0)
    storage = ObjectStoreStorage({**s3.via(failing.endpoint).options, **FAST_RETRY}, read_ahead_bytes=1 << 16)
    got = ChangeFeed(uri, storage, CONCURRENT).read_table(0)
    assert got.num_rows == expected.num_rows > 0
    # the same rows in the same order; commit times are the uploaded objects' (not the local files') times
    assert got.drop(["_commit_timestamp"]).equals(expected.drop(["_commit_timestamp"]))
    failing.stop()
    assert failing.failures > 0


def test_a_store_that_keeps_failing_is_reported_naming_the_object(s3: Cloud) -> None:
    """Every request failing: the client's retries run out and the read is a StorageError naming the commit."""
    uri = s3.uri("down")
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=s3.writer_options, configuration=CDF)
    with LatencyProxy(s3.server.endpoint, delay_ms=1, fail_rate=1.0) as proxy:
        options = {**s3.via(proxy.endpoint).options, "max_retries": "1", "backoff_config.init_backoff": "5ms"}
        with pytest.raises(StorageError) as failed:
            ChangeFeed(uri, ObjectStoreStorage(options), CONCURRENT).read_table(0, 0)
    assert failed.value.transient
    assert "_delta_log" in str(failed.value) and "503" in str(failed.value)


def test_read_ahead_settings_are_storage_options_with_bounds() -> None:
    """``deltatail_concurrency`` and ``deltatail_read_ahead_bytes`` set the reader, and are checked."""
    storage = ObjectStoreStorage({"deltatail_concurrency": "4", "deltatail_read_ahead_bytes": "1048576"})
    assert (storage.concurrency, storage.read_ahead_bytes) == (4, 1 << 20)
    assert (ObjectStoreStorage().concurrency, ObjectStoreStorage().read_ahead_bytes) == (16, 64 << 20)
    for bad in ({"deltatail_concurrency": "0"}, {"deltatail_read_ahead_bytes": "lots"}):
        with pytest.raises(ConfigError, match="deltatail_"):
            ObjectStoreStorage(bad)


def followed_to_1(s3: Cloud, name: str) -> tuple[LogFollower, bytes]:
    """A table of two commits followed (deferred checks) to version 1; the bytes of commit 1."""
    uri = s3.uri(name)
    write_deltalake(uri, pa.table({"id": [1]}), storage_options=s3.writer_options, configuration=CDF)
    write_deltalake(uri, pa.table({"id": [2]}), storage_options=s3.writer_options, mode="append")
    log = DeltaLog(uri, ObjectStoreStorage(s3.options))
    follower = LogFollower(log, log.snapshot(0), gap_check_seconds=3600)
    follower.defer_checks = True
    assert follower.discover() == [1]  # by name; commit 0 checked alongside
    follower.confirm_not_recreated()  # commit 0 as read
    follower.plan(1)
    data = bytes(obs.get(raw_store("s3", s3.server.endpoint), s3.key(f"{name}/_delta_log/{1:020d}.json")).bytes())
    return follower, data


@pytest.mark.parametrize("found_by", ["name", "listing"])
def test_a_rewritten_head_commit_refuses_the_table_checked_alongside_or_from_the_listing(
    s3: Cloud, found_by: str
) -> None:
    """Commit 1 (the head) rewritten, as by a recreated table, and a commit 2 after it.

    Found by name, the HEAD of commit 1 runs alongside and awaiting it refuses the table; found by the
    listing that follows a found commit, the listing's own entry of commit 1 refuses it at once.
    """
    follower, data = followed_to_1(s3, found_by)
    if found_by == "name":
        assert follower.discover() == []  # the listing after a found commit: nothing more
    s3.put(f"{found_by}/_delta_log/{1:020d}.json", data + b"\n")  # another table's commit 1
    s3.put(f"{found_by}/_delta_log/{2:020d}.json", data)
    if found_by == "name":
        assert follower.discover() == [2]  # returned at once: the check is in flight
        with pytest.raises(StateError, match="commit 1 was rewritten"):
            follower.confirm_not_recreated()
    else:
        with pytest.raises(StateError, match="commit 1 was rewritten"):
            follower.discover()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_large_file_is_decoded_ahead_up_to_its_stores_bound(
    where: str, s3: Cloud, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 131,072 int64 rows (1 MiB and a validity bitmap) of one 2,097,152-row file, no consumer:
    a local file's worker stops once it holds ``READ_AHEAD_BYTES`` (2 MiB: two batches), an object
    store's once it holds ``REMOTE_READ_AHEAD_BYTES`` (8 MiB: eight), where it fetches a row group's
    chunks only when it reaches them. Every row still comes out, in order."""
    monkeypatch.setattr(prefetch, "READ_AHEAD_BATCHES", 64)  # the byte bound, not the count, decides here
    local = tmp_path / "t"
    write_deltalake(local, pa.table({"id": pa.array(range(1 << 21), pa.int64())}))
    storage: Storage
    if where == "local":
        uri, storage = str(local), LocalStorage()
    else:
        uri, storage = s3.upload_dir(local, "t"), ObjectStoreStorage(s3.options)
    plan = next(ChangeFeed(uri, storage).plans(0, 0))
    (task,) = plan.tasks
    batch_bytes = (1 << 17) * 8
    with ThreadPoolExecutor(max_workers=1) as threads:
        fetch = ReadAheadReader(storage, batch_size=1 << 17)._prefetch(threads, plan, task, started=True)
        try:
            waited = 0.0
            bound = prefetch.REMOTE_READ_AHEAD_BYTES if where == "s3" else prefetch.READ_AHEAD_BYTES
            while fetch.most_held < bound and waited < 60:
                time.sleep(0.05)
                waited += 0.05
            time.sleep(0.3)  # time to run further ahead, were it not held back
            held = fetch.most_held
            ids = [i for b in fetch.batches() for i in b.batch.column(0).to_pylist()]
        finally:
            fetch.cancel()
    assert ids == list(range(1 << 21))
    expected = 8 if where == "s3" else 2
    assert expected * batch_bytes <= held < (expected + 1) * batch_bytes
