"""Months of history in one test: a seeded life of a table, followed through SIGKILLs and a data loss.

A writer in another process (``soak_writer.py``, deltalake) appends, deletes, updates, merges,
compacts, checkpoints, vacuums with the retention check off, cleans the log up, adds a column,
changes a property and restores, recording the table's rows at every version as it goes (the
ground truth). ``deltatail run --on-data-loss resnapshot`` follows it into a JSON lines sink and
is SIGKILLed at random instants; once it is held stopped while the writer rewrites every row,
vacuums and cleans the log up past it, so that what it needs is gone.

The accounting: per version, the net change the sink received (inserts and post-images less
deletes and pre-images, by ``(id, v)``) against the difference of the two snapshots; the
versions a resnapshot stands for (the ones the tailer reported passing over, which it must
have) are checked by the snapshot's rows against the table's at its version (a snapshot
whose files were vacuumed before it was all delivered, reported and superseded by a newer
one, only for holding nothing but its version's rows). Rows expected,
delivered, lost and duplicated are printed; lost and duplicated must be 0.

By default a short seeded life (``DELTATAIL_SOAK_OPERATIONS``, default 100 operations; a long
one: ``DELTATAIL_SOAK_OPERATIONS=5000``); ``DELTATAIL_SOAK_SEED`` picks the life.
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
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("soak_writer.py")
ADD = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}
Row = tuple[int, int]


def tailer(root: Path, state: Path, out: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    args = ["run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--on-data-loss", "resnapshot"]
    args += ["--starting-version", "0", "--poll-interval", "0.05", "--checkpoint-commits", "3", *extra]
    with log.open("ab") as err:
        return subprocess.Popen([sys.executable, "-m", "deltatail", *args], cwd=ROOT, stderr=err)


def load_truth(path: Path) -> dict[int, Counter[Row]]:
    truth: dict[int, Counter[Row]] = {}
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        truth[doc["version"]] = Counter((i, v) for i, v in doc["rows"])
    return truth


def rows_at(truth: dict[int, Counter[Row]], version: int) -> Counter[Row]:
    return truth[max(v for v in truth if v <= version)]


def account(truth: dict[int, Counter[Row]], out: Path, reported: set[int]) -> dict[str, int]:
    changes: dict[int, Counter[Row]] = {}
    snapshots: dict[int, Counter[Row]] = {}
    delivered = 0
    for line in out.read_text().splitlines():
        row = json.loads(line)
        version, _, in_snapshot = row["_position"]
        key = (row["id"], row["v"])
        if in_snapshot:
            snapshots.setdefault(version, Counter())[key] += 1
        else:
            changes.setdefault(version, Counter())[key] += ADD[row["_change_type"]]
            delivered += 1
    for version, got in snapshots.items():
        if version in reported and any(later > version for later in snapshots):
            # cut short (its files vacuumed before it was all delivered) and superseded, as reported
            assert not got - rows_at(truth, version), f"the cut-short snapshot at {version} holds only its rows"
            continue
        assert got == rows_at(truth, version), f"the resnapshot at version {version} is the table's rows there"
    covered: set[int] = set()
    for s in snapshots:
        after = max((v for v in changes if v < s), default=-1)
        covered |= set(range(after + 1, s + 1))
    expected = lost = duplicated = 0
    for v in range(max(truth) + 1):
        want = rows_at(truth, v).copy()
        if v > 0:
            want.subtract(rows_at(truth, v - 1))
        want = Counter({k: n for k, n in want.items() if n})
        if v in covered:
            assert not want or v in reported, f"version {v} passed over by a resnapshot the tailer did not report"
            continue
        expected += sum(abs(n) for n in want.values())
        got = changes.get(v, Counter())
        for key in set(want) | set(got):
            e, d = want[key], got[key]
            if abs(d) < abs(e) or d * e < 0:
                lost += abs(e - d)
            elif abs(d) > abs(e):
                duplicated += abs(d - e)
    return {
        "expected": expected,
        "delivered": delivered,
        "lost": lost,
        "duplicated": duplicated,
        "snapshot_rows": sum(sum(c.values()) for c in snapshots.values()),
        "resnapshots": len(snapshots),
    }


@pytest.mark.slow
def test_a_seeded_life_is_followed_without_loss_or_duplicate(tmp_path: Path) -> None:
    seed = int(os.environ.get("DELTATAIL_SOAK_SEED", "29"))
    operations = int(os.environ.get("DELTATAIL_SOAK_OPERATIONS", "100"))
    rng = random.Random(seed)
    root, state, out, truth_file, log = (tmp_path / n for n in ("t", "state", "out.jsonl", "truth.jsonl", "run.log"))
    writer = subprocess.Popen(
        [sys.executable, str(WRITER), str(root), str(truth_file), str(seed), str(operations), str(operations // 2)]
    )
    kills = 0
    after_gap: list[str] = []  # the log's files once the writer took what the tailer needs (for a failure's message)
    try:
        while not (tmp_path / "t" / "_delta_log").exists():
            time.sleep(0.05)
        while writer.poll() is None:
            proc = tailer(root, state, out, log)
            size = out.stat().st_size if out.exists() else 0
            grown = time.monotonic() + 30  # killed once it delivered something (it starts slowly on a loaded machine)
            while time.monotonic() < grown and (out.stat().st_size if out.exists() else 0) == size:
                time.sleep(0.05)
            deadline = time.monotonic() + rng.uniform(0.0, 2.0)
            while time.monotonic() < deadline and writer.poll() is None and not Path(f"{root}.paused").exists():
                time.sleep(0.05)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            if Path(f"{root}.paused").exists() and not Path(f"{root}.stopped").exists():
                Path(f"{root}.stopped").touch()  # held stopped while the writer takes what it needs
                while not Path(f"{root}.gap").exists():
                    assert writer.poll() is None, "the writer died"
                    time.sleep(0.05)
                after_gap = sorted(p.name for p in (root / "_delta_log").iterdir())
        assert writer.wait() == 0
        done = tailer(root, state, out, log, "--until-caught-up")
        assert done.wait(600) == 0, log.read_text()[-3000:]
    finally:
        if writer.poll() is None:
            writer.kill()
    text = log.read_text()
    assert "Traceback" not in text
    reported: set[int] = set()
    for a, b in re.findall(r"data lost: versions (\d+) to (\d+)", text):
        reported |= set(range(int(a), int(b) + 1))
    reported |= {int(v) for v in re.findall(r"data lost: version (\d+) ", text)}
    figures = account(load_truth(truth_file), out, reported)
    print(f"soak (seed {seed}, {operations} operations, {kills} SIGKILLs): {figures}")
    noticed = f"log after the gap: {after_gap}; the run's log ends: {text[-3000:]}"
    assert figures["resnapshots"] >= 1 and reported, noticed  # the stop past VACUUM and cleanup was noticed
    assert (figures["lost"], figures["duplicated"]) == (0, 0)
    assert figures["delivered"] >= figures["expected"] > 0
