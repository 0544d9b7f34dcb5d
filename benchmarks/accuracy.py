"""Accuracy benchmark: held-out NE / AUC of ``recd train`` and the order quality of its
training batches, for the table orders and shuffles a user can choose.

    python benchmarks/accuracy.py              # clickstream, rm1-like, impressions: 5 seeds
                                               # each, batch 512
    python benchmarks/accuracy.py --quick      # toy sizes, 2 seeds (CI)

Three configurations of one training job per profile (the ``rm1`` model):

- ``a_arrival_rows_kjt``: the arrival-order table (``table_baseline``, from the random shards:
  what a log lands as without recd), ``shuffle = "rows"`` (a seeded windowed row shuffle), no
  dedup groups: the reference a user without recd would train with;
- ``b_clustered_session_ikjt``: the clustered table, ``shuffle = "session"`` (whole sessions
  permuted, the shuffle the shipped pipelines use), the dedup groups ``recd analyze TABLE
  --config JOB`` proposes for the job, so the reader builds IKJTs and the model
  (``dedup = "full"``) runs once per distinct row (where it proposes none, as it may for
  clickstream, whose histories change on almost every event, plain KJTs);
- ``c_clustered_rows_kjt``: the clustered table, ``shuffle = "rows"``, no groups (rows
  scattered: nothing left to deduplicate).

Everything else is the same job (model, optimizer, batch size, preprocessing, steps, held-out
hours, one thread, reader in the training process, checkpoints off, the same seeds); the
reader's ``shuffle_window`` and ``streams`` are left at their defaults and each run's reader
config (from its ``train.json``) is recorded. The tables come from the same logs
(``recd.pipeline.reuse_or_build_tables``, as ``recd run`` builds them; kept in
``--work-dir``). The held-out range is the fewest latest hourly partitions holding
``HOLDOUT_SHARE`` of the rows (the same hours of both tables); the rest trains.

Sizes (``profile_jobs``), chosen so that the whole benchmark runs on a 2-core machine:
clickstream the profile's own ~88k generated rows, rm1-like 100k, impressions the profile's
own ~313k; batch 512; ``train.steps`` one pass over the training rows (full batches: 121,
161 and 505 steps at ``--data-seed 0``), ``num_epochs`` 50 so the reader never runs out first;
held-out evaluation at the last step on every held-out row. ``--quick``: 6k, 6k and 10k rows, batch
256. A run counts only if it trained and its reader gave every step.

Protocol: ``--reps`` rounds (default 5: 3 seeds do not resolve 0.005 NE here; ``--quick``
2); round r trains the three configurations with ``train.seed = r`` (weights and the
reader's shuffle) in an order drawn from a generator seeded by ``--seed`` and the profile
(recorded), each a fresh ``recd train --config`` child process. Measured per run:

- held-out NE, AUC and loss at the last step (every held-out row);
- the whole process's wall and CPU seconds (start-up, plan, every step, the evaluation);
- batch order quality: the label means of the first ``train.steps`` training batches in the
  order the run consumes them (the run's reader config read once more in this process, as
  ``recd train`` builds it: deterministic given the seed), their lag-1 autocorrelation
  (Pearson correlation of m[:-1] and m[1:]) and their standard deviation, beside the one an
  i.i.d. shuffle gives (sqrt(p (1 - p) / B)).

Summary per profile and configuration: NE and AUC mean and min-max over the seeds, the lag-1
autocorrelation mean and min-max, failures counted (a failed run is left out of every figure,
never dropped from the count). Differences: (b) - (a) and (c) - (a) per seed (a round's runs
share the seed): mean and min-max, ``indistinguishable`` unless every seed differs the same
way. Targets (met or missed, never adjusted): |NE (b) - NE (a)| <= ``NE_TARGET`` (the mean of
the per-seed differences) on every profile; the lag-1 autocorrelation of the shuffles the pipelines use, ``session`` on the clustered table (b) and
``rows`` (c), <= ``AUTOCORRELATION_TARGET`` at its bad end (the largest over the seeds).

Writes benchmarks/results/accuracy.json, .md and .png (``--quick``: accuracy_quick.*;
``--name``: another stem, e.g. for a run with more ``--passes``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as ``python benchmarks/accuracy.py``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import dataclasses
import json
import math
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.train_e2e import (
    ProfileJob,
    _profile_rows,
    holdout_start,
    job_config,
    load_avg,
    mean_spread,
    propose_groups,
    tempfile_dir,
    training_run,
    write_results,
    write_toml,
)
from recd.stats import spread

RESULTS = Path(__file__).resolve().parent / "results"
CONFIGS = ("a_arrival_rows_kjt", "b_clustered_session_ikjt", "c_clustered_rows_kjt")
REFERENCE, SESSION, ROWS = CONFIGS
LABELS = {
    REFERENCE: "(a) arrival-order table, rows shuffle, KJT",
    SESSION: "(b) clustered table, session shuffle, IKJT",
    ROWS: "(c) clustered table, rows shuffle, KJT",
}
ROWS_SHUFFLE = "rows"
"""The reader's row shuffle (``reader.shuffle``)."""
HOLDOUT_SHARE = 0.15
"""The held-out range: the fewest latest hourly partitions holding this share of the rows."""
DATA_STAMP = "accuracy_data.json"
NE_TARGET = 0.005
"""|held-out NE (b) - NE (a)|, the mean of the per-seed differences, on every profile."""
AUTOCORRELATION_TARGET = 0.2
"""Lag-1 autocorrelation of the batch label means, at its bad end (the largest seed)."""
AUTOCORRELATION_TARGET_CONFIGS = (SESSION, ROWS)
"""The shuffles the pipelines use (``session`` on the clustered table, and ``rows``)."""


@dataclass(frozen=True, slots=True)
class Setup:
    """What one configuration changes in the job: the table, the shuffle, the groups."""

    table: str
    """``table`` (clustered) or ``table_baseline`` (arrival order) in the work directory."""
    shuffle: str
    dedup: bool
    """Use the groups ``recd analyze`` proposes (else none: plain KJT batches)."""


SETUPS = {
    REFERENCE: Setup(table="table_baseline", shuffle=ROWS_SHUFFLE, dedup=False),
    SESSION: Setup(table="table", shuffle="session", dedup=True),
    ROWS: Setup(table="table", shuffle=ROWS_SHUFFLE, dedup=False),
}


def profile_jobs(quick: bool) -> dict[str, ProfileJob]:
    """The three profiles' jobs (``quick``: toy size). ``steps`` is set to one pass over the
    training rows once the held-out range is known (:func:`one_pass`)."""
    sequence = {"num_layers": 1, "num_heads": 2, "ff_dim": 32}
    optim = {"lr": 0.002, "embedding_lr": 0.002}
    batch_size = 256 if quick else 512
    return {
        "clickstream": ProfileJob(
            profile="clickstream",
            rows=6_000 if quick else None,
            batch_size=batch_size,
            steps=0,
            log_every=10,
            model={"kind": "rm1", "embedding_dim": 16, "max_rows": 50_000, "dedup": "full"},
            sequence=sequence,
            optim=optim,
            dense_log1p=["item_price", "session_step"],
        ),
        "rm1-like": ProfileJob(
            profile="rm1-like",
            rows=6_000 if quick else 100_000,
            batch_size=batch_size,
            steps=0,
            log_every=10,
            model={"kind": "rm1", "embedding_dim": 16, "max_rows": 20_000, "dedup": "full"},
            sequence=sequence,
            optim=optim,
            dense_log1p=[f"user_dense_{i}" for i in range(40)]
            + [f"item_dense_{i}" for i in range(10)],
        ),
        "impressions": ProfileJob(
            profile="impressions",
            rows=10_000 if quick else None,
            batch_size=batch_size,
            steps=0,
            log_every=10,
            model={"kind": "rm1", "embedding_dim": 16, "max_rows": 100_000, "dedup": "full"},
            sequence=sequence,
            optim=optim,
            dense_log1p=["price", "position"],
        ),
    }


def one_pass(job: ProfileJob, train_rows: int, passes: float = 1.0) -> ProfileJob:
    """``job`` with as many steps as full batches of ``passes`` passes over the training rows
    (the last partial batch of a pass is not trained on)."""
    return dataclasses.replace(job, steps=max(1, int(passes * (train_rows // job.batch_size))))


# ---------------------------------------------------------------------------- configs
def run_config(
    job: ProfileJob,
    setup: Setup,
    *,
    work: Path,
    split: str,
    run_dir: Path,
    seed: int,
    groups: list[list[str]],
    window: int | None = None,
) -> dict[str, Any]:
    """The training config of one run: the shared job with this configuration's table,
    shuffle and groups (and ``shuffle_window`` when ``window`` is given)."""
    config = job_config(
        job,
        table=work / setup.table,
        split=split,
        run_dir=run_dir,
        seed=seed,
        groups=groups if setup.dedup else [],
    )
    config["reader"]["shuffle"] = setup.shuffle
    if window is not None:
        config["reader"]["shuffle_window"] = window
    return config


# ---------------------------------------------------------------------------- batch order
def batch_label_means(config_path: Path, steps: int) -> tuple[list[float], list[int]]:
    """The first label's mean and the rows of each of the first ``steps`` training batches of
    the job at ``config_path``, read as ``recd train`` reads them (rank 0 of 1, its
    preprocessing), in the order it consumes them."""
    import torch

    from recd.reader import ResumableLoader
    from recd.train.build import prepare_reader
    from recd.train.config import load_train_config

    torch.set_num_threads(1)
    config = load_train_config(config_path)
    _, reader = prepare_reader(config, 0, 1)
    means: list[float] = []
    rows: list[int] = []
    for batch in ResumableLoader(reader):
        means.append(float(batch.labels[:, 0].mean()))
        rows.append(batch.batch_size)
        if len(means) == steps:
            break
    return means, rows


def lag1_autocorrelation(values: list[float]) -> float | None:
    """Pearson correlation of ``values[:-1]`` and ``values[1:]`` (None: fewer than 3 values or
    a constant half, where it is undefined)."""
    if len(values) < 3:
        return None
    head, tail = values[:-1], values[1:]
    if len(set(head)) < 2 or len(set(tail)) < 2:
        return None
    return statistics.correlation(head, tail)


def order_stats(means: list[float], rows: list[int], batch_size: int) -> dict[str, Any]:
    """Order quality of a run's batches: the lag-1 autocorrelation of their label means, the
    standard deviation of the means beside an i.i.d. shuffle's, and the means themselves."""
    total = sum(rows)
    label_mean = sum(m * n for m, n in zip(means, rows, strict=True)) / total if total else None
    iid_std = (
        math.sqrt(label_mean * (1 - label_mean) / batch_size) if label_mean is not None else None
    )
    return {
        "batches": len(means),
        "rows": total,
        "label_mean": label_mean,
        "lag1_autocorrelation": lag1_autocorrelation(means),
        "batch_label_mean_std": statistics.pstdev(means) if len(means) > 1 else None,
        "iid_batch_label_mean_std": iid_std,
        "batch_label_means": [round(m, 6) for m in means],
    }


def order_run(config_path: Path, job: ProfileJob) -> dict[str, Any]:
    """:func:`order_stats` of the run's batches, or the error that stopped the read."""
    began = time.perf_counter()
    try:
        means, rows = batch_label_means(config_path, job.steps)
    except Exception as exc:  # counted as a failure of the run, never raised
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {
        "ok": True,
        "wall_s": time.perf_counter() - began,
        **order_stats(means, rows, job.batch_size),
    }


def reader_used(run_dir: Path, config: dict[str, Any]) -> dict[str, Any]:
    """The reader config the run recorded in ``train.json`` (its defaults filled in), else the
    one written to its TOML."""
    summary = run_dir / "train.json"
    if summary.is_file():
        return json.loads(summary.read_text())["config"]["reader"]
    return config["reader"]


# ---------------------------------------------------------------------------- one profile
def build_tables(job: ProfileJob, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from recd.pipeline import reuse_or_build_tables

    work.mkdir(parents=True, exist_ok=True)
    return reuse_or_build_tables(
        work,
        job.profile,
        stamp=DATA_STAMP,
        seed=args.data_seed,
        rows=job.rows if job.rows is not None else _profile_rows(job.profile),
        num_shards=8,
        row_group_rows=8192,
    )


def one_run(
    job: ProfileJob,
    name: str,
    *,
    work: Path,
    split: str,
    rnd: int,
    groups: list[list[str]],
    timeout_s: float,
    window: int | None = None,
) -> dict[str, Any]:
    """Train configuration ``name`` with seed ``rnd`` and read its batch order."""
    run_dir = work / "runs" / f"{name}_{rnd}"
    config = run_config(
        job,
        SETUPS[name],
        work=work,
        split=split,
        run_dir=run_dir,
        seed=rnd,
        groups=groups,
        window=window,
    )
    path = write_toml(work / "jobs" / f"{name}_{rnd}.toml", config)
    record: dict[str, Any] = {"round": rnd, "seed": rnd}
    record.update(training_run(path, run_dir, job, timeout_s))
    record["reader"] = reader_used(run_dir, config)
    if record["ok"]:
        record["order"] = order_run(path, job)
        problem = run_problem(record, job.steps)
        if problem is not None:
            record["ok"] = False
            record["error"] = problem
    return record


def run_problem(record: dict[str, Any], steps: int) -> str | None:
    """Why a run that exited cleanly does not count (None: it does): its batch order could not
    be read, or it trained (or its reader gave) fewer steps than the job's."""
    order = record["order"]
    if not order["ok"]:
        return f"reading the batch order: {order['error']}"
    if record["steps"] != steps:
        return f"trained {record['steps']} of {steps} steps"
    if order["batches"] != steps:
        return f"the reader gave {order['batches']} of {steps} batches"
    return None


def measure_profile(job: ProfileJob, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    stamp = build_tables(job, args, work)
    split, held_out = holdout_start(work / "table", HOLDOUT_SHARE)
    job = one_pass(job, stamp["rows"] - held_out, args.passes)
    print(f"[{job.profile}] held out from {split}; proposing the dedup groups ...", flush=True)
    plain_job = write_toml(
        work / "jobs" / "analyze.toml",
        run_config(
            job, SETUPS[SESSION], work=work, split=split, run_dir=work / "x", seed=0, groups=[]
        ),
    )
    proposal = propose_groups(plain_job, work / "table", args.timeout_s)
    groups = proposal["dedup_sparse_features"]
    print(f"[{job.profile}] groups: {groups}", flush=True)
    rng = random.Random(f"{args.seed}:{job.profile}")
    orders: list[list[str]] = []
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CONFIGS}
    load_before = load_avg()
    for rnd in range(args.reps):
        order = rng.sample(CONFIGS, k=len(CONFIGS))
        orders.append(order)
        for name in order:
            record = one_run(
                job,
                name,
                work=work,
                split=split,
                rnd=rnd,
                groups=groups,
                timeout_s=args.timeout_s,
                window=args.shuffle_window,
            )
            runs[name].append(record)
            print(
                f"[{job.profile}] round {rnd + 1}/{args.reps} {name}: {shown(record)}", flush=True
            )
    return {
        "profile": job.profile,
        "job": asdict(job),
        "data": stamp,
        "split": split,
        "held_out_rows": held_out,
        "train_rows": stamp["rows"] - held_out,
        "proposal": proposal,
        "orders": orders,
        "runs": runs,
        "load_avg_before": load_before,
        "load_avg_after": load_avg(),
        **summarise(runs),
    }


def shown(record: dict[str, Any]) -> str:
    if not record["ok"]:
        return f"FAILED: {record['error'][-300:]}"
    order = record["order"]
    return (
        f"NE {record['ne']:.4f}, AUC {record['auc']:.4f}, lag-1 autocorrelation "
        f"{fmt(order['lag1_autocorrelation'], '+.3f')}, {record['whole_wall_s']:.1f} s"
    )


# ---------------------------------------------------------------------------- summary
def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per configuration spreads (failed runs counted, left out of the figures), the per-seed
    differences to the reference (a) and the targets."""
    configs: dict[str, Any] = {}
    for name in CONFIGS:
        ok = [r for r in runs[name] if r["ok"]]
        lag1 = [r["order"]["lag1_autocorrelation"] for r in ok]
        configs[name] = {
            "runs": len(runs[name]),
            "failed": len(runs[name]) - len(ok),
            "ne": mean_spread([r["ne"] for r in ok]),
            "auc": mean_spread([r["auc"] for r in ok]),
            "heldout_loss": mean_spread([r["heldout_loss"] for r in ok]),
            "lag1_autocorrelation": mean_spread([x for x in lag1 if x is not None]),
            "lag1_undefined": sum(x is None for x in lag1),
            "batch_label_mean_std": mean_spread([r["order"]["batch_label_mean_std"] for r in ok]),
            "iid_batch_label_mean_std": mean_spread(
                [r["order"]["iid_batch_label_mean_std"] for r in ok]
            ),
            "whole_wall_s": spread([r["whole_wall_s"] for r in ok]),
            "whole_cpu_s": spread([r["whole_cpu_s"] for r in ok]),
        }
    differences = {
        f"{name}-{REFERENCE}": {
            key: paired_difference(runs, key, name, REFERENCE) for key in ("ne", "auc")
        }
        for name in (SESSION, ROWS)
    }
    return {
        "configs": configs,
        "differences": differences,
        "targets": targets(configs, differences),
    }


def paired_difference(
    runs: dict[str, list[dict[str, Any]]], key: str, minuend: str, subtrahend: str
) -> dict[str, Any]:
    """``minuend`` minus ``subtrahend`` of ``key`` per seed (rounds where both ran): mean,
    min, max, and whether the seeds agree on its sign (:func:`sign_of`)."""
    ok = {c: {r["round"]: r[key] for r in runs[c] if r["ok"]} for c in (minuend, subtrahend)}
    rounds = sorted(set(ok[minuend]) & set(ok[subtrahend]))
    diffs = [ok[minuend][r] - ok[subtrahend][r] for r in rounds]
    if not diffs:
        return {"mean": None, "min": None, "max": None, "n": 0, "values": [], "sign": None}
    return {
        "mean": statistics.fmean(diffs),
        "min": min(diffs),
        "max": max(diffs),
        "n": len(diffs),
        "values": diffs,
        "sign": sign_of(diffs),
    }


def sign_of(diffs: list[float]) -> str:
    """``higher`` or ``lower`` where at least 2 seeds all differ that way, else
    ``indistinguishable`` (the min-max over the seeds holds 0)."""
    if len(diffs) >= 2 and min(diffs) > 0:
        return "higher"
    if len(diffs) >= 2 and max(diffs) < 0:
        return "lower"
    return "indistinguishable"


def targets(configs: dict[str, Any], differences: dict[str, Any]) -> dict[str, Any]:
    """Each target met or missed: the NE difference (b) - (a) by its mean over the seeds, the
    lag-1 autocorrelations by their bad end (the largest seed)."""
    ne = differences[f"{SESSION}-{REFERENCE}"]["ne"]
    out: dict[str, Any] = {
        "ne_abs_difference_b_a": {
            "target": NE_TARGET,
            "value": ne["mean"],
            "min": ne["min"],
            "max": ne["max"],
            "met": ne["mean"] is not None and abs(ne["mean"]) <= NE_TARGET,
        }
    }
    for name in AUTOCORRELATION_TARGET_CONFIGS:
        lag1 = configs[name]["lag1_autocorrelation"]
        out[f"lag1_autocorrelation_{name[0]}"] = {
            "config": name,
            "target": AUTOCORRELATION_TARGET,
            "value": lag1["max"],
            "mean": lag1["mean"],
            "met": lag1["max"] is not None and lag1["max"] <= AUTOCORRELATION_TARGET,
        }
    return out


# ---------------------------------------------------------------------------- outputs
def fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def fmt_spread(s: dict[str, Any], spec: str = ".4f") -> str:
    if s["mean"] is None:
        return "-"
    return f"{s['mean']:{spec}} ({s['min']:{spec}} to {s['max']:{spec}})"


def markdown(result: dict[str, Any]) -> str:
    p = result["protocol"]
    lines = [
        f"Command: `{p['command']}`",
        "",
        "`recd train --config` child processes (one thread, reader in-process, checkpoints off), "
        f"the `rm1` model; {p['reps']} rounds, seeds {p['seeds']}, the configurations in a "
        "seeded random order per round; held-out NE / AUC / loss at the last step on every "
        "held-out row; batch order: the label means of the training batches in the order the "
        "run consumes them, their lag-1 autocorrelation and standard deviation (beside an "
        "i.i.d. shuffle's). Figures: mean (min to max) over the seeds; failed runs counted and "
        "left out; a difference is `indistinguishable` unless every seed differs the same way.",
        "",
    ]
    for name, block in result["profiles"].items():
        lines += profile_markdown(name, block)
    lines += targets_markdown(result)
    return "\n".join(lines) + "\n"


def profile_markdown(name: str, block: dict[str, Any]) -> list[str]:
    job, data = block["job"], block["data"]
    lines = [
        f"**{name}**: {data['rows']:,} rows generated ({data['partitions']} partitions), "
        f"{block['train_rows']:,} train, held out from {block['split']} "
        f"({block['held_out_rows']:,} rows); batch {job['batch_size']}, {job['steps']} steps "
        f"({job['steps'] * job['batch_size'] / block['train_rows']:.2f} passes); model "
        f"{job['model']['kind']} (E = {job['model']['embedding_dim']}, max_rows "
        f"{job['model']['max_rows']:,}); groups proposed for (b): "
        f"`{json.dumps(block['proposal']['dedup_sparse_features'])}`. Load average "
        f"{block['load_avg_before'][0]} before, {block['load_avg_after'][0]} after.",
        "",
        "| configuration | held-out NE | AUC | held-out loss | lag-1 autocorrelation | "
        "std of batch label means (i.i.d.) | whole wall s | runs (failed) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in CONFIGS:
        s = block["configs"][c]
        lines.append(
            f"| {LABELS[c]} (`{c}`) | {fmt_spread(s['ne'])} | {fmt_spread(s['auc'])} | "
            f"{fmt(s['heldout_loss']['mean'])} | {fmt_spread(s['lag1_autocorrelation'], '+.3f')} | "
            f"{fmt(s['batch_label_mean_std']['mean'])} "
            f"({fmt(s['iid_batch_label_mean_std']['mean'])}) | "
            f"{fmt(s['whole_wall_s']['median'], '.1f')} | {s['runs']} ({s['failed']}) |"
        )
    lines += ["", "| per-seed difference | NE | AUC |", "|---|---:|---:|"]
    for key, diff in block["differences"].items():
        ne, auc = diff["ne"], diff["auc"]
        lines.append(
            f"| {key.replace('-', ' - ')} | {fmt_spread(ne, '+.4f')} {ne['sign'] or ''} | "
            f"{fmt_spread(auc, '+.4f')} {auc['sign'] or ''} |"
        )
    lines.append("")
    return lines


def targets_markdown(result: dict[str, Any]) -> list[str]:
    lines = ["| profile | target | value | threshold | |", "|---|---|---:|---:|---|"]
    for name, block in result["profiles"].items():
        for key, t in block["targets"].items():
            if key.startswith("ne_"):
                what = "\\|NE (b) - NE (a)\\|, mean of the seeds"
                value = fmt(None if t["value"] is None else abs(t["value"]))
            else:
                what = f"lag-1 autocorrelation of ({t['config'][0]}), largest seed"
                value = fmt(t["value"], "+.3f")
            verdict = "met" if t["met"] else "missed"
            lines.append(f"| {name} | {what} | {value} | <= {t['target']} | {verdict} |")
    lines.append("")
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    """Held-out NE and the lag-1 autocorrelation of the batch label means per configuration
    per profile (mean, min-max over the seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = list(result["profiles"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.25
    for i, c in enumerate(CONFIGS):
        xs = [j + (i - 1) * width for j in range(len(profiles))]
        for ax, key in zip(axes, ("ne", "lag1_autocorrelation"), strict=True):
            stats = [result["profiles"][p]["configs"][c][key] for p in profiles]
            means = [s["mean"] if s["mean"] is not None else math.nan for s in stats]
            low = [
                m - s["min"] if s["min"] is not None else 0
                for m, s in zip(means, stats, strict=True)
            ]
            high = [
                s["max"] - m if s["max"] is not None else 0
                for m, s in zip(means, stats, strict=True)
            ]
            ax.errorbar(xs, means, yerr=[low, high], fmt="o", capsize=4, label=LABELS[c])
    axes[1].axhline(AUTOCORRELATION_TARGET, color="grey", linestyle="--", linewidth=1)
    axes[1].axhline(0, color="black", linewidth=0.5)
    titles = (
        "held-out NE (mean, min-max over seeds)",
        f"lag-1 autocorrelation of batch label means (target <= {AUTOCORRELATION_TARGET})",
    )
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xticks(range(len(profiles)), profiles)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="toy sizes, 2 rounds (CI)")
    parser.add_argument(
        "--profiles",
        nargs="+",
        default=["clickstream", "rm1-like", "impressions"],
        metavar="NAME",
    )
    parser.add_argument("--reps", type=int, default=None, help="rounds (default 5; --quick 2)")
    parser.add_argument(
        "--passes", type=float, default=1.0, help="passes over the training rows (default 1)"
    )
    parser.add_argument(
        "--name", default=None, help="stem of the result files (default accuracy[_quick])"
    )
    parser.add_argument(
        "--shuffle-window",
        type=int,
        default=None,
        help="[reader] shuffle_window of every run (default: the reader's default)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the round orders")
    parser.add_argument("--data-seed", type=int, default=0, help="seed of the generated logs")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the tables here")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per child process")
    args = parser.parse_args(argv)
    if args.reps is None:
        args.reps = 2 if args.quick else 5
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = profile_jobs(args.quick)
    unknown = [p for p in args.profiles if p not in jobs]
    if unknown:
        raise SystemExit(f"unknown profile(s) {unknown}; known: {', '.join(jobs)}")
    root = args.work_dir or Path(tempfile_dir("recd-accuracy-"))
    began = time.perf_counter()
    profiles = {p: measure_profile(jobs[p], args, root / p) for p in args.profiles}
    shown_argv = sys.argv[1:] if argv is None else argv
    result = {
        "protocol": {
            "command": " ".join(["python benchmarks/accuracy.py", *shown_argv]),
            "reps": args.reps,
            "seeds": list(range(args.reps)),
            "seed": args.seed,
            "data_seed": args.data_seed,
            "threads": 1,
            "holdout_share": HOLDOUT_SHARE,
            "eval": "every held-out row, at the last step",
            "passes": args.passes,
            "reader": "in the training process (num_workers = 0); streams at the default, "
            + (
                f"shuffle_window = {args.shuffle_window}"
                if args.shuffle_window
                else "shuffle_window at the default"
            ),
            "configs": {c: asdict(s) for c, s in SETUPS.items()},
            "checkpoints": "off",
            "wall_s": time.perf_counter() - began,
        },
        "profiles": profiles,
    }
    stem = args.name or ("accuracy_quick" if args.quick else "accuracy")
    write_results(args.out_dir, stem, result, markdown, plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
