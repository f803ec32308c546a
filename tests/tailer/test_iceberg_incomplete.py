"""A writer half-way through: a metadata file cut short, a version hint naming a file not written yet, a manifest
list not there yet. Following waits for it (tailer/iceberg/look.py); a one-shot command names the table and file.

The files are real pyiceberg-written ones, cut short or moved away by the test, then put back as the writer would
finish them. Oracle: what the test wrote (the ids appended) and the bytes it cut.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from iceberg_tables import new_table, rows, table_dir
from pyiceberg.table import Table

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.errors import InvalidLogError, MissingFileError
from deltatail.tailer.cli.main import main
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.iceberg.feed import IcebergFeed
from deltatail.tailer.iceberg.follow import IcebergTailer
from deltatail.tailer.iceberg.look import TORN_SECONDS


def local(uri: str) -> Path:
    return Path(uri.split("://", 1)[-1])


def cut_short(path: Path) -> bytes:
    """Leave the first half of ``path`` (a writer still writing it); return its whole bytes."""
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    return whole


def tailer(t: Table, tmp_path: Path, sleep: Callable[[float], None], clock: Callable[[], float]) -> IcebergTailer:
    config = TailerConfig(table=table_dir(t), state_dir=str(tmp_path / "state"), until_caught_up=True, watch=False)
    sink = JsonLinesSink(str(tmp_path / "out.jsonl"))
    return IcebergTailer(config, sink, feed=IcebergFeed(table_dir(t)), sleep=sleep, clock=clock)


def delivered(tmp_path: Path) -> list[tuple[str, int]]:
    lines = (tmp_path / "out.jsonl").read_bytes().splitlines()
    return [(r["_change_type"], r["id"]) for r in map(orjson.loads, lines)]


class Writer:
    """The writer finishing what it left half-way at the follower's n-th wait (``finish``), counting the waits."""

    def __init__(self, at_wait: int, finish: Callable[[], Any]) -> None:
        self.at_wait, self.finish, self.waits = at_wait, finish, 0

    def __call__(self, seconds: float) -> None:
        self.waits += 1
        if self.waits == self.at_wait:
            self.finish()


def test_a_starting_tailer_waits_for_the_newest_metadata_file_to_be_written(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1, 2]))
    t.append(rows([3]))
    newest = local(t.metadata_location)
    whole = cut_short(newest)
    writer = Writer(3, lambda: newest.write_bytes(whole))
    tailer(t, tmp_path, writer, lambda: 0.0).run()
    assert writer.waits == 3
    assert delivered(tmp_path) == [("insert", 1), ("insert", 2), ("insert", 3)]


def test_a_following_tailer_keeps_the_older_metadata_until_the_newest_is_whole_then_refuses_it(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1]))
    now = [0.0]
    loop = tailer(t, tmp_path, lambda s: None, lambda: now[0])
    loop.open()
    try:
        assert loop.step() == 1
        t.append(rows([2]))
        newest = local(t.metadata_location)
        whole = cut_short(newest)
        assert loop.step() == 0  # not yet: the older metadata stands
        newest.write_bytes(whole)
        assert loop.step() == 1
        loop.checkpoint()
        assert delivered(tmp_path) == [("insert", 1), ("insert", 2)]
        t.append(rows([3]))
        torn = local(t.metadata_location)
        cut_short(torn)
        assert loop.step() == 0
        now[0] = TORN_SECONDS - 0.5
        assert loop.step() == 0
        now[0] = TORN_SECONDS
        with pytest.raises(InvalidLogError, match="not complete JSON") as e:
            loop.step()
        assert e.value.file == str(torn) and e.value.table == table_dir(t)
    finally:
        loop.close()
    assert delivered(tmp_path) == [("insert", 1), ("insert", 2)]


def test_a_manifest_list_not_there_yet_is_read_again_then_refused(tmp_path: Path) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1]))
    t.append(rows([2]))
    head = t.current_snapshot()
    assert head is not None
    listed = local(head.manifest_list)
    away = listed.with_name("writing.tmp")
    listed.rename(away)
    writer = Writer(2, lambda: away.rename(listed))
    tailer(t, tmp_path, writer, lambda: 0.0).run()
    assert writer.waits == 2
    assert delivered(tmp_path) == [("insert", 1), ("insert", 2)]
    # never written: refused once the waits add up to TORN_SECONDS, naming the table, version and file
    t.append(rows([3]))
    head = t.current_snapshot()
    assert head is not None and head.sequence_number is not None
    local(head.manifest_list).unlink()
    waits: list[float] = []
    with pytest.raises(MissingFileError, match="manifest list is missing") as e:
        tailer(t, tmp_path, waits.append, lambda: 0.0).run()
    assert sum(waits) >= TORN_SECONDS and len(waits) < 30
    assert e.value.file == str(local(head.manifest_list)) and e.value.version == head.sequence_number
    assert e.value.table == table_dir(t)
    assert delivered(tmp_path) == [("insert", 1), ("insert", 2)]


def test_one_shot_commands_name_the_table_and_the_file_being_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t = new_table(tmp_path / "cat")
    t.append(rows([1]))
    t.append(rows([2]))
    root = table_dir(t)
    newest = local(t.metadata_location)
    whole = cut_short(newest)
    for command in (["snapshot", root, "--json"], ["changes", root]):
        assert main(command) == 1
        err = capsys.readouterr().err
        assert "not complete JSON" in err and f"table {root}" in err and str(newest) in err
        assert "Traceback" not in err
    newest.write_bytes(whole)
    # a Hadoop table's version hint naming a file whose writer has not finished it
    meta = newest.parent
    hinted = meta / "v9.metadata.json"
    shutil.copyfile(newest, hinted)
    cut_short(hinted)
    (meta / "version-hint.text").write_text("9")
    assert main(["changes", root]) == 1
    err = capsys.readouterr().err
    assert "not complete JSON" in err and str(hinted) in err
    hinted.unlink()  # the hint names no file: the newest listed one is read
    assert main(["changes", root]) == 0
    assert [orjson.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [1, 2]
    head = t.current_snapshot()
    assert head is not None
    local(head.manifest_list).unlink()
    assert main(["snapshot", root]) == 1
    err = capsys.readouterr().err
    assert "manifest list is missing" in err and str(local(head.manifest_list)) in err and "Traceback" not in err
