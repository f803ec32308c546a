"""The readers that hand a range's commit files to the audit: a helper process for long local ranges, else a thread.

The byte-level tests read log directories of plain files (the readers never parse them); the
feed-level test runs a table written by deltalake through both readers and compares the events.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
from audit_tables import write_ops_table

import deltatail.tailer.audit.commit_files as commit_files
from deltatail.state.errors import DeltaTailError, MissingFileError, VersionGapError
from deltatail.tailer.audit.commit_files import (
    PipedCommitFiles,
    ThreadedCommitFiles,
    open_commit_files,
    read_local_commit,
)
from deltatail.tailer.audit.feed import AuditFeed
from deltatail.tailer.storage import LocalStorage


def write_log(root: Path, versions: range, *, size: int = 40) -> Path:
    """A ``_delta_log`` of files ``%020d.json`` whose bytes name their version (``size`` bytes and more)."""
    log = root / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    for v in versions:
        body = f'{{"commitInfo":{{"v":{v},"pad":"{"x" * (size + v % 7)}"}}}}\n'.encode()
        (log / f"{v:020d}.json").write_bytes(body)
        os.utime(log / f"{v:020d}.json", ns=(1_700_000_000_000_000_000 + v * 1_000_000,) * 2)
    return log


def expected(log: Path, versions: range) -> list[tuple[bytes, int]]:
    return [((log / f"{v:020d}.json").read_bytes(), 1_700_000_000_000 + v) for v in versions]


def drain(files: PipedCommitFiles | ThreadedCommitFiles, n: int) -> list[tuple[bytes, int]]:
    try:
        return [files.next() for _ in range(n)]
    finally:
        files.close()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_the_helper_hands_over_every_file_in_order_with_its_time(tmp_path: Path) -> None:
    log = write_log(tmp_path, range(3, 3003), size=300)  # ~1 MB: several pipe reads, frames split across them
    files = PipedCommitFiles(str(log), 3, 3002, head=5)
    assert files.pid is not None
    assert drain(files, 3000) == expected(log, range(3, 3003))


def test_a_short_range_needs_no_helper(tmp_path: Path) -> None:
    log = write_log(tmp_path, range(0, 4))
    files = PipedCommitFiles(str(log), 0, 3, head=10)
    assert files.pid is None
    assert drain(files, 4) == expected(log, range(0, 4))


def test_a_missing_file_is_raised_in_its_turn_and_the_rest_follow(tmp_path: Path) -> None:
    log = write_log(tmp_path, range(0, 10))
    want = expected(log, range(0, 10))
    (log / f"{6:020d}.json").unlink()
    files = PipedCommitFiles(str(log), 0, 9, head=2)
    got = [files.next() for _ in range(6)]
    with pytest.raises(MissingFileError) as e:
        files.next()
    assert e.value.file == str(log / f"{6:020d}.json")
    got += [files.next() for _ in range(3)]
    files.close()
    assert got == want[:6] + want[7:]


@pytest.mark.parametrize("version", [1, 7], ids=["read by the parent", "read by the helper"])
def test_an_unreadable_file_names_the_file_and_the_reason(tmp_path: Path, version: int) -> None:
    log = write_log(tmp_path, range(0, 10))
    (log / f"{version:020d}.json").unlink()
    (log / f"{version:020d}.json").mkdir()  # opens, but does not read
    files = PipedCommitFiles(str(log), 0, 9, head=3)
    for _ in range(version):
        files.next()
    with pytest.raises(DeltaTailError, match="cannot read the commit file: Is a directory") as e:
        files.next()
    files.close()
    assert e.value.file == str(log / f"{version:020d}.json")


def test_a_helper_that_dies_is_reported_not_waited_on(tmp_path: Path) -> None:
    log = write_log(tmp_path, range(0, 3000), size=200)  # more than the pipe holds: the helper blocks writing
    files = PipedCommitFiles(str(log), 0, 2999, head=1)
    files.next()
    assert files.pid is not None
    os.kill(files.pid, signal.SIGKILL)
    with pytest.raises(DeltaTailError, match="commit reader process ended before handing this file over") as e:
        for _ in range(2999):  # what it wrote before it died is handed over; then the error
            files.next()
    files.close()
    assert e.value.version is not None and e.value.version > 0
    assert "exit code -9" in str(e.value)


def test_stopping_early_ends_the_helper(tmp_path: Path) -> None:
    log = write_log(tmp_path, range(0, 3000), size=2000)  # more than the pipe holds: the helper blocks writing
    files = PipedCommitFiles(str(log), 0, 2999, head=1)
    pid = files.pid
    assert pid is not None
    files.next()
    files.next()
    files.close()
    files.close()  # idempotent
    assert not alive(pid)
    with pytest.raises(DeltaTailError, match="commit reader process is closed"):
        files.next()


def test_long_local_ranges_get_the_helper_others_a_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = write_log(tmp_path, range(0, 20))

    def path(version: int) -> str:
        return str(log / f"{version:020d}.json")

    monkeypatch.setattr(commit_files, "PIPE_MIN_FILES", 10)
    monkeypatch.setattr(commit_files, "PIPE_HEAD", 2)
    storage = LocalStorage()
    piped = open_commit_files(storage, path, 0, 19, None)
    assert isinstance(piped, PipedCommitFiles)
    assert drain(piped, 20) == expected(log, range(0, 20))
    short = open_commit_files(storage, path, 3, 7, None)
    assert isinstance(short, ThreadedCommitFiles)
    assert drain(short, 5) == expected(log, range(3, 8))
    listed = open_commit_files(storage, path, 0, 19, [1_700_000_000_000 + v for v in range(20)])
    assert isinstance(listed, ThreadedCommitFiles)  # times from a listing: an object store's reader
    assert drain(listed, 20) == expected(log, range(0, 20))
    unlisted = open_commit_files(storage, path, 0, 1, [1_700_000_000_000, None])
    assert unlisted.next() == expected(log, range(0, 1))[0]
    with pytest.raises(MissingFileError, match="the listing does not hold this commit"):
        unlisted.next()
    unlisted.close()
    # if the helper cannot start, the thread reads
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    with pytest.raises(OSError):
        PipedCommitFiles(str(log), 0, 19, head=2)
    fallback = open_commit_files(storage, path, 0, 19, None)
    assert isinstance(fallback, ThreadedCommitFiles)
    assert drain(fallback, 20) == expected(log, range(0, 20))


def test_read_local_commit_names_an_unreadable_file(tmp_path: Path) -> None:
    log = write_log(tmp_path, range(0, 2))
    (log / f"{1:020d}.json").unlink()
    (log / f"{1:020d}.json").mkdir()
    with pytest.raises(DeltaTailError, match="cannot read the commit file: Is a directory"):
        read_local_commit(str(log / f"{1:020d}.json"))
    with pytest.raises(MissingFileError):
        read_local_commit(str(log / f"{2:020d}.json"))


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_ops_table(tmp_path_factory.mktemp("ops"))


def test_the_feed_gives_the_same_events_from_either_reader(
    ops: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threaded = [e.to_json() for e in AuditFeed(str(ops)).events()]
    assert len(threaded) == 10
    monkeypatch.setattr(commit_files, "PIPE_MIN_FILES", 2)
    monkeypatch.setattr(commit_files, "PIPE_HEAD", 3)
    assert [e.to_json() for e in AuditFeed(str(ops)).events()] == threaded
    assert [e.to_json() for e in AuditFeed(str(ops)).events(4, 8)] == threaded[4:9]
    copy = tmp_path / "gap"
    shutil.copytree(ops, copy)
    (copy / "_delta_log" / f"{6:020d}.json").unlink()
    seen: list[int] = []
    with pytest.raises(VersionGapError, match="commit 6 is missing") as e:
        seen.extend(ev.version for ev in AuditFeed(str(copy)).events(1, 9))
    assert seen == [1, 2, 3, 4, 5]
    assert e.value.version == 6
    (copy / "_delta_log" / f"{6:020d}.json").mkdir()
    with pytest.raises(DeltaTailError, match="cannot read the commit file") as unreadable:
        list(AuditFeed(str(copy)).events(1, 9))
    assert unreadable.value.version == 6 and unreadable.value.table is not None


def test_an_audit_stopped_early_leaves_no_helper(ops: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[PipedCommitFiles] = []

    class Recorded(PipedCommitFiles):
        def __init__(self, log_dir: str, first: int, last: int) -> None:
            super().__init__(log_dir, first, last)
            made.append(self)

    monkeypatch.setattr(commit_files, "PipedCommitFiles", Recorded)
    monkeypatch.setattr(commit_files, "PIPE_MIN_FILES", 2)
    monkeypatch.setattr(commit_files, "PIPE_HEAD", 1)
    events = AuditFeed(str(ops)).events()
    assert next(events).version == 0
    assert next(events).version == 1  # read from the helper's pipe
    [reader] = made
    pid = reader.pid
    assert pid is not None
    assert Path(f"/proc/{pid}").exists()  # running, or done with its 9 files but not yet reaped
    events.close()
    assert not Path(f"/proc/{pid}").exists()  # ended and reaped: no zombie either
