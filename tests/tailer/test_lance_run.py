"""``deltatail run`` on Lance datasets: following a writer in another process, crashes and restarts, errors.

Oracles: pylance scans of every version (the contents before and after each version) and the
positions the sink holds; nothing expected is computed by deltatail. Each delivered version must
satisfy ``contents(v-1) + deleted rows == contents(v) + inserted rows`` (see test_lance_changes.py),
and each position ``(version, index)`` must be delivered exactly once (``jsonl:PATH`` reports what it
holds, so a restart repeats nothing).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Hashable
from datetime import timedelta
from pathlib import Path
from typing import Any

import lance
import orjson
import pytest
from lance_datasets import rows

from deltatail.state.errors import SchemaChangeError, SinkError, StateError, VersionGapError
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.lance.feed import LanceFeed
from deltatail.tailer.lance.follow import LanceTailer
from deltatail.tailer.read.feed import ChangeOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: crash.py (tests/ is not a package)
from crash import run_campaign, run_struck
from launcher import popen

from deltatail.sinks.embedded import JsonLinesSink

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
Row = tuple[Hashable, ...]
COLUMNS = ["id", "name", "score"]

WRITER = textwrap.dedent(
    """
    import sys, time, lance, pyarrow as pa
    root, steps = sys.argv[1], int(sys.argv[2])
    def rows(ids, tag="n", bump=0.0):
        ids = list(ids)
        return pa.table({"id": pa.array(ids, pa.int64()), "name": [f"{tag}{i}" for i in ids],
                         "score": pa.array([i * 0.5 + bump for i in ids])})
    nxt = 1000
    for step in range(steps):
        ds = lance.dataset(root)
        kind = step % 4
        if kind == 0:
            lance.write_dataset(rows(range(nxt, nxt + 50)), root, mode="append"); nxt += 50
        elif kind == 1:
            ds.delete(f"id % 13 = {step % 13} AND id < {nxt}")
        elif kind == 2:
            ds.update({"score": "score + 1"}, where=f"id % 7 = {step % 7}")
        else:
            src = rows([step * 3, step * 3 + 1, nxt], tag="m", bump=9.0); nxt += 1
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)
        time.sleep(0.15)
    """
)


def contents(root: Path, version: int) -> Counter[Row]:
    if version == 0:
        return Counter()
    table = lance.dataset(str(root), version=version).to_table(columns=COLUMNS)
    return Counter(zip(*(table.column(c).to_pylist() for c in COLUMNS), strict=True))


def jsonl(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes() if path.exists() else b""
    return [orjson.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


def assert_exact(root: Path, lines: list[dict[str, Any]], first: int, last: int) -> None:
    """Every version first..last delivered exactly once and exactly (against pylance scans)."""
    by_version: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        version, _index, snap = line["_position"]
        assert not snap
        by_version.setdefault(version, []).append(line)
    for version in range(first, last + 1):
        got = by_version.pop(version, [])
        assert [r["_position"][1] for r in got] == list(range(len(got))), f"version {version}: positions"
        ins = Counter(tuple(r[c] for c in COLUMNS) for r in got if r["_change_type"] in ("insert", "update_postimage"))
        dels = Counter(tuple(r[c] for c in COLUMNS) for r in got if r["_change_type"] in ("delete", "update_preimage"))
        before, after = contents(root, version - 1), contents(root, version)
        assert before + ins == after + dels, f"version {version}"
    assert not by_version, f"versions outside the range: {sorted(by_version)}"


def run_args(root: Path, state: Path, sink: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "deltatail", "run", str(root), "--state-dir", str(state), "--sink", sink, *extra]


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}


@pytest.mark.slow
def test_follows_a_writer_in_another_process(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(200)), str(root), enable_stable_row_ids=True)
    tail = subprocess.Popen(
        run_args(root, state, f"jsonl:{out}", "--poll-interval", "0.2", "--checkpoint-seconds", "0.2"),
        cwd=ROOT,
        env=clean_env(),
        stderr=subprocess.PIPE,
    )
    try:
        writer = subprocess.run(
            [sys.executable, "-c", WRITER, str(root), "24"], cwd=ROOT, capture_output=True, timeout=WAIT, check=False
        )
        assert writer.returncode == 0, writer.stderr.decode()[-2000:]
        latest = lance.dataset(str(root)).version
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            cursor = state / "cursor.json"
            if cursor.exists() and orjson.loads(cursor.read_bytes())["state"]["cursor"]["version"] == latest + 1:
                break
            assert tail.poll() is None, tail.stderr.read().decode() if tail.stderr else ""
            time.sleep(0.05)
        else:
            pytest.fail("the tailer did not catch up with the writer")
    finally:
        tail.send_signal(signal.SIGTERM)
        _, err = tail.communicate(timeout=WAIT)
    assert tail.returncode == 0, err.decode()[-3000:]
    assert_exact(root, jsonl(out), 1, latest)


def crash_dataset(root: Path) -> int:
    """Small versions of every kind and two large ones (kills land inside a version); returns the latest."""
    rng = random.Random(3)
    lance.write_dataset(rows(range(150_000)), str(root), enable_stable_row_ids=True, max_rows_per_file=50_000)
    nxt = 200_000
    for step in range(16):
        ds = lance.dataset(str(root))
        kind = step % 4
        lo = rng.randrange(150_000)
        if kind == 0:
            lance.write_dataset(rows(range(nxt, nxt + 20)), str(root), mode="append")
            nxt += 20
        elif kind == 1:
            ds.delete(f"id >= {lo} AND id < {lo + 30}")
        elif kind == 2:
            ds.update({"score": "score + 0.25"}, where=f"id >= {lo} AND id < {lo + 10}")
        else:
            src = rows([lo, lo + 1, nxt], tag="m", bump=5.0)
            nxt += 1
            ds.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(src)
    lance.dataset(str(root)).update({"name": "'bulk'"}, where="id % 3 = 0")  # ~50,000 update pairs
    return int(lance.dataset(str(root)).version)


@pytest.mark.slow
def test_crashes_and_restarts_deliver_every_row_once(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    latest = crash_dataset(root)
    rng = random.Random(11)
    kills: set[str] = set()

    def run(spec: str) -> int:
        args = run_args(root, state, f"jsonl:{out}", "--until-caught-up", "--checkpoint-commits", "1")
        return run_struck(args, spec, rng, out=out, env=clean_env(), cwd=ROOT, kills=kills, wait=WAIT, start=popen)

    first = ["after_write:1", "after_flush:1", "after_save:1", "after_write:3", "after_write:4", "kill:0.5"]
    run_campaign(run, kills, rng, kills_wanted=8, max_runs=20, delay=0.5, first=first)
    assert len(kills) >= 4
    assert_exact(root, jsonl(out), 1, latest)


# -- errors --------------------------------------------------------------------------------------


def _config(root: Path, state: Path) -> TailerConfig:
    return TailerConfig(table=str(root), state_dir=str(state), until_caught_up=True, watch=False)


def _run_once(root: Path, state: Path, out: Path) -> None:
    LanceTailer(_config(root, state), JsonLinesSink(str(out))).run()


def test_resuming_past_a_cleaned_up_version_is_a_gap_with_a_hint(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(10)), str(root))
    _run_once(root, state, out)
    for i in range(3):
        lance.write_dataset(rows(range(10 + i, 11 + i)), str(root), mode="append")
    lance.dataset(str(root)).cleanup_old_versions(older_than=timedelta(0))
    with pytest.raises(VersionGapError, match="cleanup_old_versions") as e:
        _run_once(root, state, out)
    assert e.value.version == 1 and e.value.table == str(root)


def test_a_recreated_dataset_is_refused(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(10)), str(root))
    _run_once(root, state, out)
    shutil.rmtree(root)
    time.sleep(0.01)
    lance.write_dataset(rows(range(5)), str(root))
    with pytest.raises(StateError, match="recreated"):
        _run_once(root, state, out)


def test_a_state_directory_of_another_dataset_is_refused(tmp_path: Path) -> None:
    a, b, state, out = tmp_path / "a", tmp_path / "b", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(3)), str(a))
    lance.write_dataset(rows(range(3)), str(b))
    _run_once(a, state, out)
    with pytest.raises(StateError, match="belongs to"):
        _run_once(b, state, out)


def test_initial_snapshot_then_changes_and_the_saved_state_is_the_cursor_alone(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(10)), str(root))
    lance.dataset(str(root)).delete("id < 2")
    config = _config(root, state)
    config.initial_snapshot = True
    LanceTailer(config, JsonLinesSink(str(out))).run()
    lines = jsonl(out)
    assert [r["_position"] for r in lines] == [[2, i, True] for i in range(8)]
    lance.dataset(str(root)).delete("id = 5")
    LanceTailer(config, JsonLinesSink(str(out))).run()
    assert jsonl(out)[-1]["_position"] == [3, 0, False] and jsonl(out)[-1]["id"] == 5
    # No snapshot file: the cursor alone (and status.json, the report deltatail status reads).
    assert sorted(p.name for p in state.iterdir()) == ["LOCK", "cursor.json", "status.json"]
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.snapshot_file == "" and saved.snapshot_version == 3


def test_stop_from_another_thread_saves_the_cursor(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(10)), str(root))
    config = TailerConfig(table=str(root), state_dir=str(state), poll_interval=0.05, watch=True)
    tailer = LanceTailer(config, JsonLinesSink(str(out)))
    thread = threading.Thread(target=tailer.run)
    thread.start()
    deadline = time.monotonic() + WAIT
    while len(jsonl(out)) < 10 and time.monotonic() < deadline:
        time.sleep(0.02)
    lance.dataset(str(root)).delete("id = 1")
    while len(jsonl(out)) < 11 and time.monotonic() < deadline:
        time.sleep(0.02)
    tailer.stop()
    thread.join(WAIT)
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.cursor.version == 3
    assert LanceFeed(str(root)).dataset.latest_version() == 2


def test_a_non_additive_change_mid_stream_stops_after_checkpointing_what_came_before(tmp_path: Path) -> None:
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(10)), str(root))
    lance.dataset(str(root)).delete("id = 1")
    lance.dataset(str(root)).alter_columns({"path": "name", "name": "label"})  # type: ignore[dict-item]
    lance.dataset(str(root)).delete("id = 2")
    with pytest.raises(SchemaChangeError) as e:
        _run_once(root, state, out)
    assert e.value.version == 3
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.cursor.version == 3 and len(jsonl(out)) == 11
    config = _config(root, state)
    config.options = ChangeOptions(allow_non_additive=True)
    LanceTailer(config, JsonLinesSink(str(out))).run()
    assert jsonl(out)[-1]["id"] == 2 and "label" in jsonl(out)[-1]


def test_rows_lost_from_the_sink_are_refused(tmp_path: Path) -> None:
    """The Lance tailer shares the sink-gap check: a file truncated by hand is a SinkError naming the gap."""
    root, state, out = tmp_path / "ds", tmp_path / "state", tmp_path / "out.jsonl"
    lance.write_dataset(rows(range(10)), str(root))
    lance.write_dataset(rows(range(10, 15)), str(root), mode="append")
    _run_once(root, state, out)
    assert [line["id"] for line in jsonl(out)] == list(range(15))
    out.write_bytes(b"".join(out.read_bytes().splitlines(keepends=True)[:3]))
    with pytest.raises(SinkError, match="missing") as e:
        _run_once(root, state, out)
    assert "from 1:3 to 2:4" in str(e.value) and e.value.file == str(out)
