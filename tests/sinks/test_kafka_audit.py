"""The Kafka commit topic through ``deltatail run``: exactly the audit event of each commit, once.

``deltatail run`` (a subprocess, for each producer backend) follows the ops table of
``tests/tailer/audit_tables.py`` (versions 0..9 written by deltalake 1.6.6, one operation each) into a
Kafka-protocol broker (tansu on 127.0.0.1, fixtures in ``conftest.py``) with ``commit_topic``. Each
message of the commit topic must be the event ``AuditFeed`` builds directly for that version, plus
``table_id`` and ``sink_id``; a second run after more commits adds only theirs (``exactly_once``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

pytest.importorskip("kafka")
pytest.importorskip("deltalake")

from deltalake import write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tailer"))  # tests/tailer: audit_tables.py
from audit_tables import write_ops_table

from deltatail.sinks.kafka.options import default_sink_id
from deltatail.tailer.audit.feed import AuditFeed

ROOT = Path(__file__).resolve().parents[2]


def run(table: Path, state: Path, uri: str) -> None:
    args = ["run", str(table), "--state-dir", str(state), "--sink", uri, "--until-caught-up", "--allow-non-additive"]
    result = subprocess.run([sys.executable, "-m", "deltatail", *args], cwd=ROOT, capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()


@pytest.mark.slow
def test_the_commit_topic_carries_the_audit_events(kafka: Any, tmp_path: Path) -> None:
    table = write_ops_table(tmp_path / "ops")
    topic, commits = kafka.new_topic(1), kafka.new_topic(2, prefix="commits")
    uri = kafka.uri(topic, exactly_once=True, commit_topic=commits)
    run(table, tmp_path / "state", uri)
    write_deltalake(str(table), pa.table({"id": pa.array([50], pa.int64()), "v": ["z"]}), mode="append")
    run(table, tmp_path / "state", uri)
    expected = [e.to_json() for e in AuditFeed(str(table)).events()]
    table_id = expected[0]["table"]["id"]
    records = kafka.consume(commits)
    assert [r.key for r in records] == [table_id.encode()] * 11
    values = [orjson.loads(r.value) for r in records]
    extra = {"table_id": table_id, "sink_id": default_sink_id(table_id, topic)}
    assert values == [{**e, **extra} for e in expected]
    assert [v["version"] for v in values] == list(range(11))
    assert [dict(r.headers)["dt.version"] for r in records] == [b"%d" % v for v in range(11)]
    assert values[2]["operation"] == "DELETE" and values[2]["actor"]["user_name"] == "bob@corp"
    assert values[2]["counts"]["rows_deleted"] == 2
