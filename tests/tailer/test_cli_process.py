"""Process-wide settings the command line makes (``tailer/cli/process.py``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow as pa
import pytest

from deltatail.tailer.cli.process import name_arrow_pool, return_memory_promptly


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


#: A child process: choose the pool (or not), then free 128 MiB that a thread started afterwards
#: allocated and touched, and print how much of it is still resident right after the free.
_FREED_IN_A_THREAD = """
import re, sys, threading
import numpy as np
import pyarrow as pa
from deltatail.tailer.cli.process import return_memory_promptly
if sys.argv[1] == "cli":
    return_memory_promptly()
else:
    pa.set_memory_pool(pa.jemalloc_memory_pool())
held = pa.allocate_buffer(100)  # the calling thread has its arena
def rss_mib():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) >> 10
def work():
    before = rss_mib()
    buffers = [pa.allocate_buffer(1 << 20) for _ in range(128)]
    for b in buffers:
        np.frombuffer(b, dtype=np.uint8)[:] = 1
    del buffers
    print(rss_mib() - before)
thread = threading.Thread(target=work)
thread.start()
thread.join()
"""


def _resident_after_free(how: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("ARROW_DEFAULT_MEMORY_POOL", "JE_ARROW_MALLOC_CONF")}
    done = subprocess.run(
        [sys.executable, "-c", _FREED_IN_A_THREAD, how], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


def test_pages_a_later_thread_frees_are_returned_at_once() -> None:
    """What a read-ahead thread decoded and the consumer freed leaves the process at once, not a second later."""
    assert _resident_after_free("plain") >= 100, (
        "jemalloc's default no longer keeps freed pages: the test shows nothing"
    )
    assert _resident_after_free("cli") <= 16


#: A child process: enter the command line through its front door (or import it directly), then print the
#: pool Arrow's C++ side chose (no pool was set from Python) and the environment's name for it.
_POOL_BEHIND_THE_FRONT_DOOR = """
import os, runpy, sys
import deltatail
if sys.argv[1] == "front-door":
    try:
        deltatail.main(["--no-such-option"])
    except SystemExit:
        pass
elif sys.argv[1] == "python -m deltatail.tailer.cli":
    sys.argv[1:] = ["--no-such-option"]
    try:
        runpy.run_module("deltatail.tailer.cli", run_name="__main__")
    except SystemExit:
        pass
else:
    import deltatail.tailer.cli.main
import pyarrow as pa
print(pa.default_memory_pool().backend_name, os.environ.get("ARROW_DEFAULT_MEMORY_POOL"))
"""


def _pool_behind(how: str, named: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if named is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = named
    done = subprocess.run(
        [sys.executable, "-c", _POOL_BEHIND_THE_FRONT_DOOR, how], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="named on Linux only, whose pyarrow has jemalloc")
def test_the_command_line_names_jemalloc_before_arrow_loads_so_its_cpp_side_allocates_there_too() -> None:
    assert _pool_behind("import") == "mimalloc None"  # pyarrow's own default here: what the entry point changes
    assert _pool_behind("front-door") == "jemalloc jemalloc"
    assert _pool_behind("python -m deltatail.tailer.cli") == "jemalloc jemalloc"
    assert _pool_behind("front-door", named="system") == "system system"  # the environment still chooses


def test_naming_the_pool_changes_nothing_once_arrow_is_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    assert "pyarrow" in sys.modules
    name_arrow_pool()
    assert "ARROW_DEFAULT_MEMORY_POOL" not in os.environ
