"""Deletion vectors: decoding, file framing, checksums and missing files, against real tables.

Oracles: facts stated in ``shared/spec/README.md`` (``kernel-rs/table-with-dv-small`` deletes
rows 0 and 9; ``kernel-rs/cdf-table-with-dv`` version 5 deletes row 3) and deltalake's own
``DeltaTable.deletion_vectors()`` decoder, an independent reader.
"""

from __future__ import annotations

import dataclasses
import shutil
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyroaring import BitMap64

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_table

from deltatail.state.actions import Add, DeletionVector, Remove, parse_json_actions
from deltatail.state.errors import DeletionVectorError, InvalidLogError, MissingFileError, UnsafePathError
from deltatail.tailer.read.deletion_vectors import MAGIC, decode_bitmap, dv_file_location, read_deletion_vector
from deltatail.tailer.storage import LocalStorage

STORAGE = LocalStorage()


def dv_actions(root: Path) -> Iterator[tuple[int, Add | Remove, DeletionVector]]:
    """Every (version, action, descriptor) of the JSON commits, in log order."""
    for commit in sorted((root / "_delta_log").glob("*.json")):
        if not commit.name[:20].isdigit() or commit.name.count(".") != 1:
            continue
        for action in parse_json_actions(commit.read_bytes()):
            if isinstance(action, Add | Remove) and action.deletion_vector is not None:
                yield int(commit.name[:20]), action, action.deletion_vector


def live_dv_adds(root: Path, version: int | None = None) -> dict[str, tuple[int, Add, DeletionVector]]:
    """The adds with a DV that are live at ``version`` (latest when ``None``), by data file path."""
    live: dict[tuple[str, str | None], tuple[int, Add]] = {}
    for commit in sorted((root / "_delta_log").glob("*.json")):
        if not commit.name[:20].isdigit() or commit.name.count(".") != 1:
            continue
        v = int(commit.name[:20])
        if version is not None and v > version:
            break
        for action in parse_json_actions(commit.read_bytes()):
            if isinstance(action, Add):
                live[(action.path, action.dv_id)] = (v, action)
            elif isinstance(action, Remove):
                live.pop((action.path, action.dv_id), None)
    return {add.path: (v, add, add.deletion_vector) for v, add in live.values() if add.deletion_vector is not None}


def deltalake_deleted_rows(root: Path, version: int | None = None) -> dict[str, set[int]]:
    """Deleted row indexes per data file path (relative to the root) according to deltalake."""
    table = DeltaTable(str(root), version=version)
    vectors = pa.RecordBatchReader.from_stream(table.deletion_vectors()).read_all()
    prefix = str(root.resolve()).rstrip("/") + "/"
    out: dict[str, set[int]] = {}
    for row in vectors.to_pylist():
        path = unquote(urlparse(row["filepath"]).path)
        assert path.startswith(prefix)
        out[path[len(prefix) :]] = {i for i, keep in enumerate(row["selection_vector"]) if not keep}
    return out


def z85_encode(data: bytes) -> str:
    """Plain Z85 (the ZeroMQ RFC 32 alphabet) of a whole number of 4-byte groups."""
    alphabet = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
    out = []
    for (value,) in struct.iter_unpack(">I", data):
        digits = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            digits.append(alphabet[digit])
        out.append("".join(reversed(digits)))
    return "".join(out)


# ------------------------------------------------------------------ decode_bitmap


def test_decode_bitmap_reads_magic_then_portable_bitmap() -> None:
    rows = BitMap64([0, 7, 1 << 33, (1 << 40) + 5])
    data = MAGIC.to_bytes(4, "little") + rows.serialize()
    assert decode_bitmap(data) == rows


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xd1\xd3\x39",
        (MAGIC + 1).to_bytes(4, "little") + BitMap64([1]).serialize(),
        MAGIC.to_bytes(4, "big") + BitMap64([1]).serialize(),
    ],
    ids=["empty", "short", "wrong-magic", "big-endian-magic"],
)
def test_decode_bitmap_rejects_bad_magic(data: bytes) -> None:
    with pytest.raises(DeletionVectorError, match="magic"):
        decode_bitmap(data)


@pytest.mark.parametrize("tail", [b"", b"\x01\x00", b"\xff" * 12], ids=["no-bitmap", "truncated", "garbage"])
def test_decode_bitmap_rejects_undecodable_bitmap(tail: bytes) -> None:
    with pytest.raises(DeletionVectorError, match="deserialize"):
        decode_bitmap(MAGIC.to_bytes(4, "little") + tail)


# ------------------------------------------------------------------ relative (u) files


def test_relative_dv_with_offset_matches_spec_readme() -> None:
    root = corpus_table("kernel-rs/table-with-dv-small")
    [(version, action, dv)] = list(dv_actions(root))
    assert (dv.storage_type, dv.offset, dv.size_in_bytes) == ("u", 1, 36)
    rows = read_deletion_vector(STORAGE, str(root), dv, data_file=action.path, version=version)
    assert rows == BitMap64([0, 9])


def test_absent_offset_defaults_to_one() -> None:
    root = corpus_table("kernel-rs/table-with-dv-small")
    [(_, action, dv)] = list(dv_actions(root))
    rows = read_deletion_vector(STORAGE, str(root), dataclasses.replace(dv, offset=None), data_file=action.path)
    assert rows == BitMap64([0, 9])


@pytest.mark.parametrize(
    "table",
    [
        "kernel-rs/table-with-dv-small",
        "kernel-rs/with-short-dv",
        "kernel-rs/cdf-table-with-cdc-and-dvs",
        "delta-rs/table_with_deletion_logs",
        "delta-golden/dv-partitioned-with-checkpoint/delta",
        "delta-golden/dv-with-columnmapping/delta",
        "delta-golden/log-replay-dv-key-cases/delta",
        "delta-kernel-java/basic-dv-no-checkpoint",
        "delta-kernel-java/basic-dv-with-checkpoint",
    ],
)
def test_live_dvs_match_deltalake(table: str) -> None:
    root = corpus_table(table)
    expected = deltalake_deleted_rows(root)
    live = live_dv_adds(root)
    assert set(live) == set(expected)
    for path, (version, add, dv) in live.items():
        rows = read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=version)
        assert set(rows) == expected[path], path
        assert len(rows) == dv.cardinality


def test_packed_dv_files_with_offsets_above_one_decode() -> None:
    root = corpus_table("kernel-rs/cdf-table-with-cdc-and-dvs")
    packed = [(v, a, dv) for v, a, dv in dv_actions(root) if dv.offset is not None and dv.offset > 1]
    assert packed, "the manifest lists this table under dv-packed-offset>1"
    for version, action, dv in packed:
        rows = read_deletion_vector(STORAGE, str(root), dv, data_file=action.path, version=version)
        assert len(rows) == dv.cardinality


# ------------------------------------------------------------------ inline (i)


def test_inline_dv_with_hash_short_group_matches_spec_readme() -> None:
    root = corpus_table("kernel-rs/cdf-table-with-dv")
    [(version, add, dv)] = [(v, a, dv) for v, a, dv in dv_actions(root) if v == 5 and isinstance(a, Add)]
    assert dv.storage_type == "i" and dv.size_in_bytes == 34 and dv.path_or_inline_dv.endswith("##093")
    assert read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=version) == BitMap64([3])


@pytest.mark.parametrize("version", [1, 3, 4, 5])
def test_inline_and_file_dvs_match_deltalake_at_each_version(version: int) -> None:
    root = corpus_table("kernel-rs/cdf-table-with-dv")
    expected = deltalake_deleted_rows(root, version)
    [(path, (v, add, dv))] = list(live_dv_adds(root, version).items())
    rows = read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=v)
    assert set(rows) == expected[path]


def test_inline_dv_with_zero_padding_keeps_size_in_bytes() -> None:
    """Delta Spark's convention: pad to a whole group with zero bytes, keep the first sizeInBytes."""
    root = corpus_table("kernel-rs/cdf-table-with-dv")
    [(_, add, dv)] = [(v, a, dv) for v, a, dv in dv_actions(root) if v == 5 and isinstance(a, Add)]
    data = MAGIC.to_bytes(4, "little") + BitMap64([3]).serialize()
    assert len(data) == dv.size_in_bytes and len(data) % 4 != 0
    padded = dataclasses.replace(dv, path_or_inline_dv=z85_encode(data + b"\0" * (-len(data) % 4)))
    assert read_deletion_vector(STORAGE, str(root), padded, data_file=add.path) == BitMap64([3])


def test_inline_dv_shorter_than_size_in_bytes_is_rejected() -> None:
    data = MAGIC.to_bytes(4, "little") + BitMap64([3]).serialize()
    data += b"\0" * (-len(data) % 4)
    dv = DeletionVector("i", z85_encode(data), size_in_bytes=len(data) + 4, cardinality=1)
    with pytest.raises(DeletionVectorError, match="decodes to") as info:
        read_deletion_vector(STORAGE, "/t", dv, data_file="part-0.parquet", version=7)
    assert (info.value.table, info.value.version, info.value.file) == ("/t", 7, "part-0.parquet")


def test_inline_dv_with_invalid_z85_is_rejected() -> None:
    dv = DeletionVector("i", "abc~~", size_in_bytes=4, cardinality=1)
    with pytest.raises(DeletionVectorError, match="Z85") as info:
        read_deletion_vector(STORAGE, "/t", dv, data_file="part-0.parquet", version=3)
    assert "part-0.parquet" in str(info.value) and "version 3" in str(info.value)


def test_inline_dv_without_the_magic_number_is_rejected() -> None:
    data = BitMap64([3]).serialize()
    data += b"\0" * (-len(data) % 4)
    dv = DeletionVector("i", z85_encode(data), size_in_bytes=len(data), cardinality=1)
    with pytest.raises(DeletionVectorError, match="magic") as info:
        read_deletion_vector(STORAGE, "/t", dv, data_file="part-0.parquet", version=2)
    assert (info.value.table, info.value.version, info.value.file) == ("/t", 2, "part-0.parquet")


def test_dv_file_location_decodes_absolute_uris_only() -> None:
    """The UUID below is the one MANIFEST-listed table kernel-rs/table-with-dv-small stores on disk."""
    relative = DeletionVector("u", "ab" + "vBn[lx{q8@P<9BNH/isA", size_in_bytes=36, cardinality=2, offset=1)
    absolute = DeletionVector("p", "file:/x/a%20b%25c.bin", size_in_bytes=36, cardinality=2, offset=1)
    assert dv_file_location("/t", relative) == "/t/ab/deletion_vector_61d16c75-6994-46b7-a15b-8b538852e50e.bin"
    assert dv_file_location("/t", absolute, ("/x",)) == "/x/a b%c.bin"  # decoded once, file: made a local path
    with pytest.raises(InvalidLogError, match="no file"):
        dv_file_location("/t", DeletionVector("i", "", size_in_bytes=0, cardinality=0))
    with pytest.raises(InvalidLogError, match="shorter"):
        dv_file_location("/t", DeletionVector("u", "short", size_in_bytes=0, cardinality=0))


def test_cardinality_mismatch_is_rejected() -> None:
    root = corpus_table("kernel-rs/table-with-dv-small")
    [(version, action, dv)] = list(dv_actions(root))
    wrong = dataclasses.replace(dv, cardinality=dv.cardinality + 1)
    with pytest.raises(DeletionVectorError, match="descriptor says 3") as info:
        read_deletion_vector(STORAGE, str(root), wrong, data_file=action.path, version=version)
    assert action.path in str(info.value) and str(root) in str(info.value)


def test_relative_dv_with_undecodable_uuid_is_rejected() -> None:
    dv = DeletionVector("u", "tooshort", size_in_bytes=36, cardinality=2, offset=1)
    with pytest.raises(DeletionVectorError, match="shorter than a Z85 UUID") as info:
        read_deletion_vector(STORAGE, "/t", dv, data_file="part-0.parquet", version=1)
    assert (info.value.table, info.value.version, info.value.file) == ("/t", 1, "part-0.parquet")


# ------------------------------------------------------------------ file damage


def copy_small_dv_table(tmp_path: Path) -> tuple[Path, Path, int, Add, DeletionVector]:
    source = corpus_table("kernel-rs/table-with-dv-small")
    root = tmp_path / "table-with-dv-small"
    shutil.copytree(source, root)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    [(version, action, dv)] = list(dv_actions(root))
    [dv_file] = list(root.glob("deletion_vector_*.bin"))
    assert isinstance(action, Add)
    return root, dv_file, version, action, dv


def flip_byte(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


def assert_names_everything(error: Exception, root: Path, version: int, data_file: str, dv_file: Path) -> None:
    text = str(error)
    for part in (str(root), f"version {version}", data_file, str(dv_file)):
        assert part in text, f"{part!r} missing from {text!r}"


def test_flipped_data_byte_fails_the_crc(tmp_path: Path) -> None:
    root, dv_file, version, add, dv = copy_small_dv_table(tmp_path)
    assert dv.offset is not None
    flip_byte(dv_file, dv.offset + 4 + dv.size_in_bytes - 1)
    with pytest.raises(DeletionVectorError, match="CRC-32") as info:
        read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=version)
    assert_names_everything(info.value, root, version, add.path, dv_file)


def test_flipped_checksum_byte_fails_the_crc(tmp_path: Path) -> None:
    root, dv_file, version, add, dv = copy_small_dv_table(tmp_path)
    assert dv.offset is not None
    flip_byte(dv_file, dv.offset + 4 + dv.size_in_bytes)
    with pytest.raises(DeletionVectorError, match="CRC-32") as info:
        read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=version)
    assert_names_everything(info.value, root, version, add.path, dv_file)


def test_size_field_disagreeing_with_descriptor_is_rejected(tmp_path: Path) -> None:
    root, dv_file, version, add, dv = copy_small_dv_table(tmp_path)
    assert dv.offset is not None
    flip_byte(dv_file, dv.offset + 3)
    with pytest.raises(DeletionVectorError, match="has size") as info:
        read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=version)
    assert_names_everything(info.value, root, version, add.path, dv_file)


def test_truncated_dv_file_is_rejected(tmp_path: Path) -> None:
    root, dv_file, version, add, dv = copy_small_dv_table(tmp_path)
    dv_file.write_bytes(dv_file.read_bytes()[:-2])
    with pytest.raises(DeletionVectorError, match="truncated") as info:
        read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=version)
    assert_names_everything(info.value, root, version, add.path, dv_file)


def test_deleted_dv_file_is_missing(tmp_path: Path) -> None:
    root, dv_file, version, add, dv = copy_small_dv_table(tmp_path)
    dv_file.unlink()
    with pytest.raises(MissingFileError) as info:
        read_deletion_vector(STORAGE, str(root), dv, data_file=add.path, version=version)
    assert info.value.file == str(dv_file)
    assert_names_everything(info.value, root, version, add.path, dv_file)


# ------------------------------------------------------------------ the delta-spark test-prefix trap


@pytest.mark.parametrize(
    "table",
    [
        "delta-spark/table-with-dv-small",
        "delta-spark/table-with-dv-large",
        "delta-spark/partitioned-table-with-dv-large",
    ],
)
def test_spark_test_prefix_tables_name_the_unprefixed_dv_file(table: str) -> None:
    """MANIFEST.md: DV files on disk carry ``test%dv%prefix-`` that the descriptors do not record."""
    root = corpus_table(table)
    on_disk = {p.name for p in root.glob("test%dv%prefix-deletion_vector_*.bin")}
    expected = {str(root / name.removeprefix("test%dv%prefix-")) for name in on_disk}
    actions = list(dv_actions(root))
    assert actions and on_disk
    for version, action, dv in actions:
        with pytest.raises(MissingFileError) as info:
            read_deletion_vector(STORAGE, str(root), dv, data_file=action.path, version=version)
        assert info.value.file in expected
        assert_names_everything(info.value, root, version, action.path, Path(info.value.file or ""))


def test_spark_special_char_template_names_the_decoded_absolute_path() -> None:
    root = corpus_table("delta-spark/table-with-dv-special-char")
    [(version, action, dv)] = list(dv_actions(root))
    assert dv.storage_type == "p"
    [on_disk] = list((root / "folder&with%special char").glob("*.bin"))
    # the template is not a path under the table (nor a local path): refused, never looked up
    with pytest.raises(UnsafePathError) as info:
        read_deletion_vector(STORAGE, str(root), dv, data_file=action.path, version=version)
    assert info.value.file == "file:{{FOLDER_WITH_SPECIAL_CHAR}}/" + on_disk.name
    assert action.path in str(info.value) and f"version {version}" in str(info.value)


# ------------------------------------------------------------------ absolute (p) files


def materialize_special_char_table(tmp_path: Path) -> Path:
    """MANIFEST.md recipe: substitute the folder's URL-encoded absolute path into a copy of the log."""
    source = corpus_table("delta-spark/table-with-dv-special-char")
    root = tmp_path / "special"
    shutil.copytree(source, root)
    for path in root.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    folder = root / "folder&with%special char"
    commit = root / "_delta_log" / "00000000000000000000.json"
    text = commit.read_text().replace("{{FOLDER_WITH_SPECIAL_CHAR}}", quote(str(folder)))
    commit.write_text(text)
    return root


def test_absolute_percent_encoded_dv_path_matches_deltalake(tmp_path: Path) -> None:
    root = materialize_special_char_table(tmp_path)
    [(version, action, dv)] = list(dv_actions(root))
    assert dv.storage_type == "p" and "%25" in dv.path_or_inline_dv and "%20" in dv.path_or_inline_dv
    rows = read_deletion_vector(STORAGE, str(root), dv, data_file=action.path, version=version)
    assert set(rows) == deltalake_deleted_rows(root)[action.path]
    assert len(rows) == dv.cardinality
