"""Where a path named by a table's log may be read from: the one containment rule. Pure: no IO.

Every path a log or manifest names (``add``/``remove``/``cdc`` paths, deletion-vector files of
storage type ``u`` and ``p``, V2 checkpoint sidecars, Lance data and deletion files) becomes a
location to read through :func:`resolve_logged_path`, before any file is opened.

The protocol allows absolute paths: an ``add`` path is "a relative path to a data file from the
root of the table or an absolute path to a file that should be added to the table. The path is a
URI as specified by RFC 2396 URI Generic Syntax, which needs to be decoded to get the data file
path" (shallow clones name their source table's files this way). A deletion vector's absolute
path is "the absolute path of the DV file" for ``storageType='p'``. So the rule is:

- A relative path, after percent-decoding (done once by :func:`state.actions.decode_path`) and
  normalising (``.`` segments dropped, ``a/../b`` is ``b``), must stay under the table root; a
  ``..`` that climbs out of it is refused.
- An absolute path or a URI of any scheme (``/x``, ``file:///x``, ``s3://otherbucket/x``,
  another container, account or host) is refused unless, once normalised, it falls under the
  table root itself or under one of the ``external_roots`` the user listed. Nothing is listed by
  default. A listed root is read with the table's own store options (credentials, endpoint).
- Schemes and hosts compare exactly (the scheme case-insensitively): ``s3a://lake`` is not
  ``s3://lake``; ``file:///x``, ``file://localhost/x``, ``file:/x`` and ``/x`` are one local path.

Refusals are :class:`~state.errors.UnsafePathError` naming the table and the path as logged;
the reader adds the version.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from deltatail.state.errors import ConfigError, UnsafePathError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_AUTHORITY = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://([^/]*)(.*)$", re.DOTALL)


def _local(location: str) -> str | None:
    """``location`` as a local absolute path if it is one in any ``file:`` form, else ``None``."""
    if location.startswith("/"):
        return location
    lower = location[:17].lower()
    if lower.startswith("file:///"):
        return location[len("file://") :]
    if lower.startswith("file://localhost/"):
        return location[len("file://localhost") :]
    if lower.startswith("file:/") and not lower.startswith("file://"):
        return location[len("file:") :]
    return None


def is_absolute(path: str) -> bool:
    """Whether a logged (decoded) path is absolute: it starts with ``/`` or has a URI scheme."""
    return path.startswith("/") or (":" in path and _SCHEME.match(path) is not None)


def _split(location: str) -> tuple[str, str]:
    """``(origin, path)``: origin ``""`` for a local path, ``scheme://authority`` (scheme lower-cased) for a URI."""
    local = _local(location)
    if local is not None:
        return "", local
    m = _AUTHORITY.match(location)
    if m is not None:
        return f"{m.group(1).lower()}://{m.group(2)}", m.group(3) or "/"
    scheme = location.split(":", 1)[0]
    return f"{scheme.lower()}:", location[len(scheme) + 1 :]


def _segments(path: str) -> list[str] | None:
    """The path's segments with ``.`` and empty ones dropped and ``..`` applied; ``None`` if ``..`` climbs out."""
    out: list[str] = []
    for segment in path.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(segment)
    return out


def _root(location: str) -> tuple[str, list[str]]:
    origin, path = _split(location)
    segments = _segments(path)
    return origin, segments if segments is not None else []


def _under(origin: str, segments: list[str], root: tuple[str, list[str]]) -> bool:
    root_origin, root_segments = root
    return (
        origin == root_origin and len(segments) > len(root_segments) and segments[: len(root_segments)] == root_segments
    )


def resolve_logged_path(table_root: str, path: str, external_roots: Sequence[str] = ()) -> str:
    """The location to read for ``path`` as the log names it (already percent-decoded), or a refusal.

    Args:
        table_root: the table's root (a local path or a URI), as the table was opened.
        path: the path from the log, decoded once (:func:`state.actions.decode_path`).
        external_roots: roots outside the table whose files the log may name (absolute paths or
            URIs, see :func:`check_external_root`); empty by default.

    Returns:
        ``<table_root>/<normalised relative path>`` for a relative path; the absolute path or URI
        (``file:`` forms made plain local paths, dot segments applied) for an allowed absolute one.

    Raises:
        UnsafePathError: if a relative path climbs out of the table root, an absolute path or URI is
            under neither the table root nor an external root, or the path is empty or holds a NUL.
    """
    if not path or "\x00" in path:
        raise UnsafePathError(f"logged path {path!r} does not name a file", table=table_root, file=path)
    if not is_absolute(path):
        segments = _segments(path)
        if not segments:
            raise UnsafePathError(
                f"logged path {path!r} climbs out of the table root (or names the root itself): refused before reading",
                table=table_root,
                file=path,
            )
        return f"{table_root.rstrip('/')}/{'/'.join(segments)}"
    origin, rest = _split(path)
    segments = _segments(rest)
    if segments is not None:
        roots = [_root(table_root), *(_root(r) for r in external_roots)]
        if any(_under(origin, segments, r) for r in roots):
            return f"{origin}/{'/'.join(segments)}"
    raise UnsafePathError(
        f"logged path {path!r} is outside the table root and not under any external root "
        "(--external-root, external_roots): refused before reading",
        table=table_root,
        file=path,
    )


def check_external_root(root: str) -> str:
    """An ``external_roots`` entry as deltatail keeps it: an absolute path or a URI, trailing ``/`` removed.

    Raises:
        ConfigError: if the root is empty, relative, the file system root, a bare scheme, or holds
            ``..`` or a NUL.
    """
    if not root or "\x00" in root or not is_absolute(root):
        raise ConfigError(f"external root {root!r} must be an absolute path or a URI (s3://bucket/prefix)")
    origin, rest = _split(root)
    segments = _segments(rest)
    if segments is None or ".." in rest.split("/"):
        raise ConfigError(f"external root {root!r} must not hold '..'")
    if not segments and (origin == "" or origin.endswith((":", "/"))):
        raise ConfigError(f"external root {root!r} would allow every file: name a directory or a bucket")
    return root.rstrip("/") or root
