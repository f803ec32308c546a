"""The architecture holds: imports run one way, with no cycles and no imports hidden in functions.

Layers, read from every module's imports (``ast``, module level and inside functions alike):

- ``state`` (pure) imports nothing of the project but ``state``, and no module that touches files,
  the network, processes or the clock;
- ``tailer`` imports ``state`` and ``tailer``, never ``sinks`` (the command line finds a sink URI's
  sink by the ``deltatail.sinks`` entry points: :mod:`tailer.cli.sink_uri`), and nothing outside
  ``tailer.cli`` imports ``tailer.cli``;
- ``sinks`` imports ``state``, ``tailer`` (the sink contract ``tailer.sink`` and the runtime; never
  the follow loop ``tailer.follow`` nor ``tailer.cli``) and ``sinks``.

An import of a project module inside a function defers a module that a command may never need (the
audit model, the object-store client, the variant codecs: start-up, tests/test_front_door.py), and a
module loaded by name when first used (``importlib.import_module`` and the helpers around it: a
command's module, a table format's) is an edge too; both count in the graphs below as a module-level
import does, so neither hides a cycle. The import graph has no cycle; nor has the graph of folders (sub-packages such as
``tailer/follow`` and ``tailer/audit``, an edge wherever a module of one imports a module of the
other), so that a folder's modules can be read, moved or drawn without the folders that use it.
No product module is over 600 lines: a longer one holds more than one job, to be split along its
seams.

A table's storage is resolved in one place, where its handle is built (``storage_for`` is called in
:mod:`tailer.table` only), and a table format is a registry entry, not a branch: outside
``tailer/formats/`` no code compares a format setting with a format's name, asks ``is_lance``, or
asks a storage's type (``type(s) is LocalStorage``: a storage says what it can do).

Settings are parsed once, into one typed model per command (:mod:`tailer.cli.model`): outside the
modules that parse them (:data:`SETTINGS_PARSERS`) no code of ``tailer/cli`` reads a setting from a
dictionary (``s.get("poll_interval", default)``, ``settings["path"]``) or takes settings as
``dict[str, Any]`` / ``Mapping[str, Any]``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from deltatail.tailer.cli.settings import SETTINGS

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("state", "tailer", "sinks")
#: Standard-library modules that reach files, the network, processes or the clock: not for ``state``.
IO_MODULES = frozenset(
    (
        *("os", "io", "pathlib", "shutil", "tempfile", "socket", "subprocess", "time", "fcntl", "select"),
        *("signal", "threading", "multiprocessing", "urllib.request", "http", "glob", "mmap", "sqlite3"),
    )
)

#: The most lines a product module may have.
MAX_MODULE_LINES = 600
#: Product modules still over MAX_MODULE_LINES, each with its line count when listed and why: the debt
#: this file documents. The test fails if a module not listed here grows past the limit, or if one listed
#: here is no longer over it (remove it then).
OVER_THE_LIMIT: dict[str, str] = {}


@dataclass(frozen=True, slots=True)
class Import:
    """One import statement's target, where it is, and whether it is inside a function."""

    module: str
    target: str
    line: int
    local: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def _modules() -> dict[str, Path]:
    """Every product module by name (found once per session; the tests read it, none changes it)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "sample" in path.relative_to(ROOT).parts:
                continue  # the demo's sample table generator is a script, not part of the package graph
            found[_module_name(path)] = path
    return found


def _resolve(target: str, known: dict[str, Path]) -> str:
    """The project module an import names (``a.b.c`` may be a module or a name in ``a.b``)."""
    while target and target not in known:
        target = target.rpartition(".")[0]
    return target


@cache
def _tree(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once per session for every test here (the tests only read it)."""
    return ast.parse(path.read_text(), filename=str(path))


def _import_nodes(body: list[ast.stmt], local: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in ``body`` and the blocks in it, and whether it is inside a function.

    An import is a statement, so only statement blocks are walked (never expressions: a tenth of the
    nodes). Imports under ``if TYPE_CHECKING:`` are left out: they are for the type checker, not run.
    """
    for stmt in body:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt, local
            continue
        inner = local or isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef)
        for block in _blocks(stmt):
            yield from _import_nodes(block, inner)


def _blocks(stmt: ast.stmt) -> Iterator[list[ast.stmt]]:
    """The statement blocks directly inside ``stmt`` (bodies, else, finally, handlers, match cases)."""
    if not (isinstance(stmt, ast.If) and _names_type_checking(stmt.test)):
        yield getattr(stmt, "body", [])
    for field in ("orelse", "finalbody"):
        yield getattr(stmt, field, [])
    for clause in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
        yield clause.body


def _names_type_checking(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Name | ast.Attribute) and _name_of(n) == "TYPE_CHECKING" for n in ast.walk(test))


def _deferred_loads(tree: ast.Module) -> Iterator[tuple[str, int]]:
    """Project modules a module loads by name at run time (``importlib.import_module``, and the helpers
    around it: ``deferred("deltatail.tailer.cli.audit", ...)``, a format registry entry's module path):
    every string argument of a call that names a ``deltatail.`` module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            for arg in (*node.args, *(k.value for k in node.keywords)):
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("deltatail."):
                    yield arg.value, node.lineno


def _imports(module: str, path: Path) -> Iterator[Import]:
    if '"deltatail.' in path.read_text():  # a module path in a string: only a few files have one
        for name, line in _deferred_loads(_tree(path)):
            # Loaded when first used, not at import: an edge of the graph all the same (a cycle through
            # it is a cycle of the design), but not a function-local import statement.
            yield Import(module, name.removeprefix("deltatail."), line, False)
    for node, local in _import_nodes(_tree(path).body):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif node.module is not None and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            # Installed, the folders are deltatail.state, deltatail.tailer and deltatail.sinks (docs/architecture.md,
            # "One installed name"); the rules here speak of the folders.
            yield Import(module, name.removeprefix("deltatail."), node.lineno, local)


@cache
def _graph() -> tuple[dict[str, Path], dict[str, list[Import]]]:
    known = _modules()
    edges: dict[str, list[Import]] = {}
    for module, path in known.items():
        edges[module] = list(_imports(module, path))
    return known, edges


def _layer_violation(source: str, target: str) -> str | None:
    top = target.split(".")[0]
    cli = _within(source, "tailer.cli")
    to_cli = _within(target, "tailer.cli")
    if source.startswith("state"):
        if top != "state":
            return "state imports only state"
    elif source.startswith("tailer"):
        if top == "sinks":
            return "tailer never imports sinks (the command line finds them by their entry points)"
        if to_cli and not cli:
            return "nothing outside tailer.cli imports it"
    elif source.startswith("sinks") and to_cli:
        return "sinks never import tailer.cli"
    elif source.startswith("sinks") and _within(target, "tailer.follow"):
        return "sinks import the sink contract (tailer.sink), never the follow loop"
    if _within(target, "sinks.spark") and not _within(source, "sinks.spark"):
        return "nothing imports the Spark front end (sinks.spark): Spark loads it"
    return None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_every_import_runs_one_way() -> None:
    known, edges = _graph()
    problems = []
    for module, imports in edges.items():
        for imp in imports:
            target = _resolve(imp.target, known)
            if target:
                why = _layer_violation(module, target)
                if why is not None:
                    problems.append(f"{known[module].relative_to(ROOT)}:{imp.line}: {module} -> {target}: {why}")
    assert not problems, "\n".join(sorted(set(problems)))


def test_state_touches_no_file_network_process_or_clock() -> None:
    known, edges = _graph()
    problems = [
        f"{known[m].relative_to(ROOT)}:{imp.line}: {m} imports {imp.target}"
        for m, imports in edges.items()
        if m.startswith("state")
        for imp in imports
        if imp.target in IO_MODULES or imp.target.split(".")[0] in IO_MODULES
    ]
    assert not problems, "\n".join(problems)


def _module_graph() -> dict[str, list[str]]:
    """Module -> the project modules it imports, at module level or deferred inside a function."""
    known, edges = _graph()
    return {
        m: sorted({t for imp in imports if (t := _resolve(imp.target, known)) and t != m})
        for m, imports in edges.items()
    }


def test_deferred_imports_count_in_the_graphs() -> None:
    # Imported inside functions (start-up): still edges of the module and folder graphs the cycle checks walk.
    known, edges = _graph()
    deferred = {(m, _resolve(imp.target, known)) for m, imports in edges.items() for imp in imports if imp.local}
    assert ("tailer.storage.factory", "tailer.storage.objectstore") in deferred
    assert "tailer.storage.objectstore" in _module_graph()["tailer.storage.factory"]
    assert "tailer.audit" in _folder_graph()["tailer.formats"]  # tailer/formats/delta.py defers the audit feed


def test_no_import_cycles() -> None:
    graph = _module_graph()
    # A package's __init__ re-exporting its modules is not a cycle with them.
    for module in graph:
        graph[module] = [t for t in graph[module] if not module.startswith(f"{t}.")]
    cycles = _cycles(graph)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def _folder(module: str, known: dict[str, Path]) -> str:
    """The folder a module is in, as a dotted name (a package's ``__init__`` is in its own folder)."""
    return module if known[module].name == "__init__.py" else module.rpartition(".")[0]


def _nested(a: str, b: str) -> bool:
    """Whether one of two folders holds the other (``state`` and ``state.actions``)."""
    return a.startswith(f"{b}.") or b.startswith(f"{a}.")


def _folder_graph() -> dict[str, list[str]]:
    """Folder -> the other folders its modules import (at module level or deferred inside a function).

    A folder and a sub-package inside it count as one (``state/actions`` is ``state``'s actions module
    split into files, and imports ``state.errors`` as any module of ``state`` does): the rule is about
    folders side by side, such as ``tailer/follow`` and ``tailer/audit``, and the top-level packages.
    """
    known, edges = _graph()
    graph: dict[str, set[str]] = {}
    for module, imports in edges.items():
        source = _folder(module, known)
        targets = graph.setdefault(source, set())
        for imp in imports:
            target = _resolve(imp.target, known)
            folder = _folder(target, known) if target else source
            if folder != source and not _nested(folder, source):
                targets.add(folder)
    return {folder: sorted(targets) for folder, targets in graph.items()}


def test_no_import_cycles_between_folders() -> None:
    # Folders, not only modules: tailer.follow importing tailer.audit.feed while tailer.audit.log imports
    # tailer.follow.state_store has no module cycle, but the two folders then stand and fall together.
    cycles = _cycles(_folder_graph())
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_folder_rule_sees_folders() -> None:
    # The folder graph the check above walks has the edges the brief's layering names (so it cannot pass empty).
    graph = _folder_graph()
    assert "tailer.runtime" in graph["tailer.follow"]
    assert "tailer.follow" in graph["tailer.lance"]
    assert "tailer.follow" not in graph["tailer.audit"]
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"]}) == [["a", "b", "c", "a"]]


def test_modules_loaded_by_name_are_edges_of_the_graph() -> None:
    # A command's module and a table format's module are imported by name when first used: the graph
    # (and so the cycle and layer rules) sees them all the same.
    known, edges = _graph()
    targets = {m: {_resolve(imp.target, known) for imp in imports} for m, imports in edges.items()}
    assert "tailer.cli.serve" in targets["tailer.cli.main"]
    assert "tailer.cli.audit" in targets["tailer.cli.audit_parser"]
    assert "tailer.formats.lance" in targets["tailer.formats.registry"]
    tree = ast.parse('x = load("deltatail.tailer.cli.demo", "run")\ny = other("elsewhere.module")')
    assert list(_deferred_loads(tree)) == [("deltatail.tailer.cli.demo", 1)]


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets (none in an acyclic graph)."""
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


def test_no_product_module_is_over_600_lines() -> None:
    known = _modules()
    lines = {m: len(path.read_text().splitlines()) for m, path in known.items()}
    over = {m: n for m, n in lines.items() if n > MAX_MODULE_LINES}
    unlisted = [f"{known[m].relative_to(ROOT)}: {n} lines" for m, n in sorted(over.items()) if m not in OVER_THE_LIMIT]
    assert not unlisted, f"over {MAX_MODULE_LINES} lines, split along its seams:\n" + "\n".join(unlisted)
    paid = sorted(m for m in OVER_THE_LIMIT if m not in over)
    assert not paid, f"no longer over {MAX_MODULE_LINES} lines, remove from OVER_THE_LIMIT: {', '.join(paid)}"


#: The modules that may call ``storage_for``: its own, and the table handle's.
STORAGE_RESOLVERS = frozenset({"tailer.storage.factory", "tailer.table"})
#: The storage implementations: code outside ``tailer/storage`` never asks a storage's type.
STORAGE_CLASSES = frozenset({"LocalStorage", "ObjectStoreStorage"})
#: The names of the table formats (a comparison with one is a format branch).
FORMAT_NAMES = frozenset({"delta", "lance", "iceberg"})


def _name_of(node: ast.AST) -> str:
    """``x`` of a name, ``b`` of an attribute ``a.b``, else ``""``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _format_branches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Where ``tree`` branches on a table format or a storage's type: (line, what)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name_of(node.func) in ("is_lance", "looks_like_lance", "is_lance_dataset"):
            yield node.lineno, f"{_name_of(node.func)}(...)"
        if isinstance(node, ast.Call) and _name_of(node.func) == "isinstance":
            checked = _name_of(node.args[1])
            if checked in STORAGE_CLASSES:
                yield node.lineno, f"isinstance(..., {checked})"
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        named = [_name_of(n) for n in sides]
        literals = {n.value for n in sides if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        texts = [ast.unparse(n) for n in sides] if literals & FORMAT_NAMES else []
        if any("format" in t or "fmt" in t for t in texts):
            yield node.lineno, f"a format compared with {sorted(literals & FORMAT_NAMES)[0]!r}"
        typed = any(isinstance(n, ast.Call) and _name_of(n.func) == "type" for n in sides)
        if typed and set(named) & STORAGE_CLASSES:
            yield node.lineno, f"type(...) compared with {sorted(set(named) & STORAGE_CLASSES)[0]}"


def _storage_for_calls(tree: ast.AST) -> Iterator[int]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name_of(node.func) == "storage_for":
            yield node.lineno


def test_storage_is_resolved_only_where_a_table_handle_is_built() -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{line}: storage_for outside the table handle (tailer/table.py)"
        for module, path in _modules().items()
        if module not in STORAGE_RESOLVERS
        for line in _storage_for_calls(_tree(path))
    ]
    assert not problems, "\n".join(problems)


def test_no_format_branch_outside_the_format_registry() -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {what} (ask the table's format: tailer/formats/)"
        for module, path in _modules().items()
        if not module.startswith(("tailer.formats", "tailer.storage"))
        for line, what in _format_branches(_tree(path))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("code", "branches"),
    [
        ('if options.table_format == "lance": pass', 1),
        ('if fmt.name != "delta": pass', 1),
        ('if table.format.name == "lance": pass', 1),
        ('if kind == "lance": pass', 0),  # not a format setting (the rule reads names: keep them honest)
        ('if args.format == "lance": pass', 1),
        ('lance = "lance" if looks_like_lance(t, s) else "delta"', 1),
        ("if is_lance(args, {}): pass", 1),
        ("local = type(self.storage) is LocalStorage", 1),
        ("local = isinstance(storage, LocalStorage)", 1),
        ("local = self.storage.local_files", 0),
        ('if args.format == "table": pass', 0),  # an output format, not a table format
        ("if table.format.refused(asked): pass", 0),
    ],
)
def test_the_format_branch_rule_itself(code: str, branches: int) -> None:
    assert len(list(_format_branches(ast.parse(code)))) == branches


def test_the_storage_rule_itself() -> None:
    assert list(_storage_for_calls(ast.parse("s = storage_for(uri, options)"))) == [1]
    assert not list(_storage_for_calls(ast.parse("s = table.storage")))


@pytest.mark.parametrize(
    ("source", "target", "allowed"),
    [
        ("state.snapshot", "tailer.log.delta_log", False),
        ("state.snapshot", "sinks.kafka.sink", False),
        ("tailer.read.feed", "sinks.kafka.sink", False),
        ("tailer.follow.tailer", "tailer.cli.settings", False),
        ("sinks.kafka.sink", "tailer.cli.main", False),
        ("tailer.cli.sink_uri", "sinks.kafka.sink", False),
        ("tailer.follow.tailer", "sinks.embedded", False),
        ("sinks.kafka.sink", "tailer.follow.loop", False),
        ("sinks.kafka.sink", "tailer.sink", True),
        ("sinks.embedded", "tailer.runtime.files", True),
        ("sinks.spark.source", "tailer.read.feed", True),
        ("sinks.kafka.sink", "sinks.spark.kafka_writer", False),
        ("sinks.spark.source", "sinks.spark.formats", True),
        ("tailer.read.feed", "state.planning", True),
    ],
)
def test_the_layer_rule_itself(source: str, target: str, allowed: bool) -> None:
    # The checks above pass on a clean tree; this makes sure the rule they apply would catch a violation.
    assert (_layer_violation(source, target) is None) is allowed


#: The modules that parse flags, environment and TOML into the settings model (and may read dictionaries).
SETTINGS_PARSERS = frozenset({"tailer.cli.settings", "tailer.cli.model", "tailer.cli.serve_config"})
#: Every setting's name, and the table keys parsed alongside them.
SETTING_NAMES = frozenset(SETTINGS) | {"storage", "format", "path", "root"}
_UNTYPED = re.compile(r"(dict|Mapping|MutableMapping)\[str, Any\]")


def _untyped_settings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Settings read from a dictionary by name, and parameters typed as a dictionary of anything."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and first.value in SETTING_NAMES:
                yield node.lineno, f".get({first.value!r}) of a setting"
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            if node.slice.value in SETTING_NAMES:
                yield node.lineno, f"[{node.slice.value!r}] of a setting"
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            params = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            for param in params:
                if param.annotation is not None and _UNTYPED.fullmatch(ast.unparse(param.annotation)):
                    yield param.lineno, f"parameter {param.arg}: {ast.unparse(param.annotation)}"


def test_settings_are_read_from_the_model_past_the_parse_step() -> None:
    problems = [
        f"{path.relative_to(ROOT)}:{line}: {what} (read the command's model: tailer/cli/model.py)"
        for module, path in _modules().items()
        if module.startswith("tailer.cli") and module not in SETTINGS_PARSERS
        for line, what in _untyped_settings(_tree(path))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("code", "found"),
    [
        ('interval = s.get("poll_interval", d.poll_interval)', 1),
        ('sink = settings.get("sink")', 1),
        ('path = str(settings["path"])', 1),
        ("def tailer_config(table: str, s: Mapping[str, Any]) -> None: pass", 1),
        ("def load(*, given: dict[str, Any]) -> None: pass", 1),
        ("interval = s.poll_interval", 0),
        ('table = recorded.get("table")', 0),  # a state file's field, not a setting
        ("def check(ids: Mapping[str, str]) -> None: pass", 0),
    ],
)
def test_the_settings_rule_itself(code: str, found: int) -> None:
    assert len(list(_untyped_settings(ast.parse(code)))) == found
