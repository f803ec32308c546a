"""Tables in S3 at a real store's distance: deltatail and deltalake through the same latency proxy (issue #31).

Run ``.venv/bin/python -m benchmarks.objectstore_latency`` (``--quick`` for a smoke run). One moto S3
server runs on 127.0.0.1; in front of it the tests' latency proxy (``tests/latency_proxy.py``, a
process of its own, so deltalake, which holds the GIL while it waits, is served as well) adds 20 ms,
then 50 ms, to the first byte of every answer: a real store's first-byte latency, which moto (about
3 ms here) cannot have. Both readers go through the same proxy. Sections, at each latency:

1. **Catch-up** over the 2,000 one-file appends and the 500-commit mixed history of
   :mod:`benchmarks.cdf_workloads`: deltatail's ``ChangeFeed`` against deltalake's ``load_cdf``, every
   batch counted and dropped, one timed run each after a warm-up of deltatail. Targets: at least 10x
   at 50 ms; within 2x of the ideal for deltatail's concurrency (its requests x the latency / the
   requests in flight).
2. **Following** one-row commits through the proxy, polling every 100 ms and woken by S3 event
   notifications (the bucket's notification configuration sends the log's new objects to a moto SQS
   queue, read through the same proxy; the safety poll set to 10 minutes): commit-to-rows p50/p99 and
   the time per commit from the look that found it (two round trips: the commit's GET and the data's
   GET). Target with notifications: p50 under 2 round trips + 20 ms.

``--only following`` runs the second section alone; ``--only catch-up --latency 50 --no-peer`` profiles
deltatail's catch-up alone. Every catch-up prints where its time went: the proxy's trace of each
request (when it came, when moto's first byte came back) gives the requests in flight over time and
moto's own time to answer, and moto's CPU seconds over the run (``/proc``) its cost per request.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import deltalake
import obstore as obs
import pyarrow as pa

from benchmarks.cdf_workloads import AppendsSpec, MixedSpec, Workload, ensure
from benchmarks.objectstore import (
    DEFAULT_DATA,
    POLL,
    Following,
    S3Table,
    Store,
    cpu_model,
    follower,
    load_cdf_rows,
    ms,
    pct,
    verdict,
)
from benchmarks.objectstore_idle import notifying_queue
from deltatail.tailer.cli.process import tune_for_latency
from deltatail.tailer.log.notifications import hub_for
from deltatail.tailer.read.feed import ChangeFeed
from deltatail.tailer.storage.objectstore import ObjectStoreStorage

PROJECT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT / "tests"))  # the test servers (tests/ is not a package); after the project's imports
from latency_proxy import LatencyProxy, read_trace  # noqa: E402
from objectstores import (  # noqa: E402
    BUCKET,
    CountingProxy,
    create_s3_bucket,
    moto_server,
    put_many,
    raw_store,
    s3_options,
)

LATENCIES_MS = (20, 50)
TARGET_RATIO_AT_50 = 10.0
TARGET_OF_IDEAL = 2.0
TARGET_NOTIFIED_EXTRA_MS = 20.0  # following with notifications: p50 under 2 round trips + this
SAFETY_POLL = 600.0  # notified following: the safety poll (never reached in a run)
RATE = [0.0]  # moto's requests per second here, measured at the start


@dataclass(frozen=True)
class Config:
    appends: AppendsSpec
    mixed: MixedSpec
    follow_commits: int
    data_dir: Path
    catch_up: bool
    following: bool
    latencies: tuple[int, ...]
    peer: bool


def parse_args(argv: Sequence[str]) -> Config:
    p = argparse.ArgumentParser(prog="python -m benchmarks.objectstore_latency", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small tables, few commits")
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA, help=f"local tables (default {DEFAULT_DATA})")
    p.add_argument("--only", choices=("all", "following", "catch-up"), default="all", help="the sections run")
    p.add_argument("--latency", type=int, action="append", help="ms added a request (repeatable; default 20 and 50)")
    p.add_argument("--no-peer", action="store_true", help="catch-up: deltatail only, no load_cdf")
    a = p.parse_args(argv)
    q = bool(a.quick)
    return Config(
        appends=AppendsSpec(commits=200 if q else 2_000, rows=80),
        mixed=MixedSpec(commits=60 if q else 500),
        follow_commits=10 if q else 40,
        data_dir=a.data_dir,
        catch_up=a.only != "following",
        following=a.only != "catch-up",
        latencies=tuple(a.latency or LATENCIES_MS),
        peer=not a.no_peer,
    )


@dataclass
class CatchUp:
    label: str
    latency_ms: int
    deltatail: float
    load_cdf: float
    requests: int
    concurrency: int

    @property
    def ratio(self) -> float:
        return self.load_cdf / self.deltatail

    @property
    def ideal(self) -> float:
        """The network's floor for deltatail's requests: requests x latency / requests in flight."""
        return self.requests * self.latency_ms / 1000 / self.concurrency


def deltatail_catch_up(uri: str, options: dict[str, str], work: Workload) -> tuple[int, float, ObjectStoreStorage]:
    storage = ObjectStoreStorage(options)
    t0 = time.perf_counter()
    rows = sum(b.rows.num_rows for b in ChangeFeed(uri, storage).batches(work.first, work.last))
    return rows, time.perf_counter() - t0, storage


def moto_rate(store: Store, n: int = 256) -> float:
    """Requests a second moto answers at deltatail's concurrency, straight (no proxy): the floor of any run here."""
    put_many(raw_store("s3", store.server.endpoint), [(f"rate/{i}", b"x" * 4096) for i in range(n)])
    storage = ObjectStoreStorage(store.options)
    paths = [f"s3://{BUCKET}/rate/{i}" for i in range(n)]
    storage.read_many(paths)  # warm-up: connections
    t0 = time.perf_counter()
    storage.read_many(paths)
    return n / (time.perf_counter() - t0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def where_time_went(trace: list[tuple[float, float, float]], start: float, end: float, moto_cpu: float) -> str:
    """Requests in flight over ``[start, end]`` (time-weighted), moto's answer times and CPU per request."""
    reqs = [r for r in trace if start <= r[0] <= end]
    if not reqs:
        return "no request traced"
    events = sorted([(s, 1) for s, _, _ in reqs] + [(a, -1) for _, _, a in reqs])
    share = {"0": 0.0, "1-3": 0.0, "4-15": 0.0, "16+": 0.0}
    level, last = 0, start
    for t, d in events:
        key = "0" if level == 0 else "1-3" if level < 4 else "4-15" if level < 16 else "16+"
        share[key] += max(t - last, 0.0)
        level, last = level + d, t
    wall = max(last - start, 1e-9)
    waits = sorted(a - s for s, _, a in reqs)
    server = sorted(v - s for s, v, _ in reqs)
    shares = ", ".join(f"{k} {v / wall:.0%}" for k, v in share.items())
    return (
        f"{len(reqs):,} requests; in flight on average {sum(waits) / wall:.1f} (time at {shares});"
        f" moto's answer p50 {ms(server[len(server) // 2])}, p90 {ms(server[len(server) * 9 // 10])};"
        f" moto's CPU {moto_cpu:.1f} s = {moto_cpu / len(reqs) * 1000:.1f} ms a request"
        f" ({moto_cpu / wall:.0%} of one core over the run)"
    )


def catch_up(
    uri: str, options: dict[str, str], work: Workload, label: str, proxy: LatencyProxy, moto_pid: int, peer: bool
) -> CatchUp:
    latency_ms = int(proxy.delay_ms)
    deltatail_catch_up(uri, options, work)  # warm-up (imports, the reader's threads)
    cpu0, m0 = cpu_seconds(moto_pid), time.monotonic()
    rows, ours, storage = deltatail_catch_up(uri, options, work)
    cpu1, m1 = cpu_seconds(moto_pid), time.monotonic()
    theirs, theirs_rows = float("nan"), rows
    if peer:
        t0 = time.perf_counter()
        theirs_rows = load_cdf_rows(uri, options, work.first, work.last)
        theirs = time.perf_counter() - t0
    r = CatchUp(label, latency_ms, ours, theirs, storage.counter.requests(), storage.concurrency)
    if proxy.trace is not None:
        profile = where_time_went(read_trace(proxy.trace, latency_ms), m0, m1, cpu1 - cpu0)
        print(f"    where deltatail's time went: {profile}")
    same = "" if rows == theirs_rows else f"  ROW COUNTS DIFFER ({rows:,} vs {theirs_rows:,})"
    print(f"  {label}: {rows:,} rows{same}")
    print(f"    deltatail {ours:7.2f} s  ({r.requests:,} requests, {r.concurrency} in flight: ideal {r.ideal:.2f} s;")
    print(f"              moto's own floor for as many requests here {r.requests / RATE[0]:.2f} s)")
    print(f"    load_cdf  {theirs:7.2f} s")
    print(f"    ratio {r.ratio:.1f}x; {ours / r.ideal:.2f}x the ideal (target <= {TARGET_OF_IDEAL:g}x)", flush=True)
    return r


@dataclass
class Followed:
    latency_ms: int
    mode: str
    in_hand: list[float]  # from the start of the commit's PUT to the rows in hand
    acked: list[float]  # from the PUT's answer (the store has the commit: the writer's commit instant) to rows
    work: list[float]
    noticed: list[float]  # from the commit's PUT to the start of the look that found it

    @property
    def target(self) -> str:
        """With notifications: p50 under two round trips + 20 ms (met or missed); polling: none."""
        if self.mode != "notifications":
            return ""
        bound = (2 * self.latency_ms + TARGET_NOTIFIED_EXTRA_MS) / 1000
        return f"; target p50 < {ms(bound)} from the PUT's answer: {verdict(statistics.median(self.acked) < bound)}"


def follow(store: Store, options: dict[str, str], base: Path, n: int, latency_ms: int, notified: bool) -> Followed:
    """Following ``n`` one-row commits through the proxy at ``options``, polling or woken by notifications."""
    mode = "notifications" if notified else "polling"
    name = f"follow-{latency_ms}-{mode}"
    table = S3Table(store, name).create()
    table.write_data(range(1, n + 1))
    queue = None
    if notified:  # the queue is read through the proxy too, as a real one is at a distance
        queue = notifying_queue(store.server.endpoint, name, f"{name}/_delta_log/")
        queue = queue.replace(store.server.endpoint, options["AWS_ENDPOINT_URL"])
    max_poll = SAFETY_POLL if notified else POLL
    tailer, sink, _ = follower(table, base / name, options, poll=POLL, max_poll=max_poll, start=1, notifications=queue)
    woken: list[float] = []  # when the queue's answer reached the hub (the tailer's own hub, shared)
    if queue is not None:
        hub_for(queue, options).subscribe(f"{table.uri}/_delta_log", lambda: woken.append(time.perf_counter()))
    following = Following(tailer)
    time.sleep(2.0)  # start-up: version 0's snapshot, the first polls
    rng = random.Random(3)
    published, put = {}, {}
    for v in range(1, n + 1):
        published[v] = table.publish(v)
        put[v] = time.perf_counter()
        time.sleep(rng.uniform(0.3, 0.5))  # commits land at random instants between polls
    sink.wait_for(n)
    following.stop()
    versions = range(1, n + 1)
    puts = [put[v] - published[v] for v in versions]
    line = f"    the commits' PUTs (straight to moto) took p50 {ms(statistics.median(puts))}"
    if woken:
        heard = [min((w for w in woken if w >= published[v]), default=float("nan")) - published[v] for v in versions]
        line += f"; from the PUT to the queue's answer in hand p50 {ms(statistics.median(heard))}"
    print(line)
    result = Followed(
        latency_ms,
        mode,
        [sink.in_hand[v] - published[v] for v in versions],
        [sink.in_hand[v] - put[v] for v in versions],
        [sink.in_hand[v] - tailer.found_at[v] for v in versions],
        [tailer.found_at[v] - published[v] for v in versions],
    )
    if queue is not None:
        hub_for(queue).close()  # its long poll would outlive the proxy
    print(f"  following at {latency_ms} ms, {describe(result)}", flush=True)
    return result


def describe(f: Followed) -> str:
    how = f"poll {POLL * 1000:g} ms" if f.mode == "polling" else f"notifications (safety poll {SAFETY_POLL:g} s)"
    work = statistics.median(f.work)
    return (
        f"{how}: commit to rows p50 {ms(statistics.median(f.in_hand))}, p99 {ms(pct(f.in_hand, 99))} from the PUT's"
        f" start, p50 {ms(statistics.median(f.acked))}, p99 {ms(pct(f.acked, 99))} from its answer"
        f"{f.target}; from the PUT to the look that found it p50 {ms(statistics.median(f.noticed))};"
        f" from that look to rows p50 {ms(work)} ({work * 1000 / f.latency_ms:.1f} round trips)"
    )


def run(cfg: Config, argv: Sequence[str]) -> None:
    print(f"command   {shlex.join([sys.executable, '-m', 'benchmarks.objectstore_latency', *argv])}")
    print(f"machine   {cpu_model()}, nproc {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    print(
        f"versions  python {platform.python_version()}, pyarrow {pa.__version__}, deltalake {deltalake.__version__},"
        f" obstore {obs.__version__}"
    )
    server = moto_server().start()
    counting = CountingProxy(server.endpoint).start()  # unused here; Store's shape
    store = Store(server, counting)
    catch_ups: list[CatchUp] = []
    follows: list[Followed] = []
    try:
        create_s3_bucket(server.endpoint)
        RATE[0] = moto_rate(store)
        print(f"moto      {RATE[0]:.0f} requests/s at 16 in flight, straight (no proxy): the floor of every figure")
        uris = {}
        for spec, prefix, label in (
            (cfg.appends, "appends", f"{cfg.appends.commits:,} one-file appends"),
            (cfg.mixed, "mixed", f"{cfg.mixed.commits}-commit mixed history"),
        ):
            if cfg.catch_up:
                work = ensure(cfg.data_dir, spec)
                uris[label] = (store.upload(work.path, prefix), work)
        with tempfile.TemporaryDirectory(prefix="deltatail-objectstore-latency-") as tmp:
            for latency in cfg.latencies:
                trace = Path(tmp) / f"trace-{latency}"
                with LatencyProxy(server.endpoint, delay_ms=latency, trace=trace) as proxy:
                    options = s3_options(proxy.endpoint)
                    print(f"\n== at {latency} ms a request (proxy at {proxy.endpoint})", flush=True)
                    for label, (uri, work) in uris.items():
                        assert server.proc is not None
                        catch_ups.append(catch_up(uri, options, work, label, proxy, server.proc.pid, cfg.peer))
                    for notified in (False, True) if cfg.following else ():
                        follows.append(follow(store, options, Path(tmp), cfg.follow_commits, latency, notified))
        print("\n== summary")
        for c in catch_ups:
            target = f"; target >= {TARGET_RATIO_AT_50:g}x: {verdict(c.ratio >= TARGET_RATIO_AT_50)}"
            print(
                f"  catch-up at {c.latency_ms} ms, {c.label}: deltatail {c.deltatail:.2f} s,"
                f" load_cdf {c.load_cdf:.2f} s,"
                f" {c.ratio:.1f}x{target if c.latency_ms == 50 else ''}; {c.deltatail / c.ideal:.2f}x the ideal"
                f" ({verdict(c.deltatail <= TARGET_OF_IDEAL * c.ideal)})"
            )
        for f in follows:
            print(f"  following at {f.latency_ms} ms, {describe(f)}")
    finally:
        counting.stop()
        server.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    cfg = parse_args(args)
    tune_for_latency()
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    run(cfg, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
