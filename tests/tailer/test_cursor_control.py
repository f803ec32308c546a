"""deltatail status, seek and reset: on a run's state directory, with the checks of a start.

The commands run through the command line's entry point in this process, as the console script calls
it (``damage.run_inline``: exit code, stdout and stderr captured).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pytest
from damage import run_inline as deltatail
from deltalake import DeltaTable, write_deltalake

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError, StateError, VersionNotFoundError
from deltatail.tailer.follow.control import describe, reset, seek
from deltatail.tailer.follow.state_store import StateStore


def make(tmp_path: Path, versions: int = 4) -> Path:
    root = tmp_path / "t"
    write_deltalake(str(root), pa.table({"id": [0]}), configuration={"delta.enableChangeDataFeed": "true"})
    for v in range(1, versions):
        write_deltalake(str(root), pa.table({"id": [v]}), mode="append")
    return root


def run(root: Path, state: Path, out: Path) -> None:
    done = deltatail("run", str(root), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up")
    assert done.returncode == 0, done.stderr


def ids(out: Path) -> list[int]:
    return [json.loads(line)["id"] for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_status_shows_cursor_version_and_lag(tmp_path: Path) -> None:
    root, state = make(tmp_path), tmp_path / "state"
    run(root, state, tmp_path / "a.jsonl")
    write_deltalake(str(root), pa.table({"id": [9]}), mode="append")
    s = describe(state, None, "t", None)
    assert (s.cursor, s.delivered_version, s.latest_version, s.versions_behind) == (Position.change(4, 0), 3, 4, 1)
    assert s.state == "stopped"
    done = deltatail("status", str(state), "--json")
    assert done.returncode == 0
    [doc] = json.loads(done.stdout)
    assert doc["versions_behind"] == 1 and doc["cursor"] == {"version": 4, "index": 0, "snapshot": False}
    text = deltatail("status", str(state)).stdout
    assert "cursor 4:0" in text and "1 versions behind" in text


@pytest.mark.slow
def test_seek_back_and_forward_then_run_delivers_from_there(tmp_path: Path) -> None:
    root, state = make(tmp_path), tmp_path / "state"
    run(root, state, tmp_path / "first.jsonl")
    assert seek(state, str(root), None, to_version=2) == Position.change(2, 0)
    run(root, state, tmp_path / "again.jsonl")  # a new file: a sink that holds nothing
    assert ids(tmp_path / "again.jsonl") == [2, 3]
    assert seek(state, str(root), None, to_version=0) == Position.change(0, 0)  # no snapshot file needed
    run(root, state, tmp_path / "all.jsonl")
    assert ids(tmp_path / "all.jsonl") == [0, 1, 2, 3]
    assert seek(state, str(root), None, to_latest=True) == Position.change(4, 0)
    write_deltalake(str(root), pa.table({"id": [4]}), mode="append")
    run(root, state, tmp_path / "latest.jsonl")
    assert ids(tmp_path / "latest.jsonl") == [4]
    # A commit's time is its file's modification time (no in-commit timestamps here); set them
    # ten seconds apart so the search does not hang on how fast the writer ran.
    base_s = 1_700_000_000
    for v in range(5):
        os.utime(root / "_delta_log" / f"{v:020d}.json", (base_s + 10 * v, base_s + 10 * v))
    assert seek(state, str(root), None, to_timestamp_ms=base_s * 1000 + 1) == Position.change(1, 0)
    assert seek(state, str(root), None, to_timestamp_ms=(base_s + 30) * 1000) == Position.change(3, 0)


def test_seek_refuses_while_followed_past_the_end_and_into_a_cleaned_up_log(tmp_path: Path) -> None:
    root, state = make(tmp_path, versions=6), tmp_path / "state"
    run(root, state, tmp_path / "a.jsonl")
    with StateStore(str(state)), pytest.raises(StateError, match="being followed"):
        seek(state, str(root), None, to_version=1)
    with pytest.raises(VersionNotFoundError, match=r"versions are 0\.\.5"):
        seek(state, str(root), None, to_version=9)
    with pytest.raises(ConfigError, match="exactly one"):
        seek(state, str(root), None, to_version=1, to_latest=True)
    DeltaTable(str(root)).create_checkpoint()  # checkpoint at 5, then commits 0..3 cleaned up
    for v in range(4):
        (root / "_delta_log" / f"{v:020d}.json").unlink()
    with pytest.raises(VersionNotFoundError):
        seek(state, str(root), None, to_version=2)
    assert seek(state, str(root), None, to_version=5) == Position.change(5, 0)  # still readable


@pytest.mark.slow
def test_reset_needs_yes_and_starts_over_with_the_current_rows(tmp_path: Path) -> None:
    root, state = make(tmp_path), tmp_path / "state"
    run(root, state, tmp_path / "a.jsonl")
    refused = deltatail("reset", str(state))
    assert refused.returncode == 2 and "--yes" in refused.stderr
    done = deltatail("reset", str(state), "--yes")
    assert done.returncode == 0, done.stderr
    run(root, state, tmp_path / "b.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in lines) == [0, 1, 2, 3] and all(r["_position"][2] for r in lines)
    with StateStore(str(state)), pytest.raises(StateError, match="being followed"):
        reset(state, str(root), None)
