"""Writing change rows to a file for ``deltatail changes --output FILE.parquet`` (Delta and Lance alike)."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from state.feed import ChangeBatch


def write_parquet(batches: Iterable[ChangeBatch], output: str, empty_schema: pa.Schema) -> int:
    """Write every batch's rows to one Parquet file, in the first batch's schema; returns 0 (the exit code).

    Later batches are cast to the first one's schema (an additive schema change inside the range
    has already been carried by the feed); with no rows at all the file holds ``empty_schema``.
    """
    writer: pq.ParquetWriter | None = None
    try:
        for batch in batches:
            if writer is None:
                writer = pq.ParquetWriter(output, batch.rows.schema)
            writer.write_batch(batch.rows.cast(writer.schema) if batch.rows.schema != writer.schema else batch.rows)
        if writer is None:
            pq.write_table(empty_schema.empty_table(), output)
    finally:
        if writer is not None:
            writer.close()
    return 0
