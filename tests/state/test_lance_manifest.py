"""Lance manifests, transactions and row-id sequences decoded from hand-built protobuf bytes; planning's refusals.

The bytes are built here with a few lines of protobuf wire encoding (field number, wire type,
varint or length-delimited value), from the field numbers in the specification's
``lance-table.proto`` and Lance's ``transaction.proto``/``rowids.proto``.
"""

from __future__ import annotations

import struct
from dataclasses import replace

import pyarrow as pa
import pytest
from pyroaring import BitMap

from deltatail.state.changes import check_schema_change
from deltatail.state.errors import InvalidLogError, SchemaChangeError, UnsupportedFeatureError
from deltatail.state.lance.manifest import (
    DataFile,
    DeletionFile,
    Fragment,
    LanceField,
    Manifest,
    Transaction,
    decode_manifest,
    decode_transaction,
    manifest_name,
    parse_manifest_name,
    transaction_bytes,
)
from deltatail.state.lance.planning import diff_versions, plan_snapshot, plan_version
from deltatail.state.lance.protobuf import as_bytes, as_int, fields, packed_varints, text
from deltatail.state.lance.row_ids import decode_row_ids


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def num(field: int, value: int) -> bytes:
    return varint(field << 3) + varint(value)


def msg(field: int, body: bytes) -> bytes:
    return varint(field << 3 | 2) + varint(len(body)) + body


def manifest_file(body: bytes, prefix: bytes = b"") -> bytes:
    position = len(prefix)
    return prefix + struct.pack("<I", len(body)) + body + struct.pack("<qHH", position, 0, 2) + b"LANC"


# -- protobuf ------------------------------------------------------------------------------------


def test_wire_format_errors_are_invalid_log_errors() -> None:
    for bad in (b"\x08", b"\x12\x05ab", b"\x0b", b"\x00\x01", b"\x09\x01", b"\x0d\x01", b"\x08" + b"\xff" * 11):
        with pytest.raises(InvalidLogError):
            list(fields(bad))
    with pytest.raises(InvalidLogError):
        as_bytes(3, "x")
    with pytest.raises(InvalidLogError):
        as_int(b"x", "x")
    with pytest.raises(InvalidLogError):
        text(b"\xff", "x")
    with pytest.raises(InvalidLogError):
        packed_varints(b"\x80", "x")
    assert packed_varints(varint(300) + varint(2), "x") == [300, 2] and packed_varints(7, "x") == [7]
    fixed = [(n, v) for n, _, v in fields(b"\x09" + struct.pack("<Q", 5) + b"\x15" + struct.pack("<I", 6))]
    assert fixed == [(1, 5), (2, 6)]


# -- names ---------------------------------------------------------------------------------------


def test_manifest_names() -> None:
    assert manifest_name(1) == "18446744073709551614.manifest" and manifest_name(7, v2=False) == "7.manifest"
    assert parse_manifest_name("18446744073709551614.manifest") == (1, True)
    assert parse_manifest_name("12.manifest") == (12, False)
    for other in ("d3.manifest", "3.manifest#1", "3.manifest-5f0c", ".3.manifest.tmp", "latest_version_hint.json"):
        assert parse_manifest_name(other) is None, other


# -- manifests -----------------------------------------------------------------------------------


def fragment_bytes(fid: int, rows: int, *, deleted: int = 0, extra: bytes = b"") -> bytes:
    body = num(1, fid) + msg(2, msg(1, b"f%d.lance" % fid) + msg(2, varint(0) + varint(1))) + num(4, rows)
    if deleted:
        body += msg(3, num(1, 1) + num(2, 4) + num(3, 99) + num(4, deleted))
    return body + extra


def test_a_manifest_decodes() -> None:
    body = (
        msg(1, num(1, 2) + msg(2, b"id") + num(3, 0) + num(4, (1 << 64) - 1) + msg(5, b"int64") + num(6, 1))
        + msg(2, fragment_bytes(0, 10, deleted=3))
        + num(3, 5)
        + msg(7, num(1, 1_700_000_000) + num(2, 123_456_789))
        + num(9, 3)
        + msg(12, b"4-abc.txn")
        + msg(16, msg(1, b"k") + msg(2, b"v"))
        + num(23, 0)
    )
    txn = num(1, 4) + msg(2, b"abc") + msg(108, num(7, 1))
    data = manifest_file(body, prefix=struct.pack("<I", len(txn)) + txn)
    m = decode_manifest(data)
    assert (m.version, m.timestamp_us, m.reader_flags, m.config) == (5, 1_700_000_000_123_456, 3, {"k": "v"})
    assert m.fields == (LanceField(0, -1, "id", "int64", 2, True),) and m.stable_row_ids
    (f,) = m.fragments
    assert f.deletion == DeletionFile(0, True, 4, 99, 3) and f.deletion.path == "_deletions/0-4-99.bin"
    assert f.files == (DataFile("f0.lance", (0, 1)),) and f.live_rows == 7
    raw = transaction_bytes(data, m)
    assert raw is not None and decode_transaction(raw) == Transaction(4, "abc", "Update", rewrite_columns=True)


def test_not_a_manifest() -> None:
    with pytest.raises(InvalidLogError, match="LANC"):
        decode_manifest(b"short")
    with pytest.raises(InvalidLogError, match="outside"):
        decode_manifest(b"x" * 4 + struct.pack("<qHH", 1000, 0, 2) + b"LANC")
    with pytest.raises(InvalidLogError, match="past the end"):
        decode_manifest(struct.pack("<I", 500) + struct.pack("<qHH", 0, 0, 2) + b"LANC")
    with pytest.raises(InvalidLogError, match="deletion file"):
        decode_manifest(manifest_file(msg(2, num(1, 0) + num(4, 5) + msg(3, num(1, 7) + num(4, 1)))))
    with pytest.raises(InvalidLogError, match="no path"):
        decode_manifest(manifest_file(msg(2, num(1, 0) + msg(2, num(4, 2)))))


def test_transactions() -> None:
    assert decode_transaction(num(1, 2) + msg(106, num(1, 1))) == Transaction(2, "", "Restore", restore_version=1)
    assert decode_transaction(msg(104, b"")).operation == "Rewrite"
    assert decode_transaction(msg(199, b"")).operation == "Unknown"
    with pytest.raises(InvalidLogError, match="no operation"):
        decode_transaction(num(1, 2))


def test_unsupported_manifest_features_are_refused() -> None:
    plain = decode_manifest(manifest_file(num(3, 2) + msg(2, fragment_bytes(0, 5))))
    plain.require_supported()
    with pytest.raises(UnsupportedFeatureError, match="reader flag 16") as e:
        replace(plain, reader_flags=16).require_supported("t")
    assert e.value.features == frozenset({"reader flag 16"}) and e.value.version == 2 and e.value.table == "t"
    with pytest.raises(UnsupportedFeatureError, match="base paths"):
        decode_manifest(manifest_file(num(3, 2) + msg(18, msg(4, b"s3://x")))).require_supported()
    overlay = decode_manifest(manifest_file(num(3, 2) + msg(2, fragment_bytes(0, 5, extra=msg(12, b"x")))))
    with pytest.raises(UnsupportedFeatureError, match="overlays"):
        overlay.require_supported()
    with pytest.raises(UnsupportedFeatureError):
        plan_snapshot(overlay)


def test_schema_changes_follow_the_additive_rules() -> None:
    a = LanceField(0, -1, "id", "int64", 2, True)
    b = LanceField(1, -1, "v", "string", 2, True)
    base = Manifest(1, 0, (a, b), (), 0, 0, "", None, {})
    grown = replace(base, fields=(a, b, LanceField(2, -1, "w", "double", 2, True)))
    check_schema_change(base.schema(), grown.schema(), version=2, allow=False)  # a column added
    for changed in (
        (a,),  # dropped
        (a, replace(b, name="v2")),  # renamed
        (a, replace(b, logical_type="large_string")),  # retyped
        (a, replace(b, id=5)),  # dropped and added again under the same name
    ):
        with pytest.raises(SchemaChangeError):
            check_schema_change(base.schema(), replace(base, fields=changed).schema(), version=2, allow=False)
    nested = (
        LanceField(0, -1, "s", "struct", 0, True),
        LanceField(1, 0, "x", "int32", 2, True),
        LanceField(2, -1, "l", "list", 1, True),
        LanceField(3, 2, "item", "float", 2, True),
        LanceField(4, -1, "ls", "list.struct", 1, True),
        LanceField(5, 4, "y", "int8", 2, True),
    )
    names = [f.name for f in replace(base, fields=nested).schema().fields]
    assert names == ["s", "l", "ls"]


# -- row ids -------------------------------------------------------------------------------------


def test_every_row_id_segment_kind() -> None:
    def seg(kind: int, body: bytes) -> bytes:
        return msg(1, msg(kind, body))

    def u16(base: int, values: list[int]) -> bytes:
        return msg(1, num(1, base) + msg(2, struct.pack(f"<{len(values)}H", *values)))

    sequence = (
        seg(1, num(1, 10) + num(2, 13))  # range 10..12
        + seg(2, num(1, 20) + num(2, 25) + msg(3, u16(20, [1, 3])))  # 20..24 without 21, 23
        + seg(3, num(1, 100) + num(2, 110) + msg(3, bytes([0b00000101, 0b00000010])))  # LSB first: 100, 102, 109
        + seg(4, u16(1000, [0, 5]))  # sorted array
        + seg(5, msg(2, num(1, 7) + msg(2, struct.pack("<2I", 3, 1))))  # u32 array
        + seg(5, msg(3, msg(2, struct.pack("<2Q", 9, 8))))  # u64 array
        + seg(1, num(1, 0) + num(2, 2))  # range from 0
    )
    assert decode_row_ids(sequence).to_pylist() == [
        *(10, 11, 12, 20, 22, 24, 100, 102, 109, 1000, 1005, 10, 8, 9, 8, 0, 1),
    ]
    assert decode_row_ids(b"").to_pylist() == []
    with pytest.raises(InvalidLogError):
        decode_row_ids(seg(4, msg(1, num(1, 0) + msg(2, b"\x01"))))  # odd number of bytes for u16
    with pytest.raises(InvalidLogError):
        decode_row_ids(seg(9, b""))
    with pytest.raises(InvalidLogError):
        decode_row_ids(seg(3, num(1, 0) + num(2, 100) + msg(3, b"\x01")))


# -- planning's refusals -------------------------------------------------------------------------


def _frag(fid: int, files: tuple[DataFile, ...], rows: int = 4, deleted: int = 0) -> Fragment:
    deletion = DeletionFile(fid, False, 1, 7, deleted) if deleted else None
    return Fragment(fid, files, rows, deletion)


F = (LanceField(0, -1, "id", "int64", 2, True), LanceField(1, -1, "v", "string", 2, True))


def _manifest(version: int, *frags: Fragment, flags: int = 0) -> Manifest:
    return Manifest(version, version * 1000, F, frags, flags, flags, "", None, {})


def test_in_place_column_rewrites_are_refused() -> None:
    old = _manifest(1, _frag(0, (DataFile("a", (0, 1)),)))
    new = _manifest(2, _frag(0, (DataFile("a", (0, -2)), DataFile("b", (1,)))))
    with pytest.raises(UnsupportedFeatureError, match="in place") as e:
        diff_versions(old, new, Transaction(1, "u", "Update", rewrite_columns=True), table="t")
    assert e.value.version == 2
    added = _manifest(2, _frag(0, (DataFile("a", (0, 1)), DataFile("c", (2,)))))
    assert diff_versions(old, added, Transaction(1, "m", "Merge")).changed == ()  # a new column only


def test_compaction_must_keep_the_live_rows_and_needs_a_transaction() -> None:
    old = _manifest(1, _frag(0, (DataFile("a", (0, 1)),)), _frag(1, (DataFile("b", (0, 1)),)))
    new = _manifest(2, _frag(2, (DataFile("c", (0, 1)),), rows=8))
    assert plan_version(diff_versions(old, new, Transaction(1, "r", "Rewrite")), {}).tasks == ()
    with pytest.raises(InvalidLogError, match="live rows"):
        diff_versions(
            old, replace(new, fragments=(_frag(2, (DataFile("c", (0, 1)),), rows=7),)), Transaction(1, "", "Rewrite")
        )
    with pytest.raises(InvalidLogError, match="no transaction"):
        diff_versions(old, new, None)


def test_planning_checks_what_it_was_given() -> None:
    old = _manifest(1, _frag(0, (DataFile("a", (0, 1)),)))
    new = _manifest(2, _frag(0, (DataFile("a", (0, 1)),), deleted=2))
    diff = diff_versions(old, new, Transaction(1, "d", "Delete"))
    (deletion,) = diff.deletion_files()
    with pytest.raises(InvalidLogError, match="was not read"):
        plan_version(diff, {})
    with pytest.raises(InvalidLogError, match="holds 1 offsets"):
        plan_version(diff, {deletion.path: BitMap([1])})
    plan = plan_version(diff, {deletion.path: BitMap([1, 3])})
    (task,) = plan.tasks
    assert task.change_type == "delete" and task.version == 1 and task.offsets is not None
    assert task.offsets.to_pylist() == [1, 3]
    stable_old = replace(old, reader_flags=2)
    stable_new = replace(
        _manifest(2, _frag(0, (DataFile("a", (0, 1)),), deleted=2), _frag(1, (DataFile("n", (0, 1)),), rows=2)),
        reader_flags=2,
    )
    stable = diff_versions(stable_old, stable_new, Transaction(1, "u", "Update"))
    assert stable.pairs_updates()
    with pytest.raises(InvalidLogError, match="row ids"):
        plan_version(stable, {deletion.path: BitMap([1, 3])}, {})
    ids = {(1, 0): pa.array([0, 1, 2, 3], pa.uint64()), (2, 1): pa.array([3, 9], pa.uint64())}
    paired = plan_version(stable, {deletion.path: BitMap([1, 3])}, ids)
    kinds = [(t.change_type, None if t.offsets is None else t.offsets.to_pylist()) for t in paired.tasks]
    assert kinds == [("delete", [1]), ("update_preimage", [3]), ("update_postimage", [0]), ("insert", [1])]
