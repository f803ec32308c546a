"""The containment rule for paths a log names (state/paths.py): examples, then properties."""

from __future__ import annotations

import posixpath

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from deltatail.state.actions import DeletionVector
from deltatail.state.errors import ConfigError, InvalidLogError, UnsafePathError
from deltatail.state.paths import check_external_root, resolve_logged_path

ROOT = "/data/lake/t"
S3_ROOT = "s3://lake/sales/t"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("part-0.parquet", "/data/lake/t/part-0.parquet"),
        ("year=2024/part-0.parquet", "/data/lake/t/year=2024/part-0.parquet"),
        ("a/../part-0.parquet", "/data/lake/t/part-0.parquet"),
        ("./a/./b.parquet", "/data/lake/t/a/b.parquet"),
        ("/data/lake/t/x.parquet", "/data/lake/t/x.parquet"),
        ("file:///data/lake/t/x.parquet", "/data/lake/t/x.parquet"),
        ("file:/data/lake/t/x.parquet", "/data/lake/t/x.parquet"),
        ("file://localhost/data/lake/t/x.parquet", "/data/lake/t/x.parquet"),
    ],
)
def test_paths_inside_the_table_resolve(path: str, expected: str) -> None:
    assert resolve_logged_path(ROOT, path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "../../outside/secret.parquet",
        "../t2/x.parquet",  # a sibling whose name starts like the root's
        "a/../../x.parquet",
        "..",
        ".",
        "",
        "a\x00b",
        "/etc/passwd",
        "/proc/self/environ",
        "/dev/zero",
        "/data/lake/t2/x.parquet",
        "/data/lake/t/../u/x.parquet",
        "/data/lake/t",
        "file:///etc/passwd",
        "file://otherhost/data/lake/t/x.parquet",
        "s3://otherbucket/secret.parquet",
        "http://169.254.169.254/latest/meta-data",
    ],
)
def test_paths_outside_the_table_are_refused(path: str) -> None:
    with pytest.raises(UnsafePathError) as info:
        resolve_logged_path(ROOT, path)
    assert isinstance(info.value, InvalidLogError)
    assert info.value.table == ROOT and info.value.file == path


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("s3://lake/sales/t/x.parquet", True),
        ("S3://lake/sales/t/x.parquet", True),
        ("s3://otherbucket/secret.parquet", False),
        ("s3://lake/sales/t2/x.parquet", False),
        ("s3a://lake/sales/t/x.parquet", False),
        ("s3://lake.evil/sales/t/x.parquet", False),
        ("/data/lake/t/x.parquet", False),
        ("../x.parquet", False),
    ],
)
def test_on_an_object_store_the_bucket_and_prefix_must_match(path: str, allowed: bool) -> None:
    if allowed:
        assert resolve_logged_path(S3_ROOT, path).endswith("/sales/t/x.parquet")
    else:
        with pytest.raises(UnsafePathError):
            resolve_logged_path(S3_ROOT, path)


def test_listed_external_roots_allow_absolute_paths_under_them_only() -> None:
    roots = ("/mnt/source", "s3://otherbucket/clones")
    assert resolve_logged_path(ROOT, "/mnt/source/a/x.parquet", roots) == "/mnt/source/a/x.parquet"
    assert resolve_logged_path(ROOT, "file:///mnt/source/x.parquet", roots) == "/mnt/source/x.parquet"
    assert resolve_logged_path(ROOT, "s3://otherbucket/clones/x.parquet", roots) == "s3://otherbucket/clones/x.parquet"
    for refused in ("/mnt/sourcex/x.parquet", "/mnt/x.parquet", "s3://otherbucket/secret.parquet", "../x.parquet"):
        with pytest.raises(UnsafePathError):
            resolve_logged_path(ROOT, refused, roots)


@pytest.mark.parametrize(
    ("root", "kept"),
    [("/mnt/source/", "/mnt/source"), ("s3://otherbucket", "s3://otherbucket"), ("file:///mnt/x", "file:///mnt/x")],
)
def test_external_roots_are_checked(root: str, kept: str) -> None:
    assert check_external_root(root) == kept


@pytest.mark.parametrize("root", ["", "relative/dir", "/", "s3://", "/mnt/../etc", "file:///"])
def test_unusable_external_roots_are_config_errors(root: str) -> None:
    with pytest.raises(ConfigError):
        check_external_root(root)


def test_deletion_vector_files_follow_the_rule() -> None:
    uuid_z85 = "ab^-aqEH.-t@S}K{vb[*"
    inside = DeletionVector("u", "ab" + uuid_z85, 10, 1)
    assert inside.absolute_path(ROOT).startswith("/data/lake/t/ab/deletion_vector_")
    climbing = DeletionVector("u", "../../outside" + uuid_z85, 10, 1)
    with pytest.raises(UnsafePathError):
        climbing.absolute_path(ROOT)
    for p in ("/etc/passwd", "file:///etc/passwd", "%2Fetc%2Fpasswd", "s3://otherbucket/dv.bin"):
        with pytest.raises(UnsafePathError):
            DeletionVector("p", p, 10, 1).absolute_path(ROOT)
    assert DeletionVector("p", "/mnt/source/dv.bin", 10, 1).absolute_path(ROOT, ("/mnt/source",)) == (
        "/mnt/source/dv.bin"
    )


_SEGMENT = st.sampled_from(["a", "b", "..", ".", "", "%2E%2E", "x.parquet", "..."])


@given(st.lists(_SEGMENT, min_size=1, max_size=8))
def test_a_resolved_relative_path_never_leaves_the_root(segments: list[str]) -> None:
    path = "/".join(segments)
    assume(not path.startswith("/"))  # absolute: the next test
    try:
        location = resolve_logged_path(ROOT, path)
    except UnsafePathError:
        # refused only if a lexical walk (independent of the code under test) climbs out or stays at the root
        depth, lowest = 0, 0
        for s in segments:
            if s == "..":
                depth -= 1
                lowest = min(lowest, depth)
            elif s not in ("", "."):
                depth += 1
        assert lowest < 0 or depth == 0
        return
    assert location.startswith(ROOT + "/")
    assert posixpath.normpath(location) == location
    assert posixpath.normpath(posixpath.join(ROOT, path)) == location


@given(st.lists(_SEGMENT, min_size=1, max_size=8), st.sampled_from(["/", "file:///", "s3://lake/", "s3://other/"]))
def test_a_resolved_absolute_path_is_under_the_root(segments: list[str], prefix: str) -> None:
    path = prefix + "/".join(segments)
    for root in (ROOT, S3_ROOT):
        try:
            location = resolve_logged_path(root, path)
        except UnsafePathError:
            continue
        assert location.startswith(root + "/")
        assert "/../" not in location and not location.endswith("/..")
