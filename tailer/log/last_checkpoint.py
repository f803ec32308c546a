"""The ``_last_checkpoint`` pointer: read, validate, and never trust blindly.

Protocol, "Last Checkpoint File": the file holds ``version``, ``size``, and
optionally ``parts``, ``sizeInBytes``, ``numOfAddFiles``, ``checkpointSchema``,
``checksum`` (and, in the newer revision, ``v2Checkpoint``). "Last checkpoint
file readers are encouraged to validate the checksum, if present": the
checksum is the MD5 of the canonicalized JSON, where scalars keep their form,
strings are quoted and URL-encoded (every octet except ``a-z A-Z 0-9 - . _ ~``
percent-encoded with uppercase hex), object and array members become
``path=value`` pairs with path segments joined by ``+`` (array positions as
bare numbers), pairs are sorted by the UTF-8 bytes of their paths and joined
by ``,``, and the top-level ``checksum`` key is ignored.

A missing, unparsable, checksum-failing or lying pointer is not fatal: the
caller falls back to listing the log, with a warning.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson

log = logging.getLogger("deltatail")


@dataclass(frozen=True, slots=True)
class LastCheckpoint:
    """The validated contents of ``_last_checkpoint``."""

    version: int
    size: int | None
    parts: int | None


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _quoted(value)
    return orjson.dumps(value).decode()


@functools.lru_cache(maxsize=4096)
def _quoted(text: str) -> str:
    """A string as the canonical form writes it; cached, as a schema repeats its keys and type names."""
    return '"' + quote(text, safe="-._~") + '"'


def _pairs(value: Any, path: str, out: list[tuple[bytes, str]]) -> None:
    """Append ``value``'s ``path=value`` pairs under ``path`` (its segments joined by ``+``; ``""`` at the top)."""
    if isinstance(value, dict):
        for key, child in value.items():
            _pairs(child, _joined(path, _scalar(key)), out)
    elif isinstance(value, list):
        for i, child in enumerate(value):
            _pairs(child, _joined(path, str(i)), out)
    else:
        out.append((path.encode(), f"{path}={_scalar(value)}"))


def _joined(path: str, segment: str) -> str:
    # No segment is empty (a key is quoted, a position is a number): only the top has the empty path.
    return f"{path}+{segment}" if path else segment


def canonicalize(document: dict[str, Any]) -> str:
    """The protocol's canonical form of a ``_last_checkpoint`` document (top-level ``checksum`` ignored)."""
    pairs: list[tuple[bytes, str]] = []
    _pairs({k: v for k, v in document.items() if k != "checksum"}, "", pairs)
    pairs.sort(key=lambda p: p[0])
    return ",".join(text for _, text in pairs)


def checksum(document: dict[str, Any]) -> str:
    """The MD5 hex digest of :func:`canonicalize` (what ``checksum`` must equal)."""
    return hashlib.md5(canonicalize(document).encode()).hexdigest()


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate keys")
    return dict(pairs)


def parse_last_checkpoint(data: bytes, *, where: str) -> LastCheckpoint | None:
    """Validate ``_last_checkpoint`` bytes; ``None`` (with a warning naming ``where``) if they cannot be trusted.

    A pointer is refused when it is not a JSON object, has duplicate keys, lacks
    an integer ``version``, or carries a ``checksum`` that does not match.
    """
    import json  # the stdlib parser can report duplicate keys; orjson cannot

    try:
        document = json.loads(data.decode("utf-8"), object_pairs_hook=_reject_duplicates)
    except (ValueError, UnicodeDecodeError) as e:
        log.warning("ignoring unreadable _last_checkpoint (%s): %s; listing the log instead", where, e)
        return None
    if not isinstance(document, dict) or not isinstance(document.get("version"), int):
        log.warning("ignoring _last_checkpoint without an integer version (%s); listing the log instead", where)
        return None
    expected = document.get("checksum")
    if expected is not None and expected != checksum(document):
        log.warning("ignoring _last_checkpoint whose checksum does not match (%s); listing the log instead", where)
        return None
    size, parts = document.get("size"), document.get("parts")
    return LastCheckpoint(
        version=document["version"],
        size=size if isinstance(size, int) else None,
        parts=parts if isinstance(parts, int) else None,
    )
