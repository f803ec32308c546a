"""``deltatail run`` following tables in object stores, as a user runs it (the real command line, in a subprocess).

- **Following a live writer, killed at random instants**: a writer in another process commits to S3
  (moto) with deltalake while ``deltatail run s3://... --storage-option ...`` follows into the
  deduplicating ``jsonl:PATH`` sink; the tailer is SIGKILLed at random instants and restarted on the
  same state directory over and over, then run to the end. The output must equal deltalake's
  ``load_cdf`` over the same versions, row for row, with every position exactly once.
- **A store restart mid-stream**: Azurite, persisting to a directory, is SIGKILLed while a tailer
  follows it, stays down, and is started again on the same port and directory; the tailer process
  must keep running (its ``TailerService`` retries the transient store failure, holding the cursor)
  and deliver the commits made after the restart. What this proves is spelled out in the test.
- **Secrets**: a secret storage option (flag and ``[storage]`` TOML table) never appears in stderr
  (text and JSON logs, verbose), in the state directory, or in errors, when the store works, when it
  throttles until the retries run out, and when it refuses access.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import obstore as obs
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.tailer.storage.objectstore import ObjectStoreStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py (tests/ is not a package)
from objectstores import (
    Cloud,
    CountingProxy,
    Server,
    azurite_server,
    create_azure_container,
    ensure_azurite,
    free_port,
    raw_store,
    wait_until,
)

pytest_plugins = ("objectstore_fixtures",)

ROOT = Path(__file__).resolve().parents[3]
CDF = {"delta.enableChangeDataFeed": "true"}
SECRET = "Sup3r-Secret-Value-0xC0FFEE"
Row = tuple[tuple[str, Hashable], ...]

#: Follow quickly: poll every 50 ms (backing off to 200 ms when idle), save the cursor after every commit.
FOLLOW_FLAGS = [
    "--no-watch",
    "--poll-interval",
    "0.05",
    "--max-poll-interval",
    "0.2",
    "--checkpoint-commits",
    "1",
    "--snapshot-commits",
    "3",
]


def rows(ids: range | list[int]) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "v": pa.array([f"v{i}" for i in ids]),
            "p": pa.array([i % 4 for i in ids], pa.int64()),
        }
    )


#: A writer process: ``commits`` commits (append, delete, update, merge in turn) with deltalake, 50-300 ms apart.
WRITER = r"""
import json, random, sys, time
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

uri, options, commits, seed = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)
next_id = 100

def rows(ids):
    ids = list(ids)
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([f"v{i}" for i in ids]),
                     "p": pa.array([i % 4 for i in ids], pa.int64())})

for step in range(commits):
    op = step % 4
    if op == 0:
        write_deltalake(uri, rows(range(next_id, next_id + 10)), mode="append", storage_options=options)
        next_id += 10
    elif op == 1:
        DeltaTable(uri, storage_options=options).delete(f"id % 5 = {rng.randrange(5)}")
    elif op == 2:
        DeltaTable(uri, storage_options=options).update(predicate=f"id % 3 = {rng.randrange(3)}", updates={"v": "'u'"})
    else:
        source = rows([rng.randrange(next_id), next_id])
        next_id += 1
        (DeltaTable(uri, storage_options=options).merge(source, "t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all().when_not_matched_insert_all().execute())
    time.sleep(rng.uniform(0.05, 0.3))
"""


def flags(options: dict[str, str]) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


def start_run(
    table: str, state: Path, out: Path, stderr: Path, *extra: str, json_logs: bool = False
) -> subprocess.Popen[bytes]:
    """``deltatail run TABLE`` into ``jsonl:OUT`` as a subprocess (stderr appended to a file)."""
    command = [sys.executable, "-m", "deltatail", *(["--log-format", "json"] if json_logs else [])]
    with stderr.open("ab") as err:
        return subprocess.Popen(
            [*command, "run", table, "--state-dir", str(state), "--sink", f"jsonl:{out}", *FOLLOW_FLAGS, *extra],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def output(out: Path) -> list[dict[str, Any]]:
    """The complete lines of a ``jsonl:PATH`` output (a torn last line, from a kill, is left out)."""
    if not out.exists():
        return []
    data = out.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()]


def delivered_up_to(out: Path) -> int:
    lines = output(out)
    return max((int(r["_commit_version"]) for r in lines), default=-1)


def canon(row: dict[str, Any]) -> Row:
    return tuple(sorted((k, v) for k, v in row.items() if k not in ("_commit_timestamp", "_position")))


def expected_rows(uri: str, options: dict[str, str], last: int) -> Counter[Row]:
    table = DeltaTable(uri, storage_options=options).load_cdf(starting_version=0, ending_version=last)
    return Counter(canon(r) for r in pa.table(table.read_all()).to_pylist())


def assert_exactly_once(lines: list[dict[str, Any]], expected: Counter[Row]) -> None:
    got = Counter(canon(r) for r in lines)
    missing, extra = expected - got, got - expected
    assert not missing and not extra, (
        f"missing {sum(missing.values())} rows, e.g. {list(missing)[:2]}; extra {sum(extra.values())}, "
        f"e.g. {list(extra)[:2]}"
    )
    positions = [tuple(r["_position"]) for r in lines]
    assert len(positions) == len(set(positions)), "a position was delivered twice"
    per_version: dict[int, list[int]] = {}
    for version, index, snapshot in positions:
        assert snapshot is False
        per_version.setdefault(version, []).append(index)
    assert all(sorted(ix) == list(range(len(ix))) for ix in per_version.values())


# ---------------------------------------------------------------- a table deleted and recreated under the tailer


@pytest.mark.slow
@pytest.mark.parametrize("new_versions", [2, 5], ids=["shorter-log", "longer-log"])
def test_a_table_recreated_on_s3_while_followed_is_refused_before_a_row_of_it(
    s3: Cloud, tmp_path: Path, new_versions: int
) -> None:
    """The tailer at version 2; every object of the table deleted and a new table written with 2 or 5 versions.

    With 5 the new log holds version 3, the tailer's next commit by name: the HEAD of its head's commit,
    made alongside the data's reads, finds it rewritten before any row of the new table is delivered.
    With 2 the log now ends before the tailer's version. Either way ``deltatail run`` stops with the
    recreated-table error, and no row of the new table is in its output.
    """
    uri = s3.uri("recreated")
    write_deltalake(uri, rows(range(5)), storage_options=s3.writer_options, configuration=CDF)
    for i in (1, 2):
        write_deltalake(uri, rows([10 * i]), storage_options=s3.writer_options, mode="append")
    out, stderr = tmp_path / "out.jsonl", tmp_path / "stderr.log"
    proc = start_run(uri, tmp_path / "state", out, stderr, *flags(s3.options))
    try:
        wait_until(lambda: delivered_up_to(out) == 2 or proc.poll() is not None, 60, "versions 0..2 delivered")
        assert proc.poll() is None, stderr.read_text()[-3000:]
        store = raw_store("s3", s3.server.endpoint)
        keys = [m["path"] for chunk in obs.list(store, s3.key("recreated")) for m in chunk]
        obs.delete(store, keys)
        write_deltalake(uri, rows(range(1000, 1003)), storage_options=s3.writer_options, configuration=CDF)
        for v in range(1, new_versions):
            write_deltalake(uri, rows([1000 + 10 * v]), storage_options=s3.writer_options, mode="append")
        code = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = stderr.read_text()
    assert code != 0 and "deleted and recreated" in text, text[-3000:]
    assert uri in text
    assert all(r["id"] < 1000 for r in output(out)), "rows of the new table were delivered"
    assert {r["id"] for r in output(out)} == {0, 1, 2, 3, 4, 10, 20}


# ---------------------------------------------------------------- a live writer, the tailer killed at random


@dataclass
class KillCampaign:
    """Runs of ``deltatail run`` on one table, state directory and output, each ended by SIGKILL."""

    table: str
    options: dict[str, str]
    base: Path
    rng: random.Random
    kills: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the run, delivered up to)

    @property
    def out(self) -> Path:
        return self.base / "out.jsonl"

    @property
    def stderr(self) -> Path:
        return self.base / "stderr.log"

    def run_until_killed(self) -> None:
        proc = start_run(self.table, self.base / "state", self.out, self.stderr, *flags(self.options))
        lifetime = self.rng.uniform(0.5, 4.0)  # start-up (~1.5-2.5 s) included: some kills land before any delivery
        try:
            proc.wait(lifetime)
            raise AssertionError(f"deltatail run exited with {proc.returncode}: {self.stderr.read_text()[-3000:]}")
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        self.kills.append((lifetime, delivered_up_to(self.out)))

    def finish(self) -> None:
        until_caught_up = ["--until-caught-up", *flags(self.options)]
        proc = start_run(self.table, self.base / "state", self.out, self.stderr, *until_caught_up)
        assert proc.wait(120) == 0, self.stderr.read_text()[-3000:]


@pytest.mark.slow
def test_following_a_live_writer_through_random_kills_loses_and_repeats_nothing(s3: Cloud, tmp_path: Path) -> None:
    """~45 s: 40 commits written by another process while the tailer is killed 10+ times."""
    uri = s3.uri("live")
    write_deltalake(uri, rows(range(20)), storage_options=s3.writer_options, partition_by=["p"], configuration=CDF)
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, uri, json.dumps(s3.writer_options), "40", "7"],
        cwd=tmp_path,
        stderr=subprocess.PIPE,
    )
    campaign = KillCampaign(uri, s3.options, tmp_path, random.Random(11))
    try:
        while writer.poll() is None or len(campaign.kills) < 10:
            campaign.run_until_killed()
    finally:
        if writer.poll() is None:
            writer.kill()
    assert writer.wait() == 0, writer.stderr.read().decode() if writer.stderr else ""
    campaign.finish()

    last = DeltaTable(uri, storage_options=s3.writer_options).version()
    assert last >= 40
    assert_exactly_once(output(campaign.out), expected_rows(uri, s3.writer_options, last))
    delivered = [up_to for _, up_to in campaign.kills]
    assert delivered[-1] > delivered[0]  # the kills landed while the tailer was moving along the log
    assert len({up_to for up_to in delivered if 0 <= up_to < last}) >= 3, campaign.kills
    assert "Traceback" not in campaign.stderr.read_text()


# ---------------------------------------------------------------- a store restart mid-stream


@pytest.fixture
def azurite_on_disk(tmp_path: Path) -> Iterator[Server]:
    """An Azurite of this test's own, persisting to a directory (so a restart keeps blobs and their mtimes)."""
    exe = ensure_azurite()
    if isinstance(exe, str):
        pytest.skip(exe)
    server = azurite_server(exe, location=tmp_path / "azurite").start()
    create_azure_container(server.endpoint)
    yield server
    server.close()


#: Azurite writes its blob metadata to disk every 5 s (LokiJS autosave); a SIGKILL loses what came after.
AZURITE_AUTOSAVE = 5.0


def status_events(stderr: Path) -> list[dict[str, Any]]:
    events = []
    for line in stderr.read_text().splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


@pytest.mark.slow
def test_a_store_restart_mid_stream_is_survived_with_the_cursor_held(azurite_on_disk: Server, tmp_path: Path) -> None:
    """What this proves, with Azurite (blobs, container and modification times kept on disk across a restart):

    1. the ``deltatail run`` process does not exit while the store is down: each failed run of the tailer
       (a transient ``StorageError``: connection refused, after the storage's own retries) is restarted by
       ``TailerService`` with backoff, reported as ``store_unavailable`` status events;
    2. each restart resumes from the saved cursor, which stays at the first version not yet delivered (the
       cursor is held: never moved past undelivered rows, never moved back over delivered ones);
    3. once the store is back, the commits made after the restart are delivered: the whole output equals
       deltalake's ``load_cdf`` over every version, each row exactly once;
    4. the commits read before the restart keep their ``_commit_timestamp`` (the stored modification
       times survive), so the tailer's check that the table was not deleted and recreated (head commit's
       size and mtime unchanged) passes, rather than stopping the tailer.

    It does not prove anything about a store that loses or rewrites objects in a restart (moto's
    recorder replay re-PUTs every object with new mtimes; a tailer then refuses the table as recreated).
    """
    cloud = Cloud.fresh("azure", azurite_on_disk)
    uri = cloud.uri("restart")
    options = cloud.writer_options
    write_deltalake(uri, rows(range(10)), storage_options=options, configuration=CDF)
    out, stderr = tmp_path / "out.jsonl", tmp_path / "stderr.log"
    reader = {**cloud.options, "max_retries": "1", "retry_timeout": "1s", "backoff_config.init_backoff": "50ms"}
    proc = start_run(uri, tmp_path / "state", out, stderr, *flags(reader), json_logs=True)

    def wait(done: Callable[[], bool], what: str, timeout: float = 60) -> None:
        try:
            wait_until(lambda: done() or proc.poll() is not None, timeout, what)
            assert proc.poll() is None, f"deltatail run exited with {proc.returncode}"
        except (TimeoutError, AssertionError) as e:
            raise AssertionError(f"{e}; the tailer's stderr: {stderr.read_text()[-3000:]}") from None

    try:
        for i in range(1, 4):
            write_deltalake(uri, rows(range(10 * i, 10 * i + 10)), storage_options=options, mode="append")
        wait(lambda: delivered_up_to(out) == 3, "versions 0..3 delivered")
        stamps_before = {r["_commit_version"]: r["_commit_timestamp"] for r in output(out)}
        time.sleep(AZURITE_AUTOSAVE + 1.5)  # Azurite has saved what was written
        down_at = time.monotonic()
        azurite_on_disk.stop()  # SIGKILL
        wait(
            lambda: any(e.get("event") == "store_unavailable" for e in status_events(stderr)),
            "the tailer to report the store unavailable",
            timeout=30,
        )
        time.sleep(max(0.0, 3.0 - (time.monotonic() - down_at)))
        assert proc.poll() is None, f"deltatail run exited while the store was down: {stderr.read_text()[-3000:]}"
        azurite_on_disk.start()
        for i in range(4, 7):
            write_deltalake(uri, rows(range(10 * i, 10 * i + 10)), storage_options=options, mode="append")
        wait(lambda: delivered_up_to(out) == 6, "versions 4..6 delivered after the restart", timeout=90)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, stderr.read_text()[-3000:]

    lines = output(out)
    assert_exactly_once(lines, expected_rows(uri, options, 6))
    assert {r["_commit_version"]: r["_commit_timestamp"] for r in lines if r["_commit_version"] <= 3} == stamps_before
    storage = ObjectStoreStorage(cloud.options)
    for version in range(7):  # every row's time is its commit object's stored modification time (or +1 ms steps)
        mtime = storage.stat(f"{uri}/_delta_log/{version:020d}.json").modification_time
        stamp = next(r["_commit_timestamp"] for r in lines if r["_commit_version"] == version)
        ms = round(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() * 1000)
        assert mtime <= ms <= mtime + 10

    events = status_events(stderr)
    unavailable = [e for e in events if e.get("event") == "store_unavailable"]
    assert unavailable and all("connect" in e["message"] for e in unavailable)
    assert [e["attempt"] for e in unavailable] == list(range(1, len(unavailable) + 1))  # one process, retrying
    # a run that reaches the store resumes from the saved state: the cursor held at the first undelivered version
    resumed = [e["message"] for e in events if e["message"].startswith("resuming ")]
    held = [int(m.group(1)) for m in (re.search(r" at (\d+):s?\d+ ", r) for r in resumed) if m]
    assert held == [4], resumed
    assert not [e for e in events if e["level"] in ("error", "critical")]


# ---------------------------------------------------------------- secrets


def secret_free(text: str, where: str) -> None:
    assert SECRET not in text, f"the secret appears in {where}"


def scan_dir(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_file():
            secret_free(path.read_bytes().decode("latin-1"), str(path))


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deltatail", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def proxy_for() -> Iterator[Callable[[Server], CountingProxy]]:
    started: list[CountingProxy] = []

    def start(server: Server) -> CountingProxy:
        started.append(CountingProxy(server.endpoint).start())
        return started[-1]

    yield start
    for p in started:
        p.stop()


@pytest.mark.slow
def test_a_secret_storage_option_never_shows(
    s3: Cloud, tmp_path: Path, proxy_for: Callable[[Server], CountingProxy]
) -> None:
    """moto accepts any secret; the secret is given as a flag, and as a session token in the TOML file."""
    uri = s3.uri("secret")
    write_deltalake(uri, rows(range(5)), storage_options=s3.writer_options, configuration=CDF)
    write_deltalake(uri, rows(range(5, 9)), storage_options=s3.writer_options, mode="append")
    proxy = proxy_for(s3.server)
    options = {**s3.via(proxy.endpoint).options, "AWS_SECRET_ACCESS_KEY": SECRET}
    config = tmp_path / "deltatail.toml"
    config.write_text(f'[storage]\naws_session_token = "{SECRET}-token"\nmax_retries = "1"\nretry_timeout = "1s"\n')
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    run = ["run", uri, "--state-dir", str(state), "--sink", f"jsonl:{out}", "--config", str(config), *flags(options)]

    # a working store: the state directory fills (cursor, snapshot, lock), verbose logs in both formats
    first = run_cli("-v", *run, "--until-caught-up")
    assert first.returncode == 0, first.stderr
    assert len(output(out)) == 9 and any(state.iterdir())
    append = rows(range(9, 12))
    write_deltalake(uri, append, storage_options=s3.writer_options, mode="append")
    second = run_cli("-v", "--log-format", "json", *run, "--until-caught-up")
    assert second.returncode == 0, second.stderr
    # a store that throttles until the retries run out: the run retries, then gives up (--sink-retries 1)
    proxy.fail_next(10_000, 503)
    throttled = run_cli("-v", "--log-format", "json", *run, "--sink-retries", "1")
    assert throttled.returncode == 1 and "store_unavailable" in throttled.stderr and "HTTP 503" in throttled.stderr
    # a store that refuses access: the run stops at once
    proxy.fail_next(10_000, 403)
    denied = run_cli(*run)
    assert denied.returncode == 1 and "access denied" in denied.stderr
    proxy.fail_next(0)
    # the other commands, on a store that cannot be reached
    dead = {**options, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "max_retries": "0"}
    snapshot = run_cli("-v", "snapshot", uri, *flags(dead))
    changes = run_cli("--log-format", "json", "changes", uri, *flags(dead))
    assert snapshot.returncode == changes.returncode == 1 and "connection refused" in snapshot.stderr

    for name, result in [
        ("run", first),
        ("run (json)", second),
        ("run, throttled", throttled),
        ("run, denied", denied),
        ("snapshot", snapshot),
        ("changes", changes),
    ]:
        secret_free(result.stderr + result.stdout, f"the output of {name}")
        assert "Traceback" not in result.stderr, result.stderr
    scan_dir(state)
    secret_free(out.read_text(), "the sink's output")
    assert os.environ.get("AWS_SECRET_ACCESS_KEY") != SECRET  # the secret came only from the flag
