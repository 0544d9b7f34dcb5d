"""Per-column Parquet encodings, chosen on measured statistics of the first shard's rows.

Parquet encodes each leaf column before zstd sees it. The candidates:

* ``RLE_DICTIONARY``: distinct values once per row group + bit-packed/RLE indices. Pays for a
  small alphabet scattered over the data: labels, countries, categories, sellers.
* ``DELTA_BINARY_PACKED`` (integers): bit-packed differences. Pays for near-sorted integers
  with small steps: ``ts`` inside a session, ``session_id`` once clustered, sequential
  ``request_id`` in arrival order.
* ``BYTE_STREAM_SPLIT`` (floats): one byte stream per byte of the float, which zstd compresses
  better than interleaved float bytes when values are not repeated.
* ``PLAIN``: raw values; zstd alone finds repeated runs and repeated id sequences.

What the measurements showed (``measure_encodings`` on the small and rm1-like profiles): the
textbook rule "dictionary when the distinct ratio is low" is wrong *after clustering*. A static
user feature or ``session_id`` has a distinct ratio of 1/S, yet in clustered order its values
come in runs that zstd removes from PLAIN bytes almost for free, while dictionary indices are
bit-packed so the repeats no longer align on bytes: dictionary came out larger there. The
rule used by ``auto`` is therefore two-step:

1. distinct ratio > ``DICTIONARY_MAX_DISTINCT_RATIO`` (nearly unique values: ``request_id``,
   ``ts``, prices, per-item ids): never dictionary (larger in every measurement);
2. otherwise encode a sample of the first shard's rows (in output order, same row-group size and
   zstd level as the table) with each candidate and keep the smallest; ties go to the simpler
   encoding (PLAIN, then DELTA/BYTE_STREAM_SPLIT, then dictionary).

One in-memory write per candidate covers a group of columns at once (encodings are independent
per column), so the choice costs three writes of a ~16k-row sample, done a column group of
about ``SAMPLE_MAX_BYTES`` at a time to bound memory. ``dictionary="all"``/``"none"`` force dictionary
on/off (``none`` still picks PLAIN vs DELTA/BYTE_STREAM_SPLIT by size) so a benchmark can
measure the choice.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from recd.errors import ConfigError

DICTIONARY = "RLE_DICTIONARY"
PLAIN = "PLAIN"
DELTA = "DELTA_BINARY_PACKED"
BYTE_STREAM_SPLIT = "BYTE_STREAM_SPLIT"
DICTIONARY_MODES = ("auto", "all", "none")
# Above this distinct/values ratio dictionary never paid in the measurements (see docstring).
DICTIONARY_MAX_DISTINCT_RATIO = 0.5
# Rows of the first shard's output used to measure statistics and trial encodings (two row
# groups at the default size: dictionary pages are per row group, so fewer rows flatter PLAIN).
SAMPLE_ROWS = 16_384
# Sampled bytes held at once: columns are trial-encoded a group of about this many bytes at a
# time, and the sample shrinks if its widest column alone exceeds it. The ETL lowers it under
# a memory budget.
SAMPLE_MAX_BYTES = 4 << 20
MIN_SAMPLE_ROWS = 256


@dataclass(frozen=True, kw_only=True, slots=True)
class ColumnStats:
    """Statistics of one leaf column, measured on a sample of rows."""

    column: str
    """Arrow column name."""
    leaf_path: str
    """Parquet leaf path (``name`` or ``name.list.element``): what writer options key on."""
    kind: str
    """``int``, ``float`` or ``list`` (a list of int64 ids)."""
    values: int
    """Non-null leaf values measured."""
    distinct: int
    """Distinct leaf values among them."""

    @property
    def distinct_ratio(self) -> float:
        return self.distinct / self.values if self.values else 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class ColumnEncoding:
    """The encoding chosen for one column, and why."""

    column: str
    leaf_path: str
    encoding: str
    """RLE_DICTIONARY, PLAIN, DELTA_BINARY_PACKED or BYTE_STREAM_SPLIT."""
    reason: str = ""
    """The statistic or measurement that decided, for reports."""

    @property
    def dictionary(self) -> bool:
        return self.encoding == DICTIONARY


@dataclass(kw_only=True, slots=True)
class EncodingPlan:
    """Encodings of every column of a table: turns into ``pyarrow.parquet`` writer options."""

    columns: list[ColumnEncoding]

    def writer_options(self) -> dict[str, Any]:
        """``use_dictionary`` and ``column_encoding`` for ``pq.ParquetWriter``."""
        return {
            "use_dictionary": [c.leaf_path for c in self.columns if c.dictionary],
            "column_encoding": {c.leaf_path: c.encoding for c in self.columns if not c.dictionary},
        }

    def describe(self) -> dict[str, str]:
        """Column -> encoding name, for the ETL report."""
        return {c.column: c.encoding for c in self.columns}

    @classmethod
    def uniform(cls, schema: pa.Schema, pick: dict[str, str]) -> EncodingPlan:
        """Every column gets ``pick[kind]`` (kind: int, float, list), falling back to PLAIN."""
        columns = []
        for field in schema:
            encoding = pick.get(_kind_of(field), PLAIN)
            columns.append(
                ColumnEncoding(column=field.name, leaf_path=leaf_path(field), encoding=encoding)
            )
        return cls(columns=columns)


def leaf_path(field: pa.Field) -> str:
    """Parquet leaf path of an Arrow field (lists are written as ``name.list.element``)."""
    if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
        return f"{field.name}.list.element"
    return field.name


def _kind_of(field: pa.Field) -> str:
    if pa.types.is_list(field.type) or pa.types.is_large_list(field.type):
        if not pa.types.is_integer(field.type.value_type):
            raise ConfigError(f"column {field.name!r}: unsupported list type {field.type}")
        return "list"
    if pa.types.is_floating(field.type):
        return "float"
    if pa.types.is_integer(field.type):
        return "int"
    raise ConfigError(f"column {field.name!r}: unsupported type {field.type} for encoding")


def candidate_encodings(kind: str, *, mode: str = "auto") -> list[str]:
    """The encodings to consider for a column kind, simplest first (ties go to the first)."""
    if mode not in DICTIONARY_MODES:
        raise ConfigError(f"dictionary must be one of {', '.join(DICTIONARY_MODES)}, got {mode!r}")
    if mode == "all":
        return [DICTIONARY]
    fallback = [PLAIN, BYTE_STREAM_SPLIT] if kind == "float" else [PLAIN, DELTA]
    return fallback if mode == "none" else [*fallback, DICTIONARY]


def column_statistics(table: pa.Table) -> list[ColumnStats]:
    """Distinct counts of every column's leaf values (nulls excluded)."""
    stats = []
    for field, column in zip(table.schema, table.columns, strict=True):
        kind = _kind_of(field)
        values = pc.list_flatten(column) if kind == "list" else column
        count = len(values) - values.null_count
        distinct = int(pc.count_distinct(values).as_py()) if count else 0
        stats.append(
            ColumnStats(
                column=field.name,
                leaf_path=leaf_path(field),
                kind=kind,
                values=count,
                distinct=distinct,
            )
        )
    return stats


def column_chunk_bytes(
    table: pa.Table, plan: EncodingPlan, *, zstd_level: int = 3, row_group_rows: int = 8192
) -> dict[str, int]:
    """Write ``table`` to memory with ``plan``; compressed bytes of each column (all row groups)."""
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        compression_level=zstd_level,
        row_group_size=row_group_rows,
        **plan.writer_options(),
    )
    meta = pq.read_metadata(pa.py_buffer(sink.getvalue()))
    sizes = {name: 0 for name in table.column_names}
    for rg in range(meta.num_row_groups):
        group = meta.row_group(rg)
        for c in range(group.num_columns):
            chunk = group.column(c)
            sizes[chunk.path_in_schema.split(".")[0]] += chunk.total_compressed_size
    return sizes


def trial_bytes(
    sample: pa.Table, *, zstd_level: int = 3, row_group_rows: int = 8192
) -> dict[str, dict[str, int]]:
    """Column -> {encoding: compressed bytes of ``sample``'s column under that encoding}.

    One in-memory write per candidate covers all columns of ``sample`` (encodings are
    independent per column). Dictionary trials take many times the sample's bytes of memory:
    pass column groups (see :func:`plan_encodings`) to bound it.
    """
    sizes: dict[str, dict[str, int]] = {name: {} for name in sample.column_names}
    for encoding_by_kind in (
        {"int": PLAIN, "float": PLAIN, "list": PLAIN},
        {"int": DELTA, "float": BYTE_STREAM_SPLIT, "list": DELTA},
        {"int": DICTIONARY, "float": DICTIONARY, "list": DICTIONARY},
    ):
        plan = EncodingPlan.uniform(sample.schema, encoding_by_kind)
        measured = column_chunk_bytes(
            sample, plan, zstd_level=zstd_level, row_group_rows=row_group_rows
        )
        for column in plan.columns:
            sizes[column.column][column.encoding] = measured[column.column]
    return sizes


def smallest_bytes(
    sample: pa.Table, *, zstd_level: int = 3, row_group_rows: int = 8192
) -> dict[str, int]:
    """Column -> compressed bytes of ``sample``'s column under the smaller of PLAIN and
    DELTA_BINARY_PACKED / BYTE_STREAM_SPLIT (dictionary is left out: it never won on
    clustered lists, and its trial takes many times the sample's memory)."""
    sizes: dict[str, int] = {}
    for encoding_by_kind in (
        {"int": PLAIN, "float": PLAIN, "list": PLAIN},
        {"int": DELTA, "float": BYTE_STREAM_SPLIT, "list": DELTA},
    ):
        plan = EncodingPlan.uniform(sample.schema, encoding_by_kind)
        measured = column_chunk_bytes(
            sample, plan, zstd_level=zstd_level, row_group_rows=row_group_rows
        )
        for name, size in measured.items():
            sizes[name] = min(size, sizes.get(name, size))
    return sizes


def sample_row_count(table: pa.Table, *, sample_rows: int, sample_bytes: int) -> int:
    """Rows to sample: at most ``sample_rows``, and few enough that the widest column's sample
    stays within about ``sample_bytes`` (at least MIN_SAMPLE_ROWS)."""
    rows = min(table.num_rows, sample_rows)
    if table.num_rows == 0:
        return 0
    widest_per_row = max(column.nbytes for column in table.columns) / table.num_rows
    if widest_per_row * rows > sample_bytes:
        rows = min(rows, max(MIN_SAMPLE_ROWS, int(sample_bytes / widest_per_row)))
    return rows


def column_groups(table: pa.Table, *, rows: int, sample_bytes: int) -> list[list[str]]:
    """Split the columns into groups whose ``rows``-row samples hold about ``sample_bytes``."""
    scale = rows / table.num_rows if table.num_rows else 0.0
    groups: list[list[str]] = [[]]
    group_bytes = 0.0
    for name, column in zip(table.column_names, table.columns, strict=True):
        size = column.nbytes * scale
        if groups[-1] and group_bytes + size > sample_bytes:
            groups.append([])
            group_bytes = 0.0
        groups[-1].append(name)
        group_bytes += size
    return groups


def iter_samples(
    table: pa.Table,
    *,
    order: pa.Array | None = None,
    sample_rows: int = SAMPLE_ROWS,
    sample_bytes: int = SAMPLE_MAX_BYTES,
) -> Iterator[pa.Table]:
    """Samples of the first rows of ``table`` (in ``order`` if given), one column group at a
    time, so that at most about ``sample_bytes`` of sampled rows exist at once."""
    rows = sample_row_count(table, sample_rows=sample_rows, sample_bytes=sample_bytes)
    for group in column_groups(table, rows=rows, sample_bytes=sample_bytes):
        columns = table.select(group)
        yield columns.slice(0, rows) if order is None else columns.take(order.slice(0, rows))


def plan_encodings(
    table: pa.Table,
    *,
    mode: str = "auto",
    zstd_level: int = 3,
    row_group_rows: int = 8192,
    sample_rows: int = SAMPLE_ROWS,
    sample_bytes: int = SAMPLE_MAX_BYTES,
    order: pa.Array | None = None,
) -> EncodingPlan:
    """The encoding plan for tables like ``table`` under ``mode`` (the module docstring's rule).

    Measured on the first ``sample_rows`` rows in output order (``order``: row indices of the
    output order; None: ``table`` is already in output order), a group of columns at a time
    holding about ``sample_bytes`` (trial dictionary encoding takes many times that in memory).
    """
    if mode not in DICTIONARY_MODES:
        raise ConfigError(f"dictionary must be one of {', '.join(DICTIONARY_MODES)}, got {mode!r}")
    stats: list[ColumnStats] = []
    sizes: dict[str, dict[str, int]] = {}
    rows = 0
    for sample in iter_samples(
        table, order=order, sample_rows=sample_rows, sample_bytes=sample_bytes
    ):
        rows = sample.num_rows
        stats.extend(column_statistics(sample))
        if mode != "all":
            sizes.update(trial_bytes(sample, zstd_level=zstd_level, row_group_rows=row_group_rows))
    columns = []
    for s in stats:
        if mode == "all":
            columns.append(
                ColumnEncoding(
                    column=s.column, leaf_path=s.leaf_path, encoding=DICTIONARY, reason="forced"
                )
            )
            continue
        candidates = candidate_encodings(s.kind, mode=mode)
        if DICTIONARY in candidates and s.distinct_ratio > DICTIONARY_MAX_DISTINCT_RATIO:
            candidates.remove(DICTIONARY)
        best = min(candidates, key=lambda e: sizes[s.column][e])
        measured = ", ".join(f"{e} {sizes[s.column][e]}" for e in candidates)
        reason = f"distinct ratio {s.distinct_ratio:.3f}; bytes on {rows} rows: {measured}"
        columns.append(
            ColumnEncoding(column=s.column, leaf_path=s.leaf_path, encoding=best, reason=reason)
        )
    return EncodingPlan(columns=columns)


def measure_encodings(
    table: pa.Table,
    *,
    zstd_level: int = 3,
    row_group_rows: int = 8192,
    sample_rows: int = SAMPLE_ROWS,
    sample_bytes: int = SAMPLE_MAX_BYTES,
) -> dict[str, dict[str, Any]]:
    """Bytes of every column of ``table`` under every encoding, and what each mode picks.

    For the storage benchmark: pass a table in output order (clustered or baseline: the order
    changes the answer), e.g. one partition file or a few (every encoding of every column is
    written once, a group of columns of about ``sample_bytes`` at a time). The plans are chosen
    exactly as the ETL chooses them (on the first ``sample_rows`` rows), then applied to the
    whole table. Returns ``{column: {"PLAIN": bytes, "DELTA_BINARY_PACKED" |
    "BYTE_STREAM_SPLIT": bytes, "RLE_DICTIONARY": bytes, "distinct_ratio": float, "auto":
    chosen encoding, "best": smallest encoding}}`` and a ``"_total"`` entry: bytes of all
    columns under the ``auto``, ``all`` and ``none`` plans and under the per-column best (the
    bound ``auto`` approaches).
    """
    sizes: dict[str, dict[str, int]] = {}
    stats: list[ColumnStats] = []
    for group in column_groups(table, rows=table.num_rows, sample_bytes=sample_bytes):
        columns = table.select(group)
        sizes.update(trial_bytes(columns, zstd_level=zstd_level, row_group_rows=row_group_rows))
        stats.extend(column_statistics(columns))
    plans = {
        mode: plan_encodings(
            table,
            mode=mode,
            zstd_level=zstd_level,
            row_group_rows=row_group_rows,
            sample_rows=sample_rows,
            sample_bytes=sample_bytes,
        )
        for mode in DICTIONARY_MODES
    }
    result: dict[str, dict[str, Any]] = {}
    for s, chosen in zip(stats, plans["auto"].columns, strict=True):
        row: dict[str, Any] = dict(sizes[s.column])
        row["distinct_ratio"] = round(s.distinct_ratio, 4)
        row["auto"] = chosen.encoding
        row["best"] = min(sizes[s.column], key=lambda e: sizes[s.column][e])
        result[s.column] = row
    totals: dict[str, Any] = {
        mode: sum(sizes[c.column][c.encoding] for c in plan.columns) for mode, plan in plans.items()
    }
    totals["best_per_column"] = sum(min(v.values()) for v in sizes.values())
    result["_total"] = totals
    return result
