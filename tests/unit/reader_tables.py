"""Tiny Hive-layout test tables for the reader tests (real zstd Parquet, ``_SUCCESS``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.schema import Catalogue, DenseFeature, SparseFeature

CATALOGUE = Catalogue(
    name="readertest",
    dense=[DenseFeature(name="price"), DenseFeature(name="age")],
    sparse=[
        SparseFeature(name="hist"),
        SparseFeature(name="cart_a", group="cart"),
        SparseFeature(name="cart_b", group="cart"),
        SparseFeature(name="item_id"),
    ],
)


def make_rows(first_row: int, n: int, *, rows_per_session: int = 3) -> pa.Table:
    """``n`` rows; row r has item_id [r], price r, session s = r // rows_per_session, age 10 s;
    hist, cart_a and cart_b depend on the session only (duplicates within a session)."""
    r = np.arange(first_row, first_row + n)
    session = r // rows_per_session
    lists = lambda vals: pa.array([list(v) for v in vals], type=pa.list_(pa.int64()))  # noqa: E731
    data = {
        "session_id": session,
        "request_id": r,
        "ts": r * 1000,
        "label": (r % 2).astype(np.float32),
        "price": r.astype(np.float32),
        "age": (session * 10).astype(np.float32),
        "hist": lists([[s, s + 1][: 1 + s % 2] for s in session]),
        "cart_a": lists([[s % 5] for s in session]),
        "cart_b": lists([[s % 5 + 100] for s in session]),
        "item_id": lists([[x] for x in r]),
    }
    return pa.table(data, schema=CATALOGUE.arrow_schema())


def write_table(root: Path, layout: dict[str, list[int]], *, row_group_rows: int = 4) -> int:
    """Write partitions ``{"2026-11-01/00": [rows of file 0, rows of file 1], ...}``; returns
    the number of rows. Every partition is committed (``_SUCCESS``)."""
    row = 0
    for part, files in layout.items():
        ds, hour = part.split("/")
        directory = root / f"ds={ds}" / f"hour={hour}"
        directory.mkdir(parents=True)
        for i, n in enumerate(files):
            table = make_rows(row, n)
            pq.write_table(
                table,
                directory / f"part-{i:04d}.parquet",
                row_group_size=row_group_rows,
                compression="zstd",
            )
            row += n
        (directory / "_SUCCESS").touch()
    return row
