"""A malformed action in a real table's log: the error names table, version, file, action and field.

Copies of corpus tables are damaged in one field; DeltaLog (read_commit, snapshot, update) must refuse
them with an InvalidLogError carrying all five, and the CLI must print it on one line with exit code 1.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_table

from deltatail.state.errors import InvalidLogError
from deltatail.tailer.log.delta_log import DeltaLog

TABLE = "delta-rs/table_with_deletion_logs"


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    shutil.copytree(corpus_table(TABLE), root)
    return root


def _damage(root: Path, version: int, kind: str, field: str, value: object) -> Path:
    """Set ``field`` of the first ``kind`` action of commit ``version`` to ``value``; returns the file."""
    path = root / "_delta_log" / f"{version:020d}.json"
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        obj = json.loads(line)
        if kind in obj:
            obj[kind][field] = value
            lines[i] = json.dumps(obj)
            break
    else:
        raise AssertionError(f"commit {version} of {TABLE} holds no {kind} action")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_remove_with_numeric_data_change_names_table_version_file_action_and_field(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    path = _damage(root, 4, "remove", "dataChange", 1)
    log = DeltaLog(str(root))
    with pytest.raises(InvalidLogError) as info:
        log.read_commit(4)
    e = info.value
    assert (e.table, e.version, e.file) == (str(root), 4, str(path))
    message = str(e)
    assert "remove action: field 'dataChange' must be a boolean" in message
    assert f"table {root}" in message
    assert "version 4" in message
    assert f"file {path}" in message


def test_snapshot_and_update_refuse_the_damaged_commit(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _damage(root, 3, "add", "size", "635")
    log = DeltaLog(str(root))
    with pytest.raises(InvalidLogError, match=r"add action: field 'size' must be a long .*version 3"):
        log.snapshot(5)
    before = log.snapshot(2)
    with pytest.raises(InvalidLogError, match=r"add action: field 'size'"):
        log.update(before)


def test_cli_prints_one_line_and_exits_1(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _damage(root, 4, "remove", "dataChange", 1)
    cli = Path(sys.executable).parent / "deltatail"
    done = subprocess.run(
        [str(cli), "changes", str(root), "--ending-version", "5"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("deltatail: error: line ")
    assert "remove action: field 'dataChange'" in lines[0]
    assert "Traceback" not in done.stderr


def test_an_empty_commit_file_is_an_invalid_log_naming_it(tmp_path: Path) -> None:
    # A zero-byte commit is one still being written on a store without atomic writes: never an empty commit.
    root = _copy(tmp_path)
    path = root / "_delta_log" / f"{4:020d}.json"
    path.write_bytes(b"")
    with pytest.raises(InvalidLogError, match="commit file is empty") as info:
        DeltaLog(str(root)).read_commit(4)
    assert (info.value.version, info.value.file) == (4, str(path))
