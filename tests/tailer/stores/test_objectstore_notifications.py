"""Following S3 tables from S3 event notifications delivered to SQS (both moto's, real servers on 127.0.0.1).

The bucket's notification configuration sends every object created under the test's prefix to an
SQS queue, as S3 does. Proven here:

- the queue's messages become ``(bucket, key)`` of the objects created (S3's test event ignored),
  and are deleted once acknowledged, after the tables they name were woken;
- a tailer with ``notifications`` and a safety poll of an hour finds each commit through its
  notification alone, and sends the store no request at all while idle;
- notifications are hints: a relay between the bucket's queue and the tailer's loses, duplicates,
  delays and reorders them at random while a writer commits; the rows delivered equal deltalake's
  ``load_cdf``, each exactly once (the lost ones are made up for by the safety poll).
"""

from __future__ import annotations

import functools
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.errors import ConfigError, StorageError
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.log.notifications import (
    WAIT_SECONDS,
    NotificationHub,
    SqsNotifications,
    hub_for,
    s3_event_objects,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/tailer: serve_child.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py (tests/ is not a package)
from objectstores import BUCKET, MOTO_KEY_ID, MOTO_REGION, MOTO_SECRET, Cloud, CountingProxy, free_port, wait_until
from serve_child import ServeChild, delivered, expected, wait_for

pytest_plugins = ("objectstore_fixtures",)

CDF = {"delta.enableChangeDataFeed": "true"}
#: The long poll of the hubs made here: ``close`` waits out the poll in hand, SQS's 20 seconds per test otherwise.
POLL_SECONDS = 2


def client(cloud: Cloud, service: str) -> Any:
    return boto3.client(
        service,
        endpoint_url=cloud.server.endpoint,
        region_name=MOTO_REGION,
        aws_access_key_id=MOTO_KEY_ID,
        aws_secret_access_key=MOTO_SECRET,
    )


def new_queue(cloud: Cloud, name: str) -> str:
    return str(client(cloud, "sqs").create_queue(QueueName=f"{cloud.prefix}-{name}")["QueueUrl"])


def in_queue(cloud: Cloud, queue: str) -> tuple[int, int]:
    """The queue's messages: (visible, taken by a reader and not yet deleted)."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    got = client(cloud, "sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=names)["Attributes"]
    return int(got[names[0]]), int(got[names[1]])


@pytest.fixture
def notified(s3: Cloud) -> Iterator[tuple[Cloud, str]]:
    """The test's prefix announcing every object created under it to a queue (the bucket's only configuration)."""
    queue = new_queue(s3, "bucket")
    arn = client(s3, "sqs").get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = {"Key": {"FilterRules": [{"Name": "prefix", "Value": f"{s3.prefix}/"}]}}
    config = {"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"], "Filter": rule}]}
    client(s3, "s3").put_bucket_notification_configuration(Bucket=BUCKET, NotificationConfiguration=config)
    client(s3, "sqs").purge_queue(QueueUrl=queue)  # S3's test event of the configuration: each test starts empty
    yield s3, queue
    client(s3, "s3").put_bucket_notification_configuration(Bucket=BUCKET, NotificationConfiguration={})


def rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": [f"v{i}" for i in ids]})


def output(out: Path) -> list[dict[str, Any]]:
    if not out.exists():
        return []
    data = out.read_bytes()
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines() if line.strip()]


def delivered_up_to(out: Path) -> int:
    return max((int(r["_commit_version"]) for r in output(out)), default=-1)


def at_version(out: Path, version: int) -> bool:
    return delivered_up_to(out) == version


def canon(row: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in row.items() if k not in ("_commit_timestamp", "_position")))


class Following:
    """A :class:`Tailer` running on a thread until :meth:`stop`."""

    def __init__(self, config: TailerConfig, out: Path) -> None:
        self.tailer = Tailer(config, JsonLinesSink(str(out)))
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.tailer.run()
        except BaseException as e:  # handed to the test
            self.error = e

    def stop(self) -> None:
        self.tailer.stop()
        self.thread.join(60)
        if self.error is not None:
            raise self.error


def test_s3_event_notifications_are_read_off_the_queue_as_the_objects_created(notified: tuple[Cloud, str]) -> None:
    cloud, queue = notified
    cloud.put("t/_delta_log/00000000000000000000.json", b"{}")
    cloud.put("t/part with space+plus.parquet", b"x")
    source = SqsNotifications(queue, cloud.options)
    got: list[tuple[str, str]] = []

    def two() -> bool:
        got.extend(source.receive(1))
        return len(got) >= 2

    wait_until(two, 30, "two notifications")
    assert sorted(got) == sorted(
        [
            (BUCKET, cloud.key("t/_delta_log/00000000000000000000.json")),
            (BUCKET, cloud.key("t/part with space+plus.parquet")),
        ]
    )
    assert in_queue(cloud, queue) == (0, 2)  # read: taken, not yet deleted
    assert source.receive(0) == []
    source.acknowledge()
    assert in_queue(cloud, queue) == (0, 0)  # deleted once acknowledged
    source.acknowledge()  # nothing read since: no request, no error
    assert list(s3_event_objects('{"Service": "Amazon S3", "Event": "s3:TestEvent"}')) == []
    assert list(s3_event_objects("not json")) == []
    with pytest.raises(ConfigError, match="SQS queue"):
        SqsNotifications("s3://not-a-queue")
    with pytest.raises(ConfigError, match="SQS queue"):
        hub_for("https://sqs.us-east-1.amazonaws.com/")


def test_a_queue_that_cannot_be_read_is_a_transient_storage_error_naming_it(s3: Cloud) -> None:
    """Nothing listens at the queue's address: the error names the queue and the failure, never a credential."""
    queue = f"http://127.0.0.1:{free_port()}/123456789012/gone"
    options = {**s3.options, "AWS_SECRET_ACCESS_KEY": "Sup3r-Secret-Value"}
    with pytest.raises(StorageError) as failed:
        SqsNotifications(queue, options).receive(0)
    assert failed.value.transient and queue in str(failed.value)
    assert "Sup3r-Secret-Value" not in str(failed.value)


def test_a_delete_the_queue_refuses_is_a_transient_storage_error_and_the_message_stays(
    notified: tuple[Cloud, str],
) -> None:
    """The queue refuses the delete (403): the error names the queue; the message is still there (a hint again)."""
    cloud, queue = notified
    proxy = CountingProxy(cloud.server.endpoint).start()
    try:
        source = SqsNotifications(queue.replace(cloud.server.endpoint, proxy.endpoint), cloud.options)
        cloud.put("t/_delta_log/00000000000000000000.json", b"{}")
        got: list[tuple[str, str]] = []

        def heard() -> bool:
            got.extend(source.receive(1))
            return bool(got)

        wait_until(heard, 30, "the notification")
        proxy.fail_next(1, 403)
        with pytest.raises(StorageError, match="cannot write the notification queue") as failed:
            source.acknowledge()
    finally:
        proxy.stop()
    assert failed.value.transient and proxy.endpoint in str(failed.value)
    assert in_queue(cloud, queue) == (0, 1)  # not deleted: it comes back after its visibility timeout


@pytest.mark.slow
def test_a_notified_tailer_finds_commits_by_their_notification_and_sends_nothing_while_idle(
    notified: tuple[Cloud, str], tmp_path: Path
) -> None:
    """A safety poll of an hour: without the notifications nothing after version 0 would be found."""
    cloud, queue = notified
    uri = cloud.uri("t")
    write_deltalake(uri, rows([0, 1]), storage_options=cloud.writer_options, configuration=CDF)
    proxy = CountingProxy(cloud.server.endpoint).start()
    out = tmp_path / "out.jsonl"
    config = TailerConfig(
        table=uri,
        state_dir=str(tmp_path / "state"),
        poll_interval=0.05,
        max_poll_interval=3600,
        gap_check_seconds=3600,
        notifications=queue,
        storage_options=cloud.via(proxy.endpoint).options,
    )
    following = Following(config, out)
    try:
        wait_until(lambda: delivered_up_to(out) == 0, 60, "version 0 delivered")
        for v in (1, 2, 3):
            write_deltalake(uri, rows([10 * v]), storage_options=cloud.writer_options, mode="append")
            wait_until(functools.partial(at_version, out, v), 60, f"version {v} delivered on its notification")
        time.sleep(0.5)  # the look after the last commit (its listing) is done
        proxy.take()
        time.sleep(2.0)
        assert proxy.take() == []  # idle: no poll, no listing
    finally:
        following.stop()
        proxy.stop()
    expected = pa.table(DeltaTable(uri, storage_options=cloud.writer_options).load_cdf(0, 3).read_all())
    assert Counter(canon(r) for r in output(out)) == Counter(canon(r) for r in expected.to_pylist())


class Relay:
    """Moves notifications from the bucket's queue to the tailer's, losing, duplicating, delaying and reordering.

    Each message is, at random: lost (a quarter), sent twice, or held back for a few rounds; held
    messages go out shuffled (reordered).
    """

    def __init__(self, cloud: Cloud, source: str, target: str, seed: int) -> None:
        self.sqs = client(cloud, "sqs")
        self.source, self.target = source, target
        self.rng = random.Random(seed)
        self.held: list[tuple[int, str]] = []  # (rounds left, body)
        self.counts: Counter[str] = Counter()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopping.is_set():
            answer = self.sqs.receive_message(QueueUrl=self.source, MaxNumberOfMessages=10, WaitTimeSeconds=1)
            for m in answer.get("Messages", []):
                self.sqs.delete_message(QueueUrl=self.source, ReceiptHandle=m["ReceiptHandle"])
                self._route(m["Body"])
            ready = [body for rounds, body in self.held if rounds <= 0]
            self.held = [(rounds - 1, body) for rounds, body in self.held if rounds > 0]
            self.rng.shuffle(ready)
            self.counts["reordered"] += len(ready) > 1
            for body in ready:
                self.sqs.send_message(QueueUrl=self.target, MessageBody=body)

    def _route(self, body: str) -> None:
        if '"Records"' not in body:
            return
        draw = self.rng.random()
        if draw < 0.25:
            self.counts["lost"] += 1
        elif draw < 0.5:
            self.counts["duplicated"] += 1
            self.held += [(0, body), (self.rng.randrange(3), body)]
        elif draw < 0.75:
            self.counts["delayed"] += 1
            self.held.append((self.rng.randrange(1, 4), body))
        else:
            self.held.append((0, body))

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)


WRITER_OPS = 16


def write_changes(uri: str, options: dict[str, str], seed: int) -> int:
    """Appends, deletes, updates and merges in turn, at random instants; returns the last version."""
    rng = random.Random(seed)
    next_id = 100
    for step in range(WRITER_OPS):
        op = step % 4
        dt = DeltaTable(uri, storage_options=options)
        if op == 0:
            write_deltalake(uri, rows(list(range(next_id, next_id + 5))), storage_options=options, mode="append")
            next_id += 5
        elif op == 1:
            dt.delete(f"id % 5 = {rng.randrange(5)}")
        elif op == 2:
            dt.update(predicate=f"id % 3 = {rng.randrange(3)}", updates={"v": "'u'"})
        else:
            source = rows([rng.randrange(next_id), next_id])
            next_id += 1
            merge = dt.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
            merge.when_matched_update_all().when_not_matched_insert_all().execute()
        time.sleep(rng.uniform(0.0, 0.3))
    return DeltaTable(uri, storage_options=options).version()


@pytest.mark.slow
def test_lost_duplicated_delayed_and_reordered_notifications_never_change_the_rows(
    notified: tuple[Cloud, str], tmp_path: Path
) -> None:
    cloud, bucket_queue = notified
    uri = cloud.uri("t")
    write_deltalake(uri, rows(list(range(20))), storage_options=cloud.writer_options, configuration=CDF)
    tailer_queue = new_queue(cloud, "tailer")
    relay = Relay(cloud, bucket_queue, tailer_queue, seed=31)
    out = tmp_path / "out.jsonl"
    config = TailerConfig(
        table=uri,
        state_dir=str(tmp_path / "state"),
        poll_interval=0.05,
        max_poll_interval=1.0,  # the safety poll that makes up for lost notifications
        checkpoint_commits=1,
        notifications=tailer_queue,
        storage_options=cloud.options,
    )
    following = Following(config, out)
    try:
        last = write_changes(uri, cloud.writer_options, seed=7)
        wait_until(lambda: delivered_up_to(out) == last, 90, f"every version up to {last} delivered")
    finally:
        relay.stop()
        following.stop()
    assert relay.counts["lost"] and relay.counts["duplicated"] and relay.counts["delayed"], relay.counts
    expected = pa.table(DeltaTable(uri, storage_options=cloud.writer_options).load_cdf(0, last).read_all())
    lines = output(out)
    assert Counter(canon(r) for r in lines) == Counter(canon(r) for r in expected.to_pylist())
    positions = [tuple(r["_position"]) for r in lines]
    assert len(positions) == len(set(positions)), "a position was delivered twice"


def test_the_hub_wakes_a_table_before_it_deletes_the_message_that_named_it(notified: tuple[Cloud, str]) -> None:
    """The delete is not a round trip between a commit's notification and the follower's look.

    When the table is woken its message is still taken, not deleted (the delete goes out after the
    wake-ups); once the hub has moved on the message is gone from the queue.
    """
    cloud, queue = notified
    hub = NotificationHub(SqsNotifications(queue, cloud.options), wait_seconds=POLL_SECONDS)
    seen: list[tuple[int, int]] = []
    hub.subscribe(cloud.uri("t/_delta_log"), lambda: seen.append(in_queue(cloud, queue)))
    cloud.put("t/_delta_log/00000000000000000000.json", b"{}")
    try:
        wait_until(lambda: bool(seen) and in_queue(cloud, queue) == (0, 0), 30, "the notification, then its delete")
    finally:
        hub.close()
    assert seen == [(0, 1)]


def test_the_hub_reads_the_queue_only_while_a_table_listens(notified: tuple[Cloud, str]) -> None:
    """The last subscriber's end stops the hub's long-poll thread; a new subscriber starts one and is woken.

    A notification that arrives while nobody listens ends the stopping thread's long poll and is
    dropped from the queue (a hint nobody needs); the next subscriber hears of the next object.
    """
    cloud, queue = notified
    hub = NotificationHub(SqsNotifications(queue, cloud.options), wait_seconds=POLL_SECONDS)
    before = set(threading.enumerate())
    try:
        first = hub.subscribe(cloud.uri("t/_delta_log"), lambda: None)
        (thread,) = set(threading.enumerate()) - before
        assert hub.running and thread.is_alive()
        hub.unsubscribe(first)
        assert not hub.running
        cloud.put("t/_delta_log/00000000000000000000.json", b"{}")
        wait_until(lambda: not thread.is_alive(), 30, "the hub's thread to end once nobody listens")
        assert in_queue(cloud, queue) == (0, 0)
        woken: list[float] = []
        hub.subscribe(cloud.uri("t/_delta_log"), lambda: woken.append(time.monotonic()))
        assert hub.running
        cloud.put("t/_delta_log/00000000000000000001.json", b"{}")
        wait_until(lambda: bool(woken), 30, "the new subscriber to be woken by the new thread")
    finally:
        hub.close()
    assert not hub.running


def test_one_hub_wakes_only_the_tables_whose_log_an_object_is_in(s3: Cloud) -> None:
    """The hub's routing: a notification wakes the subscribers of its log (once), not those of other tables."""
    hub = NotificationHub(SqsNotifications(new_queue(s3, "hub"), s3.options), wait_seconds=POLL_SECONDS)
    woken: Counter[str] = Counter()
    a = hub.subscribe("s3://b/lake/a/_delta_log", lambda: woken.update(["a"]))
    hub.subscribe("s3a://b/lake/ab/_delta_log", lambda: woken.update(["ab"]))
    hub.deliver([("b", "lake/a/_delta_log/00000000000000000001.json"), ("b", "lake/a/_delta_log/x.crc")])
    hub.deliver([("other", "lake/a/_delta_log/00000000000000000002.json"), ("b", "lake/a/part-0.parquet")])
    assert woken == Counter({"a": 1})
    hub.unsubscribe(a)
    hub.deliver([("b", "lake/a/_delta_log/00000000000000000003.json"), ("b", "lake/ab/_delta_log/1.json")])
    assert woken == Counter({"a": 1, "ab": 1})
    assert (hub.received, hub.matched) == (6, 3)
    hub.close()
    assert NotificationHub(hub.source, wait_seconds=60).wait_seconds == WAIT_SECONDS  # SQS's limit
    assert NotificationHub(hub.source, wait_seconds=-1).wait_seconds == 0


@pytest.mark.slow
def test_serve_follows_many_tables_from_one_queue(notified: tuple[Cloud, str], tmp_path: Path) -> None:
    """Three S3 tables in one ``deltatail serve``, notifications in ``[defaults]``, a safety poll of an hour.

    Each table's commits are found, so the one long poll of the queue wakes every table it names; the
    output of each equals deltalake's ``load_cdf``; idle, the tables send their store no request.
    """
    cloud, queue = notified
    uris = {name: cloud.uri(name) for name in ("a", "b", "c")}
    for uri in uris.values():
        write_deltalake(uri, rows([0]), storage_options=cloud.writer_options, configuration=CDF)
    storage = "".join(f'{k} = "{v}"\n' for k, v in cloud.options.items())
    tables = "".join(f'[[tables]]\nname = "{n}"\npath = "{u}"\n[tables.storage]\n{storage}' for n, u in uris.items())
    out = tmp_path / "out"
    out.mkdir()
    file = tmp_path / "serve.toml"
    file.write_text(
        f'[service]\nstate_root = "{tmp_path / "state"}"\nlisten = "127.0.0.1:0"\n\n'
        f'[defaults]\nsink = "jsonl:{out}/{{table_name}}.jsonl"\npoll_interval = 0.05\n'
        f'max_poll_interval = 3600\ncheckpoint_seconds = 0.5\nnotifications = "{queue}"\n\n{tables}'
    )
    child = ServeChild(file, tmp_path / "serve.log")

    def all_delivered() -> bool:
        return all(delivered(out / f"{n}.jsonl") == expected(u, cloud.writer_options) for n, u in uris.items())

    try:
        child.start()
        wait_for(all_delivered, "version 0 of each table", child)
        for i in (1, 2):
            for uri in uris.values():
                write_deltalake(uri, rows([i]), storage_options=cloud.writer_options, mode="append")
        wait_for(all_delivered, "every table's commits found on their notifications", child)
        time.sleep(1.0)  # the looks after the last commits are done
        before = {n: child.metric("deltatail_store_requests_total", table=n) for n in uris}
        time.sleep(2.0)
        assert {n: child.metric("deltatail_store_requests_total", table=n) for n in uris} == before  # idle: none
    finally:
        code = child.stop()
    assert code == 0
