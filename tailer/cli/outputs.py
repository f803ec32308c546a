"""Writing change rows for ``deltatail changes --output`` (Delta and Lance alike): JSON lines or Parquet."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from deltatail.state.errors import ConfigError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.cli.sink_uri import open_sink


def write_changes(
    batches: Iterable[ChangeBatch],
    output: str | None,
    info: Callable[[], TableInfo],
    empty_schema: Callable[[], pa.Schema],
) -> int:
    """Write change rows to ``output``; returns 0 (the exit code).

    ``output`` is ``-`` or ``None`` (JSON lines on stdout), a ``.jsonl`` file (the ``jsonl:`` sink)
    or a ``.parquet`` file (:func:`write_parquet`; ``empty_schema`` is asked for only when there are
    no rows). ``info`` names the table to the JSON-lines sink.

    Raises:
        ConfigError: if ``output`` ends neither in ``.jsonl`` nor in ``.parquet``.
        SinkError: if the output cannot be written.
    """
    output = output or "-"
    if output.endswith(".parquet"):
        return write_parquet(batches, output, empty_schema)
    if output != "-" and not output.endswith(".jsonl"):
        raise ConfigError(f"--output must end in .jsonl or .parquet, got {output!r}")
    sink = open_sink(f"jsonl:{output}")
    sink.open(info())
    try:
        for batch in batches:
            sink.write(batch)
        sink.flush()
    finally:
        sink.close()
    return 0


def write_parquet(batches: Iterable[ChangeBatch], output: str, empty_schema: Callable[[], pa.Schema]) -> int:
    """Write every batch's rows to one Parquet file, in the first batch's schema; returns 0 (the exit code).

    Later batches are cast to the first one's schema (an additive schema change inside the range
    has already been carried by the feed); with no rows at all the file holds ``empty_schema()``.
    """
    writer: pq.ParquetWriter | None = None
    try:
        for batch in batches:
            if writer is None:
                writer = pq.ParquetWriter(output, batch.rows.schema)
            writer.write_batch(batch.rows.cast(writer.schema) if batch.rows.schema != writer.schema else batch.rows)
        if writer is None:
            pq.write_table(empty_schema().empty_table(), output)
    finally:
        if writer is not None:
            writer.close()
    return 0
