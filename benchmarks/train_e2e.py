"""End-to-end training benchmark: ``recd train`` with its reader in the loop, KJT on the
arrival-order table against IKJT on the clustered table, the ``rm1`` model.

    python benchmarks/train_e2e.py              # impressions (the whole profile, 313k rows)
                                                # and rm1-like (100k rows), batch 2048,
                                                # 3 seeds
    python benchmarks/train_e2e.py --quick      # both profiles at toy size, batch 512, 2 seeds

What a user of recd runs, twice:

- ``kjt_arrival``: the job on the arrival-order table (``table_baseline``, from the random
  shards: what a log lands as without recd's session sharding and clustering), no dedup
  groups: every batch is a plain KJT and the model runs every row;
- ``ikjt_clustered``: the same job on the clustered table with the dedup groups ``recd
  analyze TABLE --config JOB`` proposes for it (priced for this job: reader + training
  step), so the reader builds IKJTs and the model (``dedup = "full"``) runs lookups and the
  history transformers once per distinct row.

Both sides are the same job: the same training config but for the table
and the groups (model, optimizer, batch size, preprocessing, shuffle ``session``, steps, held
out hours, one thread, reader in the training process), the same seeds. The tables come from
the same logs (``recd.pipeline.reuse_or_build_tables``, as ``recd run`` builds them; kept in
``--work-dir``). The held-out range is the fewest latest hourly partitions holding
``HOLDOUT_SHARE`` of the rows (the same hours of both tables); the rest trains.

Protocol: ``--reps`` rounds (default 3, ``--quick`` 2); round r trains both configurations with
``train.seed = r`` (weights and shuffle) in an order drawn from a generator seeded by
``--seed`` and the profile (recorded), each a fresh ``recd train --config`` child process, and
reads each configuration's batches once more in a reader-only child (the trainer's reader,
the same number of batches) in the same shuffled order. Measured per training run:

- steady-state samples per CPU-second and per second of the training process (its
  ``metrics.jsonl`` windows after the first ``WARMUP_SHARE`` of the steps; a window's time is
  the batch's reading plus the training step, the reader running in-process);
- the whole process (start-up, imports, plan, every step, the final held-out evaluation):
  wall seconds and CPU seconds (``getrusage`` of the child);
- held-out loss, NE and AUC at the last step (every held-out row).

Ratios are IKJT over KJT: the ratio of the medians, with the min-max of the per-round ratios
(a round's two runs share a seed); a threshold counts at the bad end. NE and AUC: the mean
and min-max over the seeds of each side, and the mean per-seed difference. Beside them: the
table bytes of both tables and the reader-only samples per CPU-second. Checkpoints are off in
these runs (``[checkpoint] enabled = false``): they are the checkpoint benchmark's subject.

Writes benchmarks/results/train_e2e.json, .md and .png (``--quick``: train_e2e_quick.*).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from recd.stats import spread

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = ("kjt_arrival", "ikjt_clustered")
BASELINE, RECD = CONFIGS
LABELS = {
    "kjt_arrival": "KJT, arrival-order table",
    "ikjt_clustered": "IKJT, clustered table",
}
WARMUP_SHARE = 0.2
"""Log windows of the first 20% of the steps are warm-up (compilation, allocator)."""
HOLDOUT_SHARE = 0.15
"""The held-out range: the fewest latest hourly partitions holding this share of the rows."""
DATA_STAMP = "train_e2e_data.json"
TARGETS = {
    "impressions": {
        "train_cpu_speedup": 4.0,
        "reader_speedup": 1.0,
        "table_bytes_ratio": 1.9,
        "ne_abs_difference": 0.005,
    }
}
"""Targets on the impressions profile: training CPU per sample >= 4x, reader >= 1.0x, table
bytes >= 1.9x (ratios at the bad end of their spread), held-out NE within 0.005 (mean of the
seeds)."""


@dataclass(kw_only=True, slots=True)
class ProfileJob:
    """One profile's job: the tables it reads and the training config of both sides."""

    profile: str
    rows: int | None
    """Rows generated (None: the profile's own session count)."""
    batch_size: int
    steps: int
    log_every: int
    model: dict[str, Any]
    sequence: dict[str, Any]
    optim: dict[str, Any]
    dense_log1p: list[str] = field(default_factory=list)
    """Dense features the job takes ``log1p`` of (heavy-tailed ones)."""


def profile_jobs(quick: bool) -> dict[str, ProfileJob]:
    """The two profiles' jobs (``quick``: toy size)."""
    sequence = {"num_layers": 1, "num_heads": 2, "ff_dim": 32}
    return {
        "impressions": ProfileJob(
            profile="impressions",
            rows=40_000 if quick else None,
            batch_size=512 if quick else 2048,
            steps=40 if quick else 250,
            log_every=5 if quick else 10,
            model={"kind": "rm1", "embedding_dim": 16, "max_rows": 100_000, "dedup": "full"},
            sequence=sequence,
            optim={"lr": 0.002, "embedding_lr": 0.002},
            dense_log1p=["price", "position"],
        ),
        "rm1-like": ProfileJob(
            profile="rm1-like",
            rows=8_000 if quick else 100_000,
            batch_size=512 if quick else 2048,
            steps=10 if quick else 60,
            log_every=2 if quick else 5,
            model={"kind": "rm1", "embedding_dim": 16, "max_rows": 20_000, "dedup": "full"},
            sequence=sequence,
            optim={"lr": 0.002, "embedding_lr": 0.002},
            dense_log1p=[f"user_dense_{i}" for i in range(40)]
            + [f"item_dense_{i}" for i in range(10)],
        ),
    }


# ---------------------------------------------------------------------------- configs
def job_config(
    job: ProfileJob,
    *,
    table: Path,
    split: str,
    run_dir: Path,
    seed: int,
    groups: list[list[str]],
) -> dict[str, Any]:
    """The training config of one run (a TOML table): ``table`` before ``split`` trains,
    from ``split`` on is held out."""
    reader: dict[str, Any] = {
        "table": str(table),
        "end": split,
        "batch_size": job.batch_size,
        "shuffle": "session",
        "num_epochs": 50,
        "dedup_sparse_features": groups,
    }
    if job.dense_log1p:
        reader["preprocessing"] = [{"kind": "log1p", "features": job.dense_log1p}]
    return {
        "reader": reader,
        "eval": {"start": split, "batch_size": 2048},
        "model": {**job.model, "sequence": job.sequence},
        "optim": job.optim,
        "train": {
            "steps": job.steps,
            "log_every": job.log_every,
            "eval_every": job.steps,
            "seed": seed,
            "run_dir": str(run_dir),
            "num_threads": 1,
            "plot": False,
        },
        "checkpoint": {"enabled": False},
    }


def write_toml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(data))
    return path


# ---------------------------------------------------------------------------- children
def recd_env() -> dict[str, str]:
    return {**os.environ, "RECD_PROGRESS": "0", "OMP_NUM_THREADS": "1"}


def run_child(argv: list[str], *, timeout_s: float) -> dict[str, Any]:
    """Run ``argv``; its wall seconds, CPU seconds (user + system of the child, from
    ``getrusage``), exit code and the end of its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout_s, env=recd_env(), check=False
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "returncode": done.returncode,
        "wall_s": wall,
        "cpu_s": cpu,
        "stdout": done.stdout,
        "stderr_tail": done.stderr[-3000:],
    }


def propose_groups(config: Path, table: Path, timeout_s: float) -> dict[str, Any]:
    """``recd analyze TABLE --config JOB --json``: the groups recd proposes for this job."""
    argv = [sys.executable, "-m", "recd", "analyze", str(table), "--config", str(config)]
    child = run_child([*argv, "--json"], timeout_s=timeout_s)
    if child["returncode"] != 0:
        raise RuntimeError(f"recd analyze failed: {child['stderr_tail']}")
    analysis = json.loads(child["stdout"])
    return {
        "command": " ".join(["recd", *argv[3:]]),
        "dedup_sparse_features": analysis["dedup_sparse_features"],
        "groups": analysis["groups"],
        "rejected": analysis["rejected"],
        "reader_ms_per_1k": analysis.get("reader_ms_per_1k"),
        "trainer_ms_per_1k": analysis.get("trainer_ms_per_1k"),
        "wall_s": child["wall_s"],
    }


def training_run(config: Path, run_dir: Path, job: ProfileJob, timeout_s: float) -> dict[str, Any]:
    """One ``recd train --config`` child and what its outputs say."""
    shutil.rmtree(run_dir, ignore_errors=True)
    argv = [sys.executable, "-m", "recd", "train", "--config", str(config)]
    child = run_child(argv, timeout_s=timeout_s)
    record: dict[str, Any] = {
        "ok": child["returncode"] == 0,
        "whole_wall_s": child["wall_s"],
        "whole_cpu_s": child["cpu_s"],
    }
    if not record["ok"]:
        record["error"] = child["stderr_tail"]
        return record
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    record.update(steady_state(lines, job))
    result = json.loads((run_dir / "train.json").read_text())["result"]
    final = result["evals"][-1]
    record.update(
        steps=result["steps"],
        samples=result["samples"],
        ne=final["ne"],
        auc=final["auc"],
        heldout_loss=final["loss"],
        heldout_rows=final["rows"],
        peak_rss_bytes=result.get("peak_rss_bytes"),
    )
    return record


def steady_state(lines: list[dict[str, Any]], job: ProfileJob) -> dict[str, Any]:
    """Samples per CPU-second and per second over the training windows after warm-up."""
    first = max(job.log_every, int(WARMUP_SHARE * job.steps))
    windows = [r for r in lines if r["kind"] == "train" and r["step"] > first]
    rows = cpu = wall = 0.0
    previous = first
    for w in windows:
        n = (w["step"] - previous) * job.batch_size
        previous = w["step"]
        rows += n
        cpu += n / w["samples_per_cpu_s"]
        wall += n / w["samples_per_s"]
    return {
        "steady_samples": rows,
        "steady_steps_from": first,
        "samples_per_cpu_s": rows / cpu if cpu else None,
        "samples_per_s": rows / wall if wall else None,
    }


def reader_run(config: Path, batches: int, timeout_s: float) -> dict[str, Any]:
    """The trainer's reader alone, in a child: ``batches`` batches after 5 warm-up ones."""
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--reader-child",
        str(config),
        "--batches",
        str(batches),
    ]
    child = run_child(argv, timeout_s=timeout_s)
    if child["returncode"] != 0:
        return {"ok": False, "error": child["stderr_tail"]}
    return {"ok": True, **json.loads(child["stdout"].strip().splitlines()[-1])}


def reader_child(config_path: Path, batches: int) -> dict[str, Any]:
    """Read ``batches`` batches of the job's training reader (as ``recd train`` builds it:
    rank 0 of 1, ``hash_modulo`` added); CPU and wall seconds after 5 warm-up batches."""
    import torch

    from recd.reader import ResumableLoader
    from recd.reader.memory import keep_freed_memory
    from recd.train.build import prepare_reader
    from recd.train.config import load_train_config

    torch.set_num_threads(1)
    keep_freed_memory()
    config = load_train_config(config_path)
    _, reader = prepare_reader(config, 0, 1)
    batches_iter = iter(ResumableLoader(reader))
    for _ in range(5):
        next(batches_iter)
    cpu0, wall0, rows = time.process_time(), time.perf_counter(), 0
    for _ in range(batches):
        rows += next(batches_iter).batch_size
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"rows": rows, "cpu_s": cpu, "wall_s": wall, "samples_per_cpu_s": rows / cpu}


# ---------------------------------------------------------------------------- one profile
def measure_profile(job: ProfileJob, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from recd.pipeline import reuse_or_build_tables

    work.mkdir(parents=True, exist_ok=True)
    stamp = reuse_or_build_tables(
        work,
        job.profile,
        stamp=DATA_STAMP,
        seed=args.data_seed,
        rows=job.rows if job.rows is not None else _profile_rows(job.profile),
        num_shards=8,
        row_group_rows=8192,
    )
    tables = {BASELINE: work / "table_baseline", RECD: work / "table"}
    split, held_out = holdout_start(tables[RECD], HOLDOUT_SHARE)
    print(f"[{job.profile}] held out from {split}; proposing the dedup groups ...", flush=True)
    plain_job = write_toml(
        work / "jobs" / "analyze.toml",
        job_config(job, table=tables[RECD], split=split, run_dir=work / "x", seed=0, groups=[]),
    )
    proposal = propose_groups(plain_job, tables[RECD], args.timeout_s)
    print(f"[{job.profile}] groups: {proposal['dedup_sparse_features']}", flush=True)
    groups = {BASELINE: [], RECD: proposal["dedup_sparse_features"]}
    rng = random.Random(f"{args.seed}:{job.profile}")
    orders: list[list[str]] = []
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    readers: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    load_before = load_avg()
    for rnd in range(args.reps):
        items = [(kind, c) for kind in ("train", "reader") for c in CONFIGS]
        rng.shuffle(items)
        orders.append([f"{kind}:{c}" for kind, c in items])
        for kind, name in items:
            run_dir = work / "runs" / f"{name}_{rnd}"
            config = write_toml(
                work / "jobs" / f"{name}_{rnd}.toml",
                job_config(
                    job,
                    table=tables[name],
                    split=split,
                    run_dir=run_dir,
                    seed=rnd,
                    groups=groups[name],
                ),
            )
            if kind == "train":
                record = training_run(config, run_dir, job, args.timeout_s)
                runs[name].append({"round": rnd, "seed": rnd, **record})
                shown = (
                    f"{record.get('samples_per_cpu_s', 0):,.0f} samples/CPU-s, NE "
                    f"{record.get('ne', float('nan')):.4f}"
                    if record["ok"]
                    else f"FAILED: {record['error'][-300:]}"
                )
            else:
                record = reader_run(config, job.steps, args.timeout_s)
                readers[name].append({"round": rnd, **record})
                shown = (
                    f"{record['samples_per_cpu_s']:,.0f} samples/CPU-s"
                    if record["ok"]
                    else f"FAILED: {record['error'][-300:]}"
                )
            print(f"[{job.profile}] round {rnd + 1}/{args.reps} {kind} {name}: {shown}", flush=True)
    return {
        "profile": job.profile,
        "job": asdict(job),
        "data": stamp,
        "split": split,
        "held_out_rows": held_out,
        "proposal": proposal,
        "orders": orders,
        "runs": runs,
        "readers": readers,
        "load_avg_before": load_before,
        "load_avg_after": load_avg(),
        **summarise(runs, readers, stamp, job.profile),
    }


def holdout_start(table: Path, share: float) -> tuple[str, int]:
    """The start of the fewest latest partitions holding >= ``share`` of ``table``'s rows
    (at least one partition left to train on), and their rows."""
    import pyarrow.parquet as pq

    from recd.table.partitions import format_time_ms
    from recd.table.snapshot import committed_files

    parts = [
        (p.start_ms, sum(pq.ParquetFile(f).metadata.num_rows for f in files))
        for p, files in committed_files(table).partitions
    ]
    parts.sort()
    total = sum(rows for _, rows in parts)
    first, held = len(parts), 0
    while first > 1 and (first == len(parts) or held < share * total):
        first -= 1
        held += parts[first][1]
    return format_time_ms(parts[first][0]), held


def _profile_rows(profile: str) -> int:
    from recd.schema import load_catalogue

    sessions = load_catalogue(profile).sessions
    return round(sessions.num_sessions * sessions.mean_samples)


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# ---------------------------------------------------------------------------- summary
def summarise(
    runs: dict[str, list[dict[str, Any]]],
    readers: dict[str, list[dict[str, Any]]],
    stamp: dict[str, Any],
    profile: str,
) -> dict[str, Any]:
    """Per configuration spreads, and the headline ratios with their per-round spread."""
    configs: dict[str, Any] = {}
    for name in CONFIGS:
        ok = [r for r in runs[name] if r["ok"]]
        read_ok = [r for r in readers[name] if r["ok"]]
        configs[name] = {
            "runs": len(runs[name]),
            "failed": len(runs[name]) - len(ok),
            "reader_failed": len(readers[name]) - len(read_ok),
            "samples_per_cpu_s": spread([r["samples_per_cpu_s"] for r in ok]),
            "samples_per_s": spread([r["samples_per_s"] for r in ok]),
            "whole_wall_s": spread([r["whole_wall_s"] for r in ok]),
            "whole_cpu_s": spread([r["whole_cpu_s"] for r in ok]),
            "ne": mean_spread([r["ne"] for r in ok]),
            "auc": mean_spread([r["auc"] for r in ok]),
            "reader_samples_per_cpu_s": spread([r["samples_per_cpu_s"] for r in read_ok]),
        }
    headlines = {
        "train_cpu_speedup": ratio(runs, "samples_per_cpu_s"),
        "train_wall_speedup": ratio(runs, "samples_per_s"),
        "whole_wall_speedup": ratio(runs, "whole_wall_s", inverse=True),
        "whole_cpu_speedup": ratio(runs, "whole_cpu_s", inverse=True),
        "reader_speedup": ratio(readers, "samples_per_cpu_s"),
        "table_bytes_ratio": {
            "median": stamp["table_bytes_unclustered"] / stamp["table_bytes_clustered"],
            "min": None,
            "max": None,
            "n": 1,
        },
        "ne_difference": paired_difference(runs, "ne"),
        "auc_difference": paired_difference(runs, "auc"),
    }
    return {
        "configs": configs,
        "headlines": headlines,
        "targets": targets_met(headlines, TARGETS.get(profile, {})),
    }


def mean_spread(values: list[float]) -> dict[str, Any]:
    out = spread(values)
    out["mean"] = statistics.fmean(values) if values else None
    return out


def ratio(
    runs: dict[str, list[dict[str, Any]]], key: str, *, inverse: bool = False
) -> dict[str, Any]:
    """IKJT over KJT of ``key`` (``inverse``: KJT over IKJT, for times): the ratio of the
    medians and the min-max of the per-round ratios (rounds where both sides ran)."""
    ok = {c: {r["round"]: r[key] for r in runs[c] if r.get("ok")} for c in CONFIGS}
    base, ours = ok[BASELINE], ok[RECD]
    if not base or not ours:
        return {"median": None, "min": None, "max": None, "n": 0}
    top, bottom = (base, ours) if inverse else (ours, base)
    per_round = [top[r] / bottom[r] for r in sorted(set(base) & set(ours))]
    return {
        "median": statistics.median(top.values()) / statistics.median(bottom.values()),
        "min": min(per_round) if per_round else None,
        "max": max(per_round) if per_round else None,
        "n": len(per_round),
        "per_round": per_round,
    }


def paired_difference(runs: dict[str, list[dict[str, Any]]], key: str) -> dict[str, Any]:
    """IKJT minus KJT of ``key`` per seed (a round's two runs share it): mean, min, max."""
    ok = {c: {r["round"]: r[key] for r in runs[c] if r.get("ok")} for c in CONFIGS}
    diffs = [ok[RECD][r] - ok[BASELINE][r] for r in sorted(set(ok[RECD]) & set(ok[BASELINE]))]
    if not diffs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(diffs), "min": min(diffs), "max": max(diffs), "n": len(diffs)}


def targets_met(headlines: dict[str, Any], targets: dict[str, float]) -> dict[str, Any]:
    """Each target against the bad end of its figure (NE: the mean difference of the seeds)."""
    out: dict[str, Any] = {}
    for key, target in targets.items():
        if key == "ne_abs_difference":
            value = headlines["ne_difference"]["mean"]
            met = value is not None and abs(value) <= target
            out[key] = {"target": target, "value": value, "met": met}
            continue
        h = headlines[key]
        bad_end = h["min"] if h["min"] is not None else h["median"]
        out[key] = {
            "target": target,
            "median": h["median"],
            "bad_end": bad_end,
            "met": bad_end is not None and bad_end >= target,
        }
    return out


# ---------------------------------------------------------------------------- outputs
def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def fmt_ratio(h: dict[str, Any]) -> str:
    if h["median"] is None:
        return "-"
    if h.get("min") is None:
        return f"{h['median']:.2f}x"
    return f"{h['median']:.2f}x ({h['min']:.2f}-{h['max']:.2f})"


def markdown(result: dict[str, Any]) -> str:
    p = result["protocol"]
    lines = [
        f"Command: `{p['command']}`",
        "",
        "`recd train` with its reader in the loop (one process, one thread, reader in-process), "
        "KJT on the arrival-order table vs IKJT on the clustered table with the groups `recd "
        f"analyze --config JOB` proposes for the job; {p['reps']} rounds, seeds 0..{p['reps'] - 1}, "
        "configurations in a seeded random order per round; steady state = the metrics windows "
        f"after the first {WARMUP_SHARE:.0%} of the steps; ratios: median (min-max over rounds).",
        "",
    ]
    for name, block in result["profiles"].items():
        job, data, h = block["job"], block["data"], block["headlines"]
        lines += [
            f"**{name}**: {data['rows']:,} rows ({data['partitions']} partitions), "
            f"batch {job['batch_size']}, {job['steps']} steps, held out from {block['split']} "
            f"({block['held_out_rows']:,} rows); "
            f"model {job['model']['kind']} (E = {job['model']['embedding_dim']}, max_rows "
            f"{job['model']['max_rows']:,}); groups proposed: "
            f"`{json.dumps(block['proposal']['dedup_sparse_features'])}`. "
            f"Load average {block['load_avg_before'][0]} before, {block['load_avg_after'][0]} after.",
            "",
            "| configuration | samples/CPU-s (steady) | samples/s (steady) | whole wall s | "
            "whole CPU s | held-out NE mean (min-max) | AUC mean | reader samples/CPU-s | "
            "runs (failed) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c in CONFIGS:
            s = block["configs"][c]
            ne = s["ne"]
            lines.append(
                f"| {LABELS[c]} (`{c}`) | {fmt(s['samples_per_cpu_s']['median'])} | "
                f"{fmt(s['samples_per_s']['median'])} | {fmt(s['whole_wall_s']['median'], '.1f')} | "
                f"{fmt(s['whole_cpu_s']['median'], '.1f')} | {fmt(ne['mean'], '.4f')} "
                f"({fmt(ne['min'], '.4f')}-{fmt(ne['max'], '.4f')}) | "
                f"{fmt(s['auc']['mean'], '.4f')} | {fmt(s['reader_samples_per_cpu_s']['median'])} "
                f"| {s['runs']} ({s['failed']}) |"
            )
        ne_diff = h["ne_difference"]
        lines += [
            "",
            "| headline (IKJT clustered vs KJT arrival) | value | target |",
            "|---|---:|---:|",
        ]
        targets = block["targets"]
        for key, label in (
            ("train_cpu_speedup", "training CPU per sample (steady)"),
            ("train_wall_speedup", "training samples/s (steady)"),
            ("whole_wall_speedup", "whole process wall"),
            ("whole_cpu_speedup", "whole process CPU"),
            ("reader_speedup", "reader alone, samples/CPU-s"),
            ("table_bytes_ratio", "table bytes, arrival-order / clustered"),
        ):
            target = targets.get(key)
            mark = (
                f">= {target['target']} ({'met' if target['met'] else 'missed'})" if target else ""
            )
            lines.append(f"| {label} | {fmt_ratio(h[key])} | {mark} |")
        target = targets.get("ne_abs_difference")
        mark = (
            f"within {target['target']} ({'met' if target['met'] else 'missed'})" if target else ""
        )
        lines.append(
            f"| held-out NE, IKJT - KJT per seed: mean (min-max) | {fmt(ne_diff['mean'], '+.4f')} "
            f"({fmt(ne_diff['min'], '+.4f')} to {fmt(ne_diff['max'], '+.4f')}) | {mark} |"
        )
        auc = h["auc_difference"]
        lines.append(
            f"| held-out AUC, IKJT - KJT per seed: mean (min-max) | {fmt(auc['mean'], '+.4f')} "
            f"({fmt(auc['min'], '+.4f')} to {fmt(auc['max'], '+.4f')}) | |"
        )
        lines.append("")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Steady training samples per CPU-second (log scale, the IKJT/KJT ratio written on top)
    and held-out NE (mean, min-max over the seeds), per profile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(result["profiles"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.38
    for i, c in enumerate(CONFIGS):
        xs = [j + (i - 0.5) * width for j in range(len(profiles))]
        blocks = [result["profiles"][p] for p in profiles]
        med = [b["configs"][c]["samples_per_cpu_s"]["median"] or 0 for b in blocks]
        axes[0].bar(xs, med, width, label=LABELS[c])
        if c == RECD:
            for x, m, b in zip(xs, med, blocks, strict=True):
                speedup = b["headlines"]["train_cpu_speedup"]["median"]
                if speedup:
                    axes[0].annotate(f"{speedup:.1f}x", (x, m), ha="center", va="bottom")
        ne = [b["configs"][c]["ne"] for b in blocks]
        axes[1].errorbar(
            xs,
            [n["mean"] or 0 for n in ne],
            yerr=[
                [(n["mean"] or 0) - (n["min"] or 0) for n in ne],
                [(n["max"] or 0) - (n["mean"] or 0) for n in ne],
            ],
            fmt="o",
            capsize=4,
            label=LABELS[c],
        )
    axes[0].set_yscale("log")
    axes[0].autoscale_view()
    titles = ("training samples per CPU-second (steady, log scale)", "held-out NE (mean, min-max)")
    for ax, title, where in zip(axes, titles, ("upper right", "center"), strict=True):
        ax.set_xticks(range(len(profiles)), profiles)
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc=where)
    low, high = axes[0].get_ylim()
    axes[0].set_ylim(low, high * 4)  # room for the ratios above the bars
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="toy sizes, 2 rounds (CI)")
    parser.add_argument(
        "--profiles", nargs="+", default=["impressions", "rm1-like"], metavar="NAME"
    )
    parser.add_argument("--reps", type=int, default=None, help="rounds (default 3; --quick 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the round orders")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the generated logs")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the tables here")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per child process")
    parser.add_argument("--reader-child", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.quick else 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reader_child is not None:
        print(json.dumps(reader_child(args.reader_child, args.batches)))
        return 0
    jobs = profile_jobs(args.quick)
    unknown = [p for p in args.profiles if p not in jobs]
    if unknown:
        raise SystemExit(f"unknown profile(s) {unknown}; known: {', '.join(jobs)}")
    root = args.work_dir or Path(tempfile_dir())
    began = time.perf_counter()
    profiles = {p: measure_profile(jobs[p], args, root / p) for p in args.profiles}
    command = "python benchmarks/train_e2e.py" + (" --quick" if args.quick else "")
    if argv:
        command = "python benchmarks/train_e2e.py " + " ".join(argv)
    result = {
        "protocol": {
            "command": command,
            "reps": args.reps,
            "seed": args.seed,
            "data_seed": args.data_seed,
            "threads": 1,
            "warmup_share": WARMUP_SHARE,
            "reader": "in the training process (num_workers = 0)",
            "checkpoints": "off",
            "wall_s": time.perf_counter() - began,
        },
        "profiles": profiles,
    }
    stem = "train_e2e_quick" if args.quick else "train_e2e"
    write_results(args.out_dir, stem, result, markdown, plot)
    return 0


def write_results(
    out_dir: Path,
    stem: str,
    result: dict[str, Any],
    markdown: Callable[[dict[str, Any]], str],
    plot: Callable[[dict[str, Any], Path], None],
) -> None:
    """``stem``.json, .md and .png in ``out_dir``; the Markdown printed too."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (out_dir / f"{stem}.md").write_text(text)
    plot(result, out_dir / f"{stem}.png")
    print(text)


def tempfile_dir(prefix: str = "recd-train-e2e-") -> str:
    import tempfile

    return tempfile.mkdtemp(prefix=prefix)


if __name__ == "__main__":
    sys.exit(main())
