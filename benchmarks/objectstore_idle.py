"""What many idle S3 tables cost in one ``deltatail serve``: requests a minute, polling against notifications (#31).

Run ``.venv/bin/python -m benchmarks.objectstore_idle`` (``--tables 200 --idle-seconds 60`` by
default; ``--quick``: 20 tables, 20 s). One moto server (S3 and SQS) on 127.0.0.1; the tables
(``--tables`` of them, one commit each, CDF on) are written straight to moto. ``deltatail serve``
runs as a child process with its store options and its queue URL pointing at a counting proxy in
front of moto, which counts every request it sends (S3 and SQS alike). For each mode, 45 s after
every table is ready, the requests of ``--idle-seconds`` with no commit are counted:

- **polling**: the defaults (poll every 1 s, doubling to 5 s; a listing every 10 s);
- **notifications**: the bucket's S3 event notifications to an SQS queue, ``notifications`` in
  ``[defaults]`` and a safety poll (``max_poll_interval``) of 1,800 s.

Target with notifications: under 5 requests a minute in all, whatever the number of tables.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import boto3

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT / "tests" / "tailer"))  # serve_child.py (tests/ is not a package)
sys.path.insert(0, str(PROJECT / "tests"))
from objectstores import (  # noqa: E402
    BUCKET,
    MOTO_KEY_ID,
    MOTO_REGION,
    MOTO_SECRET,
    CountingProxy,
    create_s3_bucket,
    kind,
    moto_server,
    put_many,
    raw_store,
    s3_options,
)
from serve_child import ServeChild  # noqa: E402

TARGET_NOTIFIED_PER_MINUTE = 5
SAFETY_SECONDS = 1800
#: Seconds between the last table ready and the idle window: on two loaded cores, 200 tables' first
#: checkpoints (each a step, so a look) spread over tens of seconds.
SETTLE_SECONDS = 45.0


def commit_zero() -> list[dict[str, Any]]:
    schema = {"type": "struct", "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}]}
    actions: list[dict[str, Any]] = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 4}},
        {
            "metaData": {
                "id": "",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {"delta.enableChangeDataFeed": "true"},
                "createdTime": int(time.time() * 1000),
            }
        },
        {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "CREATE TABLE"}},
    ]
    return actions


def write_tables(endpoint: str, n: int) -> list[str]:
    """``n`` empty tables (one commit each, distinct ids), straight to moto; their URIs."""
    items = []
    for i in range(n):
        actions = commit_zero()
        actions[1]["metaData"]["id"] = f"00000000-0000-4000-8000-{i:012d}"
        body = "".join(json.dumps(a) + "\n" for a in actions).encode()
        items.append((f"idle/t{i:04d}/_delta_log/{0:020d}.json", body))
    put_many(raw_store("s3", endpoint), items)
    return [f"s3://{BUCKET}/idle/t{i:04d}" for i in range(n)]


def notifying_queue(endpoint: str, name: str = "idle", prefix: str = "idle/") -> str:
    """A queue receiving the bucket's notifications of objects created under ``prefix`` (the bucket's only ones)."""
    kw = {
        "endpoint_url": endpoint,
        "region_name": MOTO_REGION,
        "aws_access_key_id": MOTO_KEY_ID,
        "aws_secret_access_key": MOTO_SECRET,
    }
    sqs, s3 = boto3.client("sqs", **kw), boto3.client("s3", **kw)
    url = str(sqs.create_queue(QueueName=name)["QueueUrl"])
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    rule = {"Key": {"FilterRules": [{"Name": "prefix", "Value": prefix}]}}
    config = {"QueueConfigurations": [{"QueueArn": arn, "Events": ["s3:ObjectCreated:*"], "Filter": rule}]}
    s3.put_bucket_notification_configuration(Bucket=BUCKET, NotificationConfiguration=config)
    sqs.purge_queue(QueueUrl=url)  # S3's test event of the configuration
    return url


def serve_config(tmp: Path, uris: list[str], options: dict[str, str], defaults: str) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    storage = "".join(f'{k} = "{v}"\n' for k, v in options.items())
    tables = "".join(
        f'[[tables]]\nname = "t{i:04d}"\npath = "{u}"\n[tables.storage]\n{storage}' for i, u in enumerate(uris)
    )
    file = tmp / "serve.toml"
    file.write_text(
        f'[service]\nstate_root = "{tmp / "state"}"\nlisten = "127.0.0.1:0"\n\n'
        f'[defaults]\nsink = "jsonl:{tmp}/out/{{table_name}}.jsonl"\n{defaults}\n{tables}'
    )
    (tmp / "out").mkdir(exist_ok=True)
    return file


def idle_minute(label: str, file: Path, proxy: CountingProxy, seconds: float, n: int) -> Counter[str]:
    child = ServeChild(file, file.parent / f"{label}.log")
    try:
        child.start(timeout=300)
        deadline = time.monotonic() + 600
        while child.not_ready() != {} and time.monotonic() < deadline:
            time.sleep(0.5)
        if child.not_ready() != {}:
            raise RuntimeError(f"{label}: tables not ready: {list((child.not_ready() or {}).items())[:3]}")
        time.sleep(SETTLE_SECONDS)  # past every table's first checkpoint (a look of its own when it falls due)
        proxy.take()
        time.sleep(seconds)
        sent = Counter(f"{'SQS' if 'Action=' in r[1] or r[0] == 'POST' else 'S3'} {kind(r)}" for r in proxy.take())
    finally:
        child.stop()
    per_minute = Counter({k: round(v * 60 / seconds) for k, v in sent.items()})
    total = sum(per_minute.values())
    print(f"  {label:<14} {total:>7,} requests a minute for {n} tables ({total / n:.2f} a table): {dict(per_minute)}")
    return per_minute


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.objectstore_idle", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="20 tables, 20 s")
    p.add_argument("--tables", type=int, default=200)
    p.add_argument("--idle-seconds", type=float, default=60.0)
    a = p.parse_args(argv)
    n, seconds = (20, 20.0) if a.quick else (a.tables, a.idle_seconds)
    print(f"machine   nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; {n} tables, {seconds:g} s idle")
    server = moto_server().start()
    proxy = CountingProxy(server.endpoint).start()
    try:
        create_s3_bucket(server.endpoint)
        uris = write_tables(server.endpoint, n)
        queue = notifying_queue(server.endpoint).replace(server.endpoint, proxy.endpoint)
        options = s3_options(proxy.endpoint)
        with tempfile.TemporaryDirectory(prefix="deltatail-idle-") as tmp:
            polled = idle_minute("polling", serve_config(Path(tmp) / "p", uris, options, ""), proxy, seconds, n)
        with tempfile.TemporaryDirectory(prefix="deltatail-idle-") as tmp:
            notified_defaults = f'notifications = "{queue}"\nmax_poll_interval = {SAFETY_SECONDS}\n'
            file = serve_config(Path(tmp) / "n", uris, options, notified_defaults)
            notified = idle_minute("notifications", file, proxy, seconds, n)
        total = sum(notified.values())
        print("\n== summary")
        print(
            f"  idle, {n} tables in one serve: polling {sum(polled.values()):,} requests a minute,"
            f" notifications {total:,} (target < {TARGET_NOTIFIED_PER_MINUTE}:"
            f" {'met' if total < TARGET_NOTIFIED_PER_MINUTE else 'MISSED'})"
        )
    finally:
        proxy.stop()
        server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
