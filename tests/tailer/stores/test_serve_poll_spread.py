"""``deltatail serve`` spreads the polls of its object-store tables over time instead of synchronising them.

A :class:`~tailer.serve.service.Service` follows six idle S3 tables in moto through the tests' counting
proxy, one worker, every table polled at a fixed interval. Each poll of an idle table is one GET of its next
commit, answered 404; the proxy's log gives, for each round k, the order in which the tables made
their k-th such look. Tables opened together and polled at a fixed interval stay in step: every round
in the order they were opened. With the jitter (:func:`~tailer.runtime.backoff.next_poll`, seeded
here) the order changes from round to round: their polls are drawn apart. Only the order of the
requests is compared, never a duration.
"""

from __future__ import annotations

import itertools
import random
import re
import sys
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.serve.service import Service, ServiceOptions, TableSource
from deltatail.tailer.serve.state_root import StateRoot

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py (tests/ is not a package)
from objectstores import Cloud, CountingProxy, Request, Server, wait_until

pytest_plugins = ("objectstore_fixtures",)

TABLES = 6
NEXT_COMMIT = re.compile(r"/(t\d+)/_delta_log/0{19}1\.json$")


def rounds_of(requests: list[Request]) -> list[list[str]]:
    """For each k, the tables in the order of their k-th look for version 1 (a GET answered 404)."""
    looks: Counter[str] = Counter()
    rounds: list[list[str]] = []
    for method, path, status in requests:
        m = NEXT_COMMIT.search(path.split("?")[0])
        if method == "GET" and status == 404 and m:
            k = looks[m[1]]
            looks[m[1]] += 1
            rounds.extend([] for _ in range(k + 1 - len(rounds)))
            rounds[k].append(m[1])
    return rounds


def poll_rounds(cloud: Cloud, tmp: Path, jitter: float, interval: float, rounds: int) -> list[list[str]]:
    """Serve the tables, polled every ``interval``, until each looked ``rounds`` times; those rounds of looks."""
    proxy = CountingProxy(cloud.server.endpoint).start()
    options = cloud.via(proxy.endpoint).options
    out = tmp / "out"
    out.mkdir(parents=True)

    def source(name: str) -> TableSource:
        config = TailerConfig(
            table=cloud.uri(name),
            state_dir="",
            poll_interval=interval,
            max_poll_interval=interval,
            checkpoint_seconds=3600.0,
            watch=False,
            storage_options=options,
        )
        return TableSource(name, config, lambda _: JsonLinesSink(str(out / f"{name}.jsonl")))

    service = Service(
        StateRoot(tmp / "state"),
        [source(f"t{i}") for i in range(TABLES)],
        ServiceOptions(workers=1, poll_jitter=jitter),
        rng=random.Random(35),
    )
    runner = threading.Thread(target=service.run, daemon=True)
    runner.start()
    try:
        wait_until(lambda: complete(rounds_of(list(proxy.requests)), rounds), 120, f"{rounds} looks of every table")
    finally:
        service.stop()
        runner.join(60)
        proxy.stop()
    assert not runner.is_alive()
    return rounds_of(proxy.requests)[:rounds]


def complete(looks: list[list[str]], rounds: int) -> bool:
    """Every table made its ``rounds``-th look."""
    return len(looks) >= rounds and len(looks[rounds - 1]) == TABLES


@pytest.mark.slow
def test_serve_spreads_the_polls_of_object_store_tables_instead_of_keeping_them_in_step(
    moto: Server, tmp_path: Path
) -> None:
    cloud = Cloud.fresh("s3", moto)
    for i in range(TABLES):
        data = pa.table({"id": pa.array([i], pa.int64())})
        write_deltalake(cloud.uri(f"t{i}"), data, storage_options=cloud.writer_options)

    in_step = poll_rounds(cloud, tmp_path / "in-step", jitter=0.0, interval=1.0, rounds=4)
    assert all(sorted(r) == sorted(in_step[0]) for r in in_step), in_step  # every table looked in every round
    assert all(r == in_step[0] for r in in_step), in_step  # without the jitter: the same order, round after round

    # The opens, one after the other, leave the tables a step's time apart (~0.1-0.2 s through the
    # proxy); the jitter of a 2 s interval (+-0.4 s a poll) is drawn wider than that.
    spread = poll_rounds(cloud, tmp_path / "spread", jitter=0.2, interval=2.0, rounds=5)
    assert all(sorted(r) == sorted(spread[0]) for r in spread), spread
    changed = sum(1 for before, after in itertools.pairwise(spread) if before != after)
    assert changed >= 1, spread  # drawn apart: the tables overtake one another
