"""The tailer's run loop (``tailer/follow/tailer.py``) on real tables written by ``deltalake``.

Oracles: ``DeltaTable.load_cdf`` and ``DeltaTable(..., version=v)`` scans of deltalake 1.6.6 (an
independent reader) and facts the tests wrote themselves (commit file times, the commits they
hand-wrote). Nothing expected here is computed by deltatail.

Most tests drive :class:`tailer.follow.tailer.Tailer` in a thread with a :class:`Gate` in place of the
watcher: the tailer reaches the gate only when it is idle (everything listed so far delivered and
checkpointed), so a test can change the table "while following" at a known point, release the
tailer, and wait for it to be idle again or to fail. The live-writer and signal tests run the
real ``deltatail run`` command against a writer in another process.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.cursor import Position
from deltatail.state.errors import (
    ConfigError,
    DeltaTailError,
    InvalidLogError,
    SchemaChangeError,
    StateError,
    UnsupportedFeatureError,
    VersionGapError,
)
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.cli.settings import merge
from deltatail.tailer.follow.tailer import Tailer, TailerConfig
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.runtime.status import count_change_types
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage import LocalStorage, Storage

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0
"""Generous timeout (seconds) for anything a test waits for; never an assertion about speed."""
CDF = {"delta.enableChangeDataFeed": "true"}
Row = tuple[tuple[str, Hashable], ...]


# ---------------------------------------------------------------- tables written by deltalake


def data(ids: Iterable[int], *, bump: float = 0.0) -> pa.Table:
    """Rows ``id, name, score`` for ``ids``."""
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
            "score": pa.array([i * 0.5 + bump for i in ids], pa.float64()),
        }
    )


def create(root: Path, ids: Iterable[int] = range(10)) -> None:
    write_deltalake(str(root), data(ids), configuration=CDF)


def append(root: Path, ids: Iterable[int]) -> int:
    write_deltalake(str(root), data(ids), mode="append")
    return DeltaTable(str(root)).version()


def merge_rows(root: Path, ids: Iterable[int]) -> int:
    """Upsert ``ids`` (existing ones get a new score, new ones are inserted)."""
    dt = DeltaTable(str(root))
    (
        dt.merge(data(ids, bump=1000.0), "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    return DeltaTable(str(root)).version()


def varied_table(root: Path) -> int:
    """Versions 0..4: create, append, delete, update, merge. Returns the latest version."""
    create(root, range(10))
    append(root, range(10, 20))
    DeltaTable(str(root)).delete("id < 3")
    DeltaTable(str(root)).update(updates={"score": "score + 100.0"}, predicate="id >= 15")
    return merge_rows(root, [5, 6, 20, 21])


def latest(root: Path) -> int:
    return DeltaTable(str(root)).version()


def table_id(root: Path) -> str:
    return str(DeltaTable(str(root)).metadata().id)


def commit_file(root: Path, version: int) -> Path:
    return root / "_delta_log" / f"{version:020d}.json"


# ---------------------------------------------------------------- comparing rows


def canon(row: Mapping[str, Any]) -> Row:
    """A row without ``_commit_timestamp`` (deltatail uses file times, deltalake commitInfo) and ``_position``."""
    return tuple(sorted((k, v) for k, v in row.items() if k not in ("_commit_timestamp", "_position")))


def expected_cdf(root: Path, start: int, end: int) -> Counter[Row]:
    """deltalake's change rows of ``start..end`` as a multiset."""
    table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=start, ending_version=end).read_all())
    return Counter(canon(r) for r in table.to_pylist())


def expected_snapshot(root: Path, version: int) -> Counter[Row]:
    """deltalake's live rows at ``version`` as initial-snapshot ``insert`` rows of that version."""
    reader = DeltaTable(str(root), version=version).scan()
    table = pa.RecordBatchReader.from_stream(reader).read_all()
    return Counter(canon({**r, "_change_type": "insert", "_commit_version": version}) for r in table.to_pylist())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def rows_of(lines: Iterable[Mapping[str, Any]]) -> Counter[Row]:
    return Counter(canon(r) for r in lines)


def assert_rows(actual: Counter[Row], expected: Counter[Row]) -> None:
    missing, extra = expected - actual, actual - expected
    assert not missing and not extra, (
        f"missing {len(missing)}: {list(missing)[:5]}; extra {len(extra)}: {list(extra)[:5]}"
    )


def assert_positions(lines: list[dict[str, Any]]) -> None:
    """Positions strictly increase in output order, and each version's indexes are exactly 0..n-1."""
    keys = [Position(r["_position"][0], 0 if r["_position"][2] else 1, r["_position"][1]) for r in lines]
    assert all(a < b for a, b in itertools.pairwise(keys)), "positions not unique and increasing"
    per_version: dict[tuple[int, int], list[int]] = {}
    for row, key in zip(lines, keys, strict=True):
        assert row["_commit_version"] == key.version, f"row of version {row['_commit_version']} at {key}"
        per_version.setdefault((key.version, key.snapshot_rank), []).append(key.index)
    for version, indexes in per_version.items():
        assert indexes == list(range(len(indexes))), f"indexes of {version} are not contiguous from 0"


def saved_cursor(state_dir: Path) -> Position | None:
    """The cursor in ``cursor.json`` (only used to know when a subprocess tailer has caught up)."""
    try:
        body = json.loads((state_dir / "cursor.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return Position.from_json(body["state"]["cursor"])


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


# ---------------------------------------------------------------- the tailer in a thread


class Gate:
    """Stands in for ``tailer.follow.tailer.LogWatcher``: an idle tailer waits here until the test releases it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._waiting = False
        self._open = False

    def __call__(self, *args: Any, **kwargs: Any) -> Gate:  # LogWatcher(log_dir, watch=...)
        return self

    def wait(self, timeout: float) -> bool:
        with self._cond:
            self._waiting = True
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._waiting or self._open, timeout=WAIT)
            self._waiting = False
        return True

    def wake(self) -> None:
        self.open()

    def close(self) -> None:
        pass

    def release(self) -> None:
        with self._cond:
            self._waiting = False
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()

    def idle_or_done(self, thread: threading.Thread) -> None:
        deadline = time.monotonic() + WAIT
        with self._cond:
            while not self._waiting and thread.is_alive():
                if time.monotonic() > deadline:
                    pytest.fail("the tailer neither went idle nor stopped")
                self._cond.wait(0.02)


class MemorySink(Sink):
    """A sink that cannot tell what it holds (``open`` returns ``None``): delivery relies on the cursor alone."""

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.flushes = 0
        self.on_write: Callable[[ChangeBatch], None] | None = None

    def open(self, table: TableInfo) -> Position | None:
        return None

    def write(self, batch: ChangeBatch) -> None:
        start = batch.start
        for i, row in enumerate(batch.rows.to_pylist()):
            self.lines.append({**row, "_position": [start.version, start.index + i, start.snapshot]})
        if self.on_write is not None:
            self.on_write(batch)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        pass


class Following:
    """A :class:`Tailer` running in a thread behind a :class:`Gate`."""

    def __init__(self, tailer: Tailer, gate: Gate) -> None:
        self.tailer = tailer
        self.gate = gate
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.tailer.run()
        except BaseException as e:  # handed to the test
            self.error = e

    def idle(self) -> None:
        """Wait until the tailer is idle; fail if it stopped with an error."""
        self.gate.idle_or_done(self.thread)
        if self.error is not None:
            raise AssertionError(f"the tailer failed: {self.error!r}") from self.error
        assert self.thread.is_alive(), "the tailer returned instead of following"

    def step(self) -> None:
        """Let the idle tailer look at the log again and wait until it is idle again."""
        self.gate.release()
        self.idle()

    def step_to_error(self) -> BaseException:
        """Let the tailer look again; it must stop with an error, which is returned."""
        self.gate.release()
        self.gate.idle_or_done(self.thread)
        if self.thread.is_alive():
            self.stop()
            pytest.fail("the tailer went on following instead of stopping with an error")
        assert self.error is not None, "the tailer stopped without an error"
        return self.error

    def stop(self) -> None:
        self.tailer.stop()
        self.gate.open()
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


@pytest.fixture
def gate() -> Gate:
    return Gate()


class ReadHook(LocalStorage):
    """The local file system, calling ``after_read(path)`` after every read: tests see what the tailer reads."""

    def __init__(self, after_read: Callable[[str], None]) -> None:
        self.after_read = after_read

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        data = super().read(path, offset, length)
        self.after_read(path)
        return data


def config(root: Path, state: Path, **kwargs: Any) -> TailerConfig:
    return TailerConfig(table=str(root), state_dir=str(state), **kwargs)


def follow(
    root: Path, state: Path, out: Path | Sink, gate: Gate, storage: Storage | None = None, **kwargs: Any
) -> Following:
    sink = out if isinstance(out, Sink) else JsonLinesSink(str(out))
    settings = config(root, state, **kwargs)
    feed = ChangeFeed(str(root), storage, settings.options)
    following = Following(Tailer(settings, sink, feed=feed, watcher=gate), gate)
    following.idle()
    return following


def run_once(root: Path, state: Path, out: Path | Sink, **kwargs: Any) -> None:
    """Run a tailer until it is caught up."""
    sink = out if isinstance(out, Sink) else JsonLinesSink(str(out))
    Tailer(config(root, state, until_caught_up=True, **kwargs), sink).run()


def assert_names(error: DeltaTailError, *, table: Path, version: int | None = None, file: Path | None = None) -> None:
    text = str(error)
    assert str(table) in text, text
    if version is not None:
        assert f"version {version}" in text, text
        assert error.version == version
    if file is not None:
        assert str(file) in text, text


# ---------------------------------------------------------------- the command line


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "deltatail", *args]


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTATAIL_")}
    env.update(extra)
    return env


class Cli:
    """``deltatail run`` in a subprocess, its stderr read in the background."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            cli(*args), cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self.err = bytearray()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        while chunk := os.read(self.proc.stderr.fileno(), 1 << 16):
            self.err.extend(chunk)

    def wait_running(self) -> None:
        """Wait until the run loop has logged (its signal handlers are installed by then)."""
        wait_for(lambda: b"following:" in self.err or b"resuming" in self.err, "the tailer to run")

    def finish(self, sig: int, timeout: float = WAIT) -> tuple[int, str]:
        """Send ``sig``; return the exit code and stderr."""
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self._reader.join(WAIT)
            pytest.fail(f"the tailer did not exit within {timeout}s of signal {sig}: {self.err.decode()[-2000:]}")
        self._reader.join(WAIT)
        return self.proc.returncode, self.err.decode()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cli(*args), cwd=ROOT, env=env or cli_env(), capture_output=True, timeout=WAIT, check=False)


# ---------------------------------------------------------------- 1. a live writer in another process

WRITER = r"""
import random, sys, time
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

root, seconds, seed, next_id = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(seed)

def data(ids, bump=0.0):
    ids = list(ids)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "name": pa.array([f"n{i}" for i in ids], pa.string()),
        "score": pa.array([i * 0.5 + bump for i in ids], pa.float64()),
    })

counts = {}
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    kind = ["append", "delete", "append", "update", "merge"][sum(counts.values()) % 5]
    dt = DeltaTable(root)
    lo = rng.randrange(next_id)
    if kind == "append":
        n = rng.randint(1, 30)
        write_deltalake(root, data(range(next_id, next_id + n)), mode="append")
        next_id += n
    elif kind == "delete":
        dt.delete(f"id >= {lo} AND id < {lo + rng.randint(1, 6)}")
    elif kind == "update":
        dt.update(updates={"score": "score + 1.5"}, predicate=f"id >= {lo} AND id < {lo + 5}")
    else:
        ids = sorted({lo, lo + 1, lo + 2, next_id, next_id + 1})
        next_id += 2
        (dt.merge(data(ids, bump=rng.randint(1, 9) * 100.0), "t.id = s.id", source_alias="s", target_alias="t")
           .when_matched_update_all().when_not_matched_insert_all().execute())
    counts[kind] = counts.get(kind, 0) + 1
print(DeltaTable(root).version(), counts, flush=True)
"""


def start_writer(tmp_path: Path, root: Path, seconds: float, seed: int, next_id: int) -> subprocess.Popen[str]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return subprocess.Popen(
        [sys.executable, str(script), str(root), str(seconds), str(seed), str(next_id)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_writer(writer: subprocess.Popen[str]) -> int:
    out, err = writer.communicate(timeout=WAIT)
    assert writer.returncode == 0, err
    version, _, counts = out.strip().partition(" ")
    for kind in ("append", "delete", "update", "merge"):
        assert f"'{kind}'" in counts, f"the writer never ran a {kind}: {counts}"
    return int(version)


def wait_caught_up(state: Path, version: int) -> None:
    wait_for(
        lambda: saved_cursor(state) == Position.change(version + 1, 0), f"the tailer to checkpoint version {version}"
    )


def wait_delivered(out: Path, root: Path, version: int) -> None:
    """Wait until ``out`` holds as many complete lines as deltalake's change rows of versions ``0..version``."""
    want = sum(expected_cdf(root, 0, version).values())

    def complete_lines() -> int:
        return out.read_bytes().count(b"\n") if out.exists() else 0

    wait_for(lambda: complete_lines() >= want, f"the rows of versions 0..{version} delivered")


def check_live_output(root: Path, out: Path, version: int) -> None:
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_cdf(root, 0, version))
    assert {r["_commit_version"] for r in lines} <= set(range(version + 1))


@pytest.mark.slow
def test_live_writer_followed_with_watching(tmp_path: Path) -> None:
    """A writer process commits appends, deletes, updates and merges; ``deltatail run`` follows it by
    inotify, goes idle once the writer stops, and exits 0 on SIGTERM: the output is deltalake's CDF."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root, range(20))
    tailer = Cli("run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--poll-interval", "5")
    try:
        tailer.wait_running()  # following before the writer starts
        version = wait_writer(start_writer(tmp_path, root, 3.0, seed=1, next_id=20))
        wait_delivered(out, root, version)  # not the cursor: that waits for the 5 s checkpoint timer
        code, err = tailer.finish(signal.SIGTERM)
    finally:
        tailer.kill()
    assert code == 0, err
    assert saved_cursor(state) == Position.change(version + 1, 0)  # saved on the way out
    check_live_output(root, out, version)


@pytest.mark.slow
def test_live_writer_followed_by_polling_across_restarts(tmp_path: Path) -> None:
    """The same with ``--no-watch`` polling, stopped by SIGTERM while the writer runs, restarted, stopped
    again, and finished by ``--until-caught-up``: still exactly deltalake's CDF, no row twice."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root, range(20))
    args = ("run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--no-watch")
    writer = start_writer(tmp_path, root, 3.0, seed=2, next_id=20)
    codes = []
    try:
        for _ in range(2):
            tailer = Cli(*args, "--poll-interval", "0.05", "--checkpoint-commits", "7")
            try:
                tailer.wait_running()
                time.sleep(0.7)
                codes.append(tailer.finish(signal.SIGTERM))
            finally:
                tailer.kill()
    finally:
        version = wait_writer(writer)
    assert all(code == 0 for code, _ in codes), codes
    final = run_cli(*args, "--until-caught-up")
    assert final.returncode == 0, final.stderr.decode()
    assert saved_cursor(state) == Position.change(version + 1, 0)
    check_live_output(root, out, version)


# ---------------------------------------------------------------- stopping inside a commit


def test_stop_inside_a_commit_saves_a_cursor_inside_it(tmp_path: Path) -> None:
    """Stopped after the third batch of a 20,000-row commit, the tailer saves a cursor inside the commit;
    a restart with a sink that cannot deduplicate delivers exactly the rest."""
    root, state = tmp_path / "t", tmp_path / "state"
    create(root, range(5))
    options = ChangeOptions(batch_size=1000)
    first = MemorySink()
    run_once(root, state, first, options=options)
    big = append(root, range(100, 20_100))
    end = append(root, range(5, 8))
    second = MemorySink()
    tailer = Tailer(config(root, state, until_caught_up=True, options=options), second)
    writes = 0

    def stop_after_third(batch: ChangeBatch) -> None:
        nonlocal writes
        writes += 1
        if writes == 3:
            tailer.stop()

    second.on_write = stop_after_third
    tailer.run()
    assert len(second.lines) == 3000
    assert saved_cursor(state) == Position.change(big, 3000)
    third = MemorySink()
    run_once(root, state, third, options=options)
    lines = first.lines + second.lines + third.lines
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_cdf(root, 0, end))


# ---------------------------------------------------------------- 3. failure paths


def test_version_gap_in_a_copied_table(tmp_path: Path) -> None:
    """A commit missing in the middle of the log: VersionGapError naming it, even with --until-caught-up."""
    source, root, state, out = tmp_path / "src", tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    version = varied_table(source)
    shutil.copytree(source, root)
    commit_file(root, 2).unlink()
    with pytest.raises(VersionGapError) as info:
        run_once(root, state, out)
    assert_names(info.value, table=root, version=2, file=commit_file(root, 2))
    assert version > 2
    lines = read_jsonl(out)
    assert_rows(rows_of(lines), expected_cdf(source, 0, 1))  # what came before the gap, nothing after it


@pytest.mark.parametrize("keep_start", [True, False], ids=["commits-0-2-kept", "cleaned-from-0"])
def test_log_cleaned_up_past_the_cursor(tmp_path: Path, keep_start: bool) -> None:
    """The tailer has delivered versions 0..3; then commits 3..8 (or 0..8) are removed, a checkpoint at 9 and
    commits 9..10 kept: VersionGapError at version 4, with the hint to restart with --initial-snapshot."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root, range(5))
    for v in range(1, 4):
        append(root, [100 + v])
    run_once(root, state, out)
    assert saved_cursor(state) == Position.change(4, 0)
    for v in range(4, 10):
        append(root, [100 + v])
    DeltaTable(str(root)).create_checkpoint()
    append(root, [110])
    assert (root / "_delta_log" / f"{9:020d}.checkpoint.parquet").exists() and latest(root) == 10
    for v in range(0 if not keep_start else 3, 9):
        commit_file(root, v).unlink()
    with pytest.raises(VersionGapError) as info:
        run_once(root, state, out)
    assert_names(info.value, table=root, version=4)
    assert "--initial-snapshot" in str(info.value), f"no recovery hint: {info.value}"


def truncated_next_commit(tmp_path: Path, root: Path) -> tuple[bytes, int]:
    """The bytes of a valid next commit of ``root``, made by deltalake on a copy (its data file copied over)."""
    scratch = tmp_path / "scratch"
    shutil.copytree(root, scratch)
    version = append(scratch, range(500, 503))
    for f in scratch.glob("*.parquet"):
        if not (root / f.name).exists():
            shutil.copyfile(f, root / f.name)
    return commit_file(scratch, version).read_bytes(), version


def test_unparsable_commit_is_refused_after_retries(tmp_path: Path, gate: Gate) -> None:
    """A truncated next commit that stays truncated: InvalidLogError naming the file, after the retries."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root)
    body, version = truncated_next_commit(tmp_path, root)
    expected = expected_cdf(root, 0, 0)
    path = commit_file(root, version)
    attempts: list[str] = []
    storage = ReadHook(lambda read: attempts.append(read) if read == str(path) else None)
    following = follow(root, state, out, gate, storage, parse_retries=3, parse_retry_delay=0.01)
    path.write_bytes(body[: len(body) // 2])  # cut inside a line
    error = following.step_to_error()
    assert type(error) is InvalidLogError, repr(error)
    assert_names(error, table=root, version=version, file=path)
    assert len(attempts) == 4  # the first read and three retries
    assert_rows(rows_of(read_jsonl(out)), expected)


def test_an_unparsable_commit_followed_by_a_later_one_is_refused_at_once(tmp_path: Path) -> None:
    """Writers commit in order: a commit with a later one after it is complete, so it is not read again."""
    root = tmp_path / "t"
    create(root)
    middle = append(root, range(10, 12))
    append(root, range(12, 14))
    path = commit_file(root, middle)
    path.write_bytes(path.read_bytes()[:-9])  # cut inside its last line
    reads: list[str] = []
    feed = ChangeFeed(str(root), ReadHook(lambda read: reads.append(read) if read == str(path) else None))
    with pytest.raises(InvalidLogError) as info:
        list(feed.batches(0))
    assert_names(info.value, table=root, version=middle, file=path)
    assert len(reads) == 1


def test_commit_completed_within_the_retry_window_is_read(tmp_path: Path, gate: Gate) -> None:
    """A non-atomic store: the commit is seen half written, then completed while the tailer retries."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root)
    body, version = truncated_next_commit(tmp_path, root)
    path = commit_file(root, version)
    reads: list[str] = []

    def complete_after_first_read(read: str) -> None:
        if read == str(path):
            reads.append(read)
            if len(reads) == 1:
                path.write_bytes(body)  # the writer finishes its commit while the tailer backs off

    storage = ReadHook(complete_after_first_read)
    following = follow(root, state, out, gate, storage, parse_retries=8, parse_retry_delay=0.02)
    path.write_bytes(body[: len(body) - 7])
    following.step()
    following.stop()
    assert len(reads) == 2  # the half-written commit, then the whole one
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_cdf(root, 0, version))


@pytest.mark.parametrize("damage", ["truncated", "bad-checksum", "empty"])
def test_corrupt_cursor_file_is_an_error_not_a_restart(tmp_path: Path, damage: str) -> None:
    """A damaged cursor.json: StateError with a recovery hint; nothing delivered, the file left as it is."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    version = varied_table(root)
    run_once(root, state, out)
    cursor = state / "cursor.json"
    raw = cursor.read_bytes()
    if damage == "truncated":
        cursor.write_bytes(raw[: len(raw) // 2])
    elif damage == "bad-checksum":
        cursor.write_bytes(raw.replace(b'"version": 5', b'"version": 0'))
    else:
        cursor.write_bytes(b"")
    damaged = cursor.read_bytes()
    assert damaged != raw
    append(root, [99])
    sink = MemorySink()
    with pytest.raises(StateError) as info:
        run_once(root, state, sink)
    assert str(cursor) in str(info.value)
    assert "--starting-version" in str(info.value) and "backup" in str(info.value), str(info.value)
    assert sink.lines == []  # it did not start again from version 0
    assert cursor.read_bytes() == damaged
    assert_rows(rows_of(read_jsonl(out)), expected_cdf(root, 0, version))


def test_second_tailer_on_a_locked_state_dir(tmp_path: Path, gate: Gate) -> None:
    """A second tailer on a state directory in use is refused; the first one goes on."""
    root, state = tmp_path / "t", tmp_path / "state"
    create(root)
    first = follow(root, state, tmp_path / "a.jsonl", gate)
    second = MemorySink()
    with pytest.raises(StateError) as info:
        run_once(root, state, second)
    assert "another tailer" in str(info.value) and str(os.getpid()) in str(info.value)
    assert str(state / "LOCK") in str(info.value)
    assert second.lines == []
    version = append(root, [50])
    first.step()  # the first one is unaffected
    first.stop()
    assert_rows(rows_of(read_jsonl(tmp_path / "a.jsonl")), expected_cdf(root, 0, version))
    run_once(root, state, second)  # the lock is released when the first one stops
    assert second.lines == []


def test_state_dir_of_another_table(tmp_path: Path) -> None:
    """The state directory of table A used for table B: StateError naming both table ids."""
    a, b, state = tmp_path / "a", tmp_path / "b", tmp_path / "state"
    create(a)
    create(b)
    run_once(a, state, tmp_path / "a.jsonl")
    sink = MemorySink()
    with pytest.raises(StateError) as info:
        run_once(b, state, sink)
    text = str(info.value)
    assert table_id(a) in text and table_id(b) in text and str(b) in text, text
    assert sink.lines == []


@pytest.mark.parametrize("new_versions", [1, 3, 6], ids=["fewer-versions", "as-many", "more-versions"])
def test_table_deleted_and_recreated_while_following(tmp_path: Path, gate: Gate, new_versions: int) -> None:
    """The tailer at version 2; the table is removed and written anew with 1, 3 or 6 versions."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root, range(5))
    append(root, [5])
    append(root, [6])
    old_id = table_id(root)
    following = follow(root, state, out, gate)
    shutil.rmtree(root)
    create(root, range(1000, 1003))
    for v in range(1, new_versions):
        append(root, [1000 + 10 * v])
    assert table_id(root) != old_id
    error = following.step_to_error()
    assert isinstance(error, StateError), repr(error)
    assert str(root) in str(error)
    assert all(r["id"] < 1000 for r in read_jsonl(out)), "rows of the new table were delivered"
    with pytest.raises(StateError) as info:  # a restart refuses the state directory too
        run_once(root, state, MemorySink())
    assert old_id in str(info.value) and table_id(root) in str(info.value)


def test_schema_change_mid_stream(tmp_path: Path, gate: Gate) -> None:
    """A column dropped mid-stream: SchemaChangeError, cursor saved at that version, nothing before it
    repeated on restart; with allow_non_additive the tailer goes on across the change."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root, range(10))
    append(root, range(10, 15))
    following = follow(root, state, out, gate)
    before = append(root, range(15, 18))
    expected_before = expected_cdf(root, 0, before)  # deltalake reads old versions with the newest schema
    write_deltalake(str(root), data(range(30, 33)).drop_columns(["score"]), mode="overwrite", schema_mode="overwrite")
    change = before + 1
    write_deltalake(str(root), data([40]).drop_columns(["score"]), mode="append")
    end = latest(root)
    error = following.step_to_error()
    assert isinstance(error, SchemaChangeError), repr(error)
    assert "score" in str(error)
    assert_names(error, table=root, version=change, file=commit_file(root, change))
    assert saved_cursor(state) == Position.change(change, 0)
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_before)
    # Restarting with a sink that cannot deduplicate: nothing before the change comes again.
    again = MemorySink()
    with pytest.raises(SchemaChangeError):
        run_once(root, state, again)
    assert again.lines == []
    # Allowed explicitly, it goes on across the change. deltalake reads the rows the overwrite deletes
    # in the new schema; deltatail delivers them as they were, with the dropped column's values.
    run_once(root, state, out, options=ChangeOptions(allow_non_additive=True))
    lines = read_jsonl(out)
    assert_positions(lines)
    scores = {r["id"]: r["score"] for r in DeltaTable(str(root), version=change - 1).to_pyarrow_table().to_pylist()}
    after: Counter[Row] = Counter()
    for row, n in expected_cdf(root, change, end).items():
        fields = dict(row)
        if fields["_change_type"] == "delete" and fields["_commit_version"] == change:
            fields["score"] = scores[fields["id"]]
        after[canon(fields)] += n
    assert_rows(rows_of(lines), expected_before + after)
    assert saved_cursor(state) == Position.change(end + 1, 0)


def test_unsupported_reader_feature_mid_stream(tmp_path: Path, gate: Gate) -> None:
    """A commit requiring reader feature catalogManaged: UnsupportedFeatureError, cursor saved before it."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root, range(10))
    following = follow(root, state, out, gate)
    before = append(root, range(10, 13))
    expected = expected_cdf(root, 0, before)
    upgrade = before + 1
    protocol = {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": ["catalogManaged"],
        "writerFeatures": ["catalogManaged", "inCommitTimestamp"],
    }
    info = {"timestamp": int(time.time() * 1000), "operation": "UPGRADE PROTOCOL"}
    commit_file(root, upgrade).write_text(json.dumps({"commitInfo": info}) + "\n" + json.dumps({"protocol": protocol}))
    error = following.step_to_error()
    assert isinstance(error, UnsupportedFeatureError), repr(error)
    assert error.features == frozenset({"catalogManaged"})
    assert "catalogManaged" in str(error)
    assert_names(error, table=root, version=upgrade, file=commit_file(root, upgrade))
    assert saved_cursor(state) == Position.change(upgrade, 0)
    assert_rows(rows_of(read_jsonl(out)), expected)
    again = MemorySink()
    with pytest.raises(UnsupportedFeatureError):
        run_once(root, state, again)
    assert again.lines == []


def test_temporary_crc_checkpoint_and_compaction_files_while_following(tmp_path: Path, gate: Gate) -> None:
    """Temporary and partial commit files, .crc files, a checkpoint and a compaction file appear in
    _delta_log while following: the output is still exactly deltalake's change feed."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    create(root, range(10))
    append(root, range(10, 20))
    log = root / "_delta_log"
    following = follow(root, state, out, gate)
    garbage = b'{"add": {"path": "nowhere.parquet", "size": 1, "partitionVal'
    (log / f"_commit_{uuid.uuid4()}.json.tmp").write_bytes(garbage)  # delta-rs's temporary commit
    (log / f".{2:020d}.json.{uuid.uuid4()}.tmp").write_bytes(garbage)  # Hadoop-style temporary commit
    (log / f"{2:020d}.json.tmp").write_bytes(garbage)
    (log / f"{2:020d}.json.partial").write_bytes(garbage)
    (log / f".{1:020d}.json.crc").write_bytes(b"\x00\x01garbage")  # Hadoop checksum side file
    (log / f"{0:020d}.crc").write_text(json.dumps({"tableSizeBytes": 1, "numFiles": 2}))  # not a commit
    following.step()
    DeltaTable(str(root)).delete("id < 4")  # version 2
    (log / f"{1:020d}.crc").write_text("{ not json")
    DeltaTable(str(root)).create_checkpoint()
    compacted = b"".join(commit_file(root, v).read_bytes() for v in (1, 2))
    (log / f"{1:020d}.{2:020d}.compacted.json").write_bytes(compacted)
    following.step()
    DeltaTable(str(root)).update(updates={"score": "score * 2.0"}, predicate="id > 15")  # version 3
    merge_rows(root, [4, 5, 30])  # version 4
    (log / f"{5:020d}.json.tmp").write_bytes(garbage)
    following.step()
    following.stop()
    for noise in log.iterdir():  # deltalake, the oracle, would trip over some of them
        if noise.name.endswith((".crc", ".tmp", ".partial", ".compacted.json")):
            noise.unlink()
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_cdf(root, 0, 4))


# ---------------------------------------------------------------- settings


def test_settings_merge_flags_over_environment_over_toml(tmp_path: Path) -> None:
    """tailer.cli.settings.merge: flags > environment > TOML ([run] table or top level, - or _), errors named."""
    toml = tmp_path / "a.toml"
    toml.write_text(
        '[run]\npoll-interval = 3.0\nsink = "jsonl:toml"\nstarting_version = 5\nno-watch = true\nkey = "id"\n'
    )
    other = tmp_path / "b.toml"
    other.write_text('poll_interval = 9.0\nsink = "jsonl:other"\n')
    env = {"DELTATAIL_CONFIG": str(toml), "DELTATAIL_POLL_INTERVAL": "2", "DELTATAIL_SINK": "jsonl:env"}
    flags: dict[str, Any] = {"config": None, "poll_interval": 1.0, "sink": None, "starting_version": None}
    s = merge(flags, env)
    assert s["poll_interval"] == 1.0 and s["sink"] == "jsonl:env" and s["starting_version"] == 5
    assert s["no_watch"] is True and s["key"] == "id"
    assert merge({**flags, "poll_interval": None}, env)["poll_interval"] == 2.0
    assert merge({**flags, "poll_interval": None}, {"DELTATAIL_CONFIG": str(toml)})["poll_interval"] == 3.0
    assert merge({**flags, "poll_interval": None, "config": str(other)}, env)["sink"] == "jsonl:env"
    s = merge({**flags, "poll_interval": None, "config": str(other)}, {"DELTATAIL_CONFIG": str(toml)})
    assert s["poll_interval"] == 9.0 and s["sink"] == "jsonl:other" and "starting_version" not in s
    assert merge({}, {"DELTATAIL_NO_WATCH": "no", "DELTATAIL_UNTIL_CAUGHT_UP": "1"}) == {
        "no_watch": False,
        "until_caught_up": True,
    }
    with pytest.raises(ConfigError, match="DELTATAIL_POLL_INTERVAL"):
        merge({}, {"DELTATAIL_POLL_INTERVAL": "soon"})
    bad = tmp_path / "bad.toml"
    bad.write_text("pol_interval = 1\n")
    with pytest.raises(ConfigError) as info:
        merge({"config": str(bad)}, {})
    assert str(bad) in str(info.value) and "pol_interval" in str(info.value)


@pytest.mark.slow
def test_cli_settings_precedence(tmp_path: Path) -> None:
    """deltatail run: flags over DELTATAIL_* environment over the TOML file, seen in what it delivers."""
    root = tmp_path / "t"
    version = varied_table(root)
    toml = tmp_path / "run.toml"
    toml.write_text(
        f'state_dir = "{tmp_path / "state-toml"}"\nsink = "jsonl:{tmp_path / "toml.jsonl"}"\n'
        "starting_version = 1\nuntil-caught-up = true\n"
    )
    # TOML alone, except the environment's starting version.
    done = run_cli("run", str(root), env=cli_env(DELTATAIL_CONFIG=str(toml), DELTATAIL_STARTING_VERSION="3"))
    assert done.returncode == 0, done.stderr.decode()
    assert_rows(rows_of(read_jsonl(tmp_path / "toml.jsonl")), expected_cdf(root, 3, version))
    # Flags over both.
    flag_out, env_out = tmp_path / "flag.jsonl", tmp_path / "env.jsonl"
    done = run_cli(
        "run",
        str(root),
        "--config",
        str(toml),
        "--starting-version",
        "4",
        "--state-dir",
        str(tmp_path / "state-flag"),
        env=cli_env(DELTATAIL_STARTING_VERSION="3", DELTATAIL_SINK=f"jsonl:{env_out}"),
    )
    assert done.returncode == 0, done.stderr.decode()
    # The environment's sink beats the TOML's, the flag's starting version the environment's ...
    assert_rows(rows_of(read_jsonl(env_out)), expected_cdf(root, 4, version))
    done = run_cli(
        "run",
        str(root),
        "--config",
        str(toml),
        "--state-dir",
        str(tmp_path / "state-flag2"),
        "--sink",
        f"jsonl:{flag_out}",
        "--starting-version",
        "2",
        env=cli_env(DELTATAIL_STARTING_VERSION="3", DELTATAIL_SINK=f"jsonl:{env_out}"),
    )
    assert done.returncode == 0, done.stderr.decode()  # ... and the flag's sink beats the environment's
    assert_rows(rows_of(read_jsonl(flag_out)), expected_cdf(root, 2, version))
    bad = run_cli("run", str(root), "--state-dir", str(tmp_path / "s3"), env=cli_env(DELTATAIL_CHECKPOINT_COMMITS="x"))
    assert bad.returncode == 2 and b"DELTATAIL_CHECKPOINT_COMMITS" in bad.stderr


# ---------------------------------------------------------------- starting points on a new state directory


def test_starting_version(tmp_path: Path) -> None:
    """--starting-version on a new state directory; ignored once the directory has a cursor."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    version = varied_table(root)
    run_once(root, state, out, starting_version=2)
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_cdf(root, 2, version))
    more = merge_rows(root, [1, 2, 40])
    run_once(root, state, out, starting_version=0)  # ignored: the state directory has its cursor
    assert_rows(rows_of(read_jsonl(out)), expected_cdf(root, 2, more))


def test_starting_timestamp(tmp_path: Path) -> None:
    """Commit times are the commit files' modification times (set here), made monotonic."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    version = varied_table(root)
    base = int(time.time()) - 3600
    for v in range(version + 1):
        os.utime(commit_file(root, v), (base + 100 * v, base + 100 * v))
    run_once(root, state, out, starting_timestamp_ms=(base + 250) * 1000)
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_cdf(root, 3, version))
    stamps = {(r["_commit_version"], r["_commit_timestamp"]) for r in lines}
    assert stamps == {(v, time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(base + 100 * v))) for v in (3, 4)}


@pytest.mark.parametrize("start", [None, 2])
def test_initial_snapshot(tmp_path: Path, start: int | None) -> None:
    """--initial-snapshot (at the latest version, or at --starting-version): the live rows first, as
    snapshot positions of that version, then the changes after it; a restart goes on from the cursor."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    version = varied_table(root)
    at = version if start is None else start
    run_once(root, state, out, initial_snapshot=True, starting_version=start)
    lines = read_jsonl(out)
    assert_positions(lines)
    snapshot_lines = [r for r in lines if r["_position"][2]]
    assert {r["_position"][0] for r in snapshot_lines} == {at}
    assert lines[: len(snapshot_lines)] == snapshot_lines  # the snapshot comes first
    assert_rows(rows_of(snapshot_lines), expected_snapshot(root, at))
    changes = expected_cdf(root, at + 1, version) if at < version else Counter[Row]()
    assert_rows(rows_of(lines[len(snapshot_lines) :]), changes)
    more = append(root, [77, 78])
    run_once(root, state, out, initial_snapshot=True, starting_version=start)
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines[len(snapshot_lines) :]), changes + expected_cdf(root, more, more))


# ---------------------------------------------------------------- signals


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_exits_zero_with_the_cursor_saved(tmp_path: Path, sig: int) -> None:
    """Following by inotify with an hour between polls: a signal stops it (promptly, not at the next poll),
    exit code 0, cursor saved after the last delivered commit."""
    root, state, out = tmp_path / "t", tmp_path / "state", tmp_path / "out.jsonl"
    version = varied_table(root)
    # A cursor saved at every commit: the test waits for each commit's cursor, not for the 5 s checkpoint timer.
    args = ("run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--poll-interval", "3600")
    proc = Cli(*args, "--checkpoint-commits", "1")
    try:
        wait_caught_up(state, version)
        more = append(root, [90, 91])
        wait_caught_up(state, more)
        time.sleep(0.5)  # let it settle into waiting for the next change
        code, err = proc.finish(sig, timeout=10)
    finally:
        proc.kill()
    assert code == 0, err
    assert saved_cursor(state) == Position.change(more + 1, 0)
    lines = read_jsonl(out)
    assert_positions(lines)
    assert_rows(rows_of(lines), expected_cdf(root, 0, more))


@pytest.mark.parametrize("rows", [1, 64, 65, 5000])
def test_change_types_are_counted_per_kind_in_short_and_long_batches(rows: int) -> None:
    kinds = ["insert", "delete", "update_preimage", "update_postimage"]
    column = pa.array([kinds[(i * 7) % 3 if i % 5 else 3] for i in range(rows)], pa.string())
    counts = {"insert": 2}
    count_change_types(column, counts)
    expected = {"insert": 2}
    for kind in column.to_pylist():
        expected[kind] = expected.get(kind, 0) + 1
    assert counts == expected
