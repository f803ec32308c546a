"""An idle table on an object store backs off to ``max_poll_interval`` and stays there, however long it idles.

The backoff doubled ``poll_interval`` once per idle poll with no cap on the exponent: after 1,025 idle
polls (under 1.5 hours at the defaults) ``poll_interval * 2 ** n`` overflowed a float and ``deltatail
run`` died with an ``OverflowError`` traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltatail.sinks.embedded import JsonLinesSink
from deltatail.tailer.follow.tailer import Tailer, TailerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py (tests/ is not a package)
from objectstores import Cloud

pytest_plugins = ("objectstore_fixtures",)


@pytest.mark.slow
def test_a_long_idle_spell_keeps_the_backoff_at_the_maximum(s3: Cloud, tmp_path: Path) -> None:
    write_deltalake(s3.uri("t"), pa.table({"id": [1, 2]}), storage_options=s3.writer_options)
    config = TailerConfig(
        table=s3.uri("t"),
        state_dir=str(tmp_path / "state"),
        poll_interval=0.01,
        max_poll_interval=0.5,
        checkpoint_seconds=3600,
        watch=False,
        storage_options=s3.options,
    )
    tailer = Tailer(config, JsonLinesSink(str(tmp_path / "out.jsonl")))
    tailer.open()
    try:
        assert tailer.step() == 1  # version 0
        for _ in range(1100):  # idle polls: nothing new
            assert tailer.step() == 0
        assert tailer.idle_timeout() == 0.5
    finally:
        tailer.close()
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
