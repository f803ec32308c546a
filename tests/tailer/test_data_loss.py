"""When the data is gone anyway: ``on_data_loss`` = ``fail`` | ``resnapshot`` | ``skip``.

Real losses, made by deltalake: a VACUUM with the retention check off removes the file a
delete rewrote (the tailer still needs it to read that delete's rows), and ``cleanup_metadata``
after a checkpoint, with ``delta.logRetentionDuration`` short and the old commits' times set
back, removes the commits after the tailer's cursor. Every mode is then checked by exactly-once
accounting against the ground truth of the table's own snapshots (deltalake's reads at each
version): per version, the net change the sink received against the difference of the two
snapshots, each row lost or duplicated counted; and, for ``resnapshot``, the snapshot rows
against the table at the snapshot's version.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from damage import Ran, run_inline
from deltalake import DeltaTable, write_deltalake

ROOT = Path(__file__).resolve().parents[2]
HOUR_NS = 3_600 * 10**9
pytestmark = pytest.mark.slow  # each test runs the command a few times

ADD = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


@dataclass
class Accounting:
    """What the sink received, against the table's snapshots."""

    expected: int = 0  # change rows the versions delivered as changes should carry (snapshot differences)
    delivered: int = 0  # change rows delivered
    lost: int = 0
    duplicated: int = 0
    snapshots: list[int] = field(default_factory=list)  # versions of the snapshots delivered
    changed_versions: set[int] = field(default_factory=set)


#: The table's rows at each version, read by deltalake as the version is written (before VACUUM or
#: log cleanup makes the old versions unreadable): the ground truth.
Truth = dict[int, Counter[int]]


def record(root: Path, truth: Truth) -> None:
    """Read the table's latest version into ``truth`` (and every later version with no data change)."""
    table = DeltaTable(str(root))
    truth[table.version()] = Counter(table.to_pyarrow_table().column("id").to_pylist())


def rows_at(truth: Truth, version: int) -> Counter[int]:
    """The rows at ``version``: versions not recorded (VACUUM's commits) hold the rows of the one before."""
    return truth[max(v for v in truth if v <= version)]


def account(truth: Truth, out: Path, versions: range, partial: frozenset[int] = frozenset()) -> Accounting:
    """Exactly-once accounting of ``out`` over ``versions`` (see the module docstring).

    ``partial``: versions of snapshots cut short by a loss (their files vacuumed while they were
    delivered), which must hold nothing but rows of the table at their version.
    """
    a = Accounting()
    per_version: dict[int, Counter[int]] = {}
    snapshot_rows: dict[int, Counter[int]] = {}
    for line in out.read_text().splitlines():
        row = json.loads(line)
        version, _, in_snapshot = row["_position"]
        if in_snapshot:
            snapshot_rows.setdefault(version, Counter())[row["id"]] += 1
            continue
        per_version.setdefault(version, Counter())[row["id"]] += ADD[row["_change_type"]]
        a.delivered += 1
    for version, rows in snapshot_rows.items():
        if version in partial:
            assert not rows - rows_at(truth, version), f"the cut-short snapshot at {version} holds only its rows"
        else:
            assert rows == rows_at(truth, version), f"the snapshot at {version} is the table's rows at {version}"
        a.snapshots.append(version)
    a.changed_versions = set(per_version)
    covered = set()  # versions a snapshot stands for: after the last version delivered before it, up to it
    for s in a.snapshots:
        after = max((v for v in per_version if v < s), default=-1)
        covered |= set(range(after + 1, s + 1))
    for v in versions:
        if v in covered:
            continue
        expected = rows_at(truth, v).copy()
        if v > 0:
            expected.subtract(rows_at(truth, v - 1))
        got = per_version.get(v, Counter())
        a.expected += sum(abs(n) for n in expected.values())
        for key in set(expected) | set(got):
            e, d = expected[key], got[key]
            if abs(d) < abs(e) or d * e < 0:
                a.lost += abs(e - d)
            elif abs(d) > abs(e):
                a.duplicated += abs(d - e)
    return a


def run(
    root: Path, state: Path, out: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str] | Ran:
    """``deltatail run ... --until-caught-up`` through the entry point in this process (``damage.run_inline``);
    with ``env`` (a crash point: the process is killed) in a child process."""
    args = ["run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up"]
    start = [] if "--initial-snapshot" in extra else ["--starting-version", "0"]
    if env is None:
        return run_inline(*args, *start, "--no-watch", *extra)
    return subprocess.run(
        [sys.executable, "-m", "deltatail", *args, *start, "--no-watch", *extra],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )


def status(state: Path) -> dict[str, object]:
    done = run_inline("status", str(state), "--json")
    assert done.returncode == 0, done.stderr
    [doc] = json.loads(done.stdout)
    assert isinstance(doc, dict)
    return doc


def vacuumed(tmp_path: Path) -> tuple[Path, Path, Path, Truth]:
    """Version 0 delivered; then 1 deletes ids 0..2 (rewriting the file), 2 appends 10..14, and VACUUM
    (versions 3 and 4) removes the file version 1 removed, which the tailer needs for its deleted rows."""
    root, state, out, truth = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl", Truth()
    write_deltalake(str(root), pa.table({"id": list(range(10))}))
    record(root, truth)
    done = run(root, state, out)
    assert done.returncode == 0, done.stderr
    DeltaTable(str(root)).delete("id < 3")
    record(root, truth)
    write_deltalake(str(root), pa.table({"id": list(range(10, 15))}), mode="append")
    record(root, truth)
    DeltaTable(str(root)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    assert DeltaTable(str(root)).version() == 4
    return root, state, out, truth


def cleaned(tmp_path: Path) -> tuple[Path, Path, Path, Truth]:
    """Version 0 delivered; 1 and 2 append, 3 deletes ids 0 and 1, a checkpoint at 3, and log cleanup
    (``delta.logRetentionDuration`` an hour, commits 0..2 two hours old) removes commits 0..2."""
    root, state, out, truth = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl", Truth()
    write_deltalake(
        str(root), pa.table({"id": list(range(10))}), configuration={"delta.logRetentionDuration": "interval 1 hour"}
    )
    record(root, truth)
    done = run(root, state, out)
    assert done.returncode == 0, done.stderr
    write_deltalake(str(root), pa.table({"id": list(range(10, 15))}), mode="append")
    record(root, truth)
    write_deltalake(str(root), pa.table({"id": list(range(15, 20))}), mode="append")
    record(root, truth)
    DeltaTable(str(root)).delete("id < 2")
    record(root, truth)
    table = DeltaTable(str(root))
    table.create_checkpoint()
    for v in range(3):
        commit = root / "_delta_log" / f"{v:020d}.json"
        old = commit.stat().st_mtime_ns - 2 * HOUR_NS
        os.utime(commit, ns=(old, old))
    table.cleanup_metadata()
    assert not (root / "_delta_log" / f"{1:020d}.json").exists()
    write_deltalake(str(root), pa.table({"id": [20, 21]}), mode="append")  # version 4
    record(root, truth)
    return root, state, out, truth


@pytest.mark.parametrize("make", [vacuumed, cleaned], ids=["vacuumed", "log_cleaned"])
def test_fail_is_the_default_and_never_skips(tmp_path: Path, make: object) -> None:
    root, state, out, _ = make(tmp_path)  # type: ignore[operator]
    before = out.read_text()
    for extra in ((), ("--on-data-loss", "fail")):
        done = run(root, state, out, *extra)
        assert done.returncode == 1
        assert "deltatail: error:" in done.stderr and "version 1" in done.stderr
        assert out.read_text() == before  # nothing after version 0, and nothing skipped to
        doc = status(state)
        assert (doc["delivered_version"], doc["data_losses"], doc["versions_lost"]) == (0, 0, 0)


def test_resnapshot_after_vacuum_delivers_the_current_rows_then_follows_on(tmp_path: Path) -> None:
    root, state, out, truth = vacuumed(tmp_path)
    done = run(root, state, out, "--on-data-loss", "resnapshot")
    assert done.returncode == 0, done.stderr
    assert "data lost: versions 1 to 4" in done.stderr and "resnapshot" in done.stderr
    doc = status(state)  # the counts are this process's, as the metrics' are
    assert (doc["delivered_version"], doc["data_losses"], doc["versions_lost"]) == (4, 1, 4)
    write_deltalake(str(root), pa.table({"id": [20, 21]}), mode="append")  # version 5: followed on
    record(root, truth)
    done = run(root, state, out, "--on-data-loss", "resnapshot")
    assert done.returncode == 0, done.stderr
    a = account(truth, out, range(6))
    assert a.snapshots == [4]  # the table's rows at version 4, marked as snapshot rows
    assert a.changed_versions == {0, 5}  # 1..4 passed over, covered by the snapshot
    assert (a.expected, a.delivered, a.lost, a.duplicated) == (12, 12, 0, 0)  # 10 rows of version 0, 2 of 5
    assert status(state)["delivered_version"] == 5


def test_skip_after_vacuum_passes_over_the_version_it_cannot_read_and_counts_it(tmp_path: Path) -> None:
    root, state, out, truth = vacuumed(tmp_path)
    done = run(root, state, out, "--on-data-loss", "skip")
    assert done.returncode == 0, done.stderr
    assert "data lost: version 1 (on_data_loss = skip)" in done.stderr
    a = account(truth, out, range(5))
    assert a.snapshots == []
    assert 1 not in a.changed_versions and 2 in a.changed_versions
    # version 1's three deletes lost, as reported; everything else delivered exactly once
    assert (a.expected, a.delivered, a.lost, a.duplicated) == (18, 15, 3, 0)
    doc = status(state)
    assert (doc["delivered_version"], doc["data_losses"], doc["versions_lost"]) == (4, 1, 1)


def test_resnapshot_after_log_cleanup(tmp_path: Path) -> None:
    root, state, out, truth = cleaned(tmp_path)
    done = run(root, state, out, "--on-data-loss", "resnapshot")
    assert done.returncode == 0, done.stderr
    assert "data lost: versions 1 to 4" in done.stderr
    a = account(truth, out, range(5))
    assert a.snapshots == [4] and a.changed_versions == {0}
    assert (a.expected, a.delivered, a.lost, a.duplicated) == (10, 10, 0, 0)
    doc = status(state)
    assert (doc["delivered_version"], doc["data_losses"], doc["versions_lost"]) == (4, 1, 4)


def test_skip_after_log_cleanup_jumps_to_the_oldest_version_the_log_still_builds(tmp_path: Path) -> None:
    root, state, out, truth = cleaned(tmp_path)
    done = run(root, state, out, "--on-data-loss", "skip")
    assert done.returncode == 0, done.stderr
    assert "data lost: versions 1 to 3" in done.stderr  # the checkpoint at 3 is the oldest state left
    a = account(truth, out, range(5))
    assert a.snapshots == [] and a.changed_versions == {0, 4}
    # versions 1..3 lost, as reported: 5 + 5 inserts and 2 deletes
    assert (a.expected, a.delivered, a.lost, a.duplicated) == (24, 12, 12, 0)
    doc = status(state)
    assert (doc["delivered_version"], doc["data_losses"], doc["versions_lost"]) == (4, 1, 3)


def _poll(what: str, check: Callable[[], bool], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_serve_resnapshots_a_table_whose_files_were_vacuumed(tmp_path: Path) -> None:
    root, state, out, truth = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl", Truth()
    write_deltalake(str(root), pa.table({"id": list(range(10))}))
    DeltaTable(str(root)).delete("id < 3")
    record(root, truth)
    DeltaTable(str(root)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    conf = tmp_path / "serve.toml"  # from version 0, whose file is gone
    conf.write_text(
        f'[service]\nstate_root = "{state}"\nlisten = "off"\nsafety_poll_seconds = 0.2\n'
        f'[defaults]\nsink = "jsonl:{out}"\nstarting_version = 0\non_data_loss = "resnapshot"\n'
        f'[[tables]]\npath = "{root}"\nname = "t"\n'
    )
    with (tmp_path / "serve.log").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deltatail", "serve", "--config", str(conf)], cwd=ROOT, stderr=err
        )
    try:
        _poll("the snapshot delivered", lambda: out.exists() and len(out.read_text().splitlines()) == 7)
        [table_dir] = [d for d in state.iterdir() if d.is_dir()]
        _poll("the loss in the status", lambda: status(table_dir).get("data_losses") == 1)
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
    a = account(truth, out, range(4))
    assert a.snapshots == [3]  # the rows of version 1 (ids 3..9) at the latest version, after VACUUM's commits
    assert (a.delivered, a.lost, a.duplicated) == (0, 0, 0)
    assert "data lost: versions 0 to 3 (on_data_loss = resnapshot)" in (tmp_path / "serve.log").read_text()


def test_on_data_loss_is_refused_for_lance_datasets(tmp_path: Path) -> None:
    lance.write_dataset(pa.table({"id": [1, 2]}), str(tmp_path / "d"))
    done = run(tmp_path / "d", tmp_path / "state", tmp_path / "out.jsonl", "--on-data-loss", "skip")
    assert done.returncode != 0
    assert "on_data_loss applies to Delta tables" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("mode", ["fail", "resnapshot", "skip"])
def test_a_resumed_snapshot_whose_files_were_vacuumed(tmp_path: Path, mode: str) -> None:
    """Killed inside its initial snapshot at version 0; the file it reads is then rewritten and vacuumed."""
    root, state, out, truth = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl", Truth()
    write_deltalake(str(root), pa.table({"id": list(range(10))}))
    record(root, truth)
    crashed = run(root, state, out, "--initial-snapshot", env={"DELTATAIL_CRASH_AT": "after_write:1"})
    assert crashed.returncode == -9
    DeltaTable(str(root)).delete("id < 3")
    record(root, truth)
    write_deltalake(str(root), pa.table({"id": list(range(10, 15))}), mode="append")
    record(root, truth)
    DeltaTable(str(root)).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    held = out.read_text() if out.exists() else ""
    done = run(root, state, out, "--on-data-loss", mode)
    if mode == "fail":
        assert done.returncode == 1 and "file does not exist" in done.stderr and "version 0" in done.stderr
        assert (out.read_text() if out.exists() else "") == held
        return
    assert done.returncode == 0, done.stderr
    a = account(truth, out, range(5), partial=frozenset({0}))
    assert a.duplicated == 0
    if mode == "resnapshot":  # superseded by a snapshot at the latest version, complete
        assert "data lost: versions 0 to 4 (on_data_loss = resnapshot)" in done.stderr
        assert sorted(a.snapshots)[-1] == 4 and a.changed_versions == set() and a.lost == 0
    else:  # the rest of the snapshot passed over, then version 1 (its removed file is gone too)
        assert "data lost: version 0 (on_data_loss = skip)" in done.stderr
        assert "data lost: version 1 (on_data_loss = skip)" in done.stderr
        # lost, as reported: version 1's three deletes, and the snapshot's ten rows if none reached the sink
        # before the kill (a partial snapshot stands for version 0, as far as it goes)
        assert a.changed_versions == {2} and a.lost == (3 if a.snapshots else 13)
