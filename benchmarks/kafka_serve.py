"""``deltatail serve`` with many Kafka tables: one shared producer against one producer per table.

Run ``.venv/bin/python -m benchmarks.kafka_serve [--tables 200] [--backend kafka-python|confluent]``.
The same tables (one deltalake commit of 3 rows each, change data feed on) are followed into one
local tansu broker (a topic per table) twice, by a ``deltatail serve`` process each: as serve runs
(every table's sink leases its producer from one pool, ``sinks.kafka.shared``), then with the pool
taken away (each sink opens a producer of its own, as before). Once every table is ``following``
and its rows are in its topic, the benchmark reads from ``/proc``: the process's established TCP
connections to the broker, its threads and its resident memory; and how long the service took
from start to every table following.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from benchmarks.kafka_sink import tansu_broker

PROJECT = Path(__file__).resolve().parent.parent
#: Starts the service; with ``unshared`` the pool is taken away first (one producer per table).
LAUNCH = textwrap.dedent(
    """
    import sys
    import deltatail.sinks.kafka.uri
    from deltatail.tailer.cli.main import main
    if sys.argv[1] == "unshared":
        deltatail.sinks.kafka.uri.PRODUCERS = None
    sys.exit(main(["serve", "--config", sys.argv[2]]))
    """
)


def make_tables(lake: Path, count: int) -> None:
    for t in range(count):
        rows = pa.table({"id": pa.array([3 * t, 3 * t + 1, 3 * t + 2]), "s": ["a", "b", "c"]})
        write_deltalake(str(lake / f"t{t:03d}"), rows, configuration={"delta.enableChangeDataFeed": "true"})


def proc_figures(pid: int, port: int) -> tuple[int, int, float]:
    """Established connections of ``pid`` to ``port``, its threads, and its resident memory in MiB."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    connections = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        connections += int(fields[2].split(":")[1], 16) == port and fields[3] == "01" and fields[9] in inodes
    status = Path(f"/proc/{pid}/status").read_text()
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    rss_kib = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]
    return connections, threads, rss_kib / 1024


def following(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return len(re.findall(r'deltatail_table_state\{[^}]*state="following"[^}]*\} 1', text))


def run_service(mode: str, lake: Path, bootstrap: str, backend: str, tables: int, work: Path) -> dict[str, float]:
    prefix = f"bench-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(f"{prefix}.t{t:03d}", 1, 1) for t in range(tables)])
    admin.close()
    state = work / f"state-{mode}"
    config = work / f"serve-{mode}.toml"
    config.write_text(
        textwrap.dedent(
            f"""
            [service]
            state_root = "{state}"
            listen = "127.0.0.1:0"
            status_seconds = 5
            workers = 2

            [defaults]
            sink = "kafka://{bootstrap}/{prefix}.{{table_name}}?backend={backend}&exactly_once=true"
            checkpoint_seconds = 1

            [[discover]]
            root = "{lake}"
            """
        )
    )
    log = work / f"serve-{mode}.log"
    started = time.perf_counter()
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", LAUNCH, mode, str(config)], cwd=PROJECT, stderr=err)
    try:
        port = 0
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            found = re.findall(rb"metrics and health on http://127\.0\.0\.1:(\d+)/", log.read_bytes())
            if found:
                port = int(found[-1])
                if following(port) >= tables:
                    break
            if proc.poll() is not None:
                raise SystemExit(f"serve exited: {log.read_text()[-2000:]}")
            time.sleep(0.5)
        else:
            raise SystemExit(f"not every table was following within 600 s: {log.read_text()[-2000:]}")
        elapsed = time.perf_counter() - started
        time.sleep(2.0)  # settled: producers idle, tail readers closed
        connections, threads, rss = proc_figures(proc.pid, int(bootstrap.rsplit(":", 1)[1]))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    return {"seconds": elapsed, "connections": connections, "threads": threads, "rss": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=200)
    parser.add_argument("--backend", choices=("kafka-python", "confluent"), default="kafka-python")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="deltatail-kafka-serve-") as tmp, tansu_broker() as bootstrap:
        work = Path(tmp)
        make_tables(work / "lake", args.tables)
        results = {mode: run_service(mode, work / "lake", bootstrap, args.backend, args.tables, work)
                   for mode in ("shared", "unshared")}  # fmt: skip
    print(f"serve, {args.tables} Kafka tables into one broker, backend {args.backend}")
    print(f"{'':<28}{'shared producer':>18}{'one per table':>16}")
    for key, label, unit in [
        ("connections", "connections to the broker", ""),
        ("threads", "threads", ""),
        ("rss", "resident memory", " MiB"),
        ("seconds", "start to all following", " s"),
    ]:
        shared, own = results["shared"][key], results["unshared"][key]
        print(f"{label:<28}{shared:>15,.1f}{unit:<3}{own:>13,.1f}{unit}")


if __name__ == "__main__":
    main()
