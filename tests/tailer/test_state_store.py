"""The tailer's own snapshot files: a saved snapshot loads back to the same state, for real tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_table

from deltatail.state.cursor import Position
from deltatail.state.files import FileTable
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.follow.state_store import SavedState, StateStore
from deltatail.tailer.log.delta_log import DeltaLog

TABLES = [
    "kernel-rs/cdf-table-with-dv",  # inline and file DVs, tombstones with DVs
    "delta-golden/dv-partitioned-with-checkpoint/delta",  # partitions and DVs from a checkpoint
    "delta-rs/table_with_liquid_clustering",  # row tracking ids, domain metadata
    "delta-rs/delta-0.8.0-special-partition",  # percent-encoded partition paths
    "delta-rs/simple_table",  # tombstones
    "kernel-rs/app-txn-checkpoint",  # app transactions
]


def _entries(files: FileTable) -> set[tuple[object, ...]]:
    return {
        (
            f.path,
            f.key.dv_id,
            None if f.deletion_vector is None else f.deletion_vector.cardinality,
            f.size,
            f.timestamp,
            tuple(sorted((f.partition_values or {}).items())),
            f.base_row_id,
            f.default_row_commit_version,
        )
        for f in files
    }


@pytest.mark.parametrize("table", TABLES)
def test_saved_snapshot_loads_back_to_the_same_state(table: str, tmp_path: Path) -> None:
    snap = DeltaLog(str(corpus_table(table))).snapshot()
    live, tombstones = _entries(snap.files), _entries(snap.tombstones)
    store = StateStore(str(tmp_path))
    with store:
        name = store.save_snapshot(snap)
        assert snap.metadata is not None
        saved = SavedState(
            str(corpus_table(table)), snap.metadata.id, Position.change(snap.version + 1, 0), snap.version, name, None
        )
        store.save(saved)
        loaded: Snapshot = store.load_snapshot(store.load() or saved)
    assert loaded.version == snap.version
    assert _entries(loaded.files) == live
    assert _entries(loaded.tombstones) == tombstones
    assert loaded.protocol == snap.protocol
    assert loaded.metadata == snap.metadata
    assert loaded.txns == snap.txns
    assert loaded.domains == snap.domains


_HOLD = """
import subprocess
import sys
from deltatail.tailer.follow.state_store import StateStore
store = StateStore(sys.argv[1])
store.lock()
print("locked", flush=True)
sys.stdin.read()  # hold the lock until the test closes stdin
store.unlock()
"""

_TRY = """
import subprocess
import sys
from deltatail.state.errors import StateError
from deltatail.tailer.follow.state_store import StateStore
try:
    StateStore(sys.argv[1]).lock()
except StateError as e:
    print(e)
    sys.exit(3)
print("locked")
"""


def test_unlinking_lock_does_not_admit_a_second_tailer(tmp_path: Path) -> None:
    """LOCK deleted under a running tailer: a second process is still refused, and admitted once the first stops."""
    state = tmp_path / "state"
    first = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(state)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "locked"
        (state / "LOCK").unlink()
        second = subprocess.run([sys.executable, "-c", _TRY, str(state)], capture_output=True, text=True, timeout=60)
        assert second.returncode == 3, second.stdout + second.stderr
        assert "another tailer" in second.stdout
        assert StateStore(str(state)).locked_by() is not None
    finally:
        assert first.stdin is not None
        first.stdin.close()
        first.wait(timeout=60)
    assert StateStore(str(state)).locked_by() is None
    again = subprocess.run([sys.executable, "-c", _TRY, str(state)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == "locked", again.stdout + again.stderr
