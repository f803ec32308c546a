"""The distribution installs one top-level name, ``deltatail`` (docs/architecture.md, "One installed name").

``deltatail/state``, ``deltatail/tailer`` and ``deltatail/sinks`` link to the repository's folders, so the
one package setuptools finds holds them all; project code imports them as ``deltatail.state`` and so on,
never by the bare folder name (which works in a checkout and fails, or finds somebody else's module, in a
user's environment).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from setuptools import find_packages

ROOT = Path(__file__).resolve().parents[1]
NAMESPACE = "deltatail"
FOLDERS = ("state", "tailer", "sinks")


def _bare_imports(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Imports of a folder by its bare name (``from state.cursor import ...``), not through the namespace."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            if name.split(".")[0] in FOLDERS:
                yield node.lineno, name


@pytest.mark.slow
def test_project_modules_are_imported_through_the_namespace() -> None:
    roots = (*FOLDERS, "tests", "benchmarks", "docs")
    paths = [*(ROOT / NAMESPACE).glob("*.py"), *(p for folder in roots for p in (ROOT / folder).rglob("*.py"))]
    problems = [
        f"{path.relative_to(ROOT)}:{line}: imports {name} (import {NAMESPACE}.{name})"
        for path in paths
        if "sample" not in path.relative_to(ROOT).parts
        for line, name in _bare_imports(ast.parse(path.read_text()))
    ]
    assert not problems, "\n".join(problems)


def test_the_namespace_rule_itself() -> None:
    assert list(_bare_imports(ast.parse("from state.cursor import Position"))) == [(1, "state.cursor")]
    assert list(_bare_imports(ast.parse("import tailer.table"))) == [(1, "tailer.table")]
    assert not list(_bare_imports(ast.parse("from deltatail.state.cursor import Position")))
    assert not list(_bare_imports(ast.parse("from statey import x")))


def test_the_distribution_installs_every_folder_under_the_namespace() -> None:
    for top in FOLDERS:
        link = ROOT / NAMESPACE / top
        assert link.is_symlink() and link.resolve() == (ROOT / top).resolve(), link
    found = set(find_packages(str(ROOT), include=[f"{NAMESPACE}*"]))
    inits = [p for top in FOLDERS for p in (ROOT / top).rglob("__init__.py")]
    folders = {".".join(p.parent.relative_to(ROOT).parts) for p in inits}
    assert found == {NAMESPACE, *(f"{NAMESPACE}.{f}" for f in folders)}


def test_the_installed_name_is_the_one_the_code_runs_under() -> None:
    import deltatail
    from deltatail.state import cursor

    assert Path(deltatail.__file__).resolve().parent == (ROOT / NAMESPACE).resolve()
    assert cursor.__name__ == "deltatail.state.cursor"
    assert Path(cursor.__file__).resolve() == (ROOT / "state" / "cursor.py").resolve()
