"""Test support for the ETL tests: build small session-sharded shard directories in-process.

Deliberately independent of recd.logs.generate / recd.logs.shard (the ETL is tested against its
input *format*, recd.logs.rawlog, not against another stage's implementation). Everything is
vectorised numpy so the memory test can build tens of MB quickly.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from recd.logs.hashing import splitmix64
from recd.logs.rawlog import encode_block, shard_path, write_catalogue, write_frame
from recd.schema import REQUEST_ID, SESSION_ID, TS, Catalogue, SparseKind, nullable_type

START_MS = 1_793_491_200_000  # 2026-11-01T00:00:00Z
MS_PER_HOUR = 3_600_000


def make_rows(
    catalogue: Catalogue,
    *,
    num_sessions: int = 40,
    mean_samples: float = 6.0,
    start_ms: int = START_MS,
    duration_ms: int = 2 * MS_PER_HOUR,
    mean_gap_ms: int = 30_000,
    seed: int = 0,
) -> pa.Table:
    """Rows of ``catalogue``'s schema in arrival order (ts, then request_id); request_id unique."""
    rng = np.random.default_rng(seed)
    samples = rng.geometric(1.0 / mean_samples, size=num_sessions)  # >= 1, mean mean_samples
    n = int(samples.sum())
    session_ids = np.arange(1, num_sessions + 1, dtype=np.int64) * 7919 + 13
    session = np.repeat(session_ids, samples)
    starts = np.repeat(rng.integers(0, duration_ms, num_sessions), samples)
    first = np.repeat(np.cumsum(samples) - samples, samples)  # row index of the session's first row
    gaps = rng.exponential(mean_gap_ms, size=n).astype(np.int64) + 1
    gaps[first == np.arange(n)] = 0
    cum = np.cumsum(gaps)
    ts = start_ms + starts + cum - cum[first]
    columns: dict[str, pa.Array] = {SESSION_ID: pa.array(session), TS: pa.array(ts)}
    for label in catalogue.labels:
        columns[label] = pa.array((rng.random(n) < 0.1).astype(np.float32))
    for dense in catalogue.dense:
        if dense.unchanged_prob >= 1.0:
            per_session = rng.lognormal(0, 1, num_sessions).astype(np.float32) * dense.scale
            columns[dense.name] = pa.array(np.repeat(per_session, samples))
        else:
            columns[dense.name] = pa.array(rng.lognormal(0, 1, n).astype(np.float32) * dense.scale)
    versions: dict[str, np.ndarray] = {}
    for i, sparse in enumerate(catalogue.sparse):
        key = sparse.group or sparse.name
        if key not in versions:
            if sparse.kind is SparseKind.STATIC:
                changed = np.zeros(n, dtype=np.int64)
            elif sparse.kind is SparseKind.ITEM:
                changed = np.ones(n, dtype=np.int64)
            else:
                changed = (rng.random(n) >= sparse.unchanged_prob).astype(np.int64)
            cum_changed = np.cumsum(changed)
            versions[key] = cum_changed - cum_changed[first]
        length = max(1, round(sparse.mean_length))
        seed_ids = (session * 1_000_003 + versions[key] * 7_777 + i * 31).astype(np.int64)
        grid = seed_ids[:, None] + np.arange(length, dtype=np.int64)[None, :]
        ids = (splitmix64(grid.ravel()) % np.uint64(sparse.cardinality)).astype(np.int64)
        offsets = np.arange(0, n * length + 1, length, dtype=np.int32)
        columns[sparse.name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))
    order = np.lexsort((np.arange(n), ts))
    table = pa.table(columns).take(pa.array(order))
    request_id = pa.array(np.arange(n, dtype=np.int64) + 1_000_000)
    table = table.add_column(1, REQUEST_ID, request_id)
    schema = catalogue.arrow_schema().remove_metadata()
    return table.select(schema.names).cast(schema)


def shard_of_sessions(session_ids: np.ndarray, num_shards: int) -> np.ndarray:
    return (splitmix64(session_ids) % np.uint64(num_shards)).astype(np.int64)


def write_shards(
    directory: Path,
    catalogue: Catalogue,
    table: pa.Table,
    *,
    num_shards: int = 2,
    block_rows: int = 64,
) -> list[Path]:
    """Session-shard ``table`` (arrival order kept) into ``directory/shard-KKKK.zst`` files."""
    write_catalogue(directory, catalogue)
    shard = shard_of_sessions(table.column(SESSION_ID).to_numpy(), num_shards)
    compressor = zstandard.ZstdCompressor(level=3)
    paths = []
    for k in range(num_shards):
        rows = table.filter(pa.array(shard == k))
        path = shard_path(directory, k)
        with path.open("wb") as f:
            for start in range(0, rows.num_rows, block_rows):
                for batch in rows.slice(start, block_rows).to_batches(max_chunksize=block_rows):
                    write_frame(f, encode_block(batch, compressor))
        paths.append(path)
    return paths


def write_blocks(path: Path, batches: list[pa.RecordBatch]) -> None:
    """Write one shard file holding exactly these blocks (any schema: for bad-input tests)."""
    compressor = zstandard.ZstdCompressor(level=3)
    with path.open("wb") as f:
        for batch in batches:
            write_frame(f, encode_block(batch, compressor))


def read_committed(table_dir: Path, *, decode: bool = True) -> list[tuple[str, Path, pa.Table]]:
    """(``ds=../hour=..``, file, rows) of every file of every committed partition, in order
    (rows read only when ``decode``: an empty table otherwise)."""
    from recd.table.snapshot import committed_files

    out = []
    for partition, files in committed_files(table_dir).partitions:
        for path in files:
            rows = as_nullable(pq.read_table(path)) if decode else pa.table({})
            out.append((partition.relpath, path, rows))
    return out


def committed_bytes(table_dir: Path) -> dict[str, bytes]:
    """``ds=../hour=../part-NNNNN.parquet`` -> bytes of every committed file (the run tag an
    Iceberg table puts in file names removed), to compare the output of two runs."""
    return {
        f"{relpath}/{re.sub(r'^part-[0-9a-f]{8}-', 'part-', path.name)}": path.read_bytes()
        for relpath, path, _ in read_committed(table_dir, decode=False)
    }


def as_nullable(table: pa.Table) -> pa.Table:
    """``table`` with the catalogue's nullable field types (tables are written without
    nullable fields, Catalogue.table_schema), schema metadata removed."""
    return table.cast(pa.schema([pa.field(f.name, nullable_type(f.type)) for f in table.schema]))


def all_rows(table_dir: Path) -> pa.Table:
    """Every committed row, sorted by request_id (as :func:`as_nullable` gives them)."""
    tables = [t for _, _, t in read_committed(table_dir)]
    return pa.concat_tables(tables).sort_by(REQUEST_ID)


def is_clustered(table: pa.Table) -> bool:
    """Rows sorted by (session_id, ts, request_id): sessions contiguous and ts-sorted."""
    s = table.column(SESSION_ID).to_numpy()
    t = table.column(TS).to_numpy()
    r = table.column(REQUEST_ID).to_numpy()
    same_s = s[1:] == s[:-1]
    same_t = t[1:] == t[:-1]
    ordered = (s[1:] > s[:-1]) | (same_s & ((t[1:] > t[:-1]) | (same_t & (r[1:] > r[:-1]))))
    return bool(ordered.all())


def session_runs(table: pa.Table) -> int:
    """Number of runs of equal session_id (== distinct sessions iff sessions are contiguous)."""
    s = table.column(SESSION_ID).to_numpy()
    return int(len(s) > 0) + int((s[1:] != s[:-1]).sum())


def sessions_clustered(table: pa.Table) -> bool:
    """Every session one contiguous run, sorted by (ts, request_id); session ids in any order."""
    s = table.column(SESSION_ID).to_numpy()
    t = table.column(TS).to_numpy()
    r = table.column(REQUEST_ID).to_numpy()
    same_s = s[1:] == s[:-1]
    ordered = (t[1:] > t[:-1]) | ((t[1:] == t[:-1]) & (r[1:] > r[:-1]))
    contiguous = session_runs(table) == len(np.unique(s))
    return bool(contiguous and ordered[same_s].all())


def clustered_shard_by_shard(table: pa.Table, num_shards: int) -> bool:
    """The local engine's layout of a file: the rows of shard 0, then shard 1, ..., each shard's
    rows sorted by (session_id, ts, request_id)."""
    shard = shard_of_sessions(table.column(SESSION_ID).to_numpy(), num_shards)
    if (np.diff(shard) < 0).any():
        return False
    bounds = np.flatnonzero(np.diff(shard)) + 1
    starts = np.concatenate([[0], bounds]).tolist()
    ends = np.concatenate([bounds, [len(shard)]]).tolist()
    return all(
        is_clustered(table.slice(a, b - a)) for a, b in zip(starts, ends, strict=True) if b > a
    )


def row_group_rows(path: Path) -> list[int]:
    """Rows of every row group of a Parquet file."""
    meta = pq.read_metadata(path)
    return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
