"""Damaged copies of real tables, and the deltatail command line run on them (for ``test_damaged_tables.py``).

A :class:`Damage` is one change to one file of a copy of a corpus table: truncated, emptied,
deleted, bits flipped (at JSON structure characters, at seeded random offsets, in a Parquet
footer), or a lying ``_last_checkpoint``. Damaged files keep their modification time (commit
timestamps come from it), so an unchanged answer is byte for byte the undamaged one.

:func:`run_cli` runs ``deltatail`` through its entry point, :func:`tailer.cli.main.main`, as the
console script does (``sys.exit(main(argv))``), with stdout and stderr captured and a time limit:
an exception escaping ``main`` is what a user would see as a traceback. :func:`verdict` says
whether an outcome is acceptable: the undamaged answer, or exit code 1 with one
``deltatail: error:`` line and no traceback; a different answer only where an independent reading
of the damaged file (``json`` for a commit, ``pyarrow.parquet`` for a Parquet file) also differs
from the original, that is where the damage produced a valid file that says something else.
"""

from __future__ import annotations

import functools
import io
import json
import logging
import os
import random
import shutil
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from unittest import mock

import pyarrow as pa
import pyarrow.parquet as pq

import deltatail.tailer.cli.main as cli_main
from deltatail.tailer.cli.main import main

#: Seconds a command may take on a damaged copy before it counts as hanging.
TIME_LIMIT = 60

#: The command line's parser, built once: ``main`` builds it at every call (once a process for the
#: console script), which was a third of the sweep's time in this process of thousands of calls.
#: Parsing does not change an ``argparse`` parser, so every call parses with an equal one.
_PARSER = functools.cache(cli_main.build_parser)


@dataclass(frozen=True)
class Outcome:
    """What one command did: exit code (``None``: an exception escaped), stdout, stderr, the escape."""

    code: int | None
    stdout: bytes
    stderr: str
    escaped: str | None = None


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _Hang


def run_cli(argv: list[str], env: dict[str, str] | None = None, *, clear: bool = False) -> Outcome:
    """``deltatail ARGV`` in this process, as the console script runs it, with ``env`` added to the environment
    (with ``clear``, ``env`` is the whole environment while it runs).

    What a command sets for its process (``run``: SIGINT and SIGTERM handlers, the thread switch
    interval, Arrow's memory pool; logging's handlers) is put back afterwards.
    """
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.StringIO()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level  # main() points logging at the captured stderr
    stops = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    switch, pool = sys.getswitchinterval(), pa.default_memory_pool()
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_LIMIT)
    build_parser, cli_main.build_parser = cli_main.build_parser, _PARSER
    try:
        with redirect_stdout(out), redirect_stderr(err), mock.patch.dict(os.environ, env or {}, clear=clear):
            try:
                code: int | None = main(argv)
                escaped = None
            except SystemExit as e:  # argparse: usage errors exit 2
                code, escaped = (e.code if isinstance(e.code, int) else 1), None
            except _Hang:
                code, escaped = None, f"no answer within {TIME_LIMIT} s"
            except BaseException:
                code, escaped = None, traceback.format_exc()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        for signum, handler in stops.items():
            signal.signal(signum, handler)
        sys.setswitchinterval(switch)
        pa.set_memory_pool(pool)
        cli_main.build_parser = build_parser
        root.handlers[:] = handlers
        root.setLevel(level)
    out.flush()
    raw = out.buffer
    assert isinstance(raw, io.BytesIO)
    return Outcome(code, raw.getvalue(), err.getvalue(), escaped)


@dataclass(frozen=True)
class Ran:
    """A command's exit code and output as a child process's would read (:func:`run_inline`)."""

    returncode: int | None
    stdout: str
    stderr: str


def run_inline(*args: str, env: dict[str, str] | None = None, clear: bool = False) -> Ran:
    """:func:`run_cli` read as ``subprocess.run(..., text=True)`` reads a child; an escaped exception is in stderr."""
    done = run_cli(list(args), env, clear=clear)
    return Ran(done.code, done.stdout.decode(), done.stderr + (done.escaped or ""))


# -- damages --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Damage:
    """One change to one file of a table copy; ``kind`` says which (see :func:`damages`)."""

    table: str
    file: str  # relative to the table root
    kind: str
    apply: Callable[[Path], None]
    reread: str | None = None  # "json" or "parquet": how to tell a valid-but-different file
    valid_table: bool = False  # the damaged copy is a valid table of its own (the newest commit deleted)

    @property
    def name(self) -> str:
        return f"{self.table}::{self.file}::{self.kind}"


def _keep_mtime(path: Path, change: Callable[[bytes], bytes | None]) -> None:
    stat = path.stat()
    data = path.read_bytes()
    new = change(data)
    if new is None:
        path.unlink()
        return
    path.write_bytes(new)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _flip(data: bytes, at: int, bit: int = 0) -> bytes:
    return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]


def _file_damages(table: str, relative: str, size: int, reread: str | None, seed: int) -> Iterator[Damage]:
    def make(kind: str, change: Callable[[bytes], bytes | None], reread_as: str | None = None) -> Damage:
        return Damage(table, relative, kind, lambda root: _keep_mtime(root / relative, change), reread_as)

    yield make("deleted", lambda d: None)
    yield make("emptied", lambda d: b"")
    yield make("truncated", lambda d: d[: len(d) // 2])
    yield make("last byte cut", lambda d: d[:-1])
    rng = random.Random(f"{seed}:{relative}")
    for i in range(3):
        at, bit = rng.randrange(size), rng.randrange(8)
        yield make(f"bit {bit} flipped at {at} (random {i})", functools.partial(_flip, at=at, bit=bit), reread)


def _json_structure_damages(table: str, relative: str, data: bytes) -> Iterator[Damage]:
    """Flips that break the JSON: the low bit of the first ``{``, a middle ``"``, the last ``}``, a ``:``."""
    positions = {
        "first {": data.find(b"{"),
        'a middle "': data.find(b'"', len(data) // 2),
        "last }": data.rfind(b"}"),
        "a :": data.find(b":", len(data) // 3),
    }
    for what, at in positions.items():
        if at >= 0:
            yield Damage(table, relative, f"bit 0 of {what} flipped", _flipper(relative, at, 0))


def _parquet_footer_damages(table: str, relative: str, data: bytes) -> Iterator[Damage]:
    """Flips in the footer length and in the footer itself (Thrift metadata)."""
    length = int.from_bytes(data[-8:-4], "little") if len(data) >= 12 else 0
    spots = {"footer length": len(data) - 6, "trailing magic": len(data) - 1}
    if 0 < length < len(data):
        spots["footer start"] = len(data) - 8 - length
        spots["footer middle"] = len(data) - 8 - length // 2
    for what, at in spots.items():
        yield Damage(table, relative, f"bit 3 of {what} flipped", _flipper(relative, at, 3), "parquet")


def _last_checkpoint_lies(table: str, root: Path) -> Iterator[Damage]:
    path = root / "_delta_log" / "_last_checkpoint"
    if not path.exists():
        return
    original = json.loads(path.read_text(encoding="utf-8"))
    version = int(original["version"])
    lies = {
        "points past the newest commit": {"version": version + 1000, "size": 5},
        "points to version 0 (no checkpoint there)": {"version": 0, "size": 3},
        "claims three parts": {**{k: v for k, v in original.items() if k != "checksum"}, "parts": 3},
        "negative version": {"version": -4, "size": 1},
        "version is a string": {"version": str(version), "size": 1},
        "wrong checksum": {**original, "checksum": "0" * 32},
        "not an object": [version],
    }
    yield Damage(
        table, "_delta_log/_last_checkpoint", "deleted", lambda r: (r / "_delta_log/_last_checkpoint").unlink()
    )
    for what, document in lies.items():
        text = json.dumps(document).encode()
        yield Damage(table, "_delta_log/_last_checkpoint", f"lies: {what}", _rewriter(text))
    yield Damage(table, "_delta_log/_last_checkpoint", "garbage bytes", _rewriter(b"\xff\xfe{{"))


def _rewriter(text: bytes) -> Callable[[Path], None]:
    def rewrite(root: Path) -> None:
        _keep_mtime(root / "_delta_log" / "_last_checkpoint", lambda d: text)

    return rewrite


def _flipper(relative: str, at: int, bit: int) -> Callable[[Path], None]:
    def flip(root: Path) -> None:
        _keep_mtime(root / relative, lambda d: _flip(d, at, bit))

    return flip


def classify(relative: str) -> str:
    """The kind of a table file: commit, checkpoint, sidecar, last_checkpoint, crc, dv, cdc, data or other."""
    name = Path(relative).name
    if relative.startswith("_delta_log/_sidecars/"):
        return "sidecar"
    if relative.startswith("_delta_log/"):
        if name == "_last_checkpoint":
            return "last_checkpoint"
        if ".checkpoint." in name:
            return "checkpoint"
        if name.endswith(".crc"):
            return "crc"
        if name.endswith(".json") and name[:20].isdigit():
            return "commit"
        return "other"
    if name.startswith("."):
        return "other"  # Hadoop's .crc side files
    if name.endswith(".bin"):
        return "dv"
    if relative.startswith("_change_data/"):
        return "cdc"
    if name.endswith(".parquet"):
        return "data"
    return "other"


def damages(table: str, root: Path, *, seed: int = 18, per_kind: int | None = None) -> list[Damage]:
    """Every damage of a table: each log, checkpoint, sidecar, DV, cdc and data file (at most ``per_kind`` a kind)."""
    found: list[Damage] = []
    seen: dict[str, int] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = path.relative_to(root).as_posix()
        kind = classify(relative)
        if kind in ("other", "crc", "last_checkpoint"):
            continue
        seen[kind] = seen.get(kind, 0) + 1
        if per_kind is not None and seen[kind] > per_kind:
            continue
        data = path.read_bytes()
        reread = "json" if kind == "commit" else "parquet" if path.suffix == ".parquet" else None
        if kind == "sidecar" and path.suffix == ".json":
            reread = "json"
        found += _file_damages(table, relative, max(len(data), 1), reread, seed)
        if kind == "commit" or (kind == "sidecar" and reread == "json"):
            found += _json_structure_damages(table, relative, data)
        if path.suffix == ".parquet":
            found += _parquet_footer_damages(table, relative, data)
    found += _last_checkpoint_lies(table, root)
    commits = sorted(d.file for d in found if classify(d.file) == "commit")
    newest = commits[-1] if commits else None
    # Without its newest commit a log is the log of the table before that commit: a valid, earlier table.
    return [
        Damage(d.table, d.file, d.kind, d.apply, d.reread, True) if d.file == newest and d.kind == "deleted" else d
        for d in found
    ]


def copy_table(source: Path, target: Path) -> Path:
    """A copy of ``source`` with modification times kept."""
    shutil.copytree(source, target, copy_function=shutil.copy2)
    return target


# -- verdicts -------------------------------------------------------------------------------------------


def _json_actions(data: bytes) -> list[object] | None:
    try:
        return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]
    except (UnicodeDecodeError, ValueError):
        return None


def _parquet_table(data: bytes) -> pa.Table | None:
    try:
        return pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError):
        return None


def reads_differently(damage: Damage, original: Path, damaged: Path) -> bool:
    """Whether an independent reader finds a valid file that says something else than the original."""
    if damage.reread is None or not damaged.exists():
        return False
    before, after = original.read_bytes(), damaged.read_bytes()
    if damage.reread == "json":
        a, b = _json_actions(before), _json_actions(after)
        return a is not None and b is not None and a != b
    a_table, b_table = _parquet_table(before), _parquet_table(after)
    return a_table is not None and b_table is not None and not a_table.equals(b_table)


def verdict(outcome: Outcome, expected: Outcome, different_allowed: bool) -> str | None:
    """``None`` if the outcome is acceptable, else what is wrong with it."""
    if outcome.escaped is not None:
        return f"escaped main():\n{outcome.escaped}"
    if "Traceback" in outcome.stderr:
        return f"traceback on stderr:\n{outcome.stderr}"
    if outcome.code == 0:
        if outcome.stdout == expected.stdout or different_allowed:
            return None
        return "exit 0 with a different answer (and the damaged file does not read differently)"
    if outcome.code != 1:
        return f"exit code {outcome.code}"
    errors = [line for line in outcome.stderr.splitlines() if line.startswith("deltatail: error: ")]
    lines = outcome.stderr.strip().splitlines()
    if len(errors) != 1 or not lines or lines[-1] != errors[0]:
        return f"not one deltatail error line at the end of stderr:\n{outcome.stderr}"
    return None


def pristine_outcomes(source: Path, scratch: Path, commands: list[list[str]]) -> tuple[Path, list[Outcome]]:
    """An undamaged copy of ``source`` under ``scratch`` and each command's outcome on it."""
    copy = copy_table(source, scratch / "pristine")
    outcomes = [run_cli([a.replace("{}", str(copy)) for a in argv]) for argv in commands]
    for argv, outcome in zip(commands, outcomes, strict=True):
        if outcome.code != 0:
            raise AssertionError(f"undamaged {source}: {argv}: {outcome.stderr}{outcome.escaped or ''}")
    return copy, outcomes


def run_damage(
    damage: Damage, source: Path, scratch: Path, commands: list[list[str]], pristine: tuple[Path, list[Outcome]]
) -> list[str]:
    """Damage an undamaged copy of ``source``, run each command (``{}`` is the table) on it; the problems found.

    The copy (``scratch/damaged``) is made once and reused: each damage changes one file, which is put
    back (bytes, mode, modification time) afterwards. Before each damage the copy's files (names,
    sizes, modes, modification times) are checked against ``source``'s, and the copy is made afresh
    if they differ (a command that wrote into the table): every damage starts from a copy equal to a
    fresh one, without copying the whole table per damage (most of the sweep's time when it did).
    """
    problems = []
    copy = _undamaged_copy(source, scratch / "damaged")
    saved = _saved(copy / damage.file)
    try:
        damage.apply(copy)
        different = damage.valid_table or reads_differently(damage, source / damage.file, copy / damage.file)
        for argv, want in zip(commands, pristine[1], strict=True):
            got = run_cli([a.replace("{}", str(copy)) for a in argv])
            problem = verdict(got, _relocated(want, pristine[0], copy), different)
            if problem is not None:
                problems.append(f"{damage.name} {argv[0]}: {problem}")
    finally:
        _restore(copy / damage.file, saved)
    return problems


def _tree(root: Path) -> dict[str, tuple[int, int, int] | None]:
    """Each file's ``(size, mode, mtime_ns)`` and each directory (``None``) under ``root``, by relative path."""
    found: dict[str, tuple[int, int, int] | None] = {}
    top = str(root)
    for folder, dirs, files in os.walk(top):
        base = os.path.relpath(folder, top)
        for name in dirs:
            found[os.path.join(base, name)] = None
        for name in files:
            st = os.lstat(os.path.join(folder, name))
            found[os.path.join(base, name)] = (st.st_size, st.st_mode, st.st_mtime_ns)
    return found


def _undamaged_copy(source: Path, copy: Path) -> Path:
    """``copy``, (re)made from ``source`` unless its files already equal ``source``'s."""
    if copy.exists():
        if _tree(copy) == _tree(source):
            return copy
        shutil.rmtree(copy)
    return copy_table(source, copy)


def _saved(path: Path) -> tuple[bytes, os.stat_result] | None:
    return (path.read_bytes(), path.stat()) if path.exists() else None


def _restore(path: Path, saved: tuple[bytes, os.stat_result] | None) -> None:
    """Put back the file a damage changed (or remove the one it made)."""
    if saved is None:
        path.unlink(missing_ok=True)
        return
    data, stat = saved
    if path.exists():
        path.chmod(stat.st_mode | 0o200)
    path.write_bytes(data)
    path.chmod(stat.st_mode)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _relocated(outcome: Outcome, old: Path, new: Path) -> Outcome:
    """``outcome`` with the pristine copy's path replaced by the damaged copy's (answers name their table)."""
    return Outcome(outcome.code, outcome.stdout.replace(str(old).encode(), str(new).encode()), outcome.stderr)


if __name__ == "__main__":  # exploration: python tests/tailer/damage.py TABLE_ROOT [PER_KIND] [-v]
    import tempfile
    import time

    source = Path(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        commands = [["snapshot", "{}", "--json"], ["changes", "{}", "--reader-processes", "0"]]
        reference = pristine_outcomes(source, scratch, commands)
        started, total = time.monotonic(), 0
        per_kind = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else None
        for damage in damages(source.name, source, per_kind=per_kind):
            total += 1
            for problem in run_damage(damage, source, scratch, commands, reference):
                print(problem if "-v" in sys.argv else problem.splitlines()[0], flush=True)
        print(f"{source}: {total} damages in {time.monotonic() - started:.0f} s", file=sys.stderr)
