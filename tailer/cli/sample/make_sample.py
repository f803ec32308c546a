"""Rewrite the bundled sample table ``tailer/cli/sample/orders`` with delta-rs (``deltalake``).

Run from the repository root: ``.venv/bin/python tailer/cli/sample/make_sample.py``.
The table is committed so the Quickstart needs no writer to start; this script
documents how it was made (see :func:`tailer.cli.demo.write_sample`).
"""

from __future__ import annotations

from pathlib import Path

from deltatail.tailer.cli.demo import write_sample

if __name__ == "__main__":
    write_sample(Path(__file__).parent / "orders")
