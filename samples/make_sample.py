"""Write the bundled sample table ``samples/orders`` with delta-rs (``deltalake``).

Run from the repository root: ``.venv/bin/python samples/make_sample.py``. The
table is committed to the repository so the Quickstart works without a writer;
this script documents how it was made. It holds appends, a delete, an update
and a merge, with change data feed on, partitioned by ``region``.
"""

from __future__ import annotations

import shutil
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

TARGET = Path(__file__).parent / "orders"

SCHEMA = pa.schema(
    [
        ("order_id", pa.int64()),
        ("region", pa.string()),
        ("customer", pa.string()),
        ("amount", pa.decimal128(10, 2)),
        ("placed_at", pa.timestamp("us", tz="UTC")),
    ]
)


def batch(first: int, count: int, region: str) -> pa.Table:
    """``count`` orders from id ``first`` in ``region``."""
    ids = list(range(first, first + count))
    return pa.table(
        {
            "order_id": ids,
            "region": [region] * count,
            "customer": [f"customer-{i % 7}" for i in ids],
            "amount": [Decimal(f"{(i * 37) % 500}.{i % 100:02d}") for i in ids],
            "placed_at": [datetime(2026, 1, 1, 12, i % 60, tzinfo=timezone.utc) for i in ids],
        },
        schema=SCHEMA,
    )


def main() -> None:
    """Recreate the sample table from scratch."""
    shutil.rmtree(TARGET, ignore_errors=True)
    config = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(TARGET, batch(1, 5, "emea"), partition_by=["region"], configuration=config)
    write_deltalake(TARGET, batch(6, 5, "amer"), mode="append")
    write_deltalake(TARGET, batch(11, 3, "apac"), mode="append")
    dt = DeltaTable(TARGET)
    dt.delete("order_id = 3")
    dt.update(updates={"customer": "'customer-vip'"}, predicate="order_id = 7")
    source = batch(12, 4, "apac")
    (
        dt.merge(source, predicate="t.order_id = s.order_id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    dt.create_checkpoint()
    write_deltalake(TARGET, batch(16, 2, "emea"), mode="append")


if __name__ == "__main__":
    main()
