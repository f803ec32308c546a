"""The session compiles the product's sources before it starts any ``deltatail`` process (tests/bytecode.py)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from bytecode import ROOT, compile_sources


def test_every_product_module_has_bytecode_once_the_session_started() -> None:
    sources = [p for name in ("state", "tailer", "sinks") for p in (ROOT / name).rglob("*.py")]
    assert len(sources) > 100
    missing = [p for p in sources if not Path(importlib.util.cache_from_source(str(p))).is_file()]
    assert not missing, missing[:5]


def test_compiling_writes_only_what_is_missing_or_stale(tmp_path: Path) -> None:
    package = tmp_path / "tailer"
    package.mkdir()
    module = package / "m.py"
    module.write_text("X = 1\n")
    assert compile_sources(tmp_path)
    cached = Path(importlib.util.cache_from_source(str(module)))
    first = cached.stat().st_mtime_ns
    assert compile_sources(tmp_path)
    assert cached.stat().st_mtime_ns == first  # up to date: left alone
    module.write_text("X = 2  # changed\n")
    later = module.stat().st_mtime + 10  # compileall compares whole seconds of mtime: an edit is later
    os.utime(module, (later, later))
    assert compile_sources(tmp_path)
    # A pyc's header records its source's size (bytes 12-16, PEP 552): the new source's now.
    assert int.from_bytes(cached.read_bytes()[12:16], "little") == len("X = 2  # changed\n")
    (package / "broken.py").write_text("def (:\n")
    assert not compile_sources(tmp_path)  # a syntax error is reported, not hidden
