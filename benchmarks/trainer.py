"""Trainer benchmark (RecD O5-O7, the paper's Figure 9 ablation) on the RM1-like model.

    python benchmarks/trainer.py            # rm1-like, 100k rows, base batch 2048 (~15 min)
    python benchmarks/trainer.py --quick    # rm1-like, 10k rows, base batch 256 (CI size)

Data: rm1-like logs are generated, sharded both ways and ETL'd into a clustered table (session
shards, O2) and an unclustered one (arrival order, from the random shards), as
``recd.pipeline`` does; ``--work-dir`` keeps them (and the converted batches) for the next run.

Model (``models.rm1``): the RM1-like DLRM of the catalogue, every history feature embedded per
position and pooled by one transformer per synchronised group (4 groups), the other 50 sparse
features pooled by an EmbeddingBagCollection; sizes in :class:`ModelSize` (the JSON reports
parameter counts). Optimizer: ``recd.optim.ModelAdam`` (Adam for the dense layers, the lazy
row-sparse Adam for the tables; lr 3e-3 everywhere, so that the one pass of the accuracy runs
learns something). Reader job: ``dedup_sparse_features = models.dedup_groups``
(one IKJT per sequence group and per user-side feature), ids hashed into the table sizes,
histories truncated to the transformer length, ``log1p`` of the dense features.

The ablation, one trainer process (``torch.set_num_threads(--threads)``, default 1: one process
= one core; on this shared 2-core machine two intra-op threads made the many small ops wait on
OpenMP barriers whenever another process held a core):

1. ``kjt``: DedupMode.OFF fed plain KJTs (every IKJT expanded to the batch, as a reader
   without dedup delivers them) from the clustered table;
2. ``ikjt_lookup``: DedupMode.LOOKUP: lookups and pooling on distinct rows, sequence
   embeddings expanded with ``jagged_index_select`` before the transformers (O5);
3. ``ikjt_groups``: DedupMode.FULL: each transformer runs once per distinct sequence (O6);
4. ``ikjt_groups_max_batch``: FULL at the largest batch whose peak memory fits the peak of
   (1) at the base batch (O7), found by doubling then bisection.

Every configuration runs in its own child process, forked from a server process that has only
imported the libraries (multiprocessing ``forkserver``; peak RSS = that child's ``ru_maxrss``,
on CUDA ``torch.cuda.max_memory_allocated``), on the same batches converted beforehand from the
clustered table at each batch size (loaded one at a time, outside the timed region), with the
same initial weights; warm-up steps are excluded; samples/s = batch / median step time over
the timed steps of ``--reps`` child runs (interleaved over the configs, so background load
spreads evenly). Step = zero_grad + forward + BCE loss + backward + optimizer step. Also
reported: samples per CPU-second of the child (robust to other processes on the machine).

Also: (1) and (3) on 2 processes (gloo, DMP table-wise via ``recd.train.sharding``; each rank
a batch of the base size, 1 thread each, so twice the cores of the 1-thread single-process
rows): it shows the hybrid-parallel path runs on IKJTs and what it costs. Accuracy: the same model trained for the same number
of steps (batch = base batch, one pass over the training partitions, same seed) on the
clustered and on the unclustered table, evaluated (NE, AUC) on the held-out latest hourly
partitions (the fewest at the end of the table holding >= ``--holdout-fraction`` of the rows).

Writes benchmarks/results/trainer.json, trainer.md and trainer.png (``--quick``:
trainer_quick.*).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import pickle
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

RESULTS = Path(__file__).resolve().parent / "results"
PROFILE = "rm1-like"
DATA_STAMP = "trainer_data.json"
BATCHES_META = "meta.json"
BASELINE = "kjt"
CONFIGS: dict[str, str] = {
    "kjt": "off",
    "ikjt_lookup": "lookup",
    "ikjt_groups": "full",
    "ikjt_groups_max_batch": "full",
}
"""Ablation step -> models.DedupMode value."""
LABELS = {
    "kjt": "KJT baseline",
    "ikjt_lookup": "+ IKJT lookups",
    "ikjt_groups": "+ IKJT groups\n(transformer dedup)",
    "ikjt_groups_max_batch": "+ larger batch",
}
TARGETS = {"speedup_ikjt_groups": 2.0, "max_batch_ratio": 2.0}
DIST_WORLD = 2
"""Processes of the distributed runs (gloo, one thread each)."""
DIST_WARMUP = 1
"""Untimed steps of each distributed run."""


@dataclass(kw_only=True, slots=True)
class ModelSize:
    """Size of the RM1-like model (modest: the full benchmark runs in minutes on 2 cores)."""

    embedding_dim: int = 32
    """E: embeddings, bottom MLP output and transformer width."""
    max_rows: int = 20_000
    """Rows per table (``min(cardinality, max_rows)``; ids hashed into it)."""
    seq_len: int = 64
    """Positions per sequence kept (histories truncated to their last ``seq_len`` ids)."""
    num_heads: int = 2
    """Attention heads per transformer."""
    ff_dim: int = 64
    """Feed-forward width of each transformer layer."""
    num_layers: int = 1
    """Transformer layers per sequence group."""


DEFAULT_SIZE = ModelSize()


# ---------------------------------------------------------------------- model and reader job
def model_config(size: ModelSize, dedup: str) -> Any:
    """The RM1-like ``ModelConfig`` of the rm1-like catalogue at ``size``."""
    from models import DedupMode, rm1_config
    from models.sequence import SequenceConfig
    from recd.schema import load_catalogue

    return rm1_config(
        load_catalogue(PROFILE),
        embedding_dim=size.embedding_dim,
        max_rows=size.max_rows,
        sequence=SequenceConfig(
            max_seq_len=size.seq_len,
            num_heads=size.num_heads,
            ff_dim=size.ff_dim,
            num_layers=size.num_layers,
        ),
        dedup=DedupMode(dedup),
    )


def reader_config(
    table: Path,
    size: ModelSize,
    *,
    batch_size: int,
    start: str | None = None,
    end: str | None = None,
    drop_last: bool = True,
) -> Any:
    """The reader job every configuration trains on (dedup groups, hashing, truncation)."""
    from models import dedup_groups, table_sizes
    from recd.reader import ReaderConfig
    from recd.schema import SparseKind, load_catalogue

    catalogue = load_catalogue(PROFILE)
    by_rows: dict[int, list[str]] = {}
    for feature, rows in table_sizes(catalogue, max_rows=size.max_rows).items():
        by_rows.setdefault(rows, []).append(feature)
    histories = [f.name for f in catalogue.sparse if f.kind is SparseKind.HISTORY]
    preprocessing: list[dict[str, Any]] = [
        {"kind": "hash_modulo", "features": features, "modulo": rows}
        for rows, features in sorted(by_rows.items())
    ]
    preprocessing.append({"kind": "truncate_last", "features": histories, "n": size.seq_len})
    preprocessing.append({"kind": "log1p", "features": catalogue.dense_names})
    return ReaderConfig(
        table=str(table),
        start=start,
        end=end,
        batch_size=batch_size,
        dedup_sparse_features=dedup_groups(catalogue),
        preprocessing=preprocessing,
        drop_last=drop_last,
    )


def describe_model(size: ModelSize) -> dict[str, Any]:
    """Parameter counts of the model (tables vs dense layers) and its feature layout."""
    from models import DLRM
    from recd.optim import embedding_parameter_names

    config = model_config(size, "full")
    model = DLRM(config)
    tables = embedding_parameter_names(model)
    named = dict(model.named_parameters())
    table_params = sum(named[n].numel() for n in tables)
    total = sum(p.numel() for p in named.values())
    return {
        **asdict(size),
        "parameters": total,
        "table_parameters": table_params,
        "dense_parameters": total - table_params,
        "num_tables": len(tables),
        "sequence_groups": config.sequence_groups,
        "num_pooled_features": len(config.pooled_features),
        "state_bytes_with_adam": 3 * 4 * total,
    }


# ---------------------------------------------------------------------- data
def prepare_tables(
    work: Path, *, rows: int, seed: int, num_shards: int, row_group_rows: int
) -> dict[str, Any]:
    """rm1-like into ``work/table`` (clustered) and ``work/table_baseline`` (arrival order),
    reused when ``work`` already holds the same (:func:`recd.pipeline.reuse_or_build_tables`;
    a rebuild also drops the cached batches)."""
    from recd.pipeline import reuse_or_build_tables

    return reuse_or_build_tables(
        work,
        PROFILE,
        stamp=DATA_STAMP,
        seed=seed,
        rows=rows,
        num_shards=num_shards,
        row_group_rows=row_group_rows,
        derived=("batches",),
    )


def partition_rows(table: Path) -> list[tuple[str, int]]:
    """``(ds/hour, rows)`` of every committed partition of ``table``, in time order."""
    from recd.etl.commit import committed_partition_dirs

    out = []
    for partition, directory in committed_partition_dirs(table):
        rows = sum(pq.ParquetFile(p).metadata.num_rows for p in sorted(directory.glob("*.parquet")))
        out.append((f"{partition.ds}/{partition.hour:02d}", rows))
    return out


def choose_holdout(partitions: list[tuple[str, int]], fraction: float) -> tuple[str, int, int]:
    """The fewest latest partitions holding >= ``fraction`` of the rows (at least one, and at
    least one partition left to train on): ``(first held-out partition, held-out rows, train
    rows)``."""
    if len(partitions) < 2:
        raise ValueError(f"need at least 2 partitions to hold one out, the table has {partitions}")
    total = sum(rows for _, rows in partitions)
    held = 0
    first = len(partitions)
    while first > 1 and (first == len(partitions) or held < fraction * total):
        first -= 1
        held += partitions[first][1]
    return partitions[first][0], held, total - held


def write_batches(
    table: Path, out_dir: Path, size: ModelSize, *, batch_size: int, count: int
) -> dict[str, Any]:
    """Convert the first ``count`` full batches of ``table`` (the reader job) into
    ``out_dir/NNNNN.pkl``; reuse them when ``out_dir`` already holds the same."""
    from recd.reader import iter_batches

    wanted = {"table": str(table), "batch_size": batch_size, "size": asdict(size)}
    meta_path = out_dir / BATCHES_META
    if meta_path.is_file():
        meta: dict[str, Any] = json.loads(meta_path.read_text())
        same = {k: meta.get(k) for k in wanted} == wanted
        if same and (meta["count"] >= count or meta["exhausted"]):
            return meta
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    distinct: dict[str, list[int]] = {}
    written = 0
    for batch in iter_batches(reader_config(table, size, batch_size=batch_size)):
        with (out_dir / f"{written:05d}.pkl").open("wb") as f:
            pickle.dump(batch, f, protocol=pickle.HIGHEST_PROTOCOL)
        for ikjt in batch.sparse.ikjts:
            distinct.setdefault("+".join(ikjt.keys()), []).append(ikjt.num_distinct())
        written += 1
        if written == count:
            break
    if written == 0:
        raise ValueError(f"{table}: no full batch of {batch_size} rows")
    meta = {
        **wanted,
        "count": written,
        "exhausted": written < count,
        "dedup_factor": {k: batch_size / statistics.fmean(v) for k, v in distinct.items()},
    }
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return meta


# ---------------------------------------------------------------------- child processes
PRELOAD = ["torch", "torchrec", "fbgemm_gpu", "models", "recd.optim", "recd.reader", "psutil"]
"""Imported once by the fork server: each child then starts in a fraction of a second (a fresh
interpreter importing torchrec takes 5-15 s on a busy 2-core machine)."""


@functools.cache
def fork_context() -> Any:
    """multiprocessing's forkserver context with :data:`PRELOAD` imported in the server.

    Children fork from that server, a fresh process holding nothing but the imported
    libraries (never from this process and its tables or batches), so each child's peak RSS
    is the libraries' pages it touches plus its own work, the same for every configuration.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _child_entry(kind: str, spec: dict[str, Any], result_path: str, env: dict[str, str]) -> None:
    """Body of every child process: run ``CHILDREN[kind](spec)``, write its result (JSON) or
    its traceback (``.err``) next to ``result_path``."""
    import torch

    os.environ.update({"RECD_PROGRESS": "0", **env})
    out = Path(result_path)
    try:
        result = CHILDREN[kind](spec)
        result.update(_peak_bytes(torch.device(spec.get("device", "cpu"))))
        result["threads"] = torch.get_num_threads()
        out.with_suffix(".tmp").write_text(json.dumps(result))
        out.with_suffix(".tmp").replace(out)
    except BaseException:
        out.with_suffix(".err").write_text(traceback.format_exc())
        raise


def run_children(
    kind: str,
    specs: list[dict[str, Any]],
    scratch: Path,
    *,
    envs: list[dict[str, str]] | None = None,
    timeout_s: float = 3600.0,
) -> list[dict[str, Any]]:
    """Run one child per spec, all at once (one alone for a clean measurement); return their
    results in order. A failure or timeout kills the others and raises RuntimeError with the
    failing child's traceback."""
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = fork_context()
    procs = []
    for i, spec in enumerate(specs):
        fd, name = tempfile.mkstemp(prefix=f"{kind}-", suffix=".json", dir=scratch)
        os.close(fd)
        env = {} if envs is None else envs[i]
        proc = ctx.Process(target=_child_entry, args=(kind, spec, name, env), daemon=True)
        proc.start()
        procs.append((proc, Path(name)))
    deadline = time.monotonic() + timeout_s
    errors = []
    for i, (proc, result) in enumerate(procs):
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            errors.append(f"{kind} child {i}: still running after {timeout_s:.0f} s")
        elif proc.exitcode != 0:
            err = result.with_suffix(".err")
            detail = err.read_text()[-3000:] if err.is_file() else f"exit code {proc.exitcode}"
            errors.append(f"{kind} child {i} ({specs[i].get('mode', '')}) failed: {detail}")
        if errors:
            break
    if errors:
        time.sleep(0.5)  # let a peer that crashed first finish dying (its exit code is read)
        crashed = [
            f"child {i}: signal {-proc.exitcode}"
            for i, (proc, _) in enumerate(procs)
            if proc.exitcode is not None and proc.exitcode < 0
        ]
        if crashed:
            errors.append(f"killed by a signal: {', '.join(crashed)}")
        for proc, _ in procs:
            if proc.is_alive():
                proc.kill()
                proc.join(10)
        raise RuntimeError("\n".join(errors))
    return [json.loads(result.read_text()) for _, result in procs]


def _load_batch(path: Path, *, plain: bool, device: Any) -> Any:
    """A converted batch; ``plain``: every IKJT expanded into one KJT (what a reader without
    dedup delivers to the KJT baseline)."""
    from recd.batch import Batch, SparseFeatures

    with path.open("rb") as f:
        batch = pickle.load(f)
    if plain:
        sparse = SparseFeatures(batch_size=batch.batch_size, kjt=batch.sparse.to_kjt())
        batch = Batch(dense=batch.dense, sparse=sparse, labels=batch.labels)
    return batch.to(device)


def _current_rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _peak_bytes(device: Any) -> dict[str, int | None]:
    import torch

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    cuda = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"peak_rss_bytes": rss, "peak_cuda_bytes": cuda, "peak_bytes": cuda or rss}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Train ``warmup + steps`` steps of one configuration on pre-converted batches."""
    import torch

    from models import DLRM, bce_loss
    from recd.optim import AdamConfig, ModelAdam

    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    size = ModelSize(**spec["size"])
    torch.manual_seed(spec["seed"])
    model = DLRM(model_config(size, spec["mode"]), device=device)
    opt = ModelAdam.for_model(model, AdamConfig(lr=spec["lr"]))
    rss_ready = _current_rss_bytes()
    files = sorted(Path(spec["batch_dir"]).glob("*.pkl"))
    plain = spec["mode"] == "off"
    wall, cpu, losses = [], [], []
    for i in range(spec["warmup"] + spec["steps"]):
        batch = _load_batch(files[i % len(files)], plain=plain, device=device)
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        loss = bce_loss(model(batch.dense, batch.sparse), batch.labels)
        loss.backward()
        opt.step()
        _sync(device)
        t1, c1 = time.perf_counter(), time.process_time()
        losses.append(loss.item())
        if i >= spec["warmup"]:
            wall.append(t1 - t0)
            cpu.append(c1 - c0)
        del batch, loss
    return {"step_s": wall, "step_cpu_s": cpu, "losses": losses, "rss_ready_bytes": rss_ready}


def dist_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One rank of a 2-process (gloo) run: DMP with ``spec['plan']``, rank r trains on batches
    r, r + W, r + 2W, ... (each of the base size)."""
    import datetime

    import torch
    import torch.distributed as dist

    from models import bce_loss
    from recd.optim import AdamConfig
    from recd.train.sharding import build_sharded_training

    torch.set_num_threads(spec["threads"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=spec["timeout_s"]))
    device = torch.device("cpu")
    try:
        dmp, opt = build_sharded_training(
            model_config(ModelSize(**spec["size"]), spec["mode"]),
            AdamConfig(lr=spec["lr"]),
            plan=spec["plan"],
            seed=spec["seed"],
        )
        rss_ready = _current_rss_bytes()
        files = sorted(Path(spec["batch_dir"]).glob("*.pkl"))
        plain = spec["mode"] == "off"
        wall, cpu, losses = [], [], []
        for i in range(spec["warmup"] + spec["steps"]):
            batch = _load_batch(files[(i * world + rank) % len(files)], plain=plain, device=device)
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            opt.zero_grad()
            loss = bce_loss(dmp(batch.dense, batch.sparse), batch.labels)
            loss.backward()
            opt.step()
            t1, c1 = time.perf_counter(), time.process_time()
            losses.append(loss.item())
            if i >= spec["warmup"]:
                wall.append(t1 - t0)
                cpu.append(c1 - c0)
        opt.close()
    finally:
        dist.destroy_process_group()
    return {
        "rank": rank,
        "step_s": wall,
        "step_cpu_s": cpu,
        "losses": losses,
        "rss_ready_bytes": rss_ready,
    }


def accuracy_child(spec: dict[str, Any]) -> dict[str, Any]:
    """Train ``steps`` steps on the training partitions of one table, then evaluate on the
    held-out partitions: loss, NE and AUC."""
    import torch

    from models import DLRM, bce_loss
    from recd.optim import AdamConfig, ModelAdam
    from recd.reader import iter_batches
    from recd.train.metrics import bce_from_logits, normalized_entropy, roc_auc

    torch.set_num_threads(spec["threads"])
    size = ModelSize(**spec["size"])
    table = Path(spec["table"])
    torch.manual_seed(spec["seed"])
    model = DLRM(model_config(size, "full"))
    opt = ModelAdam.for_model(model, AdamConfig(lr=spec["lr"]))
    train = reader_config(table, size, batch_size=spec["batch_size"], end=spec["holdout_start"])
    losses: list[float] = []
    start = time.perf_counter()
    model.train()
    for batch in iter_batches(train):
        if len(losses) == spec["steps"]:
            break
        opt.zero_grad()
        loss = bce_loss(model(batch.dense, batch.sparse), batch.labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    train_s = time.perf_counter() - start
    held_out = reader_config(
        table,
        size,
        batch_size=spec["batch_size"],
        start=spec["holdout_start"],
        drop_last=False,
    )
    logits, labels = [], []
    model.eval()
    with torch.no_grad():
        for batch in iter_batches(held_out):
            logits.append(model(batch.dense, batch.sparse))
            labels.append(batch.labels)
    all_logits, all_labels = torch.cat(logits), torch.cat(labels)
    return {
        "table": str(table),
        "steps": len(losses),
        "train_losses": losses,
        "train_s": train_s,
        "eval_rows": int(all_labels.shape[0]),
        "eval_loss": bce_from_logits(all_logits, all_labels),
        "ne": normalized_entropy(all_logits, all_labels),
        "auc": roc_auc(all_logits, all_labels),
        "eval_label_rate": float(all_labels.mean()),
    }


CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "step": step_child,
    "dist": dist_child,
    "accuracy": accuracy_child,
}


# ---------------------------------------------------------------------- measurement
def summarise(runs: list[dict[str, Any]], batch_size: int) -> dict[str, Any]:
    """samples/s from the median step over all timed steps of all runs; peaks (median)."""
    wall = [s for r in runs for s in r["step_s"]]
    cpu = [s for r in runs for s in r["step_cpu_s"]]
    return {
        "batch_size": batch_size,
        "samples_per_s": batch_size / statistics.median(wall),
        "samples_per_cpu_s": batch_size / statistics.median(cpu),
        "step_ms_median": 1000 * statistics.median(wall),
        "step_ms": [1000 * s for s in wall],
        "peak_rss_bytes": int(statistics.median(r["peak_rss_bytes"] for r in runs)),
        "peak_bytes": int(statistics.median(r["peak_bytes"] for r in runs)),
        "rss_ready_bytes": int(statistics.median(r["rss_ready_bytes"] for r in runs)),
        "peak_cuda_bytes": runs[0]["peak_cuda_bytes"],
        "losses": runs[0]["losses"],
        "threads": runs[0]["threads"],
        "runs": len(runs),
    }


def search_max_batch(
    base: int,
    budget_bytes: int,
    peak_of: Callable[[int], int],
    *,
    granularity: int,
    max_batch: int,
) -> tuple[int, list[dict[str, Any]]]:
    """Largest batch (a multiple of ``granularity``, <= ``max_batch``) whose ``peak_of`` fits
    ``budget_bytes``, assuming ``base`` fits and peaks grow with the batch: double from
    ``2 * base`` until one does not fit, then bisect. Returns it and every probe."""
    probes: list[dict[str, Any]] = []

    def fits(batch: int) -> bool:
        peak = peak_of(batch)
        ok = peak <= budget_bytes
        probes.append({"batch_size": batch, "peak_bytes": peak, "fits": ok})
        return ok

    lo, hi = base, None
    candidate = min(2 * base, max_batch)
    while candidate > lo:
        if not fits(candidate):
            hi = candidate
            break
        lo, candidate = candidate, min(2 * candidate, max_batch)
    if hi is None:
        return lo, probes
    while hi - lo > granularity:
        mid = (lo + hi) // 2 // granularity * granularity
        if mid <= lo:
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


class Bench:
    """Runs the measurements of one benchmark invocation (children, batches, scratch)."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.size = ModelSize(
            embedding_dim=args.embedding_dim,
            max_rows=args.max_rows,
            seq_len=args.seq_len,
            num_heads=args.num_heads,
            ff_dim=args.ff_dim,
            num_layers=args.num_layers,
        )
        self.scratch = work / "scratch"
        self.table = work / "table"
        self.batch_meta: dict[int, dict[str, Any]] = {}
        self.base_batches = max(
            args.warmup_steps + args.steps, DIST_WORLD * (DIST_WARMUP + args.dist_steps)
        )
        """Batches converted at the base size: the ablation uses the first ones, the
        2-process runs all of them (rank r takes r, r + 2, ...)."""

    def batches(self, batch_size: int, count: int) -> Path:
        out = self.work / "batches" / f"B{batch_size}"
        meta = write_batches(self.table, out, self.size, batch_size=batch_size, count=count)
        self.batch_meta[batch_size] = meta
        return out

    def spec(self, mode: str, batch_size: int, *, warmup: int, steps: int) -> dict[str, Any]:
        count = warmup + steps
        if batch_size == self.args.batch_size:  # one set of base batches for every use
            count = max(count, self.base_batches)
        return {
            "mode": mode,
            "batch_dir": str(self.batches(batch_size, count)),
            "size": asdict(self.size),
            "seed": self.args.seed,
            "lr": self.args.lr,
            "threads": self.args.threads,
            "device": self.args.device,
            "warmup": warmup,
            "steps": steps,
        }

    def step(self, mode: str, batch_size: int, *, warmup: int, steps: int) -> dict[str, Any]:
        spec = self.spec(mode, batch_size, warmup=warmup, steps=steps)
        (result,) = run_children("step", [spec], self.scratch)
        ms = 1000 * statistics.median(result["step_s"])
        print(
            f"  {mode:<6} B={batch_size:<6} {batch_size / ms * 1000:>8,.0f} samples/s "
            f"(step {ms:,.0f} ms), peak {result['peak_bytes'] / 2**20:,.0f} MiB",
            flush=True,
        )
        return result

    def ablation(self) -> dict[str, Any]:
        """Configs 1-3 at the base batch (interleaved reps), the search, then config 4."""
        a = self.args
        base = a.batch_size
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
        for rep in range(a.reps):
            print(f"ablation rep {rep + 1}/{a.reps} at batch {base} ...", flush=True)
            for name in ("kjt", "ikjt_lookup", "ikjt_groups"):
                runs[name].append(
                    self.step(CONFIGS[name], base, warmup=a.warmup_steps, steps=a.steps)
                )
        configs = {n: summarise(runs[n], base) for n in ("kjt", "ikjt_lookup", "ikjt_groups")}
        budget = configs[BASELINE]["peak_bytes"]
        print(
            f"searching the largest FULL batch within the baseline's peak "
            f"{budget / 2**20:,.0f} MiB ...",
            flush=True,
        )
        granularity = max(base // a.search_granularity_div, 1)
        max_batch = min(a.max_batch_factor * base, self.table_rows // 2)
        max_batch = max(max_batch // granularity * granularity, base)

        def peak_of(batch_size: int) -> int:
            return int(self.step("full", batch_size, warmup=1, steps=1)["peak_bytes"])

        best, probes = search_max_batch(
            base, budget, peak_of, granularity=granularity, max_batch=max_batch
        )
        print(f"timing FULL at batch {best} ...", flush=True)
        for _ in range(a.reps):
            runs["ikjt_groups_max_batch"].append(
                self.step("full", best, warmup=a.warmup_steps, steps=a.steps)
            )
        configs["ikjt_groups_max_batch"] = summarise(runs["ikjt_groups_max_batch"], best)
        for name, c in configs.items():
            c["mode"] = CONFIGS[name]
            c["dedup_factor"] = self.batch_meta[c["batch_size"]]["dedup_factor"]
            c["max_abs_loss_diff_vs_kjt"] = (
                max(
                    abs(x - y)
                    for x, y in zip(c["losses"], configs[BASELINE]["losses"], strict=True)
                )
                if c["batch_size"] == base
                else None
            )
        search = {
            "budget_bytes": budget,
            "budget_source": "peak of kjt at the base batch",
            "granularity": granularity,
            "max_batch_searched": max_batch,
            "probes": probes,
            "max_batch_size": best,
            "probe_steps": "1 warm-up + 1 step per probe",
        }
        return {"configs": configs, "search": search}

    def distributed(self) -> dict[str, Any]:
        """Configs 1 and 3 on 2 gloo processes (table-wise DMP), if recd.train.sharding is
        available; otherwise recorded as not measured, with the reason."""
        a = self.args
        try:
            import recd.train.sharding  # noqa: F401
        except Exception as exc:  # any import failure means: not measured here
            return {"measured": False, "reason": f"recd.train.sharding unavailable: {exc!r}"}
        world = DIST_WORLD
        out: dict[str, Any] = {
            "measured": True,
            "world_size": world,
            "backend": "gloo",
            "plan": a.dist_plan,
            "per_rank_batch_size": a.batch_size,
            "global_batch_size": world * a.batch_size,
            "threads_per_rank": 1,
            "note": "1 thread per rank, so 2 ranks use twice the cores of the 1-thread "
            "single-process rows; this shows the hybrid-parallel path runs on IKJTs and what it "
            "costs here",
            "configs": {},
        }
        for name in ("kjt", "ikjt_groups"):
            spec = self.spec(CONFIGS[name], a.batch_size, warmup=DIST_WARMUP, steps=a.dist_steps)
            spec.update(threads=1, plan=a.dist_plan, timeout_s=600)
            try:
                ranks = run_ranks(spec, self.scratch, world)
            except RuntimeError as exc:
                print(f"  2 processes, {name}: failed: {str(exc)[-300:]}", flush=True)
                out["configs"][name] = {"measured": False, "reason": str(exc)[-2000:]}
                continue
            steps_s = [max(r["step_s"][i] for r in ranks) for i in range(a.dist_steps)]
            median = statistics.median(steps_s)
            out["configs"][name] = {
                "measured": True,
                "mode": CONFIGS[name],
                "samples_per_s": world * a.batch_size / median,
                "step_ms_median": 1000 * median,
                "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in ranks],
                "losses_rank0": ranks[0]["losses"],
            }
            print(
                f"  2 processes, {name}: {world * a.batch_size / median:,.0f} samples/s "
                f"(step {1000 * median:,.0f} ms)",
                flush=True,
            )
        c = out["configs"]
        if c.get("kjt", {}).get("measured") and c.get("ikjt_groups", {}).get("measured"):
            out["speedup_ikjt_groups"] = (
                c["ikjt_groups"]["samples_per_s"] / c["kjt"]["samples_per_s"]
            )
        return out

    def accuracy(self) -> dict[str, Any]:
        """NE on the held-out partitions after the same steps on each table (run side by
        side: one child per table, one thread each)."""
        a = self.args
        partitions = partition_rows(self.table)
        holdout_start, held_rows, train_rows = choose_holdout(partitions, a.holdout_fraction)
        steps = train_rows // a.batch_size
        if a.train_steps:
            steps = min(steps, a.train_steps)
        print(
            f"accuracy: {steps} steps of {a.batch_size} on each table, held out from "
            f"{holdout_start} ({held_rows:,} rows) ...",
            flush=True,
        )
        tables = {"clustered": self.table, "unclustered": self.work / "table_baseline"}
        specs = {
            name: {
                "table": str(table),
                "holdout_start": holdout_start,
                "steps": steps,
                "batch_size": a.batch_size,
                "size": asdict(self.size),
                "seed": a.seed,
                "lr": a.lr,
                "threads": 1,
                "device": "cpu",
            }
            for name, table in tables.items()
        }
        results = dict(
            zip(specs, run_children("accuracy", list(specs.values()), self.scratch), strict=True)
        )
        out: dict[str, Any] = {
            "batch_size": a.batch_size,
            "steps": steps,
            "holdout_start": holdout_start,
            "holdout_rows": held_rows,
            "train_rows": train_rows,
            "holdout_partitions": [p for p, _ in partitions if p >= holdout_start],
            "mode": "full (same arithmetic as off)",
        }
        for name, r in results.items():
            out[name] = {k: v for k, v in r.items() if k != "train_losses"}
            tail = r["train_losses"][-10:]
            out[name]["train_loss_last10"] = statistics.fmean(tail) if tail else None
            print(
                f"  {name:<11} NE {r['ne']:.4f}  AUC {r['auc']:.4f}  ({r['steps']} steps, "
                f"{r['train_s']:.0f} s)",
                flush=True,
            )
        return out

    @property
    def table_rows(self) -> int:
        return sum(rows for _, rows in partition_rows(self.table))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(spec: dict[str, Any], scratch: Path, world: int) -> list[dict[str, Any]]:
    """``world`` children joined by gloo (``env://`` rendezvous, the variables torchrun sets)."""
    port = str(free_port())
    envs = [
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        for rank in range(world)
    ]
    return run_children("dist", [spec] * world, scratch, envs=envs, timeout_s=spec["timeout_s"])


# ---------------------------------------------------------------------- outputs
def headline(configs: dict[str, dict[str, Any]]) -> dict[str, float]:
    base = configs[BASELINE]

    def ratio(name: str, key: str) -> float:
        return float(configs[name][key] / base[key])

    return {
        "speedup_ikjt": ratio("ikjt_lookup", "samples_per_s"),
        "speedup_ikjt_groups": ratio("ikjt_groups", "samples_per_s"),
        "speedup_max_batch": ratio("ikjt_groups_max_batch", "samples_per_s"),
        "max_batch_ratio": configs["ikjt_groups_max_batch"]["batch_size"] / base["batch_size"],
        "speedup_ikjt_cpu": ratio("ikjt_lookup", "samples_per_cpu_s"),
        "speedup_ikjt_groups_cpu": ratio("ikjt_groups", "samples_per_cpu_s"),
        "speedup_max_batch_cpu": ratio("ikjt_groups_max_batch", "samples_per_cpu_s"),
        "peak_memory_ratio_ikjt_groups": ratio("ikjt_groups", "peak_bytes"),
    }


def markdown(r: dict[str, Any]) -> str:
    mib = 2**20
    m = r["model"]
    lines = [
        f"rm1-like, {r['data']['rows']:,} rows; RM1-like model: E = {m['embedding_dim']}, "
        f"{m['num_tables']} tables of <= {m['max_rows']:,} rows, "
        f"{len(m['sequence_groups'])} transformer groups ({m['num_layers']} layer, "
        f"{m['num_heads']} heads, ff {m['ff_dim']}, {m['seq_len']} positions), "
        f"{m['parameters'] / 1e6:.1f} M parameters. One process, {r['threads']} thread(s), "
        f"{r['device']}; {r['warmup_steps']} warm-up + {r['timed_steps']} timed steps x "
        f"{r['reps']} run(s) per config.",
        "",
        "| ablation step | batch | samples/s | vs KJT | samples/CPU-s | step | peak RSS "
        "| peak vs KJT |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = r["configs"][BASELINE]
    for name, c in r["configs"].items():
        lines.append(
            f"| {LABELS[name].replace(chr(10), ' ')} (`{name}`) | {c['batch_size']:,} "
            f"| {c['samples_per_s']:,.0f} | {c['samples_per_s'] / base['samples_per_s']:.2f}x "
            f"| {c['samples_per_cpu_s']:,.0f} | {c['step_ms_median']:,.0f} ms "
            f"| {c['peak_rss_bytes'] / mib:,.0f} MiB | {c['peak_bytes'] / base['peak_bytes']:.2f} |"
        )
    d = r["distributed"]
    if d.get("measured"):
        for name, c in d["configs"].items():
            value = (
                f"{c['samples_per_s']:,.0f} samples/s (step {c['step_ms_median']:,.0f} ms, "
                f"global batch {d['global_batch_size']:,})"
                if c.get("measured")
                else "failed: see JSON"
            )
            lines.append(f"| 2 processes ({d['plan']}), `{name}` | | {value} | | | | | |")
    else:
        lines.append(f"| 2 processes | not measured: {d['reason']} | | | | | | |")
    acc = r["accuracy"]
    lines += [
        "",
        "Wall-clock samples/s on a shared machine move by tens of percent between runs when other "
        "processes compete for the cores; samples per CPU-second of the trainer process are "
        "robust to that (the ratios below give both).",
        "",
        "| headline | value |",
        "|---|---:|",
        f"| **speedup_ikjt** (IKJT lookups vs KJT, same batch) | **{r['speedup_ikjt']:.2f}x** |",
        f"| **speedup_ikjt_groups** (+ transformer dedup vs KJT, same batch; target >= 2) | "
        f"**{r['speedup_ikjt_groups']:.2f}x** |",
        f"| **max_batch_ratio** (largest FULL batch within the KJT peak / base; target >= 2) | "
        f"**{r['max_batch_ratio']:.2f}x** ({r['search']['max_batch_size']:,} vs "
        f"{base['batch_size']:,}) |",
        f"| speedup at that batch vs KJT | {r['speedup_max_batch']:.2f}x |",
        f"| same, samples per CPU-second (lookup / groups / larger batch) | "
        f"{r['speedup_ikjt_cpu']:.2f}x / {r['speedup_ikjt_groups_cpu']:.2f}x / "
        f"{r['speedup_max_batch_cpu']:.2f}x |",
        f"| peak memory at the base batch, groups / KJT | "
        f"{r['peak_memory_ratio_ikjt_groups']:.2f} |",
        f"| held-out NE, clustered / unclustered table ({acc['steps']} steps of "
        f"{acc['batch_size']:,}) | {r['ne_clustered']:.4f} / {r['ne_unclustered']:.4f} |",
        f"| held-out AUC, clustered / unclustered | {acc['clustered']['auc']:.4f} / "
        f"{acc['unclustered']['auc']:.4f} |",
        f"| dedup factor (B / distinct rows) per sequence group at batch {base['batch_size']:,} "
        f"| {', '.join(f'{k}: {v:.1f}' for k, v in r['dedup_factor_sequence_groups'].items())} |",
    ]
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], path: Path) -> None:
    """samples/s per ablation step normalised to the KJT baseline (like Figure 9; wall clock,
    and per CPU-second of the process), with the peak memory of each step next to it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(r["configs"])
    base = r["configs"][BASELINE]
    speed = [r["configs"][n]["samples_per_s"] / base["samples_per_s"] for n in names]
    per_cpu = [r["configs"][n]["samples_per_cpu_s"] / base["samples_per_cpu_s"] for n in names]
    memory = [r["configs"][n]["peak_bytes"] / base["peak_bytes"] for n in names]
    labels = [f"{LABELS[n]}\nB={r['configs'][n]['batch_size']:,}" for n in names]
    colours = ["#8c8c8c", "#4c72b0", "#dd8452", "#55a868"]
    x = np.arange(len(names))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [3, 2]})
    ax.bar(x - 0.2, speed, 0.4, color=colours, label="samples/s (wall clock)")
    ax.bar(x + 0.2, per_cpu, 0.4, color=colours, alpha=0.45, hatch="//", label="samples/CPU-s")
    for i, (a, b) in enumerate(zip(speed, per_cpu, strict=True)):
        ax.text(i - 0.2, a, f"{a:.2f}x", ha="center", va="bottom", fontsize=9)
        ax.text(i + 0.2, b, f"{b:.2f}x", ha="center", va="bottom", fontsize=8, color="#444444")
    ax.set_xticks(x, labels)
    ax.set_ylabel("trainer throughput (1.0 = KJT baseline)")
    ax.set_title(f"rm1-like trainer ablation, 1 process, {r['threads']} thread(s)")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend(fontsize=8)
    ax2.bar(x, memory, color=colours)
    for i, value in enumerate(memory):
        ax2.text(i, value, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
    ax2.set_xticks(x, labels)
    ax2.set_ylabel("peak memory (1.0 = KJT baseline)")
    ax2.set_title("peak memory")
    ax2.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------- main
def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    started = time.perf_counter()
    load_start = os.getloadavg()[0]
    data = prepare_tables(
        work,
        rows=args.rows,
        seed=args.seed,
        num_shards=args.shards,
        row_group_rows=args.row_group_rows,
    )
    bench = Bench(args, work)
    model = describe_model(bench.size)
    print(
        f"model: {model['parameters'] / 1e6:.1f} M parameters "
        f"({model['table_parameters'] / 1e6:.1f} M in {model['num_tables']} tables)",
        flush=True,
    )
    ablation = bench.ablation()
    configs = ablation["configs"]
    print("2 processes (gloo) ...", flush=True)
    distributed = bench.distributed()
    accuracy = bench.accuracy()
    sequence_groups = {"+".join(g) for g in model["sequence_groups"]}
    base_factor = configs[BASELINE]["dedup_factor"]
    numbers = headline(configs)
    return {
        "profile": PROFILE,
        "quick": args.quick,
        "data": data,
        "model": model,
        "threads": args.threads,
        "device": args.device,
        "base_batch_size": args.batch_size,
        "warmup_steps": args.warmup_steps,
        "timed_steps": args.steps,
        "reps": args.reps,
        "lr": args.lr,
        "seed": args.seed,
        **numbers,
        "samples_per_s": {n: c["samples_per_s"] for n, c in configs.items()},
        "samples_per_cpu_s": {n: c["samples_per_cpu_s"] for n, c in configs.items()},
        "peak_rss_bytes": {n: c["peak_rss_bytes"] for n, c in configs.items()},
        "peak_bytes": {n: c["peak_bytes"] for n, c in configs.items()},
        "batch_sizes": {n: c["batch_size"] for n, c in configs.items()},
        "ne_clustered": accuracy["clustered"]["ne"],
        "ne_unclustered": accuracy["unclustered"]["ne"],
        "dedup_factor_sequence_groups": {
            k: v for k, v in base_factor.items() if k in sequence_groups
        },
        "configs": configs,
        "search": ablation["search"],
        "distributed": distributed,
        "accuracy": accuracy,
        "targets": TARGETS,
        "targets_met": {name: numbers[name] >= target for name, target in TARGETS.items()},
        "wall_s": time.perf_counter() - started,
        "load_average_1min": {"start": load_start, "end": os.getloadavg()[0]},
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="CI size: 10k rows, batch 256")
    parser.add_argument("--rows", type=int, help="rows to generate (default 100k, quick 10k)")
    parser.add_argument("--batch-size", type=int, help="base batch (default 2048, quick 256)")
    parser.add_argument("--shards", type=int, help="log-bus shards (default 16, quick 4)")
    parser.add_argument("--row-group-rows", type=int, default=8192)
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument("--steps", type=int, help="timed steps per run (default 5, quick 3)")
    parser.add_argument("--reps", type=int, help="child runs per config (default 2, quick 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each child")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (ablation children)")
    parser.add_argument("--embedding-dim", type=int, default=DEFAULT_SIZE.embedding_dim)
    parser.add_argument("--max-rows", type=int, default=DEFAULT_SIZE.max_rows)
    parser.add_argument("--seq-len", type=int, default=DEFAULT_SIZE.seq_len)
    parser.add_argument("--num-heads", type=int, default=DEFAULT_SIZE.num_heads)
    parser.add_argument("--ff-dim", type=int, default=DEFAULT_SIZE.ff_dim)
    parser.add_argument("--num-layers", type=int, default=DEFAULT_SIZE.num_layers)
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam lr (tables and dense layers)")
    parser.add_argument("--max-batch-factor", type=int, default=16, help="search cap x base")
    parser.add_argument(
        "--search-granularity-div",
        type=int,
        default=1,
        help="bisection stops at base batch / this (default: the base batch)",
    )
    parser.add_argument("--dist-plan", default="table_wise")
    parser.add_argument("--dist-steps", type=int, help="timed 2-process steps (default 3)")
    parser.add_argument("--holdout-fraction", type=float, default=0.1)
    parser.add_argument("--train-steps", type=int, help="cap on the accuracy training steps")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--work-dir", type=Path, help="keep (and reuse) tables and batches here")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.rows = args.rows or (10_000 if args.quick else 100_000)
    args.batch_size = args.batch_size or (256 if args.quick else 2048)
    args.shards = args.shards or (4 if args.quick else 16)
    args.steps = args.steps or (3 if args.quick else 5)
    args.reps = args.reps or (1 if args.quick else 2)
    args.dist_steps = args.dist_steps or 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python benchmarks/trainer.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="recd-trainer-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(args, work)
    result["command"] = command.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "trainer_quick" if args.quick else "trainer"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    table = markdown(result)
    (args.out / f"{stem}.md").write_text(f"Command: `{result['command']}`\n\n{table}")
    plot(result, args.out / f"{stem}.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
