"""Deletion vector descriptors (protocol, "Deletion Vector Descriptor Schema") and Z85 decoding.

The expected values are the protocol's own examples, ZeroMQ RFC 32's test vector, the notes in
``shared/spec/README.md`` and facts of the corpus files (DV files on disk, sizes and cardinalities
recorded in the descriptors). Two reference Z85 encoders written here from RFC 32 and from the
README's description of the ``#`` short-group convention check decoding both ways round.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pyroaring
import pytest
from core_corpus import corpus_root
from hypothesis import given
from hypothesis import strategies as st

from deltatail.state.actions import Add, DeletionVector, Remove, parse_json_actions
from deltatail.state.errors import DeletionVectorError, InvalidLogError, UnsafePathError
from deltatail.state.z85 import z85_decode


@pytest.fixture
def corpus() -> Path:
    return corpus_root()


# README: "4-byte little-endian magic 1681511377" at the start of every serialized DV.
_MAGIC = (1681511377).to_bytes(4, "little")

# ZeroMQ RFC 32 (Z85), the character set in value order.
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"

# The protocol's three example descriptors.
_U_EXAMPLE: dict[str, Any] = {
    "storageType": "u",
    "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
    "offset": 4,
    "sizeInBytes": 40,
}
_P_EXAMPLE: dict[str, Any] = {
    "storageType": "p",
    "pathOrInlineDv": "s3://mytable/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin",
    "offset": 4,
    "sizeInBytes": 40,
}
_I_EXAMPLE: dict[str, Any] = {
    "storageType": "i",
    "pathOrInlineDv": "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L",
    "sizeInBytes": 40,
}


def _descriptor(raw: dict[str, Any]) -> DeletionVector:
    dv = DeletionVector.parse({**raw, "cardinality": 6})
    assert dv is not None
    return dv


def _z85_encode_rfc32(data: bytes) -> str:
    """RFC 32 encoding: every 4 bytes, big-endian, become 5 base-85 digits (most significant first)."""
    assert len(data) % 4 == 0
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        out.append("".join(_Z85[value // 85**k % 85] for k in range(4, -1, -1)))
    return "".join(out)


def _z85_encode_short_group(data: bytes) -> str:
    """README's Rust ``z85`` convention: a tail of n < 4 bytes is ``4 - n`` '#' then n + 1 digits."""
    whole = len(data) - len(data) % 4
    text = _z85_encode_rfc32(data[:whole])
    tail = data[whole:]
    if tail:
        value = int.from_bytes(tail, "big")
        text += "#" * (4 - len(tail)) + "".join(_Z85[value // 85**k % 85] for k in range(len(tail), -1, -1))
    return text


# -- descriptors: the protocol's examples ---------------------------------------------------------


def test_relative_path_example_from_the_protocol() -> None:
    dv = _descriptor(_U_EXAMPLE)
    expected = "s3://mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert dv.absolute_path("s3://mytable/") == expected
    assert dv.absolute_path("s3://mytable") == expected
    assert dv.relative_path() == "ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"


def test_unique_id_with_offset() -> None:
    # "If offset is None then <storageType><pathOrInlineDv>. Otherwise <storageType><pathOrInlineDv>@<offset>."
    assert _descriptor(_U_EXAMPLE).unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"
    assert _descriptor(_P_EXAMPLE).unique_id == "p" + _P_EXAMPLE["pathOrInlineDv"] + "@4"


def test_unique_id_without_offset() -> None:
    assert _descriptor(_I_EXAMPLE).unique_id == "i" + _I_EXAMPLE["pathOrInlineDv"]
    no_offset = {k: v for k, v in _U_EXAMPLE.items() if k != "offset"}
    assert _descriptor(no_offset).unique_id == "uab^-aqEH.-t@S}K{vb[*k^"
    assert _descriptor({**_U_EXAMPLE, "offset": None}).unique_id == "uab^-aqEH.-t@S}K{vb[*k^"


def test_offset_distinguishes_descriptors_in_one_file() -> None:
    assert _descriptor(_U_EXAMPLE).unique_id != _descriptor({**_U_EXAMPLE, "offset": 45}).unique_id


def test_absolute_path_example_is_used_as_is() -> None:
    dv = _descriptor(_P_EXAMPLE)
    assert dv.absolute_path("s3://othertable/", ("s3://mytable",)) == _P_EXAMPLE["pathOrInlineDv"]
    with pytest.raises(UnsafePathError):  # another bucket, not listed: refused (state/paths.py)
        dv.absolute_path("s3://othertable/")
    with pytest.raises(InvalidLogError):
        dv.relative_path()


def test_inline_descriptor_has_no_path() -> None:
    # "This is not a legal field if storageType='i', as an inline DV has no absolute path."
    dv = _descriptor(_I_EXAMPLE)
    with pytest.raises(InvalidLogError):
        dv.absolute_path("s3://mytable/")
    with pytest.raises(InvalidLogError):
        dv.relative_path()


def test_absent_or_null_descriptor_means_no_deletion_vector() -> None:
    assert DeletionVector.parse(None) is None
    [add] = parse_json_actions(
        b'{"add":{"path":"p","partitionValues":{},"size":1,"modificationTime":1,"dataChange":true}}'
    )
    assert isinstance(add, Add)
    assert add.deletion_vector is None
    assert add.dv_id is None


def test_relative_path_shorter_than_a_uuid_is_an_invalid_log() -> None:
    with pytest.raises(InvalidLogError):
        _descriptor({**_U_EXAMPLE, "pathOrInlineDv": "ab^-aqEH.-t"}).relative_path()


def test_relative_path_with_undecodable_uuid_is_an_invalid_log() -> None:
    # relative_path() documents "InvalidLogError: ... if the UUID does not decode".
    with pytest.raises(InvalidLogError):
        _descriptor({**_U_EXAMPLE, "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k~"}).relative_path()


def test_relative_path_uuid_must_be_sixteen_bytes() -> None:
    # 20 characters whose last group is a '#' short group decode to 14 bytes: not a UUID.
    with pytest.raises(InvalidLogError):
        _descriptor({**_U_EXAMPLE, "pathOrInlineDv": "ab000000000000000##000"}).relative_path()


# -- descriptors: the corpus ----------------------------------------------------------------------


def test_relative_path_without_prefix_names_the_file_on_disk(corpus: Path) -> None:
    table = corpus / "kernel-rs/table-with-dv-small"
    [add] = [
        a for a in parse_json_actions((table / "_delta_log" / f"{1:020d}.json").read_bytes()) if isinstance(a, Add)
    ]
    assert add.deletion_vector is not None
    assert add.deletion_vector.relative_path() == "deletion_vector_61d16c75-6994-46b7-a15b-8b538852e50e.bin"


@pytest.mark.parametrize(
    "table",
    [
        "kernel-rs/table-with-dv-small",
        "kernel-rs/with-short-dv",
        "kernel-rs/cdf-table-with-cdc-and-dvs",
        "delta-golden/log-replay-dv-key-cases/delta",
        "delta-golden/dv-partitioned-with-checkpoint/delta",
        "delta-kernel-java/basic-dv-no-checkpoint",
        "delta-rs/table_with_deletion_logs",
    ],
)
def test_relative_descriptors_point_at_the_dv_in_its_file(corpus: Path, table: str) -> None:
    root = corpus / table
    seen = 0
    for commit in sorted((root / "_delta_log").glob("[0-9]" * 20 + ".json")):
        for action in parse_json_actions(commit.read_bytes()):
            if not isinstance(action, Add | Remove) or action.deletion_vector is None:
                continue
            dv = action.deletion_vector
            assert dv.storage_type == "u"
            assert dv.offset is not None
            data = Path(dv.absolute_path(str(root))).read_bytes()
            # README: one format-version byte (1) at the start of the file; at `offset` a 4-byte
            # big-endian size equal to sizeInBytes, then the data: magic and a portable Roaring bitmap.
            assert data[0] == 1
            (size,) = struct.unpack(">I", data[dv.offset : dv.offset + 4])
            assert size == dv.size_in_bytes
            body = data[dv.offset + 4 : dv.offset + 4 + size]
            assert body[:4] == _MAGIC
            assert len(pyroaring.BitMap64.deserialize(body[4:])) == dv.cardinality
            seen += 1
    assert seen > 0


def test_inline_descriptors_decode_to_their_recorded_size_and_cardinality(corpus: Path) -> None:
    table = corpus / "kernel-rs/cdf-table-with-dv"
    seen = set()
    for commit in sorted((table / "_delta_log").glob("[0-9]" * 20 + ".json")):
        for line in commit.read_text(encoding="utf-8").splitlines():
            body = next(iter(json.loads(line).values()))
            raw = body.get("deletionVector") if isinstance(body, dict) else None
            if not raw or raw["storageType"] != "i":
                continue
            data = z85_decode(raw["pathOrInlineDv"])
            # Spark's convention pads to whole groups, so keep the first sizeInBytes bytes.
            assert len(data) >= raw["sizeInBytes"]
            data = data[: raw["sizeInBytes"]]
            assert data[:4] == _MAGIC
            assert len(pyroaring.BitMap64.deserialize(data[4:])) == raw["cardinality"]
            seen.add(raw["sizeInBytes"])
    assert seen == {34, 36, 40}


def test_short_group_inline_dv_from_the_corpus(corpus: Path) -> None:
    # README: kernel-rs/cdf-table-with-dv version 5 ends "...5c8Xg##093", 34 bytes, deleted rows {3}.
    commit = corpus / "kernel-rs/cdf-table-with-dv/_delta_log" / f"{5:020d}.json"
    [add] = [a for a in parse_json_actions(commit.read_bytes()) if isinstance(a, Add)]
    dv = add.deletion_vector
    assert dv is not None
    assert dv.storage_type == "i"
    assert dv.path_or_inline_dv.endswith("5c8Xg##093")
    data = z85_decode(dv.path_or_inline_dv)
    assert len(data) == 34 == dv.size_in_bytes
    assert data[:4] == _MAGIC
    assert struct.unpack("<I", data[:4]) == (1681511377,)
    assert list(pyroaring.BitMap64.deserialize(data[4:])) == [3]


# -- Z85 ------------------------------------------------------------------------------------------


def test_rfc32_test_vector() -> None:
    assert z85_decode("HelloWorld") == bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])


def test_empty_text_decodes_to_nothing() -> None:
    assert z85_decode("") == b""


def test_reference_encoders_agree_with_the_known_vectors() -> None:
    # guard the test's own encoders with the published examples before using them as oracles
    assert _z85_encode_rfc32(bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])) == "HelloWorld"
    assert _z85_encode_short_group(bytes([0x03, 0x00])) == "##093"


@given(st.binary(max_size=64).map(lambda b: b[: len(b) - len(b) % 4]))
def test_decode_inverts_rfc32_encoding(data: bytes) -> None:
    assert z85_decode(_z85_encode_rfc32(data)) == data


@given(st.binary(max_size=64))
def test_decode_inverts_short_group_encoding(data: bytes) -> None:
    assert z85_decode(_z85_encode_short_group(data)) == data


@given(st.binary(min_size=1, max_size=64).filter(lambda b: len(b) % 4 != 0))
def test_zero_padded_encoding_decodes_to_data_then_padding(data: bytes) -> None:
    padded = data + bytes(-len(data) % 4)
    assert z85_decode(_z85_encode_rfc32(padded))[: len(data)] == data


@pytest.mark.parametrize("char", [" ", '"', "'", ",", ";", "\\", "_", "`", "|", "~", "\u00e9", "\n"])
def test_character_outside_the_alphabet_is_rejected(char: str) -> None:
    with pytest.raises(DeletionVectorError):
        z85_decode("Hello" + "Wor" + char + "d")


@pytest.mark.parametrize("text", ["H", "Hell", "HelloW", "HelloWorl", "HelloWorld!"])
def test_length_not_a_multiple_of_five_is_rejected(text: str) -> None:
    with pytest.raises(DeletionVectorError):
        z85_decode(text)


def test_group_over_32_bits_is_rejected() -> None:
    # "%%%%%" is 82 * (85**4 + 85**3 + 85**2 + 85 + 1) > 2**32 - 1
    assert 82 * sum(85**k for k in range(5)) >= 2**32
    with pytest.raises(DeletionVectorError):
        z85_decode("%%%%%")


def test_short_group_over_its_byte_count_is_rejected() -> None:
    # "##zzz": three digits for two bytes, but "zzz" is 35 * (85**2 + 85 + 1) > 2**16 - 1
    assert 35 * (85**2 + 85 + 1) >= 2**16
    with pytest.raises(DeletionVectorError):
        z85_decode("##zzz")


def test_short_group_must_be_the_last_group() -> None:
    with pytest.raises(DeletionVectorError):
        z85_decode("##093HelloWorld")


def test_short_group_misses_at_most_three_bytes() -> None:
    with pytest.raises(DeletionVectorError):
        z85_decode("####0")
