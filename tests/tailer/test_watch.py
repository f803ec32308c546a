"""LogWatcher: what wakes a waiting tailer and what does not (real inotify, real files)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deltatail.tailer.log.watch import LogWatcher

#: Long enough never to end a wait in these tests: a wait that returns ``True`` was signalled.
NEVER = 30.0

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "_delta_log"
    d.mkdir()
    (d / f"{0:020d}.json").write_bytes(b'{"commitInfo":{}}\n')
    return d


@pytest.fixture
def watcher_of() -> Iterator[Callable[..., LogWatcher]]:
    """Makes watchers (``LogWatcher``'s arguments) and closes them after the test."""
    made: list[LogWatcher] = []

    def make(log_dir: Path, **kwargs: bool) -> LogWatcher:
        made.append(LogWatcher(str(log_dir), **kwargs))
        return made[-1]

    yield make
    for watcher in made:
        watcher.close()


def test_a_commit_renamed_into_place_wakes_the_waiter(log_dir: Path, watcher_of: Callable[..., LogWatcher]) -> None:
    watcher = watcher_of(log_dir)
    assert watcher.watching
    tmp = log_dir / ".00000000000000000001.json.tmp"
    tmp.write_bytes(b'{"commitInfo":{}}\n')
    watcher.wait(0)  # the temporary file's own events
    assert watcher.wait(0.1) is False
    os.rename(tmp, log_dir / f"{1:020d}.json")
    assert watcher.wait(NEVER) is True


def test_a_commit_written_in_place_wakes_the_waiter(log_dir: Path, watcher_of: Callable[..., LogWatcher]) -> None:
    watcher = watcher_of(log_dir)
    with open(log_dir / f"{1:020d}.json", "xb") as f:
        f.write(b'{"commitInfo":{}}\n')
    assert watcher.wait(NEVER) is True


@linux_only
def test_reading_the_log_does_not_wake_the_waiter(log_dir: Path, watcher_of: Callable[..., LogWatcher]) -> None:
    watcher = watcher_of(log_dir)
    for _ in range(3):
        (log_dir / f"{0:020d}.json").read_bytes()
        os.stat(log_dir / f"{0:020d}.json")
        sorted(os.listdir(log_dir))
    assert watcher.wait(0.2) is False


def test_without_watching_only_the_timeout_or_wake_ends_a_wait(
    log_dir: Path, watcher_of: Callable[..., LogWatcher]
) -> None:
    watcher = watcher_of(log_dir, watch=False)
    assert not watcher.watching
    (log_dir / f"{1:020d}.json").write_bytes(b'{"commitInfo":{}}\n')
    assert watcher.wait(0.2) is False
    watcher.wake()
    assert watcher.wait(NEVER) is True


def test_wake_from_another_thread_ends_a_wait(log_dir: Path, watcher_of: Callable[..., LogWatcher]) -> None:
    watcher = watcher_of(log_dir)
    waker = threading.Timer(0.05, watcher.wake)
    waker.start()
    assert watcher.wait(NEVER) is True
    waker.join()


def test_signals_are_kept_until_the_next_wait_and_then_consumed(
    log_dir: Path, watcher_of: Callable[..., LogWatcher]
) -> None:
    watcher = watcher_of(log_dir, watch=False)
    watcher.wake()
    watcher.wake()
    assert watcher.wait(NEVER) is True
    assert watcher.wait(0.1) is False


def test_close_is_idempotent_and_wake_after_close_writes_nothing(log_dir: Path, tmp_path: Path) -> None:
    watcher = LogWatcher(str(log_dir))
    watcher.close()
    watcher.close()
    # A file opened now may get the pipe's old descriptor number: waking must not write into it.
    other = tmp_path / "other"
    with open(other, "wb") as f:
        watcher.wake()
        f.flush()
    assert other.read_bytes() == b""


@linux_only
def test_an_unwatchable_directory_falls_back_to_polling(tmp_path: Path, watcher_of: Callable[..., LogWatcher]) -> None:
    watcher = watcher_of(tmp_path / "missing")
    assert not watcher.watching
    assert watcher.wait(0.1) is False


@linux_only
def test_waiting_works_with_descriptor_numbers_above_select_limit(
    log_dir: Path, tmp_path: Path, watcher_of: Callable[..., LogWatcher]
) -> None:
    # A process holding many files (Spark, Kafka clients) hands out descriptor numbers past 1024.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    filler = [os.open(tmp_path, os.O_RDONLY) for _ in range(1100)]
    try:
        watcher = watcher_of(log_dir)
        assert watcher.watching
        (log_dir / f"{1:020d}.json").write_bytes(b'{"commitInfo":{}}\n')
        assert watcher.wait(NEVER) is True
    finally:
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
