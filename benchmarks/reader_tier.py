"""Reader tier benchmark: in-process reading, DataLoader workers and Ray Data workers feeding one
trainer loop on the same machine.

    python benchmarks/reader_tier.py                 # rm1-like, 100k rows, batch 2048 (minutes)
    python benchmarks/reader_tier.py --profile clickstream   # the shape of a real session log
    python benchmarks/reader_tier.py --quick         # 8k rows, batch 512, 1 repetition (CI size)

Data: the rm1-like profile's clustered table (as ``benchmarks/reader.py`` builds it; reused from
``--work-dir``). Job: the whole table, one epoch, batch ``--batch-size``, the IKJT groups of the
RM1-like model (one per sequence group and static feature) and the preprocessing every config of
``benchmarks/reader.py`` runs. Every tier builds the same batches (tested in
tests/integration/test_reader_ray.py).

Tiers: ``inline`` (``num_workers = 0``: the trainer process reads), ``dataloader_wN`` (N
DataLoader worker processes), ``ray_wN`` (N Ray Data tasks at once on a local Ray cluster of
``--ray-cpus`` CPUs started once before any measurement, or the cluster the calling process
already joined).

The trainer loop: for each batch, a fixed ``--step-ms`` of CPU work in the trainer process
(a stand-in for the forward/backward pass: a busy loop, so it competes for the cores like a
real step). By default the step is calibrated to the inline reader's own time per batch (the
step costs as much as reading: the regime where a separate tier can hide reading). Measured
per pass: wall time, samples/s, and the **stall fraction**: time the loop waited for its next
batch / wall time. ``cores`` is the machine's; ``samples_per_s_per_core`` = samples/s / cores
(the tiers use every core they can; on 2 cores, more than one reader worker competes with the
trainer for the second core).

Wire bytes: what a tier sends per batch to the trainer, measured on the real path: the pickled
batch (what DataLoader queues and the Ray tier's payload carry) and ``Batch.wire_bytes()`` (the
tensors), for the IKJT job and the same job with plain KJTs; ``wire_ratio_kjt_over_ikjt``.

Protocol: a warm-up pass per tier (starts the worker processes; Ray's first pass is reported as
``first_pass_s``), then ``--reps`` repetitions; in each, every tier makes one whole pass, in an
order drawn at random per repetition (seeded, recorded). Figures are medians with min-max over
the repetitions; failed passes are counted. Recorded: rows read of rows in the table, batch size,
step time, repetitions, cores, load average before and after, the orders and the command.

Each tier's samples/s is also given over the inline reader's in the same repetition (paired),
median and min-max, "indistinguishable" when the range holds 1.

Writes benchmarks/results/reader_tier.json, .md and .png (``--profile clickstream``:
reader_tier_clickstream.*; ``--quick``: reader_tier_quick.*).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from reader import job_preprocessing, prepare_tables  # noqa: E402

from recd.models import dedup_groups  # noqa: E402
from recd.reader import ReaderConfig, build_plan  # noqa: E402
from recd.reader.dataset import ResumableLoader, iter_batches  # noqa: E402
from recd.schema import load_catalogue  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def spin(seconds: float) -> None:
    """Busy CPU work for ``seconds`` (the stand-in for a training step)."""
    end = time.perf_counter() + seconds
    x = 1.0
    while time.perf_counter() < end:
        for _ in range(200):
            x = x * 1.0000001 + 1e-9


def timed_pass(config: ReaderConfig, step_s: float) -> dict[str, Any]:
    """One whole pass of ``config`` through a loop doing ``step_s`` of work per batch."""
    loader = ResumableLoader(config)
    rows = batches = 0
    waited = 0.0
    started = time.perf_counter()
    it = iter(loader)
    while True:
        t0 = time.perf_counter()
        batch = next(it, None)
        waited += time.perf_counter() - t0
        if batch is None:
            break
        rows += batch.batch_size
        batches += 1
        spin(step_s)
    wall = time.perf_counter() - started
    return {
        "rows": rows,
        "batches": batches,
        "wall_s": wall,
        "samples_per_s": rows / wall if wall > 0 else 0.0,
        "stall_fraction": waited / wall if wall > 0 else 0.0,
    }


def wire_sizes(config: ReaderConfig, max_batches: int | None) -> dict[str, float]:
    pickled, tensors = [], []
    for i, batch in enumerate(iter_batches(config)):
        if i == max_batches:
            break
        pickled.append(len(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)))
        tensors.append(batch.wire_bytes())
    return {
        "pickled_bytes_per_batch": float(np.mean(pickled)),
        "tensor_bytes_per_batch": float(np.mean(tensors)),
        "batches": len(pickled),
    }


def summary(passes: list[dict[str, Any]], key: str) -> dict[str, float]:
    values = [p[key] for p in passes]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def tiers(base: ReaderConfig, workers: list[int], ray_workers: list[int]) -> dict[str, Any]:
    out = {"inline": dataclasses.replace(base, num_workers=0)}
    for n in workers:
        out[f"dataloader_w{n}"] = dataclasses.replace(base, num_workers=n)
    for n in ray_workers:
        out[f"ray_w{n}"] = dataclasses.replace(base, num_workers=n, engine="ray")
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import ray

    catalogue = load_catalogue(args.profile)
    prepare_tables(
        work,
        rows=args.rows,
        seed=args.seed,
        num_shards=args.num_shards,
        row_group_rows=args.row_group_rows,
        profile=args.profile,
    )
    table = work / "table"
    base = ReaderConfig(
        table=str(table),
        batch_size=args.batch_size,
        dedup_sparse_features=dedup_groups(catalogue),
        preprocessing=job_preprocessing(catalogue),
    )
    configs = tiers(base, args.workers, args.ray_workers)
    started = time.perf_counter()
    ray_started_here = not ray.is_initialized()  # else: the caller's cluster (tests)
    if ray_started_here:
        ray.init(num_cpus=args.ray_cpus, include_dashboard=False, log_to_driver=False)
    ray_start_s = time.perf_counter() - started
    warm: dict[str, dict[str, Any]] = {}
    step_s = 0.0
    for name, config in configs.items():  # warm-up: worker processes up, files cached
        warm[name] = timed_pass(config, 0.0)
        print(f"warm-up {name}: {warm[name]['wall_s']:.2f} s", flush=True)
    inline = warm["inline"]
    step_s = (
        args.step_ms / 1000
        if args.step_ms is not None
        else inline["wall_s"] / max(1, inline["batches"])
    )
    load_before = os.getloadavg()
    rng = random.Random(args.seed)
    passes: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    failures: dict[str, int] = dict.fromkeys(configs, 0)
    orders = []
    for rep in range(args.reps):
        order = list(configs)
        rng.shuffle(order)
        orders.append(order)
        for name in order:
            try:
                result = timed_pass(configs[name], step_s)
            except Exception as exc:  # a failed pass is counted, not dropped silently
                failures[name] += 1
                print(f"rep {rep} {name}: FAILED {exc}", flush=True)
                continue
            passes[name].append(result)
            print(
                f"rep {rep} {name}: {result['samples_per_s']:,.0f} samples/s, stall "
                f"{result['stall_fraction']:.2f}",
                flush=True,
            )
    load_after = os.getloadavg()
    if ray_started_here:
        ray.shutdown()
    cores = os.cpu_count() or 1
    figures = {}
    for name, ps in passes.items():
        if not ps:
            continue
        sps = summary(ps, "samples_per_s")
        figures[name] = {
            "samples_per_s": sps,
            "samples_per_s_per_core": {k: v / cores for k, v in sps.items()},
            "stall_fraction": summary(ps, "stall_fraction"),
            "wall_s": summary(ps, "wall_s"),
            "rows": ps[0]["rows"],
            "batches": ps[0]["batches"],
            "passes": len(ps),
            "failed_passes": failures[name],
            "first_pass_s": warm[name]["wall_s"],
        }
        paired = [  # same repetition: this tier's samples/s over the inline reader's
            p["samples_per_s"] / i["samples_per_s"]
            for p, i in zip(ps, passes["inline"], strict=False)
            if i["samples_per_s"] > 0
        ]
        if paired and name != "inline":
            ratio = {"median": statistics.median(paired), "min": min(paired), "max": max(paired)}
            ratio["verdict"] = (
                "indistinguishable"
                if ratio["min"] <= 1.0 <= ratio["max"]
                else ("faster" if ratio["min"] > 1.0 else "slower")
            )
            figures[name]["vs_inline"] = ratio
    ikjt = wire_sizes(base, args.wire_batches)
    kjt = wire_sizes(dataclasses.replace(base, dedup_sparse_features=[]), args.wire_batches)
    table_rows = sum(unit.num_rows for unit in build_plan(base).units)
    return {
        "benchmark": "reader_tier",
        "command": " ".join([sys.executable, *sys.argv]),
        "protocol": {
            "profile": args.profile,
            "rows_requested": args.rows,
            "table_rows": table_rows,
            "batch_size": args.batch_size,
            "dedup_sparse_features": base.dedup_sparse_features,
            "preprocessing": base.preprocessing,
            "step_ms": step_s * 1000,
            "step_calibrated": args.step_ms is None,
            "reps": args.reps,
            "orders": orders,
            "cores": cores,
            "threads": {
                "torch": torch.get_num_threads(),
                "pyarrow_cpu": pa.cpu_count(),
                "pyarrow_io": pa.io_thread_count(),
            },
            "ray_cpus": args.ray_cpus,
            "ray_chunk_batches": base.ray_chunk_batches,
            "ray_start_s": ray_start_s,
            "ray_started_here": ray_started_here,
            "load_before": load_before,
            "load_after": load_after,
        },
        "tiers": figures,
        "wire": {
            "ikjt": ikjt,
            "kjt": kjt,
            "wire_ratio_kjt_over_ikjt": kjt["pickled_bytes_per_batch"]
            / ikjt["pickled_bytes_per_batch"],
            "tensor_ratio_kjt_over_ikjt": kjt["tensor_bytes_per_batch"]
            / ikjt["tensor_bytes_per_batch"],
        },
    }


def markdown(r: dict[str, Any]) -> str:
    p = r["protocol"]
    lines = [
        f"`{r['command']}`",
        "",
        f"{p['profile']}, every pass reads all {p['table_rows']:,} rows of the table, batch "
        f"{p['batch_size']}, trainer step {p['step_ms']:.1f} ms per batch"
        f"{' (calibrated: the inline read time per batch)' if p['step_calibrated'] else ''}, "
        f"{p['reps']} repetitions, {p['cores']} cores; medians (min-max).",
        "",
        "| tier | samples/s | per core | vs inline (paired) | stall fraction | first pass (s) "
        "| failed |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, f in r["tiers"].items():
        s, c, st = f["samples_per_s"], f["samples_per_s_per_core"], f["stall_fraction"]
        v = f.get("vs_inline")
        versus = (
            "-"
            if v is None
            else f"{v['median']:.2f}x ({v['min']:.2f}-{v['max']:.2f}, {v['verdict']})"
        )
        lines.append(
            f"| {name} | {s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f}) | "
            f"{c['median']:,.0f} | {versus} | {st['median']:.2f} ({st['min']:.2f}-{st['max']:.2f}) | "
            f"{f['first_pass_s']:.1f} | {f['failed_passes']} |"
        )
    w = r["wire"]
    lines += [
        "",
        f"Bytes per batch sent to the trainer (pickled): IKJT {w['ikjt']['pickled_bytes_per_batch']:,.0f}, "
        f"KJT {w['kjt']['pickled_bytes_per_batch']:,.0f}: KJT / IKJT = "
        f"{w['wire_ratio_kjt_over_ikjt']:.2f}x (tensors only: "
        f"{w['tensor_ratio_kjt_over_ikjt']:.2f}x; {w['ikjt']['batches']} batches, the whole "
        f"table unless --wire-batches). Ray cluster start: "
        f"{p['ray_start_s']:.1f} s (once per job).",
    ]
    return "\n".join(lines)


def plot(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["tiers"])
    sps = [r["tiers"][n]["samples_per_s"]["median"] for n in names]
    stall = [r["tiers"][n]["stall_fraction"]["median"] for n in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    a.bar(names, sps, color="tab:blue")
    a.set_ylabel("samples/s (median)")
    a.tick_params(axis="x", rotation=30)
    b.bar(names, stall, color="tab:red")
    b.set_ylabel("stall fraction (median)")
    b.set_ylim(0, 1)
    b.tick_params(axis="x", rotation=30)
    p = r["protocol"]
    fig.suptitle(
        f"Reader tiers feeding one trainer loop ({p['profile']}, batch {p['batch_size']}, "
        f"step {p['step_ms']:.0f} ms, {p['cores']} cores)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--profile", default="rm1-like", choices=["rm1-like", "clickstream"])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--num-shards", type=int, default=8)
    parser.add_argument("--row-group-rows", type=int, default=8192)
    parser.add_argument("--workers", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--ray-workers", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--ray-cpus", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--step-ms", type=float, default=None, help="trainer step (default: calibrated)"
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--wire-batches", type=int, default=None, help="batches measured (default: all)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--quick", action="store_true", help="CI size: 8k rows, batch 512, 1 rep")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.batch_size, args.reps = 8000, 512, 1
        args.row_group_rows, args.num_shards = 2048, 2
        args.workers, args.ray_workers, args.wire_batches = [1], [1], 2
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="recd-reader-tier-") as tmp:
        work = args.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        result = run(args, work)
    stem = "reader_tier" if args.profile == "rm1-like" else f"reader_tier_{args.profile}"
    out = args.out or RESULTS / (f"{stem}_quick.json" if args.quick else f"{stem}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(result) + "\n")
    plot(result, out.with_suffix(".png"))
    print(markdown(result))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
