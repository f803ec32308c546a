"""Following Iceberg tables (the tailer behind ``deltatail run``, opened through the format registry):
restarts and SIGKILL crashes deliver every row once, and branch resets, re-created tables and expired
snapshots stop it with a clear error instead of a silent skip.

Oracle: pyiceberg's scans of every snapshot (a snapshot's delivered rows net to the difference of its
scan and its parent's), and the positions the ``jsonl:PATH`` sink holds (each exactly once).
"""

from __future__ import annotations

import os
import random
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from pyiceberg.table import Table

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.errors import StateError, VersionGapError
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.read.feed import ChangeOptions

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: crash.py (tests/ is not a package)
from crash import run_campaign, run_struck
from iceberg_tables import SCHEMA, catalog, in_filter, new_table, rows, table_dir

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
COLUMNS = ["id", "name", "grp"]


def jsonl(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes() if path.exists() else b""
    return [orjson.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


def run_once(location: str, state: Path, out: Path, **config: Any) -> None:
    table = open_table(location)
    assert table.format.name == "iceberg"
    followed = table.format.follow(table, ChangeOptions())
    settings = TailerConfig(table=location, state_dir=str(state), until_caught_up=True, watch=False, **config)
    followed.tailer(settings, JsonLinesSink(str(out))).run()


def assert_exact(t: Table, lines: list[dict[str, Any]], *, after: int | None = None) -> None:
    """Every snapshot of ``main`` (after snapshot id ``after``) delivered once, netting to pyiceberg's scans."""
    positions = Counter((tuple(line["_position"])) for line in lines)
    assert not [p for p, n in positions.items() if n > 1], "a position delivered twice"
    by_version: dict[int, list[dict[str, Any]]] = {}
    for line in lines:
        by_version.setdefault(line["_position"][0], []).append(line)
    parent: int | None = None
    skipping = after is not None
    for snap in sorted(t.snapshots(), key=lambda s: s.sequence_number or 0):
        if skipping:
            skipping = snap.snapshot_id != after
            parent = snap.snapshot_id
            continue
        got = by_version.pop(snap.sequence_number or 0, [])
        assert [line["_position"][1] for line in got] == list(range(len(got)))
        before = _scan(t, parent)
        now = _scan(t, snap.snapshot_id)
        gone = Counter(tuple(r[c] for c in COLUMNS) for r in got if r["_change_type"] in ("delete", "update_preimage"))
        came = Counter(tuple(r[c] for c in COLUMNS) for r in got if r["_change_type"] in ("insert", "update_postimage"))
        assert (gone, came) == (before - now, now - before), snap.sequence_number
        parent = snap.snapshot_id
    assert not by_version, f"rows of versions that are not on main: {sorted(by_version)}"


def _scan(t: Table, snapshot_id: int | None) -> Counter[tuple[Any, ...]]:
    if snapshot_id is None:
        return Counter()
    table = t.scan(snapshot_id=snapshot_id, selected_fields=tuple(COLUMNS)).to_arrow()
    return Counter(zip(*(table.column(c).to_pylist() for c in COLUMNS), strict=True))


def test_restarts_deliver_only_new_snapshots(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    t.append(rows([1, 2, 3]))
    t.delete("id == 2")
    run_once(table_dir(t), state, out)
    assert [(r["_change_type"], r["id"]) for r in jsonl(out)] == [
        ("insert", 1),
        ("insert", 2),
        ("insert", 3),
        ("delete", 2),
    ]
    t.append(rows([4]))
    t.upsert(rows([1, 5], tag="u"))
    run_once(table_dir(t), state, out)
    run_once(table_dir(t), state, out)  # nothing new: nothing written
    assert_exact(t.refresh(), jsonl(out))
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.table_id == f"iceberg-{t.metadata.table_uuid}"
    head = t.current_snapshot()
    assert head is not None and (saved.snapshot_version, saved.previous_timestamp_ms) == (
        head.sequence_number,
        head.timestamp_ms,
    )


def test_initial_snapshot_then_changes(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    t.append(rows([1, 2, 3]))
    t.delete("id == 1")
    run_once(table_dir(t), state, out, initial_snapshot=True)
    head = t.current_snapshot()
    assert head is not None and head.sequence_number is not None
    version = head.sequence_number
    assert sorted((tuple(r["_position"]), r["id"]) for r in jsonl(out)) == [
        ((version, 0, True), 2),
        ((version, 1, True), 3),
    ]
    t.append(rows([9]))
    run_once(table_dir(t), state, out, initial_snapshot=True)
    assert [(r["_position"], r["id"]) for r in jsonl(out)][-1] == ([version + 1, 0, False], 9)


def test_a_branch_reset_is_refused(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    t.append(rows([1]))
    first = t.current_snapshot().snapshot_id  # type: ignore[union-attr]
    t.append(rows([2]))
    run_once(table_dir(t), state, out)
    t.manage_snapshots().rollback_to_snapshot(first).commit()
    t.append(rows([3]))
    with pytest.raises(StateError, match="no longer on the main branch") as e:
        run_once(table_dir(t), state, out)
    assert e.value.table == table_dir(t) and e.value.version == 2


def test_a_dropped_and_recreated_table_is_refused(tmp_path: Path) -> None:
    cat = catalog(tmp_path / "cat")
    t = cat.create_table("db.t", SCHEMA, properties={"format-version": "2"})
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    t.append(rows([1]))
    location = table_dir(t)
    run_once(location, state, out)
    cat.purge_table("db.t")
    again = cat.create_table("db.t", SCHEMA, properties={"format-version": "2"})
    again.append(rows([7]))
    assert table_dir(again) == location
    with pytest.raises(StateError, match="dropped and re-created"):
        run_once(location, state, out)


def test_snapshots_expired_before_they_were_read_are_a_gap(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    t.append(rows([1]))
    run_once(table_dir(t), state, out)
    t.append(rows([2]))
    t.append(rows([3]))
    ids = [s.snapshot_id for s in t.snapshots()]
    t.maintenance.expire_snapshots().by_ids(ids[:2]).commit()
    with pytest.raises(VersionGapError, match="expired") as e:
        run_once(table_dir(t), state, out)
    assert e.value.table == table_dir(t)


# -- crashes -------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    import sys
    from deltatail.sinks.embedded import JsonLinesSink
    from deltatail.tailer.follow.tailer import TailerConfig
    from deltatail.tailer.formats.registry import open_table
    from deltatail.tailer.read.feed import ChangeOptions
    location, state, out = sys.argv[1:4]
    table = open_table(location)
    config = TailerConfig(table=location, state_dir=state, until_caught_up=True, watch=False, checkpoint_commits=1,
                          options=ChangeOptions(batch_size=7))
    table.format.follow(table, ChangeOptions(batch_size=7)).tailer(config, JsonLinesSink(out)).run()
    """
)


def crash_table(tmp_path: Path) -> Table:
    t = new_table(tmp_path / "cat")
    rng = random.Random(5)
    t.append(rows(list(range(400))))
    nxt = 1000
    for step in range(12):
        live = t.scan(selected_fields=("id",)).to_arrow().column("id").to_pylist()
        if step % 3 == 0:
            t.append(rows(list(range(nxt, nxt + 30))))
            nxt += 30
        elif step % 3 == 1:
            t.delete(in_filter(rng.sample(live, 5)))
        else:
            t.upsert(rows([*rng.sample(live, 3), nxt], tag="u"))
            nxt += 1
    return t.refresh()


@pytest.mark.slow
def test_crashes_and_restarts_deliver_every_row_once(tmp_path: Path) -> None:
    t = crash_table(tmp_path)
    state, out = tmp_path / "state", tmp_path / "out.jsonl"
    rng = random.Random(11)
    kills: set[str] = set()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}

    def run(spec: str) -> int:
        args = [sys.executable, "-c", CHILD, table_dir(t), str(state), str(out)]
        return run_struck(args, spec, rng, out=out, env=env, cwd=ROOT, kills=kills, wait=WAIT)

    first = ["after_write:1", "after_flush:1", "after_save:1", "after_write:3", "after_write:9", "kill:0.3"]
    run_campaign(run, kills, rng, kills_wanted=6, max_runs=16, delay=0.3, first=first)
    assert len(kills) >= 4
    assert_exact(t, jsonl(out))
