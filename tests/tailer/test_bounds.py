"""Counts, sizes and lengths read from a table are bounded before use: a hostile number is an error, never memory.

The memory cases run the command line in a child process under ``RLIMIT_AS`` (2 GiB), so a
regression fails (``MemoryError``, exit code not 0 or 1) instead of eating the machine.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

#: The address space a child may use: far above what reading these small tables takes.
ADDRESS_SPACE = 2 << 30
LIMIT = 300


def deltatail_limited(*args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))\n"
        "from tailer.cli.main import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=LIMIT, check=False
    )


def _rows(ids: list[int]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64())})


@pytest.fixture
def table(tmp_path: Path) -> Path:
    root = tmp_path / "t"
    write_deltalake(str(root), _rows([1, 2]))
    write_deltalake(str(root), _rows([3]), mode="append")
    return root


@pytest.mark.parametrize("command", ["snapshot", "changes"])
def test_a_multi_part_checkpoint_claiming_a_billion_parts_is_not_allocated(table: Path, command: str) -> None:
    expected = deltatail_limited(command, str(table))
    assert expected.returncode == 0, expected.stderr
    hostile = table / "_delta_log" / "00000000000000000001.checkpoint.0000000001.1000000000.parquet"
    hostile.write_bytes(b"PAR1")
    out = deltatail_limited(command, str(table))
    assert out.returncode == 0, out.stderr  # incomplete: unused, the commits still build the table
    assert out.stdout == expected.stdout
    assert "lacks 999999999 of them; not used" in out.stderr
