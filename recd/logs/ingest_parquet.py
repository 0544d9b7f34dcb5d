"""The Parquet reader of ``recd logs ingest``: record batches -> the mapped columns as text;
a row's "line" is its 1-based row number."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.errors import SchemaError
from recd.logs.ingest_text import TextColumns, columns_as_text
from recd.logs.ingest_values import shorten


def iter_parquet(
    path: Path, names: dict[str, str], separator: str, chunk_bytes: int, file_bytes: int
) -> Iterator[tuple[TextColumns, int, int]]:
    """(text columns, decoded bytes, input bytes covered) of each record batch of about
    ``chunk_bytes`` decoded bytes (``file_bytes``: the file's size, shared out by rows)."""
    try:
        source = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise SchemaError(f"{path}: cannot read as Parquet: {exc}") from exc
    columns = source.schema_arrow.names
    missing = [c for c in dict.fromkeys(names.values()) if c not in columns]
    if missing:
        raise SchemaError(
            f"{path}: no column {', '.join(repr(c) for c in missing)} "
            f"(columns: {', '.join(shorten(c) for c in columns[:50])}); "
            "set the column names with --*-col or the mapping"
        )
    meta = source.metadata
    row_bytes = max(1, meta.serialized_size // max(1, meta.num_rows)) if meta.num_rows else 1
    if meta.num_rows and meta.num_row_groups:
        total = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        row_bytes = max(1, total // meta.num_rows)
    batch_rows = max(1024, chunk_bytes // (4 * row_bytes))
    line = 0
    for batch in source.iter_batches(
        batch_size=batch_rows, columns=list(dict.fromkeys(names.values()))
    ):
        table = pa.Table.from_batches([batch])
        numbers = np.arange(line + 1, line + 1 + batch.num_rows, dtype=np.int64)
        line += batch.num_rows
        text, bad, flagged = columns_as_text(table, names, numbers, separator)
        yield (
            TextColumns(
                lines=numbers, columns=text, malformed=bad, rows_in=batch.num_rows, flagged=flagged
            ),
            batch.nbytes,
            int(file_bytes * batch.num_rows / max(1, meta.num_rows)),
        )
