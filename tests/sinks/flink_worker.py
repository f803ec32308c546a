"""A PyFlink worker for the consumer tests: runs in its own virtual environment (see tests/sinks/flink.py).

It starts one Flink (a local mini-cluster in one JVM, streaming mode, parallelism 1, session
time zone UTC) and answers requests read from stdin, one JSON object a line::

    {"statements": ["CREATE TABLE ...", ...], "query": "SELECT ..."}

with one line ``@@flink@@`` + ``{"rows": [[kind, [value, ...]], ...]}``, where ``kind`` is the
Flink row kind (``+I``, ``-U``, ``+U``, ``-D``) and each value the column's string (the query
casts), or ``{"error": "..."}``. Everything else it or Flink prints is noise for the caller.
This file imports nothing from deltatail: it runs where deltatail is not installed.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import Any

MARK = "@@flink@@"


def main() -> None:
    from pyflink.table import EnvironmentSettings, TableEnvironment  # type: ignore[import-not-found]

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    config.set("parallelism.default", "1")
    config.set("table.local-time-zone", "UTC")
    answer({"ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            for statement in request.get("statements", []):
                env.execute_sql(statement)
            rows: list[Any] = []
            if request.get("query"):
                with env.execute_sql(request["query"]).collect() as results:
                    for row in results:
                        rows.append([row.get_row_kind().__str__(), [None if v is None else str(v) for v in row]])
            answer({"rows": rows})
        except Exception as e:  # every failure goes back to the test as text
            answer({"error": f"{e}\n{traceback.format_exc()}"[-6000:]})


def answer(body: dict[str, Any]) -> None:
    sys.stdout.write(MARK + json.dumps(body) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
