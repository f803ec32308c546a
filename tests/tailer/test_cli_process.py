"""Process-wide settings the command line makes (``tailer/cli/process.py``)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from deltatail.tailer.cli.process import return_memory_promptly


def test_arrow_memory_comes_from_jemalloc_unless_the_environment_names_a_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    before = pa.default_memory_pool()
    try:
        pa.set_memory_pool(pa.mimalloc_memory_pool())
        monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
        return_memory_promptly()
        assert pa.default_memory_pool().backend_name == "jemalloc"  # this Linux pyarrow has it
        held = pa.jemalloc_memory_pool().bytes_allocated()
        values = pa.array(range(1_000), pa.int64())  # allocated from it
        assert pa.jemalloc_memory_pool().bytes_allocated() >= held + values.nbytes

        pa.set_memory_pool(pa.mimalloc_memory_pool())
        monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "mimalloc")
        return_memory_promptly()
        assert pa.default_memory_pool().backend_name == "mimalloc"
    finally:
        pa.set_memory_pool(before)
