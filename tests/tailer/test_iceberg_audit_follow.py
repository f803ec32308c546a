"""``deltatail audit ICEBERG_TABLE --follow``: a pyiceberg writer in another process, SIGKILLs, refusals (issue #32).

The auditor runs as a user runs it (``python -m tailer.cli audit ... --follow``) on tables pyiceberg
0.12 writes with its SQL catalog on SQLite, in the test or in a writer process running beside it.
What is checked:

- the audit log ends up holding every snapshot of ``main`` exactly once, in order, and equal to what
  the range audit ``deltatail audit TABLE`` prints for the same table (byte for byte), however often
  the auditor was killed at a crash point (``DELTATAIL_CRASH_AT``) or at a random instant and restarted;
  the alert log holds each alert once (a rule on ``delete`` snapshots: the versions the writer deleted at);
- the events carry what the writer did: operations, records, engine, property and partition-spec changes;
- refusals, never a silent skip: a rollback of ``main`` past the snapshot audited up to, a table dropped
  and re-created, expired snapshots after the position, a ``deltatail run`` state directory.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from iceberg_tables import catalog, new_table, rows, table_dir
from pyiceberg.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: crash.py (tests/ is not a package)
from crash import strike
from launcher import Launched, popen

from deltatail.state.errors import InvalidLogError, StateError, VersionGapError
from deltatail.tailer.audit.log import JsonlAuditLog, read_audit_log
from deltatail.tailer.cli.main import main
from deltatail.tailer.follow.audit import AuditFollowConfig
from deltatail.tailer.follow.state_store import StateStore
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.iceberg.audit_follow import TORN_SECONDS, IcebergAuditFollower

DELTATAIL = [sys.executable, "-m", "deltatail"]
ROOT = Path(__file__).resolve().parents[2]
WAIT = 120.0
RULES = '[[audit.alerts]]\nname = "deletes"\noperation_in = ["delete"]\n'

#: One snapshot per step on the table ``db.t`` of the catalog under ``root``: an append of one row
#: (engine recorded), a delete of an earlier row every fourth step; a property set before step 5 and a
#: partition field added before step 9 (no snapshot of their own: they show on the next one).
WRITER = """
import sys
import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
def steps(root, first, n):
    cat = SqlCatalog("test", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    t = cat.load_table("db.t")
    for i in range(first, first + n):
        if i == 5:
            with t.transaction() as tx:
                tx.set_properties(owner="ops")
        if i == 9:
            with t.update_spec() as spec:
                spec.add_identity("grp")
        if i % 4 == 3:
            t.delete(f"id == {i - 2}")
        else:
            rows = pa.table({"id": [i], "name": [f"n{i}"], "grp": [i % 3]}, schema=t.schema().as_arrow())
            t.append(rows, snapshot_properties={"engine-name": "writer", "engine-version": "1.0"})
if __name__ == "__main__":
    steps(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
"""


def create(root: Path) -> Table:
    t = new_table(root)
    t.append(rows([0]))
    return t


def write(root: Path, first: int, n: int) -> None:
    """Steps ``first .. first + n - 1`` (one snapshot each), written by another process."""
    subprocess.run([sys.executable, "-c", WRITER, str(root), str(first), str(n)], check=True, timeout=WAIT)


def write_here(root: Path, first: int, n: int) -> None:
    """The same steps as :func:`write`, :data:`WRITER`'s own code run by this process: for commits made
    while no auditor runs (another interpreter would only add its start and pyiceberg's imports)."""
    writer: dict[str, Any] = {"__name__": "writer"}
    exec(WRITER, writer)
    writer["steps"](str(root), first, n)


def location(root: Path) -> str:
    return table_dir(catalog_table(root))


def catalog_table(root: Path) -> Table:
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("test", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    return cat.load_table("db.t")


Started = subprocess.Popen[bytes] | Launched


def audit(table: str, *args: str, env: dict[str, str] | None = None, forked: bool = False) -> Started:
    """``deltatail audit TABLE ARGS`` started by ``subprocess``, or ``forked`` by the test launcher
    (tests/launcher.py: the same ``main`` without the interpreter's start, for the crash campaign)."""
    argv, environ = [*DELTATAIL, "audit", table, *args], {**os.environ, **(env or {})}
    if forked:
        return popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ)


def finish(proc: Started) -> tuple[int, str]:
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode is not None and err is not None
    return proc.returncode, err.decode()


def range_output(table: str, *, forked: bool = False) -> bytes:
    """What ``deltatail audit TABLE`` prints (JSON lines) for the whole table."""
    proc = audit(table, forked=forked)
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0 and out is not None, err
    return out


def wait_for_lines(path: Path, n: int, proc: Started) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if path.exists() and path.read_bytes().count(b"\n") >= n:
            return
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.05)
    raise AssertionError(f"{path} did not reach {n} lines")


def follow_args(state: Path, *extra: str) -> list[str]:
    return ["--follow", "--state-dir", str(state), "--poll-interval", "0.05", *extra]


def log_size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def grown(path: Path) -> Callable[[], bool]:
    """Whether ``path`` has grown since now (a run's progress: it wrote an event)."""
    size = log_size(path)
    return lambda: log_size(path) != size


def deleted_steps(last: int) -> list[int]:
    return [i for i in range(1, last + 1) if i % 4 == 3]


@pytest.mark.slow
def test_follow_a_writer_in_another_process_then_resume(tmp_path: Path) -> None:
    root, state, log, alerts, config = (tmp_path / n for n in ("cat", "state", "a.jsonl", "alerts.jsonl", "c.toml"))
    create(root)
    table = location(root)
    config.write_text(RULES)
    args = [*follow_args(state), "--output", str(log), "--alert-output", str(alerts), "--config", str(config)]
    proc = audit(table, *args)
    write(root, 1, 10)  # while the auditor follows
    write(root, 11, 2)
    wait_for_lines(log, 13, proc)  # the first append and twelve steps: one event per snapshot
    proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0 and "Traceback" not in err, err
    write_here(root, 13, 3)  # while it is stopped
    code, err = finish(audit(table, *args, "--until-caught-up"))
    assert code == 0, err
    events = [e.to_json() for e in read_audit_log(str(log))]
    snapshots = catalog_table(root).metadata.snapshots
    assert [e["version"] for e in events] == [s.sequence_number for s in snapshots] == list(range(1, 17))
    assert b"".join(orjson.dumps(e) + b"\n" for e in events) == range_output(table)
    steps = list(range(1, 16))
    ops = [e["operation"] for e in events[1:]]
    assert ops == ["delete" if i in deleted_steps(15) else "append" for i in steps]
    assert [e["counts"]["rows_deleted"] for e in events[1:] if e["operation"] == "delete"] == [1] * 4
    assert {e["actor"]["engine_info"] for e in events[1:] if e["operation"] == "append"} == {"writer 1.0"}
    changed = {e["version"]: e["property_changes"] for e in events if e["property_changes"]}
    assert changed == {6: [{"key": "owner", "old": None, "new": "ops", "change": "added"}]}  # step 5 is snapshot 6
    spec = {e["version"]: e["metadata_changes"] for e in events if e["metadata_changes"]}
    assert list(spec) == [10] and "grp=identity(field 3)" in spec[10][0]["new"]
    raised = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [a["version"] for a in raised] == [i + 1 for i in deleted_steps(15)]


@pytest.mark.slow
def test_killed_at_every_point_and_restarted(tmp_path: Path) -> None:
    root, state, log, alerts, config = (tmp_path / n for n in ("cat", "state", "a.jsonl", "alerts.jsonl", "c.toml"))
    create(root)
    write_here(root, 1, 8)
    table = location(root)
    config.write_text(RULES)
    rng = random.Random(32)
    args = [
        *follow_args(state, "--until-caught-up", "--checkpoint-commits", "2"),
        *("--output", str(log), "--alert-output", str(alerts), "--config", str(config)),
    ]
    codes: list[tuple[str, int]] = []
    step = 9
    for spec in ["after_write:3", "after_flush:1", "after_save:2", "after_write:1", "kill:0.5", "after_flush:2"]:
        env = {"DELTATAIL_CRASH_AT": spec} if spec.startswith("after_") else {}
        grew = grown(log)
        proc = audit(table, *args, env=env, forked=True)
        strike(proc, spec, rng, grew, wait=WAIT, tick=0.01)
        code, err = finish(proc)
        assert code in (0, -signal.SIGKILL) and "Traceback" not in err, err
        codes.append((spec, code))
        write_here(root, step, 1)  # the table moves on between runs
        step += 1
    code, err = finish(audit(table, *args, forked=True))
    assert code == 0, err
    assert sum(c == -signal.SIGKILL for _, c in codes) >= 4, codes
    events = [e.to_json() for e in read_audit_log(str(log))]
    assert [e["version"] for e in events] == list(range(1, step + 1))  # each snapshot once, in order
    assert b"".join(orjson.dumps(e) + b"\n" for e in events) == range_output(table, forked=True)
    raised = [json.loads(line) for line in alerts.read_text().splitlines()]
    assert [a["version"] for a in raised] == [i + 1 for i in deleted_steps(step - 1)]


def follower(table: str, state: Path, log: Path, **kwargs: Any) -> IcebergAuditFollower:
    ref = open_table(table)
    config = AuditFollowConfig(table=table, state_dir=str(state), until_caught_up=True, watch=False, **kwargs)
    loop = ref.format.audit_follower(ref, config, [JsonlAuditLog(str(log))], None)
    assert isinstance(loop, IcebergAuditFollower)
    return loop


def test_a_rollback_past_the_position_is_refused(tmp_path: Path) -> None:
    t = create(tmp_path / "cat")
    t.append(rows([1]))
    t.append(rows([2]))
    state, log = tmp_path / "state", tmp_path / "a.jsonl"
    assert follower(table_dir(t), state, log).run().versions == 3
    first = t.refresh().metadata.snapshots[0].snapshot_id
    t.manage_snapshots().rollback_to_snapshot(first).commit()
    t.refresh().append(rows([3]))  # main: snapshot 1, then a new one; 2 and 3 are off the branch
    with pytest.raises(StateError, match=r"version 3 .* no longer on the main branch: it was rolled back") as e:
        follower(table_dir(t), state, log).run()
    assert e.value.table == table_dir(t) and e.value.version == 3 and str(state) in str(e.value)
    assert [ev.version for ev in read_audit_log(str(log))] == [1, 2, 3]  # kept as written
    # a new state directory audits the branch as it is: the first snapshot, then the new one
    assert follower(table_dir(t), tmp_path / "s2", tmp_path / "b.jsonl").run().versions == 2
    versions = [ev.version for ev in read_audit_log(str(tmp_path / "b.jsonl"))]
    assert versions == [1, 4]


def test_a_rollback_while_following_is_refused_after_checkpointing(tmp_path: Path) -> None:
    t = create(tmp_path / "cat")
    t.append(rows([1]))
    state, log = tmp_path / "state", tmp_path / "a.jsonl"
    loop = follower(table_dir(t), state, log)
    loop.open()
    try:
        assert loop.step() == 2
        t.manage_snapshots().set_current_snapshot(t.metadata.snapshots[0].snapshot_id).commit()
        with pytest.raises(StateError, match="version 2"):
            loop.step()
    finally:
        loop.close()
    saved = StateStore(str(state)).load()
    assert saved is not None and saved.cursor.version == 3  # what was audited was checkpointed before the refusal
    assert [ev.version for ev in read_audit_log(str(log))] == [1, 2]


def test_recreated_table_expired_snapshots_and_a_tailers_state(tmp_path: Path) -> None:
    root = tmp_path / "cat"
    t = create(root)
    t.append(rows([1]))
    state, log = tmp_path / "state", tmp_path / "a.jsonl"
    assert follower(table_dir(t), state, log, checkpoint_commits=1).run().versions == 2
    # expired: snapshots after the position are gone from main's history
    t.append(rows([2]))
    t.append(rows([3]))
    with t.maintenance.expire_snapshots() as ex:
        for s in t.refresh().metadata.snapshots[:-1]:
            ex.by_id(s.snapshot_id)
    with pytest.raises(VersionGapError, match="audited up to, and the snapshots after it are gone") as gap:
        follower(table_dir(t), state, log).run()
    assert gap.value.version == 2
    # dropped (its files deleted) and re-created at the same place: another uuid
    shutil.rmtree(table_dir(t))
    cat = catalog(tmp_path / "cat2")
    u = cat.create_table("db.t", t.schema(), location=table_dir(t), properties={"format-version": "2"})
    u.append(rows([9]))
    with pytest.raises(StateError, match="a different table, or it was dropped and re-created"):
        follower(table_dir(u), state, log).run()
    # a `deltatail run` tailer's state directory
    run_state = tmp_path / "run"
    run_state.mkdir()
    (run_state / "cursor.json").write_text((state / "cursor.json").read_text())
    with pytest.raises(StateError, match="belongs to a `deltatail run` tailer"):
        follower(table_dir(t), run_state, tmp_path / "c.jsonl").run()


def test_start_at_latest_audits_only_new_snapshots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = create(tmp_path / "cat")
    t.append(rows([1]))
    state, log = tmp_path / "state", tmp_path / "a.jsonl"
    base = ["audit", table_dir(t), "--follow", "--state-dir", str(state), "--until-caught-up", "--no-watch"]
    assert main([*base, "--starting-version", "latest", "--output", str(log)]) == 0
    assert not log.exists() or log.read_bytes() == b""
    t.append(rows([2]))
    t.delete("id == 1")
    assert main([*base, "--output", str(log)]) == 0
    events = [e.to_json() for e in read_audit_log(str(log))]
    assert [(e["version"], e["operation"]) for e in events] == [(3, "append"), (4, "delete")]
    assert events[1]["counts"]["rows_deleted"] == 1 and events[1]["counts"]["table_rows_after"] == 2
    # a start past the newest version: the snapshots before it are not audited
    later = ["audit", table_dir(t), "--follow", "--state-dir", str(tmp_path / "s2"), "--until-caught-up"]
    assert main([*later, "--no-watch", "--starting-version", "6", "--output", str(tmp_path / "b.jsonl")]) == 0
    t.append(rows([5]))  # version 5
    t.append(rows([6]))  # version 6
    assert main([*later, "--no-watch", "--output", str(tmp_path / "b.jsonl")]) == 0
    assert [e.version for e in read_audit_log(str(tmp_path / "b.jsonl"))] == [6]


def test_a_newest_metadata_file_being_written_is_looked_at_again_then_refused(tmp_path: Path) -> None:
    t = create(tmp_path / "cat")
    state, log = tmp_path / "state", tmp_path / "a.jsonl"
    now = [0.0]
    ref = open_table(table_dir(t))
    config = AuditFollowConfig(table=table_dir(t), state_dir=str(state), until_caught_up=True, watch=False)
    loop = ref.format.audit_follower(ref, config, [JsonlAuditLog(str(log))], None)
    assert isinstance(loop, IcebergAuditFollower)
    loop._clock = lambda: now[0]
    loop.open()
    try:
        assert loop.step() == 1
        torn = Path(table_dir(t)) / "metadata" / f"99999-{uuid.uuid4()}.metadata.json"
        torn.write_bytes(b"")  # a writer has created the file and not written it yet
        assert loop.step() == 0  # the older metadata stands
        now[0] = TORN_SECONDS - 0.5
        assert loop.step() == 0
        now[0] = TORN_SECONDS
        with pytest.raises(InvalidLogError, match="does not parse") as e:
            loop.step()
        assert e.value.file is not None and e.value.file.endswith(torn.name)
    finally:
        loop.close()
    assert [ev.version for ev in read_audit_log(str(log))] == [1]
