"""The cost of parsing log actions: ``parse_json_actions`` on 10,000 ``add`` lines, and on 8-action commits.

Run ``.venv/bin/python -m benchmarks.parse_actions`` (a few seconds). Two workloads:

1. One buffer of 10,000 ``add`` actions as Delta Spark writes them (partition value,
   stats string, four tags, and every tenth file with a deletion vector).
2. 2,000 commits of 8 actions each (commitInfo, 1 remove, 6 adds): the parse half of
   ``DeltaLog.read_commit`` for a typical streaming commit.

Each figure is the median of ``--repeat`` runs after one warm-up run, in CPU time of the
calling thread (``time.thread_time``): on a shared two-core machine, wall time mostly measures the
neighbours. The spread (min..max) is printed beside it.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson

from benchmarks.workload import add_action, commit_info_action, file_path, remove_action
from deltatail.state.actions import parse_json_actions

_TAGS = {
    "INSERTION_TIME": "1700000000000000",
    "MIN_INSERTION_TIME": "1700000000000000",
    "MAX_INSERTION_TIME": "1700000000000000",
    "OPTIMIZE_TARGET_SIZE": "268435456",
}
_DV = {"storageType": "u", "pathOrInlineDv": "vBn[lx{q8@P<9BNH/isA", "offset": 1, "sizeInBytes": 36, "cardinality": 2}


def _add_line(rng: random.Random, i: int) -> bytes:
    action: dict[str, Any] = add_action(rng, file_path(rng, i % 16), i % 16, 1_700_000_000_000 + i)
    action["add"]["tags"] = _TAGS
    if i % 10 == 0:
        action["add"]["deletionVector"] = _DV
    return orjson.dumps(action)


def adds_buffer(n: int) -> bytes:
    """``n`` add actions as one newline-delimited buffer."""
    rng = random.Random(n)
    return b"\n".join(_add_line(rng, i) for i in range(n)) + b"\n"


def commit_buffers(count: int) -> list[bytes]:
    """``count`` commits of 8 actions: commitInfo, one remove, six adds."""
    rng = random.Random(count)
    commits = []
    for c in range(count):
        ts = 1_700_000_000_000 + c
        lines = [orjson.dumps(commit_info_action(ts, "WRITE", 1))]
        lines.append(orjson.dumps(remove_action(file_path(rng, 0), 0, ts)))
        lines += [_add_line(rng, 6 * c + i) for i in range(6)]
        commits.append(b"\n".join(lines) + b"\n")
    return commits


def _time(run: Callable[[], object], repeat: int) -> list[float]:
    run()
    samples = []
    for _ in range(repeat):
        gc.collect()
        start = time.thread_time()
        run()
        samples.append(time.thread_time() - start)
    return samples


def _line(name: str, samples: list[float], per: int, unit: str) -> str:
    med = statistics.median(samples) / per * 1e6
    lo, hi = min(samples) / per * 1e6, max(samples) / per * 1e6
    return f"{name:<40} {med:8.2f} µs per {unit}  ({lo:.2f}..{hi:.2f}, {len(samples)} runs)"


def main(argv: list[str] | None = None) -> None:
    """Print the two figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=31)
    args = parser.parse_args(argv)
    n = 10_000
    adds = adds_buffer(n)
    if len(parse_json_actions(adds)) != n:
        raise SystemExit("the add buffer did not parse to one action per line")
    print(_line(f"parse_json_actions, {n:,} adds", _time(lambda: parse_json_actions(adds), args.repeat), n, "add"))
    commits = commit_buffers(2_000)

    def parse_commits() -> None:
        for data in commits:
            parse_json_actions(data)

    print(_line("parse_json_actions, 8-action commits", _time(parse_commits, args.repeat), len(commits), "commit"))


if __name__ == "__main__":
    main()
