"""Crash and restart: ``deltatail run`` killed with SIGKILL at many points, restarted on the same state directory.

Each campaign runs the real command line (``python -m tailer.cli run``) with ``--until-caught-up
--checkpoint-commits 1 --snapshot-commits 2`` over and over on one state directory and one output,
killing it

- at named crash points (``DELTATAIL_CRASH_AT=after_write:k``, ``after_flush:k``, ``after_snapshot:k``,
  ``after_save:k`` for several ``k``; see ``tailer/faults.py``),
- with SIGKILL at random times,
- and, now and then, stopping it with SIGTERM at a random time (which must exit 0),

until it has been killed often enough, then lets it finish. Two tables: many small commits of every
kind (create, append, delete, update, merge; CDF on), and one with a single 200,000-row commit spread
over 16 partition files, so that kills land in the middle of a commit.

Outcomes checked against deltalake's ``load_cdf`` of the same versions:

- ``jsonl:FILE`` and ``parquet:DIR`` (sinks that report what they hold): the delivered rows equal the
  expected rows exactly, no loss and no duplicate, and their positions cover each version's rows
  ``0..n-1`` exactly once;
- ``jsonl:-`` (stdout, captured and concatenated across restarts; at-least-once): every expected row
  is there, and a repeated position always repeats the same row.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: crash.py (tests/ is not a package)
from crash import POINTS, Proc, run_campaign, strike
from launcher import popen

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
CDF = {"delta.enableChangeDataFeed": "true"}
Row = tuple[tuple[str, Hashable], ...]
Pos = tuple[int, bool, int]  # version, snapshot, index


# ---------------------------------------------------------------- tables written by deltalake


def data(ids: Iterable[int], *, bump: float = 0.0) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "p": pa.array([i % 16 for i in ids], pa.int64()),
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
            "score": pa.array([i * 0.5 + bump for i in ids], pa.float64()),
        }
    )


def small_commits_table(root: Path) -> int:
    """130 versions of small commits of every kind; returns the latest version."""
    rng = random.Random(7)
    write_deltalake(str(root), data(range(40)), configuration=CDF)
    next_id = 40
    for step in range(129):
        dt = DeltaTable(str(root))
        lo = rng.randrange(next_id)
        kind = step % 4
        if kind == 0:
            write_deltalake(str(root), data(range(next_id, next_id + 15)), mode="append")
            next_id += 15
        elif kind == 1:
            dt.delete(f"id >= {lo} AND id < {lo + 4}")
        elif kind == 2:
            dt.update(updates={"score": "score + 0.25"}, predicate=f"id >= {lo} AND id < {lo + 6}")
        else:
            source = data([lo, lo + 1, next_id, next_id + 1], bump=100.0)
            next_id += 2
            dt.merge(
                source, "t.id = s.id", source_alias="s", target_alias="t"
            ).when_matched_update_all().when_not_matched_insert_all().execute()
    return DeltaTable(str(root)).version()


def large_commit_table(root: Path) -> int:
    """Version 1 is one 200,000-row commit of 16 files (one per partition); then a partition delete,
    an update, and small appends and deletes. Returns the latest version."""
    write_deltalake(str(root), data(range(160)), partition_by=["p"], configuration=CDF)
    write_deltalake(str(root), data(range(1000, 201_000)), mode="append")
    DeltaTable(str(root)).delete("p = 3")
    DeltaTable(str(root)).update(updates={"score": "score + 1.0"}, predicate="id % 1000 = 7")
    write_deltalake(str(root), data(range(500, 520)), mode="append")
    for step in range(8):
        if step % 2:
            DeltaTable(str(root)).delete(f"id >= {1000 + 997 * step} AND id < {1000 + 997 * step + 40}")
        else:
            write_deltalake(str(root), data(range(300_000 + 50 * step, 300_000 + 50 * step + 50)), mode="append")
    return DeltaTable(str(root)).version()


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, int]]:
    base = tmp_path_factory.mktemp("tables")
    return {
        "small": (base / "small", small_commits_table(base / "small")),
        "large": (base / "large", large_commit_table(base / "large")),
    }


def canon(row: Mapping[str, Any]) -> Row:
    return tuple(sorted((k, v) for k, v in row.items() if k not in ("_commit_timestamp", "_position")))


def expected_rows(root: Path, end: int) -> Counter[Row]:
    table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=0, ending_version=end).read_all())
    return Counter(canon(r) for r in table.to_pylist())


def per_version(rows: Counter[Row]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for row, n in rows.items():
        version = dict(row)["_commit_version"]
        assert isinstance(version, int)
        counts[version] = counts.get(version, 0) + n
    return counts


def assert_rows(actual: Counter[Row], expected: Counter[Row]) -> None:
    missing, extra = expected - actual, actual - expected
    assert not missing and not extra, f"missing {sum(missing.values())} rows, e.g. {list(missing)[:3]}; " + (
        f"extra {sum(extra.values())}, e.g. {list(extra)[:3]}"
    )


# ---------------------------------------------------------------- one campaign of kills and restarts


@dataclass
class Campaign:
    """Runs of ``deltatail run`` on one table, state directory and sink."""

    root: Path
    state: Path
    sink: str
    rng: random.Random
    stdout: list[bytes] = field(default_factory=list)
    kills: set[tuple[str, str]] = field(default_factory=set)
    specs: list[str] = field(default_factory=list)
    terms: int = 0
    held_after_kills: list[Pos | None] = field(default_factory=list)

    def args(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "deltatail.tailer.cli",
            "run",
            str(self.root),
            "--state-dir",
            str(self.state),
            "--sink",
            self.sink,
            "--until-caught-up",
            "--checkpoint-commits",
            "1",
            "--snapshot-commits",
            "2",
        ]

    def fingerprint(self, stdout_bytes: int = 0) -> str:
        """What the state directory and the sink hold now (tells kill points apart, and shows progress)."""
        h = hashlib.sha256()
        cursor = self.state / "cursor.json"
        try:
            h.update(cursor.read_bytes())
        except FileNotFoundError:
            h.update(b"-")
        target = Path(self.sink.partition(":")[2])
        if target.is_dir():
            h.update(" ".join(sorted(p.name for p in target.iterdir())).encode())
        elif target.is_file():
            h.update(str(target.stat().st_size).encode())
        else:
            h.update(str(sum(len(c) for c in self.stdout) + stdout_bytes).encode())
        return h.hexdigest()

    def held(self) -> Pos | None:
        """The position of the last complete line of a ``jsonl:FILE`` output (``None`` for other sinks)."""
        target = Path(self.sink.partition(":")[2])
        if not target.is_file():
            return None
        lines = jsonl_lines([target.read_bytes()])
        return position(lines[-1]) if lines else None

    def _start(self, crash_at: str | None) -> Proc:
        """The run, forked by the launcher (tests/launcher.py; the snapshot test below starts the command
        the ordinary way)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
        if crash_at is not None:
            env["DELTATAIL_CRASH_AT"] = crash_at
        return popen(self.args(), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, spec: str) -> int:
        """One run: ``<point>:<k>`` (crash point), ``kill:<s>`` / ``term:<s>`` (SIGKILL / SIGTERM at a random
        moment up to ``s`` seconds after the run first shows progress), or ``clean``."""
        before = self.fingerprint()
        kind = spec.partition(":")[0]
        proc = self._start(spec if kind in POINTS else None)
        out, err = bytearray(), bytearray()
        readers = [_drain(proc.stdout, out), _drain(proc.stderr, err)]
        try:
            strike(proc, spec, self.rng, lambda: self.fingerprint(len(out)) != before, wait=WAIT, tick=0.002)
            proc.wait(WAIT)
        finally:
            proc.kill()
            for reader in readers:
                reader.join(WAIT)
        self.stdout.append(bytes(out))
        code = proc.returncode
        self.specs.append(spec)
        if code == -signal.SIGKILL:
            self.kills.add((spec if kind in POINTS else "kill", before))
            self.held_after_kills.append(self.held())
        else:
            assert code == 0, f"{spec}: exit {code}: {err.decode()[-3000:]}"
            self.terms += kind == "term"
        return code

    def campaign(self, kills_wanted: int, *, max_runs: int, delay: float, first: Sequence[str] = ()) -> None:
        """Crash runs until ``kills_wanted`` distinct kill points were hit, then a clean run (tests/crash.py)."""
        run_campaign(
            self.run,
            self.kills,
            self.rng,
            kills_wanted=kills_wanted,
            max_runs=max_runs,
            delay=delay,
            first=first,
            kill_share=0.25,
            term_share=0.07,
        )


def _drain(pipe: IO[bytes] | None, into: bytearray) -> threading.Thread:
    """Read ``pipe`` to its end in a thread (a child never blocks on a full pipe)."""
    assert pipe is not None

    def read() -> None:
        while chunk := os.read(pipe.fileno(), 1 << 16):
            into.extend(chunk)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


# ---------------------------------------------------------------- reading what was delivered


def jsonl_lines(chunks: Iterable[bytes]) -> list[dict[str, Any]]:
    """JSON lines of every run's output; a run killed mid-line leaves a torn last line, which is dropped."""
    lines: list[dict[str, Any]] = []
    for chunk in chunks:
        complete = chunk[: chunk.rfind(b"\n") + 1]
        lines += [orjson.loads(line) for line in complete.splitlines()]
    return lines


def position(row: Mapping[str, Any]) -> Pos:
    version, index, snap = row["_position"]
    return (int(version), bool(snap), int(index))


def assert_exactly_once(lines: list[dict[str, Any]], expected: Counter[Row]) -> None:
    positions = [position(r) for r in lines]
    order = [(v, not s, i) for v, s, i in positions]
    assert order == sorted(order) and len(set(order)) == len(order), "positions repeat or go backwards"
    assert_contiguous(positions, expected)
    assert_rows(Counter(canon(r) for r in lines), expected)


def assert_contiguous(positions: Iterable[Pos], expected: Counter[Row]) -> None:
    counts = per_version(expected)
    seen: dict[int, list[int]] = {}
    for version, snap, index in positions:
        assert not snap
        seen.setdefault(version, []).append(index)
    assert {v: sorted(ix) for v, ix in seen.items()} == {v: list(range(n)) for v, n in counts.items() if n}


def assert_at_least_once(lines: list[dict[str, Any]], expected: Counter[Row]) -> None:
    first: dict[Pos, Row] = {}
    for row in lines:
        key, value = position(row), canon(row)
        assert first.setdefault(key, value) == value, f"position {key} repeated with another row"
        assert row["_commit_version"] == key[0]
    assert_contiguous(first, expected)
    assert_rows(Counter(first.values()), expected)  # every expected row at least once, and repeats are exact
    assert len(lines) >= sum(expected.values())


_FILE = re.compile(r"^v(\d{20})-([sc])(\d{12})_v(\d{20})-([sc])(\d{12})\.parquet$")


def parquet_output(directory: Path, expected: Counter[Row]) -> Counter[Row]:
    """The rows of a ``parquet:DIR`` output, after checking that its files' position ranges tile the feed."""
    counts = per_version(expected)
    covered: dict[int, list[int]] = {}
    rows: Counter[Row] = Counter()
    names = sorted(p.name for p in directory.iterdir())
    assert not [n for n in names if n.startswith(".")], f"temporary files left: {names}"
    for name in names:
        m = _FILE.match(name)
        assert m, name
        start, end = (int(m.group(1)), int(m.group(3))), (int(m.group(4)), int(m.group(6)))
        version, index = start
        while (version, index) < end:
            stop = end[1] if version == end[0] else counts.get(version, 0)
            covered.setdefault(version, []).extend(range(index, stop))
            version, index = version + 1, 0
        table = pq.read_table(directory / name)
        rows.update(canon(r) for r in table.to_pylist())
    assert {v: sorted(ix) for v, ix in covered.items() if ix} == {v: list(range(n)) for v, n in counts.items() if n}
    return rows


# ---------------------------------------------------------------- the campaigns


@pytest.mark.slow
@pytest.mark.parametrize("sink", ["jsonl", "parquet"])
def test_kills_and_restarts_deliver_exactly_once(
    tmp_path: Path, tables: dict[str, tuple[Path, int]], sink: str
) -> None:
    rng = random.Random(f"crash-{sink}")
    kills: set[tuple[str, str]] = set()
    specs: list[str] = []
    terms = 0
    # On the large table, version 0 is delivered and saved, then two kills land inside the large commit.
    large_first = ("after_save:1", "after_write:3", "after_write:5")
    # The large table has only ~14 versions to die in (a faster tailer finishes it in fewer runs), so
    # the small table's 130 versions carry most of the 30 distinct kill points (a tailer that reads ahead
    # gets through more of it per run than one that does not).
    for name, wanted, first in (("small", 26, ()), ("large", 10, large_first)):
        root, version = tables[name]
        target = tmp_path / (f"{name}.jsonl" if sink == "jsonl" else f"{name}-parquet")
        c = Campaign(root, tmp_path / f"state-{name}", f"{sink}:{target}", rng)
        c.campaign(wanted, max_runs=50, delay=0.05, first=first)
        kills |= {(f"{name}:{spec}", state) for spec, state in c.kills}
        specs += c.specs
        terms += c.terms
        expected = expected_rows(root, version)
        if sink == "jsonl":
            assert_exactly_once(jsonl_lines([target.read_bytes()]), expected)
            if name == "large":  # some kills left the output in the middle of the 200,000-row commit
                inside = [p for p in c.held_after_kills if p is not None and p[0] == 1 and p[2] + 1 < 200_000]
                assert inside, f"no kill landed inside the large commit: {c.held_after_kills}"
        else:
            assert_rows(parquet_output(target, expected), expected)
    assert len(kills) >= 30, f"only {len(kills)} distinct kill points: {sorted(kills)}"
    points = {spec.split(":")[1] for spec, _ in kills}
    assert set(POINTS) | {"kill"} <= points, f"kill points hit: {points}"
    assert len({spec for spec, _ in kills if spec.split(":")[1] == "after_write"}) >= 3


@pytest.mark.slow
def test_kills_and_restarts_deliver_at_least_once_to_stdout(
    tables: dict[str, tuple[Path, int]], tmp_path: Path
) -> None:
    rng = random.Random("crash-stdout")
    for name, wanted in (("small", 8), ("large", 4)):
        root, version = tables[name]
        c = Campaign(root, tmp_path / f"state-{name}", "jsonl:-", rng)
        c.campaign(wanted, max_runs=20, delay=0.05)
        assert len(c.kills) >= wanted // 2
        assert_at_least_once(jsonl_lines(c.stdout), expected_rows(root, version))


# ---------------------------------------------------------------- an initial snapshot interrupted while the table moves


@pytest.mark.slow
def test_initial_snapshot_killed_midway_while_the_table_moves(tmp_path: Path) -> None:
    """Killed in the middle of its initial snapshot; the table gets a commit before the restart. The
    output must still be one consistent feed: one snapshot (at one version), then the changes after it."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    write_deltalake(str(root), data(range(80_000)), partition_by=["p"], configuration=CDF)
    first = DeltaTable(str(root)).version()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
    args = [sys.executable, "-m", "deltatail", "run", str(root), "--state-dir", str(state)]
    args += ["--sink", f"jsonl:{out}", "--initial-snapshot", "--until-caught-up"]
    killed = subprocess.run(
        args, cwd=ROOT, env={**env, "DELTATAIL_CRASH_AT": "after_write:4"}, capture_output=True, timeout=WAIT
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr.decode()
    partial = jsonl_lines([out.read_bytes()])
    assert 0 < len(partial) < 80_000  # rows of the first batches reached the file before the kill
    write_deltalake(str(root), data(range(90_000, 90_010)), mode="append")
    last = DeltaTable(str(root)).version()
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, timeout=WAIT)
    assert done.returncode == 0, done.stderr.decode()
    lines = jsonl_lines([out.read_bytes()])
    snapshot_versions = {r["_position"][0] for r in lines if r["_position"][2]}
    assert len(snapshot_versions) == 1, f"initial snapshots of versions {sorted(snapshot_versions)} in one feed"
    (at,) = snapshot_versions
    assert at in (first, last)
    live = pa.RecordBatchReader.from_stream(DeltaTable(str(root), version=at).scan()).read_all()
    want = Counter(canon({**r, "_change_type": "insert", "_commit_version": at}) for r in live.to_pylist())
    if at < last:
        table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=at + 1, ending_version=last).read_all())
        want.update(canon(r) for r in table.to_pylist())
    assert_rows(Counter(canon(r) for r in lines), want)
