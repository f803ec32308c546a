"""Tables in S3: deltatail side by side with deltalake on the same tables in one moto server (issue #17).

Run ``.venv/bin/python -m benchmarks.objectstore`` (about five minutes on two cores; the local tables of
``benchmarks.changes`` are written the first time, under ``benchmarks/.data/changes``, and reused) or
add ``--quick`` for a smoke run. One moto S3 server runs on 127.0.0.1 for the whole run (the fixtures'
server of ``tests/objectstores.py``); a counting reverse proxy in front of it is the independent
witness of what each reader asks the store. Sections:

1. **Following one commit at a time** at a 100 ms poll interval (``--poll-interval 0.1
   --max-poll-interval 0.1``; an object store cannot be watched): one-row commits published to S3 at
   random instants (their data file first, then the commit object, timed just before its PUT); a
   ``Tailer`` follows into the JSON lines sink. Commit-to-rows latency (to Arrow rows in hand, and to
   rows fsynced) p50/p99, and the time per commit (from the start of the poll that found it to its
   rows in hand) against deltalake's ``update_incremental()`` + ``load_cdf(v, v).read_all()`` for the
   same commit on an identical twin table (its requests read from moto's access log). Targets: p99
   within the poll interval plus 50 ms; at least 10x less time per commit.
2. **Requests**: an idle table followed with the defaults (poll every 1 s, backing off to 5 s; a
   listing every 10 s) for a minute, and at a 100 ms poll (requests per poll); then one commit at a
   time (requests per followed commit). Counted by the storage's ``RequestCounter`` and by the proxy,
   which also checks that every listing starts after a key (never a whole-log listing). Targets: no
   whole-log listing; at most 2 requests per poll while idle.
3. **Catch-up**: the 2,000 one-file appends and the 500-commit mixed history of
   :mod:`benchmarks.cdf_workloads`, uploaded to S3; deltatail's ``ChangeFeed`` over ``s3://...``
   against deltalake's ``load_cdf`` over the same ``s3://...`` table, every batch counted and
   dropped. Median of interleaved runs after a warm-up, whose requests (moto's access log: the proxy
   cannot serve deltalake, which holds the GIL while it waits) are counted for each side. Target:
   deltatail at least as fast.

Following runs first, on a fresh server: moto's pauses grow with what it holds, which real S3's do not.
``--profile`` prints cProfile's hot spots of deltatail's catch-up and following.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import os
import platform
import pstats
import random
import shlex
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import deltalake
import obstore as obs
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from benchmarks.cdf_workloads import AppendsSpec, MixedSpec, Workload, ensure
from benchmarks.latency import CountingSink, TimedJsonLines
from deltatail.tailer.cli.process import tune_for_latency
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.read.feed import ChangeFeed
from deltatail.tailer.storage.objectstore import ObjectStoreStorage

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT / "tests"))  # the test servers (tests/ is not a package); after the project's imports
from objectstores import (  # noqa: E402
    BUCKET,
    CountingProxy,
    Request,
    Server,
    create_s3_bucket,
    kind,
    listing_start,
    moto_server,
    put_many,
    raw_store,
    s3_options,
)

DEFAULT_DATA = PROJECT / "benchmarks" / ".data" / "changes"
POLL = 0.1
TARGET_P99_MS = POLL * 1000 + 50
TARGET_FOLLOW_RATIO = 10.0
TARGET_REQUESTS_PER_IDLE_POLL = 2.0
CDF = {"delta.enableChangeDataFeed": "true"}


@dataclass(frozen=True)
class Config:
    appends: AppendsSpec
    mixed: MixedSpec
    repeat: int
    follow_commits: int
    idle_seconds: float
    fast_idle_seconds: float
    counted_commits: int
    data_dir: Path
    profile: bool
    quick: bool


def parse_args(argv: Sequence[str]) -> Config:
    p = argparse.ArgumentParser(prog="python -m benchmarks.objectstore", description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small tables, few commits, short idle windows")
    p.add_argument("--repeat", type=int, help="timed catch-up runs per side (default 3; 1 with --quick)")
    p.add_argument("--follow-commits", type=int, help="commits followed one at a time (default 100)")
    p.add_argument("--idle-seconds", type=float, help="idle window at the default poll settings (default 60)")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help=f"local tables (default {DEFAULT_DATA})")
    p.add_argument("--profile", action="store_true", help="cProfile of deltatail's catch-up and following")
    a = p.parse_args(argv)
    q = bool(a.quick)
    return Config(
        appends=AppendsSpec(commits=200 if q else 2_000, rows=80),
        mixed=MixedSpec(commits=60 if q else 500),
        repeat=max(1, a.repeat or (1 if q else 3)),
        follow_commits=a.follow_commits or (20 if q else 100),
        idle_seconds=a.idle_seconds or (10.0 if q else 60.0),
        fast_idle_seconds=5.0 if q else 10.0,
        counted_commits=5 if q else 20,
        data_dir=a.data_dir,
        profile=bool(a.profile),
        quick=q,
    )


# -- the store -------------------------------------------------------------------------------------


@dataclass
class Store:
    """The moto server of the run, a counting proxy in front of it, and the options of both."""

    server: Server
    proxy: CountingProxy

    @property
    def options(self) -> dict[str, str]:
        """Reader options straight to moto (timed runs)."""
        return s3_options(self.server.endpoint)

    @property
    def counted(self) -> dict[str, str]:
        """Reader options through the proxy (counted runs)."""
        return s3_options(self.proxy.endpoint)

    @property
    def writer(self) -> dict[str, str]:
        return {**self.options, "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}

    def upload(self, local: Path, prefix: str) -> str:
        """Every file under ``local`` to ``s3://bkt/<prefix>/``; returns the table URI."""
        files = [p for p in sorted(local.rglob("*")) if p.is_file()]
        put_many(
            raw_store("s3", self.server.endpoint), [(f"{prefix}/{p.relative_to(local)}", p.read_bytes()) for p in files]
        )
        return f"s3://{BUCKET}/{prefix}"

    def put(self, key: str, data: bytes) -> None:
        obs.put(raw_store("s3", self.server.endpoint), key, data)


def census(requests: list[Request]) -> Counter[str]:
    """Requests by kind and status, e.g. ``HEAD 404``, ``GET 206``, ``LIST 200``."""
    return Counter(f"{kind(r)} {r[2]}" for r in requests)


def whole_log_listings(requests: list[Request]) -> int:
    """Listings that did not start after a key (a listing of a whole prefix)."""
    return sum(1 for r in requests if kind(r) == "LIST" and not listing_start(r))


def fmt_census(c: Counter[str]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items())) or "none"


# -- 1. catch-up -----------------------------------------------------------------------------------


def deltatail_rows(uri: str, options: dict[str, str], first: int, last: int) -> int:
    rows = 0
    for batch in ChangeFeed(uri, ObjectStoreStorage(options)).batches(first, last):
        rows += batch.rows.num_rows
    return rows


def load_cdf_rows(uri: str, options: dict[str, str], first: int, last: int) -> int:
    table = DeltaTable(uri, storage_options=options)
    reader = pa.RecordBatchReader.from_stream(table.load_cdf(starting_version=first, ending_version=last))
    return sum(b.num_rows for b in reader)


def tailer_rows(uri: str, options: dict[str, str], first: int, last: int) -> int:
    """``deltatail run --until-caught-up`` in-process (the Tailer, its checkpoints to a temporary state dir)."""
    with tempfile.TemporaryDirectory(prefix="deltatail-objectstore-state-") as state:
        sink = CountingSink()
        config = TailerConfig(
            table=uri, state_dir=state, starting_version=first, until_caught_up=True, storage_options=options
        )
        Tailer(config, sink).run()
    return sink.rows


READERS: dict[str, Callable[[str, dict[str, str], int, int], int]] = {
    "deltatail": deltatail_rows,
    "tailer": tailer_rows,
    "load_cdf": load_cdf_rows,
}
"""``deltatail``: ``ChangeFeed`` (as ``deltatail changes``); ``tailer``: ``deltatail run`` until caught up."""


@dataclass
class CatchUpResult:
    label: str
    rows: dict[str, int]
    samples: dict[str, list[float]]
    requests: dict[str, Counter[str]]

    def median(self, side: str) -> float:
        return statistics.median(self.samples[side])

    @property
    def ratio(self) -> float:
        """load_cdf's time over deltatail's (> 1: deltatail faster)."""
        return self.median("load_cdf") / self.median("deltatail")

    @property
    def tailer_ratio(self) -> float:
        """load_cdf's time over the tailer's."""
        return self.median("load_cdf") / self.median("tailer")


def catch_up(store: Store, work: Workload, prefix: str, label: str, cfg: Config) -> CatchUpResult:
    started = time.perf_counter()
    uri = store.upload(work.path, prefix)
    print(f"  uploaded {work.path.name} to {uri} in {time.perf_counter() - started:.1f} s", flush=True)
    result = CatchUpResult(label, {}, {s: [] for s in READERS}, {})
    for rep in range(1 + cfg.repeat):
        for side, read in READERS.items():
            gc.collect()
            offset = store.server.log_offset()
            t0 = time.perf_counter()
            result.rows[side] = read(uri, store.options, work.first, work.last)
            elapsed = time.perf_counter() - t0
            if rep:
                result.samples[side].append(elapsed)
            else:  # the warm-up run: the requests each side makes, from moto's access log
                result.requests[side] = census(store.server.requests_since(offset))
    for side in READERS:
        t = result.samples[side]
        n = result.rows[side]
        print(
            f"  {side:<10}{n:>10,} rows {statistics.median(t):8.2f} s {n / statistics.median(t):>12,.0f} rows/s"
            f"   (min {min(t):.2f}, max {max(t):.2f}; {len(t)} runs)"
        )
        print(f"  {'':<10}requests: {fmt_census(result.requests[side])} = {sum(result.requests[side].values()):,}")
    same = "" if len(set(result.rows.values())) == 1 else "  ROW COUNTS DIFFER"
    print(
        f"  ratio {result.ratio:.2f} (load_cdf time / deltatail time; target >= 1: {verdict(result.ratio >= 1)}),"
        f" tailer {result.tailer_ratio:.2f}{same}"
    )
    if cfg.profile:
        profiled(lambda: deltatail_rows(uri, store.options, work.first, work.last), f"deltatail catch-up, {label}")
    return result


# -- 2. following ----------------------------------------------------------------------------------


def one_row(v: int) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array([v], pa.int64()), "v": pa.array([f"row-{v}"])}), sink)
    return sink.getvalue()


@dataclass
class S3Table:
    """A table created by deltalake in S3 (version 0, CDF on) whose later commits are put here by hand."""

    store: Store
    prefix: str
    sizes: dict[int, int] = field(default_factory=dict)

    @property
    def uri(self) -> str:
        return f"s3://{BUCKET}/{self.prefix}"

    def create(self) -> S3Table:
        write_deltalake(
            self.uri,
            pa.table({"id": pa.array([0], pa.int64()), "v": ["row-0"]}),
            storage_options=self.store.writer,
            configuration=CDF,
        )
        return self

    def write_data(self, versions: range) -> None:
        items = []
        for v in versions:
            data = one_row(v)
            self.sizes[v] = len(data)
            items.append((f"{self.prefix}/part-{v:06d}.parquet", data))
        put_many(raw_store("s3", self.store.server.endpoint), items)

    def publish(self, v: int) -> float:
        """Put commit ``v`` (commitInfo and the add of its data file); returns the time just before the PUT."""
        now = int(time.time() * 1000)
        actions: list[dict[str, Any]] = [
            {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Append"}}},
            {
                "add": {
                    "path": f"part-{v:06d}.parquet",
                    "partitionValues": {},
                    "size": self.sizes[v],
                    "modificationTime": now,
                    "dataChange": True,
                    "stats": orjson.dumps({"numRecords": 1}).decode(),
                }
            },
        ]
        body = b"\n".join(orjson.dumps(a) for a in actions) + b"\n"
        stamp = time.perf_counter()
        self.store.put(f"{self.prefix}/_delta_log/{v:020d}.json", body)
        return stamp


class TimedTailer(Tailer):
    """A tailer that notes when each poll starts, and when the poll that found a version started."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.polls = 0
        self.found_at: dict[int, float] = {}

    def _new_versions(self, limit: int | None = None) -> list[int]:
        started = time.perf_counter()
        self.polls += 1
        found = super()._new_versions(limit)
        for v in found:
            self.found_at.setdefault(v, started)
        return found


class Following:
    """A tailer running in a thread (profiled when asked)."""

    def __init__(self, tailer: TimedTailer, profile: bool = False) -> None:
        self.tailer = tailer
        self.error: BaseException | None = None
        self.profiler = cProfile.Profile() if profile else None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        if self.profiler is not None:
            self.profiler.enable()
        try:
            self.tailer.run()
        except BaseException as e:
            self.error = e
        finally:
            if self.profiler is not None:
                self.profiler.disable()

    def stop(self) -> None:
        self.tailer.stop()
        self.thread.join(60)
        if self.error is not None:
            raise self.error


def follower(
    table: S3Table,
    work: Path,
    options: dict[str, str],
    *,
    poll: float,
    max_poll: float,
    start: int,
    notifications: str | None = None,
) -> tuple[TimedTailer, TimedJsonLines, ObjectStoreStorage]:
    """A tailer of ``table`` from version ``start`` into a timed JSON lines file, on its own counted storage.

    With ``notifications`` (an SQS queue's URL) it is woken by the queue; ``max_poll`` is then its safety poll.
    """
    storage = ObjectStoreStorage(options)
    sink = TimedJsonLines(str(work / "out.jsonl"))
    config = TailerConfig(
        table=table.uri,
        state_dir=str(work / "state"),
        starting_version=start,
        poll_interval=poll,
        max_poll_interval=max_poll,
        watch=False,
        storage_options=options,
        notifications=notifications,
    )
    tailer = TimedTailer(config, sink, feed=ChangeFeed(table.uri, storage, config.options))
    return tailer, sink, storage


def pct(xs: Sequence[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


@dataclass
class FollowResult:
    in_hand: list[float]
    flushed: list[float]
    work: list[float]
    deltalake: list[float]
    deltalake_requests: Counter[str]
    commits: int

    @property
    def ratio(self) -> float:
        return statistics.median(self.deltalake) / statistics.median(self.work)


def follow(store: Store, base: Path, cfg: Config) -> FollowResult:
    n = cfg.follow_commits
    ours, twin = S3Table(store, "follow").create(), S3Table(store, "follow-twin").create()
    for t in (ours, twin):
        t.write_data(range(1, n + 1))
    tailer, sink, _ = follower(ours, base / "follow", store.options, poll=POLL, max_poll=POLL, start=1)
    following = Following(tailer, profile=cfg.profile)
    time.sleep(1.0)  # start-up: version 0's snapshot, the first polls
    rng = random.Random(3)
    published: dict[int, float] = {}
    for v in range(1, n + 1):
        published[v] = ours.publish(v)
        time.sleep(rng.uniform(0.15, 0.35))  # commits land at random instants between polls
    sink.wait_for(n)
    following.stop()
    if following.profiler is not None:
        report_profile(following.profiler, "deltatail following (waiting left out)", leave_out="wait")
    versions = range(1, n + 1)
    in_hand = [sink.in_hand[v] - published[v] for v in versions]
    flushed = [sink.flushed[v] - published[v] for v in versions]
    work = [sink.in_hand[v] - tailer.found_at[v] for v in versions]

    dt = DeltaTable(twin.uri, storage_options=store.options)
    theirs = []
    offset = store.server.log_offset()
    for v in versions:
        twin.publish(v)
        t0 = time.perf_counter()
        dt.update_incremental()
        got = dt.load_cdf(starting_version=v, ending_version=v).read_all().num_rows
        theirs.append(time.perf_counter() - t0)
        if got != 1:
            raise RuntimeError(f"deltalake read {got} rows at version {v}")
    asked = Counter({k: v for k, v in census(store.server.requests_since(offset)).items() if not k.startswith("PUT")})
    result = FollowResult(in_hand, flushed, work, theirs, asked, n)
    print(f"  {'measure':<58}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}")
    for label, xs in (
        ("deltatail: commit PUT to Arrow rows in hand", in_hand),
        ("deltatail: commit PUT to rows fsynced by the JSON lines sink", flushed),
        ("deltatail: time per commit (poll start to rows in hand)", work),
        ("deltalake: update_incremental() + load_cdf(v, v).read_all()", theirs),
    ):
        print(f"  {label:<58}" + "".join(f"{ms(pct(xs, p)):>10}" for p in (50, 90, 99, 100)))
    per = sum(asked.values()) / n
    print(f"  deltalake's requests, {per:.1f} per commit: {fmt_census(asked)} (moto's access log, the PUTs left out)")
    p99 = pct(in_hand, 99) * 1000
    print(
        f"  p99 commit to rows in hand {p99:.1f} ms (target <= {TARGET_P99_MS:g} ms: {verdict(p99 <= TARGET_P99_MS)});"
        f" time per commit {result.ratio:.1f}x less than deltalake's (p50; target >= {TARGET_FOLLOW_RATIO:g}x:"
        f" {verdict(result.ratio >= TARGET_FOLLOW_RATIO)})"
    )
    return result


# -- 3. requests -----------------------------------------------------------------------------------


@dataclass
class RequestResult:
    idle_per_minute: Counter[str]
    idle_counter_per_minute: dict[str, float]
    per_poll: float
    per_commit: float
    commit_census: Counter[str]
    whole_log_listings: int


def requests(store: Store, base: Path, cfg: Config) -> RequestResult:
    table = S3Table(store, "census").create()
    k = cfg.counted_commits
    table.write_data(range(1, k + 1))
    proxy = store.proxy

    # (a) idle, default poll settings (1 s, backing off to 5 s; gap check every 10 s)
    defaults = TailerConfig(table="", state_dir="")
    tailer, _, storage = follower(
        table, base / "idle", store.counted, poll=defaults.poll_interval, max_poll=defaults.max_poll_interval, start=1
    )
    following = Following(tailer)
    time.sleep(2.0)
    proxy.take()
    storage.counter.take()
    time.sleep(cfg.idle_seconds)
    idle = proxy.take()
    idle_counts = storage.counter.take()
    following.stop()
    scale = 60.0 / cfg.idle_seconds
    per_minute = Counter({key: round(v * scale) for key, v in census(idle).items()})
    counter_per_minute = {key: v * scale for key, v in idle_counts.items()}
    whole = whole_log_listings(idle)
    print(
        f"  idle {cfg.idle_seconds:g} s at the defaults (poll {defaults.poll_interval:g} s backing off to "
        f"{defaults.max_poll_interval:g} s, gap check every {defaults.gap_check_seconds:g} s), per minute:"
    )
    print(f"    proxy:   {fmt_census(per_minute)}  = {sum(per_minute.values())} requests/minute")
    print(f"    storage: {', '.join(f'{a} {b:.0f}' for a, b in sorted(counter_per_minute.items()))}")
    for r in idle:
        if kind(r) == "LIST":
            print(f"    a listing, as sent: {r[0]} {r[1]}")
            break

    # (b) idle at a 100 ms poll: requests per poll
    tailer, _, storage = follower(table, base / "fast", store.counted, poll=POLL, max_poll=POLL, start=1)
    following = Following(tailer)
    time.sleep(2.0)
    proxy.take()
    polls0 = tailer.polls
    time.sleep(cfg.fast_idle_seconds)
    fast = proxy.take()
    polls = tailer.polls - polls0
    per_poll = len(fast) / max(polls, 1)
    whole += whole_log_listings(fast)
    print(
        f"  idle {cfg.fast_idle_seconds:g} s at a {POLL * 1000:g} ms poll: {len(fast)} requests in {polls} polls = "
        f"{per_poll:.2f} per poll ({fmt_census(census(fast))}); target <= {TARGET_REQUESTS_PER_IDLE_POLL:g}: "
        f"{verdict(per_poll <= TARGET_REQUESTS_PER_IDLE_POLL)}"
    )

    # (c) one commit at a time, the same tailer: what each commit costs beyond the idle polls around it
    sink = tailer.sink
    assert isinstance(sink, TimedJsonLines)
    proxy.take()
    polls0 = tailer.polls
    for v in range(1, k + 1):
        table.publish(v)
        sink.wait_for(v)
        time.sleep(0.3)
    window = proxy.take()
    polls = tailer.polls - polls0
    following.stop()
    whole += whole_log_listings(window)
    commit_keys = {f"/{BUCKET}/census/_delta_log/{v:020d}.json" for v in range(1, k + 2)}
    # an idle poll probes the next commit by name: one GET (a HEAD before) answered 404
    idle_probes = sum(
        1 for r in window if r[0] in ("GET", "HEAD") and r[2] == 404 and r[1].split("?")[0] in commit_keys
    )
    per_commit = (len(window) - idle_probes) / k
    print(
        f"  {k} commits followed one at a time ({polls} polls): {fmt_census(census(window))};"
        f" {per_commit:.1f} requests per commit beyond the idle polls' one probe each"
    )
    print(f"  listings of a whole log (no start key): {whole} (target 0: {verdict(whole == 0)})")
    return RequestResult(per_minute, counter_per_minute, per_poll, per_commit, census(window), whole)


# -- printing --------------------------------------------------------------------------------------


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def report_profile(profiler: cProfile.Profile, title: str, *, leave_out: str = "") -> None:
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    print(f"  cProfile, {title}, by own time:")
    lines = [line for line in out.getvalue().splitlines() if line.strip() and (not leave_out or leave_out not in line)]
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    for line in lines[start : start + 18]:
        print(f"    {line}")


def profiled(run: Callable[[], object], title: str) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    report_profile(profiler, title)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(cfg: Config, argv: Sequence[str]) -> None:
    print(f"command   {shlex.join([sys.executable, '-m', 'benchmarks.objectstore', *argv])}")
    print(f"machine   {cpu_model()}, nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    print(
        f"versions  python {platform.python_version()}, pyarrow {pa.__version__}, deltalake {deltalake.__version__},"
        f" obstore {obs.__version__}"
    )
    server = moto_server().start()
    proxy = CountingProxy(server.endpoint).start()  # deltatail only: deltalake holds the GIL while it waits
    store = Store(server, proxy)
    summary: list[str] = []
    try:
        create_s3_bucket(server.endpoint)
        print(f"store     moto at {server.endpoint}, counting proxy at {proxy.endpoint}")
        with tempfile.TemporaryDirectory(prefix="deltatail-objectstore-") as tmp:
            base = Path(tmp)
            print(f"\n== 1. following {cfg.follow_commits} one-row commits, one at a time, poll {POLL * 1000:g} ms")
            fol = follow(store, base, cfg)
            print("\n== 2. requests to the store")
            req = requests(store, base, cfg)
            a, m = cfg.appends, cfg.mixed
            results = []
            for spec, prefix, label in (
                (a, "appends", f"{a.commits:,} one-file appends of {a.rows} rows"),
                (m, "mixed", f"{m.commits}-commit mixed DML history, partitioned"),
            ):
                work = ensure(cfg.data_dir, spec)
                print(f"\n== 3. catch-up over {label}, versions {work.first}..{work.last}", flush=True)
                results.append(catch_up(store, work, prefix, label, cfg))

        for r in results:
            summary.append(
                f"catch-up, {r.label}: deltatail {r.median('deltatail'):.2f} s (run: {r.median('tailer'):.2f} s),"
                f" load_cdf {r.median('load_cdf'):.2f} s, ratio {r.ratio:.2f} (run: {r.tailer_ratio:.2f};"
                f" target >= 1: {verdict(min(r.ratio, r.tailer_ratio) >= 1)})"
            )
        p99 = pct(fol.in_hand, 99) * 1000
        summary.append(
            f"following at a {POLL * 1000:g} ms poll: commit to rows p50 {ms(statistics.median(fol.in_hand))},"
            f" p99 {p99:.1f} ms (target <= {TARGET_P99_MS:g} ms: {verdict(p99 <= TARGET_P99_MS)})"
        )
        summary.append(
            f"time per followed commit: deltatail {ms(statistics.median(fol.work))}, deltalake"
            f" {ms(statistics.median(fol.deltalake))} (p50), {fol.ratio:.1f}x (target >= {TARGET_FOLLOW_RATIO:g}x:"
            f" {verdict(fol.ratio >= TARGET_FOLLOW_RATIO)})"
        )
        summary.append(
            f"idle at the defaults: {sum(req.idle_per_minute.values())} requests per minute"
            f" ({fmt_census(req.idle_per_minute)}); at a {POLL * 1000:g} ms poll {req.per_poll:.2f} per poll"
            f" (target <= {TARGET_REQUESTS_PER_IDLE_POLL:g}: {verdict(req.per_poll <= TARGET_REQUESTS_PER_IDLE_POLL)})"
        )
        summary.append(
            f"per followed commit: {req.per_commit:.1f} requests; whole-log listings: {req.whole_log_listings}"
            f" (target 0: {verdict(req.whole_log_listings == 0)})"
        )
        print("\n== summary")
        for line in summary:
            print(f"  {line}")
    finally:
        proxy.stop()
        server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(args)
    tune_for_latency()  # as `deltatail run` does
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    run(cfg, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
