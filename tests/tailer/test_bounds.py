"""Counts, sizes and lengths read from a table are bounded before use: a hostile number is an error, never memory.

The memory cases run the command line in a child process under ``RLIMIT_AS`` (2 GiB), so a
regression fails (``MemoryError``, exit code not 0 or 1) instead of eating the machine.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from cdf_helpers import append_commit, z85_encode
from deltalake import DeltaTable, write_deltalake
from lance.fragment import FragmentMetadata

#: The address space a child may use: far above what reading these small tables takes.
ADDRESS_SPACE = 2 << 30
LIMIT = 300


def deltatail_limited(*args: str) -> subprocess.CompletedProcess[str]:
    code = (
        "import resource, sys\n"
        f"resource.setrlimit(resource.RLIMIT_AS, ({ADDRESS_SPACE}, {ADDRESS_SPACE}))\n"
        "from deltatail.tailer.cli.main import main\n"
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


def test_a_deletion_vector_claiming_two_gigabytes_is_an_error_not_an_allocation(table: Path) -> None:
    dv_uuid = uuid.uuid4()
    (table / f"deletion_vector_{dv_uuid}.bin").write_bytes(b"\x01" + b"\0" * 40)  # a real file, a few bytes
    data_file = DeltaTable(str(table)).file_uris()[0].rsplit("/", 1)[-1]
    size = (table / data_file).stat().st_size
    dv = {"storageType": "u", "pathOrInlineDv": z85_encode(dv_uuid.bytes), "sizeInBytes": 2**31 - 1, "cardinality": 1}
    protocol = {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors"],
        }
    }
    remove = {"remove": {"path": data_file, "deletionTimestamp": 1_700_000_000_000, "dataChange": True}}
    add = {
        "add": {
            "path": data_file,
            "partitionValues": {},
            "size": size,
            "modificationTime": 1_700_000_000_000,
            "dataChange": True,
            "deletionVector": dv,
        }
    }
    version = append_commit(table, [protocol, remove, add])
    out = deltatail_limited("changes", str(table), "--starting-version", str(version))
    assert out.returncode == 1, out.stderr
    assert "is truncated" in out.stderr and f"version {version}" in out.stderr and data_file in out.stderr
    assert "MemoryError" not in out.stderr


def test_a_lance_fragment_claiming_a_trillion_rows_is_an_error_not_an_allocation(tmp_path: Path) -> None:
    """The hostile manifest is written by pylance: an Append of a fragment whose row count lies."""
    uri = tmp_path / "ds"
    lance.write_dataset(pa.table({"id": [1, 2]}), str(uri))
    real = lance.dataset(str(uri)).get_fragments()[0].metadata
    lying = FragmentMetadata(id=1, files=real.files, physical_rows=10**12)
    version = lance.LanceDataset.commit(str(uri), lance.LanceOperation.Append([lying]), read_version=1).version
    out = deltatail_limited("changes", str(uri))
    assert out.returncode == 1, out.stderr
    assert "claims 1000000000000 physical rows" in out.stderr and f"version {version}" in out.stderr
    assert "MemoryError" not in out.stderr
