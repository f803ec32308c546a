"""One inotify descriptor for many log directories (``tailer/log/watch_many.py``), on the real kernel."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from deltatail.tailer.log.watch_many import DirectoryWatcher
from deltatail.tailer.serve.http import TableCollector

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


@pytest.fixture
def watcher() -> Iterator[DirectoryWatcher]:
    w = DirectoryWatcher()
    yield w
    w.close()


def _dirs(tmp_path: Path, *names: str) -> list[Path]:
    made = [tmp_path / n / "_delta_log" for n in names]
    for d in made:
        d.mkdir(parents=True)
    return made


def test_a_change_in_one_directory_names_that_directory_only(tmp_path: Path, watcher: DirectoryWatcher) -> None:
    a, b = _dirs(tmp_path, "a", "b")
    assert watcher.add("a", str(a)) and watcher.add("b", str(b))
    (a / "00000000000000000000.json").write_text("{}")
    assert watcher.wait(5) == {"a"}
    assert watcher.wait(0) == set()
    assert watcher.overflows == 0


def _max_queued_events() -> int:
    return int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())


def test_dropped_events_name_every_watched_directory(
    tmp_path: Path, watcher: DirectoryWatcher, caplog: pytest.LogCaptureFixture
) -> None:
    """More events than the kernel queues: the quiet directory, whose news may be among the dropped, is named too."""
    limit = _max_queued_events()
    if limit > 200_000:
        pytest.skip(f"fs.inotify.max_queued_events is {limit}: overflowing it would take too long here")
    busy, quiet = _dirs(tmp_path, "busy", "quiet")
    assert watcher.add("busy", str(busy)) and watcher.add("quiet", str(quiet))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TableCollector(list, watch_overflows=lambda: watcher.overflows))
    for flood in range(3):
        for i in range(limit // 2 + 100):  # an empty file's create and close: two events each
            os.close(os.open(busy / f"{flood}-{i:08d}.tmp", os.O_CREAT | os.O_WRONLY, 0o644))
        with caplog.at_level(logging.WARNING, logger="deltatail"):
            changed = watcher.wait(5)
            changed |= watcher.wait(0)
        assert changed == {"busy", "quiet"}
        assert watcher.overflows == flood + 1
        assert registry.get_sample_value("deltatail_watch_overflows_total") == flood + 1
    warnings = [r.getMessage() for r in caplog.records if "inotify queue overflow" in r.getMessage()]
    assert len(warnings) == 2, warnings  # the 1st and 2nd overflow are logged, the 3rd is not (the 4th would be)
    assert "max_queued_events" in warnings[0] and "1 so far" in warnings[0] and "2 so far" in warnings[1]
