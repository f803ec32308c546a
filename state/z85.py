"""Z85 decoding for inline deletion vectors and relative DV path UUIDs.

Protocol, "Deletion Vector Descriptor Schema": "The concrete Base85 variant
used is Z85, because it is JSON-friendly." Two padding conventions exist in
real tables when the decoded length is not a multiple of 4 (see
``shared/spec/README.md``): Delta Spark pads the data with zero bytes to a whole
group (so callers keep only the first ``sizeInBytes`` bytes), while writers
using the Rust ``z85`` crate end with a short group whose leading ``#``
characters mark missing bytes, one per byte. Both are decoded here.
"""

from __future__ import annotations

from deltatail.state.errors import DeletionVectorError

_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_VALUE = {c: i for i, c in enumerate(_ALPHABET)}


def _group_value(group: str) -> int:
    value = 0
    for char in group:
        digit = _VALUE.get(char)
        if digit is None:
            raise DeletionVectorError(f"invalid Z85 character {char!r}")
        value = value * 85 + digit
    return value


def z85_decode(text: str) -> bytes:
    """Decode Z85 text into bytes.

    Args:
        text: Z85 characters; a whole number of 5-character groups, where the
            last group may use the ``#``-prefixed short-group convention.

    Returns:
        The decoded bytes (4 per whole group; fewer for a short last group).

    Raises:
        DeletionVectorError: if the text has a length that is not a multiple
            of 5, a character outside the Z85 alphabet, or a group over 2**32.
    """
    if len(text) % 5 != 0:
        raise DeletionVectorError(f"Z85 text of length {len(text)} is not a multiple of 5")
    out = bytearray()
    for start in range(0, len(text), 5):
        group = text[start : start + 5]
        missing = len(group) - len(group.lstrip("#"))
        if missing:
            if start + 5 != len(text) or missing > 3:
                raise DeletionVectorError(f"Z85 short group {group!r} is not the last group")
            value = _group_value(group[missing:])
            if value >= 1 << (8 * (4 - missing)):
                raise DeletionVectorError(f"Z85 short group {group!r} overflows")
            out += value.to_bytes(4 - missing, "big")
            continue
        value = _group_value(group)
        if value >= 1 << 32:
            raise DeletionVectorError(f"Z85 group {group!r} overflows 32 bits")
        out += value.to_bytes(4, "big")
    return bytes(out)
