"""Reader benchmark (RecD O3 + O4, the paper's Figure 10): samples/s of one reader process.

    python benchmarks/reader.py                          # rm1-like, 300k rows, batch 2048 (minutes)
    python benchmarks/reader.py --profile clickstream    # the shape of a real session log
    python benchmarks/reader.py --quick                  # 20k rows, batch 512 (CI size)

Data: the profile's logs are generated, sharded both ways and ETL'd into a clustered table
(from the session shards, O2) and an unclustered one (arrival order, from the random shards),
as ``recd.pipeline`` does. ``--work-dir`` keeps them for the next run (reused when the same
rows / seed / shards / row-group size were asked for). Every pass reads the whole table
(``--window all``, the default; ``full`` and ``same-files`` are secondary windows).

Headline (same job on both sides: same rows, same batch size, same preprocessing, one core):
``reader_speedup`` = samples per CPU-second of clustered+IKJT over unclustered+KJT, both at
``--batch-size`` (2048) with the preprocessing every config runs; the IKJT groups are what
``recd analyze`` proposes for the clustered table, cost-aware (the reader timed on the table's
own batches with and without each group, with the job's preprocessing: a group that would
slow the reader down is not used; if none pays, clustered+IKJT is clustered+KJT).
Beside it, each with the same rule:

- ``reader_speedup_b6144``: the same at ``--recd-batch-size`` (3x the batch);
- ``reader_speedup_no_preprocessing``: the same jobs without preprocessing (groups proposed
  for a reader that does no per-id work);
- ``reader_speedup_paper_protocol``: the paper's RM1 protocol (clustered+IKJT at 6144 over
  unclustered+KJT at 2048: two different jobs, reported for comparison only).

Protocol: one process (``torch.set_num_threads(1)``, pyarrow CPU and IO pools of one thread),
every config warmed up, then ``--reps`` repetitions. A repetition runs in rounds: one whole
pass over the whole table per config, in an order drawn at random per round (seeded,
recorded), until every config's passes add up to ``--min-measure-s`` CPU seconds (default 2:
one short pass alone varies widely on a shared machine). So every config's measurement
spans the whole repetition, and a slow stretch of the machine falls on both sides of a ratio
alike (``--interleave measurement``, the protocol before: each config's passes back to back,
configs in a random order per repetition, so the two sides of a ratio ran far apart in time
and the per-repetition ratios of the same code spread widely). A measurement's
figures are per pass (the mean of its passes), and its number of passes is recorded. Figures
are medians over the repetitions; each ratio is the ratio of the medians, with the min-max of
the per-repetition ratios (passes of one repetition are paired). Recorded with each figure:
batch sizes, rows read of rows in the table, repetitions, threads, load average before and
after, the orders and the command.

Measured per config: samples/s (wall) and per CPU-second; the reader's time split into fill
(read + decompress + decode + checks), convert (Arrow -> tensors, dedup) and process
(preprocessing); compressed bytes read per sample; bytes per batch sent to a trainer
(``pickle`` and ``Batch.wire_bytes()``). Side by side, the plain torchrec way on both tables:
pyarrow reads the same Parquet files, each batch's KJT is built with
``KeyedJaggedTensor.from_lengths_sync``, no dedup, the same preprocessing modules.

The preprocessing: ``hash_modulo`` of every sparse feature, ``truncate_last`` of the sequence
(history) features, ``log1p`` of every dense feature.

Writes benchmarks/results/reader.json, .md and .png (``--profile clickstream``:
reader_clickstream.*; ``--quick``: *_quick.*).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.analyze import TableAnalysis, analyze_table
from recd.pipeline import reuse_or_build_tables
from recd.reader import ReaderConfig, build_plan, keep_freed_memory
from recd.reader.memory import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES
from recd.reader.plan import ReadPlan
from recd.reader.stats import BatchTiming
from recd.reader.tagged import iter_tagged_batches
from recd.reader.transform import BatchTransform
from recd.schema import Catalogue, SparseKind, load_catalogue
from recd.table.partitions import format_time_ms
from recd.table.snapshot import committed_files
from recd.tensors.batch import Batch, SparseFeatures
from recd.tensors.ikjt import kjt_equal

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = ("rm1-like", "clickstream")
DATA_STAMP = "reader_data.json"
# The job spec shared by every config (a realistic reader job).
HASH_MODULO = 500_000
"""Rows of every embedding table: sparse ids are hashed into [0, HASH_MODULO)."""
SEQUENCE_KEEP = 32
"""Sequence (history) features keep their last SEQUENCE_KEEP ids."""
BASELINE = "unclustered_kjt"
RECD = "clustered_ikjt"
READER_CONFIGS = ("unclustered_kjt", "unclustered_ikjt", "clustered_kjt", "clustered_ikjt")
LARGE_CONFIGS = ("unclustered_kjt_large", "clustered_kjt_large", "clustered_ikjt_large")
"""The same jobs at the RecD batch size (``--recd-batch-size``)."""
NOPRE_CONFIGS = ("unclustered_kjt_nopre", "clustered_kjt_nopre", "clustered_ikjt_nopre")
"""The same jobs at the batch size, without preprocessing."""
DEDUP_CONFIGS = ("dedup_ikjt", "dedup_ikjt_nopre")
"""The jobs of clustered_ikjt and clustered_ikjt_nopre read from the dedup layout (``recd etl
--layout dedup``; IKJTs of encoded groups without hashing, the encoded features' sparse
preprocessing on their stored ids once per row group), with the groups ``recd analyze``
proposes on that table for each job."""
FACTOR_ONLY = "clustered_ikjt_factor_only"
"""clustered+IKJT at the batch size with the groups of the paper's rule (factor above the
threshold, no timing): what the proposal was before it became cost-aware."""
RECD_FULL = "clustered_ikjt_large"
"""RecD with every reader-side optimisation: clustered table, IKJTs, the larger batch (O7)."""
HEADLINES = {
    "reader_speedup": (RECD, BASELINE),
    "reader_speedup_b6144": (RECD_FULL, "unclustered_kjt_large"),
    "reader_speedup_no_preprocessing": ("clustered_ikjt_nopre", "unclustered_kjt_nopre"),
    "reader_speedup_paper_protocol": (RECD_FULL, BASELINE),
    "reader_speedup_factor_only_proposal": (FACTOR_ONLY, BASELINE),
    "reader_speedup_dedup_layout": ("dedup_ikjt", BASELINE),
    "reader_speedup_dedup_layout_no_preprocessing": ("dedup_ikjt_nopre", "unclustered_kjt_nopre"),
    "dedup_layout_vs_clustered": ("dedup_ikjt", RECD),
    "dedup_layout_vs_clustered_no_preprocessing": ("dedup_ikjt_nopre", "clustered_ikjt_nopre"),
}
"""Headline ratios: (numerator config, denominator config), samples per CPU-second."""
REFERENCE_CONFIGS = ("torchrec_unclustered", "torchrec_clustered")
PARTS = ("fill", "convert", "process")


# ---------------------------------------------------------------------- data
def prepare_tables(
    work: Path,
    *,
    rows: int,
    seed: int,
    num_shards: int,
    row_group_rows: int,
    profile: str = "rm1-like",
) -> dict[str, Any]:
    """``profile`` into ``work/table`` (clustered) and ``work/table_baseline`` (arrival order),
    reused when ``work`` already holds the same (:func:`recd.pipeline.reuse_or_build_tables`)."""
    return reuse_or_build_tables(
        work,
        profile,
        stamp=DATA_STAMP,
        seed=seed,
        rows=rows,
        num_shards=num_shards,
        row_group_rows=row_group_rows,
        dedup=True,
    )


def leading_window(clustered: Path, unclustered: Path, *, min_rows: int = 0) -> dict[str, Any]:
    """The leading partitions in which both tables hold the same number of files and every
    partition at least ``min_rows`` rows.

    The tables end in a sparse tail of hourly partitions (a few long sessions trickle samples
    for days), where random shards still put a few rows in every shard's file and a file's
    fixed opening costs weigh as much as decoding its rows: both would favour one side for
    reasons production partitions (millions of rows) do not have. ``min_rows`` (``--window
    full``: one full row group) keeps partitions of that kind. The first partition always
    stays. Returns ``end`` (None: no cut) and how many partitions the cut leaves out.
    """
    a = committed_files(clustered).partitions
    b = committed_files(unclustered).partitions
    out: dict[str, Any] = {
        "end": None,
        "partitions": len(a),
        "partitions_left_out": 0,
        "min_partition_rows": min_rows,
    }
    for i, ((pa_, files_a), (pb, files_b)) in enumerate(zip(a, b, strict=False)):
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files_a)
        small = i > 0 and rows < min_rows  # the first partition always stays
        if pa_ != pb or len(files_a) != len(files_b) or small:
            out.update(
                end=format_time_ms(pa_.start_ms), partitions=i, partitions_left_out=len(a) - i
            )
            break
    return out


def job_preprocessing(catalogue: Catalogue) -> list[dict[str, Any]]:
    """The preprocessing every config runs: hash all ids, truncate sequences, log1p dense."""
    sequences = [f.name for f in catalogue.sparse if f.kind == SparseKind.HISTORY]
    return [
        {"kind": "hash_modulo", "features": catalogue.sparse_names, "modulo": HASH_MODULO},
        {"kind": "truncate_last", "features": sequences, "n": SEQUENCE_KEEP},
        {"kind": "log1p", "features": catalogue.dense_names},
    ]


# ---------------------------------------------------------------------- measurement
@dataclass(slots=True)
class Pass:
    """One timed pass of one config over the whole table."""

    rows: int = 0
    batches: int = 0
    wall_s: float = 0.0
    """Wall seconds of the whole pass (everything the reading loop did)."""
    cpu_s: float = 0.0
    """CPU seconds of this process during the pass (one thread: about wall when unloaded)."""
    fill_s: float = 0.0
    convert_s: float = 0.0
    process_s: float = 0.0
    read_bytes: int = 0
    gc_collections: int = 0
    """Python garbage collections during the pass (any generation)."""
    gc_s: float = 0.0
    """Wall seconds they took (inside ``wall_s``)."""
    passes: int = 1
    """Whole passes this measurement made; every other field is per pass (their mean)."""

    def add(self, timing: BatchTiming) -> None:
        self.rows += timing.rows
        self.batches += 1
        self.fill_s += timing.fill_s
        self.convert_s += timing.convert_s
        self.process_s += timing.process_s
        self.read_bytes += timing.read_bytes


class RecdReader:
    """One recd reader config: the read plan and its compiled transform, built once."""

    def __init__(self, config: ReaderConfig) -> None:
        self.config = config
        self.plan: ReadPlan = build_plan(config)
        self.transform = BatchTransform(self.plan)

    def iter_timed(self) -> Iterator[tuple[Batch, BatchTiming]]:
        """What ``iter_batches`` does with ``num_workers=0``, without rebuilding the plan and
        recompiling the TorchScript preprocessing on every pass."""
        for item in iter_tagged_batches(self.plan, self.transform, epoch=0, stream=0):
            yield item.batch, item.timing


class TorchrecReference:
    """The plain torchrec way: pyarrow batches -> ``KeyedJaggedTensor.from_lengths_sync``.

    Reads the files of the same table in the same order, rebatches to ``batch_size`` rows
    across files, builds one KJT of every sparse feature (no dedup) plus dense and labels
    tensors, and runs the same preprocessing modules as the recd configs.
    """

    def __init__(self, config: ReaderConfig, transform: BatchTransform, plan: ReadPlan) -> None:
        self.files = committed_files(
            Path(config.table),
            snapshot_id=plan.config.snapshot,
            start_ms=config.start_ms,
            end_ms=config.end_ms,
        ).files
        self.batch_size = config.batch_size
        self.labels, self.dense, self.sparse = plan.labels, plan.dense, plan.sparse
        self.columns = [*self.labels, *self.dense, *self.sparse]
        self.sparse_module = transform.sparse_module
        self.dense_module = transform.dense_module
        self.read_bytes = {str(u.path): 0 for u in plan.units}
        for u in plan.units:
            self.read_bytes[str(u.path)] += u.read_bytes

    def _iter_rows(self) -> Iterator[tuple[pa.RecordBatch, float, int]]:
        """(batch of rows, fill seconds, compressed bytes of the files opened meanwhile)."""
        pending: list[pa.RecordBatch] = []
        rows = 0
        fill_s, read_bytes = 0.0, 0
        for path in self.files:
            t0 = time.perf_counter()
            parquet = pq.ParquetFile(path)
            read_bytes += self.read_bytes[str(path)]
            for record_batch in parquet.iter_batches(
                batch_size=self.batch_size, columns=self.columns
            ):
                pending.append(record_batch)
                rows += record_batch.num_rows
                while rows >= self.batch_size:
                    table = pa.Table.from_batches(pending)
                    out = table.slice(0, self.batch_size).combine_chunks().to_batches()[0]
                    rest = table.slice(self.batch_size)
                    pending = rest.combine_chunks().to_batches() if rest.num_rows else []
                    rows = rest.num_rows
                    fill_s += time.perf_counter() - t0
                    yield out, fill_s, read_bytes
                    fill_s, read_bytes = 0.0, 0
                    t0 = time.perf_counter()
            fill_s += time.perf_counter() - t0
        if rows:
            t0 = time.perf_counter()
            out = pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
            yield out, fill_s + time.perf_counter() - t0, read_bytes

    def convert(self, rows: pa.RecordBatch) -> Batch:
        lengths = [pc.list_value_length(rows.column(name)) for name in self.sparse]
        values = [rows.column(name).flatten() for name in self.sparse]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.sparse,
            values=torch.from_numpy(np.concatenate([v.to_numpy() for v in values])),
            lengths=torch.from_numpy(np.concatenate([n.to_numpy() for n in lengths])),
        )
        return Batch(
            dense=_float_matrix(rows, self.dense),
            sparse=SparseFeatures(batch_size=rows.num_rows, kjt=kjt),
            labels=_float_matrix(rows, self.labels),
        )

    def process(self, batch: Batch) -> Batch:
        kjt = batch.sparse.kjt
        assert kjt is not None
        return Batch(
            dense=batch.dense if self.dense_module is None else self.dense_module(batch.dense),
            sparse=SparseFeatures(
                batch_size=batch.batch_size,
                kjt=kjt if self.sparse_module is None else self.sparse_module(kjt),
            ),
            labels=batch.labels,
        )

    def iter_timed(self) -> Iterator[tuple[Batch, BatchTiming]]:
        for rows, fill_s, read_bytes in self._iter_rows():
            t0 = time.perf_counter()
            batch = self.convert(rows)
            t1 = time.perf_counter()
            batch = self.process(batch)
            t2 = time.perf_counter()
            yield batch, BatchTiming(rows.num_rows, fill_s, t1 - t0, t2 - t1, read_bytes)


def _float_matrix(rows: pa.RecordBatch, names: list[str]) -> torch.Tensor:
    out = np.empty((rows.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        out[:, j] = rows.column(name).to_numpy(zero_copy_only=False)
    return torch.from_numpy(out)


Reader = RecdReader | TorchrecReference


def check_same_output(readers: dict[str, Reader], batches: int) -> int:
    """Every config of a table hands out the same batches (expanded): the same job is timed.

    Compares the first ``batches`` batches of the KJT, IKJT and torchrec configs of each table
    (dense, labels, and every sparse key after preprocessing); raises RuntimeError otherwise.
    Returns the number of batches compared per config.
    """
    compared = 0
    for names in (
        ["unclustered_kjt", "unclustered_ikjt", "torchrec_unclustered"],
        ["clustered_kjt", "clustered_ikjt", "torchrec_clustered", FACTOR_ONLY, "dedup_ikjt"],
        ["clustered_kjt_large", RECD_FULL],
        ["clustered_kjt_nopre", "clustered_ikjt_nopre", "dedup_ikjt_nopre"],
    ):
        streams = [readers[name].iter_timed() for name in names]
        for i in range(batches):
            got = [next(stream, None) for stream in streams]
            if all(g is None for g in got):
                break
            if any(g is None for g in got):
                raise RuntimeError(f"configs {names} hand out different batch counts")
            first, *others = [g[0] for g in got if g is not None]
            keys = first.sparse.keys()
            for name, other in zip(names[1:], others, strict=True):
                same = (
                    torch.equal(first.dense, other.dense)
                    and torch.equal(first.labels, other.labels)
                    and kjt_equal(first.sparse.to_kjt(keys), other.sparse.to_kjt(keys))
                )
                if not same:
                    raise RuntimeError(f"batch {i}: {name} differs from {names[0]}")
            compared = max(compared, i + 1)
    return compared


def warm_up(reader: Reader, batches: int) -> None:
    """Page cache, TorchScript profiling runs, allocator: a few batches, untimed."""
    for i, _ in enumerate(reader.iter_timed()):
        if i + 1 >= batches:
            break


class GcClock:
    """Counts Python's garbage collections and their wall time (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0
        self._began = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.collections += 1
            self.seconds += time.perf_counter() - self._began


GC_CLOCK = GcClock()


def timed_pass(reader: Reader) -> Pass:
    """One pass over the whole table; per-batch timings plus the loop's wall and CPU time,
    and the garbage collections that ran during it."""
    result = Pass()
    if GC_CLOCK not in gc.callbacks:
        gc.callbacks.append(GC_CLOCK)
    collections, gc_s = GC_CLOCK.collections, GC_CLOCK.seconds
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _, timing in reader.iter_timed():
        result.add(timing)
    result.wall_s = time.perf_counter() - wall0
    result.cpu_s = time.process_time() - cpu0
    result.gc_collections = GC_CLOCK.collections - collections
    result.gc_s = GC_CLOCK.seconds - gc_s
    return result


def timed_measurement(reader: Reader, min_cpu_s: float) -> Pass:
    """Whole passes over the table until they add up to ``min_cpu_s`` CPU seconds (at least
    one), as one :class:`Pass` holding the mean of its passes."""
    passes = [timed_pass(reader)]
    while sum(p.cpu_s for p in passes) < min_cpu_s:
        passes.append(timed_pass(reader))
    return mean_pass(passes)


def mean_pass(passes: list[Pass]) -> Pass:
    """Several whole passes of one reader as one :class:`Pass` holding their mean."""
    if len({(p.rows, p.batches) for p in passes}) != 1:
        raise RuntimeError("two passes over the same table read different rows")
    k = len(passes)
    mean = Pass(rows=passes[0].rows, batches=passes[0].batches, passes=k)
    for name in ("wall_s", "cpu_s", "fill_s", "convert_s", "process_s", "gc_s"):
        setattr(mean, name, sum(getattr(p, name) for p in passes) / k)
    mean.read_bytes = sum(p.read_bytes for p in passes) // k
    mean.gc_collections = sum(p.gc_collections for p in passes)
    return mean


def wire_sizes(reader: Reader, max_batches: int) -> dict[str, float]:
    """Mean bytes per full batch sent to a trainer: pickled (protocol 5) and wire_bytes()."""
    pickled, wire, sparse_pickled = [], [], []
    for batch, _ in reader.iter_timed():
        if batch.batch_size != reader_batch_size(reader):
            continue
        pickled.append(len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)))
        sparse_pickled.append(len(pickle.dumps(batch.sparse, protocol=pickle.HIGHEST_PROTOCOL)))
        wire.append(batch.wire_bytes())
        if len(pickled) >= max_batches:
            break
    return {
        "batches": len(pickled),
        "pickled_bytes_per_batch": statistics.fmean(pickled),
        "sparse_pickled_bytes_per_batch": statistics.fmean(sparse_pickled),
        "wire_bytes_per_batch": statistics.fmean(wire),
    }


def reader_batch_size(reader: Reader) -> int:
    return reader.config.batch_size if isinstance(reader, RecdReader) else reader.batch_size


def summarise(passes: list[Pass]) -> dict[str, Any]:
    """Medians (and min-max) over the repetitions: samples/s (wall and CPU), the time split,
    bytes read.

    The split is measured in wall seconds by the reader (``BatchTiming``); ``cpu_s_per_1k``
    spreads the pass's CPU seconds over the parts in the same shares, which on a shared,
    loaded machine is the better estimate of what each part costs a dedicated core.
    """
    rows = passes[0].rows
    fill, convert, process = (
        statistics.median(getattr(p, f"{part}_s") for p in passes) for part in PARTS
    )
    total = fill + convert + process
    shares = {part: v / total for part, v in zip(PARTS, (fill, convert, process), strict=True)}
    cpu_per_1k = statistics.median(p.cpu_s for p in passes) * 1000.0 / rows
    wall_per_1k = 1000.0 / rows
    per_cpu = [p.rows / p.cpu_s for p in passes]
    per_wall = [p.rows / p.wall_s for p in passes]
    return {
        "rows": rows,
        "batches": passes[0].batches,
        "samples_per_s": statistics.median(per_wall),
        "samples_per_s_min_max": [min(per_wall), max(per_wall)],
        "samples_per_cpu_s": statistics.median(per_cpu),
        "samples_per_cpu_s_min_max": [min(per_cpu), max(per_cpu)],
        "wall_s": [p.wall_s for p in passes],
        "cpu_s": [p.cpu_s for p in passes],
        "time_share": shares,
        "wall_s_per_1k": {
            "fill": fill * wall_per_1k,
            "convert": convert * wall_per_1k,
            "process": process * wall_per_1k,
            "total": total * wall_per_1k,
        },
        "cpu_s_per_1k": {
            **{part: shares[part] * cpu_per_1k for part in PARTS},
            "total": cpu_per_1k,
        },
        "read_bytes": passes[0].read_bytes,
        "read_bytes_per_sample": passes[0].read_bytes / rows,
        "passes": [asdict(p) for p in passes],
    }


def ratio_with_spread(
    configs: dict[str, dict[str, Any]], num: str, den: str, *, key: str = "samples_per_cpu_s"
) -> dict[str, Any]:
    """``num`` over ``den``: the ratio of the medians and the min-max of the per-repetition
    ratios (pass i of both configs ran in repetition i, minutes apart at most)."""
    field = "cpu_s" if key == "samples_per_cpu_s" else "wall_s"
    a, b = configs[num], configs[den]
    per_rep = [
        (a["rows"] / ta) / (b["rows"] / tb) for ta, tb in zip(a[field], b[field], strict=True)
    ]
    return {
        "value": a[key] / b[key],
        "min": min(per_rep),
        "max": max(per_rep),
        "per_repetition": per_rep,
        "numerator": num,
        "denominator": den,
        "basis": key,
    }


def verdict(spread: dict[str, Any]) -> str:
    """ "faster" / "slower" only when every repetition agrees; else "indistinguishable"."""
    if spread["min"] > 1.0:
        return "faster"
    if spread["max"] < 1.0:
        return "slower"
    return "indistinguishable"


# ---------------------------------------------------------------------- outputs
def markdown(r: dict[str, Any]) -> str:
    base = r["configs"][BASELINE]["cpu_s_per_1k"]["total"]
    p = r["protocol"]
    lines = [
        f"{r['profile']}, {p['rows_read_per_pass']:,} rows read per pass of "
        f"{p['rows_in_table']:,} in the table ({p['window']}), batch {r['batch_size']} "
        f"(`*_large`: {r['recd_batch_size']}), one reader process (1 thread), "
        f"{p['repetitions']} repetitions ({p.get('order', 'random order')}; each "
        f"measurement: {p.get('measurement', 'one pass')}), medians "
        f"(min-max); malloc: {p.get('malloc', 'glibc defaults')}; load average {p['load_average_before'][0]:.1f} before, "
        f"{p['load_average_after'][0]:.1f} after, on {r['cpu_count']} CPUs.",
        "",
        "| config | samples/CPU-s (min-max) | samples/s (wall) | fill | convert | process "
        "| total (vs baseline) | read B/sample | pickled B/batch |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ALL_CONFIGS:
        c = r["configs"][name]
        t = c["cpu_s_per_1k"]
        lo, hi = c["samples_per_cpu_s_min_max"]
        wire = r["wire"].get(name, {}).get("pickled_bytes_per_batch")
        lines.append(
            f"| {name} | {c['samples_per_cpu_s']:,.0f} ({lo:,.0f}-{hi:,.0f}) "
            f"| {c['samples_per_s']:,.0f} "
            f"| {t['fill'] * 1e3:.1f} ms | {t['convert'] * 1e3:.1f} ms "
            f"| {t['process'] * 1e3:.1f} ms | {t['total'] * 1e3:.1f} ms ({t['total'] / base:.2f}) "
            f"| {c['read_bytes_per_sample']:,.0f} | "
            + (f"{wire / 1e6:.2f} MB |" if wire else "- |")
        )
    vs = r["speedup_vs_torchrec"]
    h = r["headlines"]

    def row(key: str, label: str, bold: bool = False) -> str:
        x = h[key]
        value = f"{x['value']:.2f}x ({x['min']:.2f}-{x['max']:.2f}, {verdict(x)})"
        return f"| {'**' + key + '**' if bold else key} ({label}) | {'**' + value + '**' if bold else value} |"

    b, big = r["batch_size"], r["recd_batch_size"]
    lines += [
        "",
        "Times: CPU ms per 1k samples, split in the reader's measured shares (fill = read + "
        "decompress + decode + checks; convert = Arrow -> tensors incl. dedup; "
        "process = preprocessing). Pickled: `pickle.dumps(batch)`, full batches.",
        "",
        "| headline (samples per CPU-second, median of repetitions, min-max of per-repetition "
        "ratios) | value |",
        "|---|---:|",
        row(
            "reader_speedup",
            f"clustered+IKJT / unclustered+KJT, both batch {b}, with preprocessing",
            bold=True,
        ),
        row("reader_speedup_b6144", f"the same at batch {big}"),
        row("reader_speedup_no_preprocessing", f"the same at batch {b} without preprocessing"),
        row(
            "reader_speedup_paper_protocol",
            f"clustered+IKJT at {big} / unclustered+KJT at "
            f"{b}: two different jobs, the paper's RM1 protocol",
        ),
        row(
            "reader_speedup_factor_only_proposal",
            f"clustered+IKJT with the paper's rule's groups (factor only, no timing) / "
            f"unclustered+KJT, batch {b}, with preprocessing",
        ),
        row(
            "reader_speedup_dedup_layout",
            f"the dedup layout, groups recd analyze proposes on it (no hashing) / "
            f"unclustered+KJT, batch {b}, with preprocessing",
            bold=True,
        ),
        row(
            "reader_speedup_dedup_layout_no_preprocessing",
            "the same without preprocessing",
        ),
        row("dedup_layout_vs_clustered", "dedup layout / clustered plain layout, +IKJT, same job"),
        row(
            "dedup_layout_vs_clustered_no_preprocessing",
            "the same without preprocessing",
        ),
        f"| table bytes, unclustered / clustered / dedup layout "
        f"| {r['table_bytes']['unclustered'] / 1e6:,.1f} / "
        f"{r['table_bytes']['clustered'] / 1e6:,.1f} / "
        + (
            f"{r['table_bytes']['dedup_layout'] / 1e6:,.1f} MB (baseline / dedup "
            f"{r['table_bytes']['unclustered'] / r['table_bytes']['dedup_layout']:.2f}x) |"
            if r["table_bytes"].get("dedup_layout")
            else "n/a |"
        ),
        row("reader_speedup_wall", "headline pair, wall-clock samples/s"),
        row("clustering", "clustered+KJT / unclustered+KJT"),
        row("ikjt_on_clustered", "clustered+IKJT / clustered+KJT, same table"),
        f"| **wire_bytes_ratio** (pickled KJT / IKJT batch, clustered) "
        f"| **{r['wire_bytes_ratio']:.2f}x** |",
        f"| wire_bytes_ratio at batch {big} | {r['wire_bytes_ratio_large']:.2f}x |",
        f"| bytes read per sample, unclustered / clustered "
        f"| {r['bytes_read_per_sample']['unclustered']:,.0f} / "
        f"{r['bytes_read_per_sample']['clustered']:,.0f} B "
        f"(dedup layout {r['bytes_read_per_sample'].get('dedup_layout', 0):,.0f} B) |",
        f"| vs plain torchrec dataloader, same table (unclustered+KJT / clustered+IKJT) "
        f"| {vs['unclustered_kjt_vs_torchrec_unclustered']:.2f}x / "
        f"{vs['clustered_ikjt_vs_torchrec_clustered']:.2f}x |",
    ]
    for label, key in (
        (f"batch {b}, with preprocessing", "with_preprocessing"),
        (f"batch {big}, with preprocessing", "large"),
        (f"batch {b}, no preprocessing", "no_preprocessing"),
        (f"batch {b}, the paper's rule, factor only", "factor_only"),
        (f"dedup layout, batch {b}, with preprocessing", "dedup_with_preprocessing"),
        (f"dedup layout, batch {b}, no preprocessing", "dedup_no_preprocessing"),
    ):
        a = r["analysis"][key]
        groups = "; ".join(_group_label(g) for g in a["dedup_sparse_features"]) or "none"
        rejected = "; ".join(
            f"{_group_label(x['features'])} (factor {x['measured_factor']:.1f})"
            for x in a["rejected"]
        )
        lines.append(
            f"| dedup groups proposed by `recd analyze` ({label}) | {groups}"
            + (f"; not proposed: {rejected}" if rejected else "")
            + " |"
        )
    return "\n".join(lines) + "\n"


def _group_label(group: list[str]) -> str:
    return group[0] if len(group) == 1 else f"{group[0]} .. {group[-1]} ({len(group)} keys)"


def plot(r: dict[str, Any], path: Path) -> None:
    """Stacked fill/convert/process CPU time per sample, normalised to the baseline
    (the paper's Figure 10)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(ALL_CONFIGS)
    base = r["configs"][BASELINE]["cpu_s_per_1k"]["total"]
    fig, ax = plt.subplots(figsize=(12, 4.8))
    bottom = np.zeros(len(names))
    colours = {"fill": "#4c72b0", "convert": "#dd8452", "process": "#55a868"}
    for part in PARTS:
        heights = np.array([r["configs"][n]["cpu_s_per_1k"][part] / base for n in names])
        ax.bar(names, heights, bottom=bottom, label=part, color=colours[part])
        bottom += heights
    for i, total in enumerate(bottom):
        ax.text(i, total + 0.01, f"{total:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"reader CPU time per sample (1.0 = {BASELINE})")
    ax.set_title(
        f"{r['profile']} reader time split, batch {r['batch_size']} (_large: "
        f"{r['recd_batch_size']}), {r['rows']:,} rows per pass, median of "
        f"{r['protocol']['repetitions']}"
    )
    ax.set_ylim(0, float(bottom.max()) * 1.18)
    ax.legend(loc="upper left", ncols=3)
    ax.tick_params(axis="x", labelrotation=25, labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------- main
ALL_CONFIGS = (
    *READER_CONFIGS,
    *LARGE_CONFIGS,
    *NOPRE_CONFIGS,
    FACTOR_ONLY,
    *DEDUP_CONFIGS,
    *REFERENCE_CONFIGS,
)


def build_readers(
    clustered: Path,
    unclustered: Path,
    dedup: Path,
    *,
    profile: str,
    batch_size: int,
    recd_batch_size: int,
    end: str | None,
    groups: dict[str, list[list[str]]],
) -> dict[str, Reader]:
    """The recd configs at both batch sizes, without preprocessing, and the two torchrec
    references (same job, same window). ``groups``: the dedup groups of each job
    ("with_preprocessing", "large", "no_preprocessing")."""
    preprocessing = job_preprocessing(load_catalogue(profile))

    def recd(
        table: Path, dedup: list[list[str]], size: int = batch_size, pre: bool = True
    ) -> RecdReader:
        config = ReaderConfig(
            table=str(table),
            end=end,
            batch_size=size,
            dedup_sparse_features=dedup,
            preprocessing=preprocessing if pre else [],
            streams=1,  # table order, as the torchrec reference reads the files
        )
        return RecdReader(config)

    g, g_large, g_nopre = groups["with_preprocessing"], groups["large"], groups["no_preprocessing"]
    # "factor_only": the paper's rule, for comparison
    readers: dict[str, Reader] = {
        "unclustered_kjt": recd(unclustered, []),
        "unclustered_ikjt": recd(unclustered, g),
        "clustered_kjt": recd(clustered, []),
        "clustered_ikjt": recd(clustered, g),
        "unclustered_kjt_large": recd(unclustered, [], recd_batch_size),
        "clustered_kjt_large": recd(clustered, [], recd_batch_size),
        RECD_FULL: recd(clustered, g_large, recd_batch_size),
        "unclustered_kjt_nopre": recd(unclustered, [], pre=False),
        "clustered_kjt_nopre": recd(clustered, [], pre=False),
        "clustered_ikjt_nopre": recd(clustered, g_nopre, pre=False),
        FACTOR_ONLY: recd(clustered, groups["factor_only"]),
        "dedup_ikjt": recd(dedup, groups["dedup_with_preprocessing"]),
        "dedup_ikjt_nopre": recd(dedup, groups["dedup_no_preprocessing"], pre=False),
    }
    for name, like in zip(REFERENCE_CONFIGS, ("unclustered_kjt", "clustered_kjt"), strict=True):
        base = readers[like]
        assert isinstance(base, RecdReader)
        readers[name] = TorchrecReference(base.config, base.transform, base.plan)
    return readers


INTERLEAVES = ("pass", "measurement")


def measure(
    readers: dict[str, Reader],
    *,
    reps: int,
    warmup_batches: int,
    seed: int,
    min_measure_s: float = 0.0,
    interleave: str = "pass",
) -> tuple[dict[str, list[Pass]], list[list[list[str]]]]:
    """``reps`` repetitions of one measurement per reader: whole passes adding up to
    ``min_measure_s`` CPU seconds (at least one), in orders drawn at random (seeded).

    ``interleave``: ``pass`` (the default) runs each repetition in rounds of one pass of
    every reader, in a random order per round, until every reader has its CPU seconds: every
    reader's measurement spans the whole repetition, so a slow stretch of a shared machine
    falls on all of them alike. ``measurement`` (the protocol before) runs each reader's
    passes back to back, readers in a random order per repetition: two readers of one
    ratio ran up to a minute apart.

    Returns the passes per reader (index i: repetition i) and, per repetition, the orders of
    its rounds (``measurement``: one round).
    """
    for reader in readers.values():
        warm_up(reader, warmup_batches)
    passes: dict[str, list[Pass]] = {name: [] for name in readers}
    orders: list[list[list[str]]] = []
    rng = random.Random(seed)
    for rep in range(reps):
        if interleave == "measurement":
            order = rng.sample(list(readers), k=len(readers))
            orders.append([order])
            for name in order:
                passes[name].append(timed_measurement(readers[name], min_measure_s))
                _report(rep, reps, name, passes[name][-1])
            continue
        rounds: list[list[str]] = []
        runs: dict[str, list[Pass]] = {name: [] for name in readers}
        while not rounds or any(
            sum(p.cpu_s for p in runs[name]) < min_measure_s for name in readers
        ):
            rounds.append(rng.sample(list(readers), k=len(readers)))
            for name in rounds[-1]:
                runs[name].append(timed_pass(readers[name]))
            print(f"  rep {rep + 1}/{reps}: round {len(rounds)} done", flush=True)
        orders.append(rounds)
        for name in readers:
            passes[name].append(mean_pass(runs[name]))
            _report(rep, reps, name, passes[name][-1])
    return passes, orders


def _report(rep: int, reps: int, name: str, p: Pass) -> None:
    print(
        f"  rep {rep + 1}/{reps} {name:<22} {p.rows / p.cpu_s:>8,.0f} samples/CPU-s "
        f"{p.rows / p.wall_s:>8,.0f} samples/s (fill {p.fill_s:.2f} s, convert "
        f"{p.convert_s:.2f} s, process {p.process_s:.2f} s per pass, {p.passes} pass(es))",
        flush=True,
    )


def analyses_per_job(
    clustered: Path,
    dedup: Path,
    *,
    profile: str,
    batch_size: int,
    recd_batch_size: int,
    end: str | None,
) -> dict[str, TableAnalysis]:
    """``recd analyze``'s cost-aware proposal for each job of the benchmark: the reader timed
    on the clustered table's own batches with that job's batch size and preprocessing; the
    dedup layout's jobs on that table's (no hashing there, so other groups may pay)."""
    preprocessing = job_preprocessing(load_catalogue(profile))
    jobs = {
        "with_preprocessing": (batch_size, preprocessing),
        "large": (recd_batch_size, preprocessing),
        "no_preprocessing": (batch_size, []),
    }
    out = {}
    for job, (size, specs) in jobs.items():
        print(f"analyzing {clustered} at batch size {size} ({job}) ...", flush=True)
        out[job] = analyze_table(
            clustered, batch_size=size, end=end, cost_aware=True, preprocessing=specs
        )
    out["factor_only"] = analyze_table(clustered, batch_size=batch_size, end=end)
    for job, specs in (("dedup_with_preprocessing", preprocessing), ("dedup_no_preprocessing", [])):
        print(f"analyzing {dedup} at batch size {batch_size} ({job}) ...", flush=True)
        out[job] = analyze_table(
            dedup, batch_size=batch_size, end=end, cost_aware=True, preprocessing=specs
        )
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    data = prepare_tables(
        work,
        rows=args.rows,
        seed=args.seed,
        num_shards=args.shards,
        row_group_rows=args.row_group_rows,
        profile=args.profile,
    )
    clustered, unclustered = work / "table", work / "table_baseline"
    window = (
        leading_window(
            clustered,
            unclustered,
            min_rows=args.row_group_rows if args.window == "full" else 0,
        )
        if args.window != "all"
        else {"end": None, "partitions": len(committed_files(clustered).partitions)}
    )
    end = str(window["end"]) if window["end"] is not None else None
    analyses = analyses_per_job(
        clustered,
        work / "table_dedup",
        profile=args.profile,
        batch_size=args.batch_size,
        recd_batch_size=args.recd_batch_size,
        end=end,
    )
    print("building readers (TorchScript preprocessing) ...", flush=True)
    readers = build_readers(
        clustered,
        unclustered,
        work / "table_dedup",
        profile=args.profile,
        batch_size=args.batch_size,
        recd_batch_size=args.recd_batch_size,
        end=end,
        groups={job: a.dedup_sparse_features for job, a in analyses.items()},
    )
    for name in ("clustered_kjt", "unclustered_kjt"):
        reader = readers[name]
        assert isinstance(reader, RecdReader)
        key = name.split("_")[0]
        window[f"files_{key}"] = len({u.path for u in reader.plan.units})
        window[f"row_groups_{key}"] = len(reader.plan.units)
    identical = check_same_output(readers, args.check_batches)
    print(f"all configs of a table hand out identical batches ({identical} compared)")
    load_before = os.getloadavg()
    passes, orders = measure(
        readers,
        reps=args.reps,
        warmup_batches=args.warmup_batches,
        seed=args.seed,
        min_measure_s=args.min_measure_s,
        interleave=args.interleave,
    )
    load_after = os.getloadavg()
    configs = {name: summarise(p) for name, p in passes.items()}
    wire = {
        name: wire_sizes(readers[name], args.wire_batches)
        for name in (*READER_CONFIGS, *LARGE_CONFIGS)
    }
    result = headline(args, data=data, window=window, analyses=analyses, configs=configs, wire=wire)
    result["protocol"] = {
        "batch_size": args.batch_size,
        "recd_batch_size": args.recd_batch_size,
        "rows_read_per_pass": configs[BASELINE]["rows"],
        "rows_in_table": data["rows"],
        "window": "the whole table"
        if window["end"] is None
        else f"partitions before {window['end']} ({window.get('partitions_left_out', 0)} left out)",
        "repetitions": args.reps,
        "interleave": args.interleave,
        "order": (
            "per repetition, rounds of one pass of every config, in an order drawn at random "
            "per round, until every config has its CPU-s"
            if args.interleave == "pass"
            else "every config once per repetition, in an order drawn at random per repetition"
        ),
        "measurement": (
            f"whole passes over the table until >= {args.min_measure_s} CPU-s (at least one)"
            + (
                ", interleaved pass by pass with every other config"
                if args.interleave == "pass"
                else ""
            )
            + "; figures per pass, the mean of its passes"
        ),
        "passes_per_measurement": {
            name: [p.passes for p in config_passes] for name, config_passes in passes.items()
        },
        "gc_collections_in_measurements": sum(
            p.gc_collections for config_passes in passes.values() for p in config_passes
        ),
        "orders_seed": args.seed,
        "orders": orders,
        "warmup_batches": args.warmup_batches,
        "threads": {"torch": 1, "pyarrow_cpu": 1, "pyarrow_io": 1},
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "failures": "a pass that fails stops the run: no pass is left out of a figure",
        "ratios": "ratio of the medians; min-max of the per-repetition ratios",
    }
    result["identical_batches_checked"] = identical
    return result


def headline(
    args: argparse.Namespace,
    *,
    data: dict[str, Any],
    window: dict[str, Any],
    analyses: dict[str, TableAnalysis],
    configs: dict[str, dict[str, Any]],
    wire: dict[str, dict[str, float]],
) -> dict[str, Any]:
    """The result document: headline ratios first, then every measurement behind them."""

    def cpu_ratio(a: str, b: str) -> float:
        return float(configs[a]["samples_per_cpu_s"] / configs[b]["samples_per_cpu_s"])

    spreads = {key: ratio_with_spread(configs, *pair) for key, pair in HEADLINES.items()}
    spreads["reader_speedup_wall"] = ratio_with_spread(configs, RECD, BASELINE, key="samples_per_s")
    spreads["clustering"] = ratio_with_spread(configs, "clustered_kjt", BASELINE)
    spreads["ikjt_on_clustered"] = ratio_with_spread(configs, RECD, "clustered_kjt")
    spreads["ikjt_on_clustered_no_preprocessing"] = ratio_with_spread(
        configs, "clustered_ikjt_nopre", "clustered_kjt_nopre"
    )
    main_analysis = analyses["with_preprocessing"]
    return {
        "profile": args.profile,
        "quick": args.quick,
        "rows": configs[BASELINE]["rows"],
        "batch_size": args.batch_size,
        "recd_batch_size": args.recd_batch_size,
        **{key: spreads[key]["value"] for key in HEADLINES},
        "reader_speedup_wall": spreads["reader_speedup_wall"]["value"],
        "reader_speedup_basis": (
            f"samples per CPU-second of the reader process (1 thread): {RECD} (clustered "
            f"table, IKJT groups proposed by recd analyze's cost model) over {BASELINE}, both "
            f"at batch {args.batch_size}, both with preprocessing, over the whole table"
        ),
        "headlines": spreads,
        "speedup_parts": {
            "clustering": cpu_ratio("clustered_kjt", BASELINE),
            "ikjt_on_clustered": cpu_ratio(RECD, "clustered_kjt"),
            "ikjt_on_unclustered": cpu_ratio("unclustered_ikjt", BASELINE),
            "larger_batch_kjt": cpu_ratio("unclustered_kjt_large", BASELINE),
            "larger_batch_ikjt": cpu_ratio(RECD_FULL, RECD),
            "ikjt_on_clustered_no_preprocessing": cpu_ratio(
                "clustered_ikjt_nopre", "clustered_kjt_nopre"
            ),
        },
        "wire_bytes_ratio": wire["clustered_kjt"]["pickled_bytes_per_batch"]
        / wire[RECD]["pickled_bytes_per_batch"],
        "wire_bytes_ratio_tensor": wire["clustered_kjt"]["wire_bytes_per_batch"]
        / wire[RECD]["wire_bytes_per_batch"],
        "wire_bytes_ratio_large": wire["clustered_kjt_large"]["pickled_bytes_per_batch"]
        / wire[RECD_FULL]["pickled_bytes_per_batch"],
        "bytes_read_per_sample": {
            "clustered": configs["clustered_kjt"]["read_bytes_per_sample"],
            "unclustered": configs[BASELINE]["read_bytes_per_sample"],
            "dedup_layout": configs["dedup_ikjt"]["read_bytes_per_sample"],
        },
        "table_bytes": {
            "unclustered": data["table_bytes_unclustered"],
            "clustered": data["table_bytes_clustered"],
            "dedup_layout": data.get("table_bytes_dedup"),
            "dedup_encoded_features": data.get("dedup_encoded_features"),
        },
        "samples_per_cpu_s": {name: c["samples_per_cpu_s"] for name, c in configs.items()},
        "samples_per_s": {name: c["samples_per_s"] for name, c in configs.items()},
        "time_split": {
            name: {"cpu_s_per_1k": c["cpu_s_per_1k"], "share": c["time_share"]}
            for name, c in configs.items()
        },
        "torchrec_reference_samples_per_cpu_s": {
            "unclustered": configs["torchrec_unclustered"]["samples_per_cpu_s"],
            "clustered": configs["torchrec_clustered"]["samples_per_cpu_s"],
        },
        "speedup_vs_torchrec": {
            "unclustered_kjt_vs_torchrec_unclustered": cpu_ratio(BASELINE, "torchrec_unclustered"),
            "clustered_ikjt_vs_torchrec_clustered": cpu_ratio(RECD, "torchrec_clustered"),
            "clustered_ikjt_vs_torchrec_unclustered": cpu_ratio(RECD, "torchrec_unclustered"),
        },
        "dedup_sparse_features": main_analysis.dedup_sparse_features,
        "dedup_groups_source": (
            f"recd analyze's cost-aware proposal for the clustered table at batch "
            f"{args.batch_size} (with preprocessing); per job in `analysis`"
        ),
        "analysis": {
            job: {
                "batch_size": a.batch_size,
                "cost_model": a.cost_model,
                "dedup_sparse_features": a.dedup_sparse_features,
                "groups": [asdict(g) for g in a.groups],
                "rejected": [asdict(g) for g in a.rejected],
            }
            for job, a in analyses.items()
        },
        "dedup_group_factors": {
            "+".join(g.features): g.measured_factor for g in main_analysis.groups
        },
        "samples_per_session": main_analysis.samples_per_session,
        "preprocessing": job_preprocessing(load_catalogue(args.profile)),
        "window": window,
        "data": data,
        "reps": args.reps,
        "warmup_batches": args.warmup_batches,
        "threads": {"torch": torch.get_num_threads(), "pyarrow_cpu": pa.cpu_count()},
        "cpu_count": os.cpu_count(),
        "wire": wire,
        "configs": configs,
        "targets": {"reader_speedup": 1.5 if args.profile == "rm1-like" else 1.0},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", choices=PROFILES, default="rm1-like")
    parser.add_argument("--quick", action="store_true", help="CI size: 20k rows, batch 512")
    parser.add_argument("--rows", type=int, help="rows to generate (default 300k, quick 20k)")
    parser.add_argument(
        "--batch-size", type=int, help="rows per batch of every job (default 2048, quick 512)"
    )
    parser.add_argument(
        "--recd-batch-size",
        type=int,
        help="rows per batch of the *_large configs (default 3x --batch-size, as the paper's "
        "RM1: 2048 -> 6144)",
    )
    parser.add_argument("--shards", type=int, help="log-bus shards (default 16, quick 4)")
    parser.add_argument("--row-group-rows", type=int, default=8192)
    parser.add_argument("--reps", type=int, help="repetitions (default 5, at least 3)")
    parser.add_argument("--warmup-batches", type=int, default=3)
    parser.add_argument(
        "--min-measure-s",
        type=float,
        help="CPU seconds of whole passes per measurement (default 2, quick 0: one pass)",
    )
    parser.add_argument(
        "--interleave",
        choices=INTERLEAVES,
        default="pass",
        help="pass (default): each repetition in rounds of one pass per config, random order "
        "per round, until every config has --min-measure-s; measurement: each config's "
        "passes back to back (the protocol before)",
    )
    parser.add_argument("--wire-batches", type=int, default=20, help="batches to pickle")
    parser.add_argument(
        "--check-batches", type=int, default=3, help="batches compared across configs"
    )
    parser.add_argument(
        "--window",
        choices=("all", "full", "same-files"),
        default="all",
        help="all (default): every partition; full: the leading partitions where both tables "
        "hold as many files and each partition at least one full row group (a secondary "
        "figure); same-files: without the row-group rule",
    )
    parser.add_argument("--seed", type=int, default=1, help="data seed and order seed")
    parser.add_argument(
        "--system-malloc",
        action="store_true",
        help="keep glibc's dynamic malloc thresholds (the default fixes them, as reader "
        "worker processes do: recd.reader.keep_freed_memory)",
    )
    parser.add_argument("--work-dir", type=Path, help="keep (and reuse) the tables here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.rows = args.rows or (20_000 if args.quick else 300_000)
    args.batch_size = args.batch_size or (512 if args.quick else 2048)
    args.recd_batch_size = args.recd_batch_size or 3 * args.batch_size
    args.shards = args.shards or (4 if args.quick else 16)
    args.reps = args.reps or 5
    if args.min_measure_s is None:
        args.min_measure_s = 0.0 if args.quick else 2.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = " ".join(["python benchmarks/reader.py", *(sys.argv[1:] if argv is None else argv)])
    # Every config runs in this process as a reader worker process runs (fixed malloc
    # thresholds, recd.reader.memory), unless --system-malloc asks for glibc's defaults.
    malloc = "glibc defaults" if args.system_malloc else "glibc defaults (not glibc)"
    if not args.system_malloc and keep_freed_memory():
        malloc = (
            f"fixed thresholds as reader workers run (mmap {MMAP_THRESHOLD_BYTES >> 20} MiB, "
            f"trim {TRIM_THRESHOLD_BYTES >> 20} MiB)"
        )
    saved = torch.get_num_threads(), pa.cpu_count(), pa.io_thread_count()
    torch.set_num_threads(1)  # one reader process = one core
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    try:
        with tempfile.TemporaryDirectory(prefix="recd-reader-") as tmp:
            work = args.work_dir or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            result = run(args, work)
    finally:
        torch.set_num_threads(saved[0])
        pa.set_cpu_count(saved[1])
        pa.set_io_thread_count(saved[2])
    result = {"command": command, **result}
    result["protocol"]["command"] = command
    result["protocol"]["malloc"] = malloc
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "reader" if args.profile == "rm1-like" else f"reader_{args.profile}"
    stem += "_quick" if args.quick else ""
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = markdown(result)
    (args.out / f"{stem}.md").write_text(f"Command: `{command}`\n\n{table}")
    plot(result, args.out / f"{stem}.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
