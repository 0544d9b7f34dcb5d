"""Failure-free cost of survivor recovery: the update-undo capture, on the trainer benchmark's model.

    python benchmarks/undo_overhead.py              # rm1-like, 100k rows, batch 2048 per rank
    python benchmarks/undo_overhead.py --quick      # 10k rows, batch 256 (undo_overhead_quick.*)

``recd train --recovery survivor`` keeps, every step, what it needs to take that step's update
back (a survivor that applied the update of a step its dead peer never finished undoes it).
That is the only work survivor mode adds to a step that does not fail, so it decides whether
survivor recovery is a net win. Two ways to keep it (``recd train --undo``):

- ``copy`` (the default): the pre-update values the step has at hand anyway: the copy of the
  dense layers' weights, m and v that the capture takes before torch's in-place Adam, and the
  table rows the lazy row-sparse Adam gathers before it writes; no work after the update;
- ``inverse``: SwIFT's algebraic inverse, made exact by corrections computed after every
  update (smaller record, an inverse pass per step);
- ``copy+peer``: ``copy`` plus ``--peer-copy`` (each rank sends the rows its update touched to
  the rank keeping a copy of its shards, :mod:`recd.recovery.peer_copy`).

Model and data: the trainer benchmark's (``benchmarks/trainer.py``): the RM1-like DLRM of the
profile (sequence transformers, DedupMode FULL: lookups and transformers once per distinct row),
its reader job (IKJTs, hashing, truncation, log1p), batches converted beforehand from the
clustered table; 2 ranks (gloo, 1 thread each, forked), tables sharded table-wise by
``recd.train.sharding`` (the sharded trainer ``recd train --nproc 2`` runs), Adam lr 3e-3.

Protocol. Each repetition is a fresh pair of ranks; after the warm-up steps (plain), every
step is one of ``plain`` (``ShardedAdam.step()``), ``copy``, ``inverse``
(``step(capture=True, undo=...)``) and ``copy+peer``, in rounds holding each once, in an order drawn from a
generator seeded by ``--seed`` and the repetition (the same on both ranks); the steps of a
round train on the same batch (rank r of round j: converted batch 2j + r), so that the
batch's content, which sets most of a step's time, is the same on both sides of a pair. A step's time is
zero_grad + forward + loss + backward + optimizer step (+ capture), the slower rank's, between
barriers; the optimizer step alone is recorded too. Overhead = sum(method's steps) /
sum(plain steps) - 1 over the rounds of every repetition, paired by round, with a 95%
Student-t interval (``benchmarks.checkpoint.paired_ratio_interval``); the headline
``failure_free_overhead_upper95`` is that interval's bad end. The capture's own time (the
optimizer step with the capture minus the plain one in the same round, over the plain
training step) is the same figure without the forward/backward noise. Per repetition: the
ratio of median steps. A failed repetition is counted and reported. Memory: the bytes each
record holds until the next step.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.checkpoint import paired_ratio_interval  # noqa: E402
from benchmarks.trainer import (  # noqa: E402
    DEFAULT_SIZE,
    ModelSize,
    load_1min,
    model_config,
    prepare_tables,
    profile_size,
    write_batches,
)
from recd.stats import spread  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
METHODS = ("plain", "copy", "inverse", "copy+peer")
"""``copy+peer``: the ``copy`` capture plus the peer copy of the shards (``--peer-copy``)."""
WORLD = 2
WARMUP_STEPS = 3


def step_order(rounds: int, seed: str) -> list[str]:
    """Warm-up (plain) steps, then ``rounds`` rounds of every method once, seeded order."""
    rng = random.Random(seed)
    order = ["plain"] * WARMUP_STEPS
    for _ in range(rounds):
        methods = list(METHODS)
        rng.shuffle(methods)
        order += methods
    return order


def _rank(spec: dict[str, Any], rank: int, out: Path) -> None:
    """One forked rank: train ``spec['order']`` steps, write the step times to ``out``."""
    try:
        import pickle

        import torch
        import torch.distributed as dist

        from recd.models import bce_loss
        from recd.optim import AdamConfig
        from recd.train.sharding import build_sharded_training

        torch.set_num_threads(1)
        store = dist.FileStore(spec["store"], WORLD)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=WORLD, timeout=datetime.timedelta(600)
        )
        dmp, opt = build_sharded_training(
            model_config(spec["profile"], ModelSize(**spec["size"]), "full"),
            AdamConfig(lr=spec["lr"]),
            plan="table_wise",
            seed=spec["seed"],
        )
        from recd.recovery.peer_copy import PeerCopy

        peer = PeerCopy(opt)
        peer.seed(0)
        files = sorted(Path(spec["batch_dir"]).glob("*.pkl"))
        times: list[dict[str, Any]] = []
        for i, method in enumerate(spec["order"]):
            # the methods of a round train on the same batch (its content sets the step time)
            b = i if i < WARMUP_STEPS else WARMUP_STEPS + (i - WARMUP_STEPS) // len(METHODS)
            with files[(b * WORLD + rank) % len(files)].open("rb") as f:
                batch = pickle.load(f)
            dist.barrier()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = bce_loss(dmp(batch.dense, batch.sparse), batch.labels)
            loss.backward()
            t1 = time.perf_counter()
            opt.keep_rows_after = method == "copy+peer"
            if method == "plain":
                record = opt.step()
            else:
                record = opt.step(capture=True, undo=method.removesuffix("+peer"))
            if method == "copy+peer":  # the exchange (before the loss all-reduce), the commit
                peer.send_step()
                peer.commit()
            opt.rows_after = []
            t2 = time.perf_counter()
            times.append(
                {
                    "method": method,
                    "warmup": i < WARMUP_STEPS,
                    "step_s": t2 - t0,
                    "optimizer_s": t2 - t1,
                    "record_bytes": 0 if record is None else record.nbytes,
                    "peer_bytes": peer.nbytes,
                    "loss": float(loss.item()),
                }
            )
            del record, batch, loss
        opt.close()
        dist.barrier()
        dist.destroy_process_group()
        out.write_text(json.dumps(times))
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)


def run_rep(spec: dict[str, Any], scratch: Path, timeout_s: float) -> list[dict[str, Any]]:
    """Two forked ranks; per step, the slower rank's times (raises on a failed rank)."""
    scratch.mkdir(parents=True, exist_ok=True)
    store = scratch / "store"
    store.unlink(missing_ok=True)
    outs = [scratch / f"rank{r}.json" for r in range(WORLD)]
    for o in outs:
        o.unlink(missing_ok=True)
    ctx = mp.get_context("fork")
    procs = [
        ctx.Process(target=_rank, args=({**spec, "store": str(store)}, r, outs[r]))
        for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(1.0, deadline - time.monotonic()))
        if p.exitcode is None:
            p.kill()
            p.join()
    codes = [p.exitcode for p in procs]
    if any(c != 0 for c in codes):
        raise RuntimeError(f"ranks exited {codes}")
    ranks = [json.loads(o.read_text()) for o in outs]
    steps = []
    for per_rank in zip(*ranks, strict=True):
        steps.append(
            {
                "method": per_rank[0]["method"],
                "warmup": per_rank[0]["warmup"],
                "step_s": max(s["step_s"] for s in per_rank),
                "optimizer_s": max(s["optimizer_s"] for s in per_rank),
                "record_bytes": [s["record_bytes"] for s in per_rank],
                "peer_bytes": max(s["peer_bytes"] for s in per_rank),
            }
        )
    return steps


def _median_of(steps: list[dict[str, Any]], method: str, key: str = "step_s") -> float:
    return statistics.median(s[key] for s in steps if s["method"] == method and not s["warmup"])


def paired(steps: list[dict[str, Any]], method: str, key: str) -> tuple[list[float], list[float]]:
    """Per round (each method once, adjacent steps): the plain step's and ``method``'s."""
    timed = [s for s in steps if not s["warmup"]]
    rounds = [timed[i : i + len(METHODS)] for i in range(0, len(timed), len(METHODS))]
    plain = [next(s[key] for s in r if s["method"] == "plain") for r in rounds]
    treated = [next(s[key] for s in r if s["method"] == method) for r in rounds]
    return plain, treated


def summarise(reps: list[list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """Per method: overhead over the plain step, per repetition and paired over all rounds."""
    out: dict[str, Any] = {
        "plain": {
            "step_ms": spread([1000 * _median_of(rep, "plain") for rep in reps]),
            "optimizer_ms": spread(
                [1000 * _median_of(rep, "plain", "optimizer_s") for rep in reps]
            ),
        }
    }
    for method in METHODS[1:]:
        pairs = {
            key: [paired(rep, method, key) for rep in reps] for key in ("step_s", "optimizer_s")
        }
        plain_steps = [x for a, _ in pairs["step_s"] for x in a]
        treated_steps = [x for _, b in pairs["step_s"] for x in b]
        whole = paired_ratio_interval(plain_steps, treated_steps, seed=args.seed)
        # the optimizer step alone (where the capture runs), over the plain *training* step
        opt_plain = [x for a, _ in pairs["optimizer_s"] for x in a]
        opt_treated = [x for _, b in pairs["optimizer_s"] for x in b]
        with_capture = [
            x + (b - a) for x, a, b in zip(plain_steps, opt_plain, opt_treated, strict=True)
        ]
        own = paired_ratio_interval(plain_steps, with_capture, seed=args.seed)
        record = [
            b
            for rep in reps
            for s in rep
            if s["method"] == method and not s["warmup"]
            for b in s["record_bytes"]
        ]
        out[method] = {
            "overhead": whole["point"],
            "overhead_ci95": whole["ci95"],
            "overhead_interval": whole,
            "overhead_per_repetition": spread(
                [_median_of(rep, method) / _median_of(rep, "plain") - 1 for rep in reps]
            ),
            "capture_time_fraction": own["point"],
            "capture_time_fraction_ci95": own["ci95"],
            "step_ms": spread([1000 * _median_of(rep, method) for rep in reps]),
            "optimizer_ms": spread([1000 * _median_of(rep, method, "optimizer_s") for rep in reps]),
            "record_bytes_per_rank_median": statistics.median(record),
        }
    return out


def _pct(x: float) -> str:
    return f"{100 * x:+.2f}%"


def _ci(ci: list[float]) -> str:
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def markdown(r: dict[str, Any]) -> str:
    p = r["protocol"]
    m = r["methods"]
    lines = [
        f"Failure-free overhead of survivor recovery (`--undo copy`, the default): "
        f"**{_pct(r['failure_free_overhead'])}** of a training step, 95% interval "
        f"{_ci(r['failure_free_overhead_ci95'])}; the capture's own time (optimizer step "
        f"with capture minus without, paired) {_pct(r['capture_time_fraction'])} "
        f"{_ci(r['capture_time_fraction_ci95'])}. `--undo inverse`: "
        f"{_pct(r['failure_free_overhead_inverse'])} "
        f"{_ci(r['failure_free_overhead_inverse_ci95'])}. `--peer-copy` (on top of copy): "
        f"{_pct(r['failure_free_overhead_peer_copy'])} "
        f"{_ci(r['failure_free_overhead_peer_copy_ci95'])}, holding "
        f"{r['peer_copy_bytes_per_rank'] / 1e6:.0f} MB per rank.",
        "",
        f"Model: the trainer benchmark's RM1-like DLRM ({p['profile']}, DedupMode FULL, "
        f"{r['model']['parameters']:,} parameters, {r['model']['dense_parameters']:,} dense), "
        f"{p['world_size']} ranks (gloo, table-wise, 1 thread each), batch {p['batch_size']} "
        f"per rank; {p['repetitions']} repetitions x {p['rounds']} rounds of the "
        f"{len(r['methods'])} methods each, in seeded random order ({p['failed_repetitions']} failed); load "
        f"{p['load_average_1min']['before']:.2f} -> {p['load_average_1min']['after']:.2f}; "
        f"`{p['command']}`",
        "",
        "| method | step ms (median of reps, min-max) | optimizer step ms (+ peer exchange) | "
        "overhead, paired [95%] | capture's own time [95%] | record / rank |",
        "|---|---|---|---|---|---|",
    ]
    plain = m["plain"]
    lines.append(
        f"| plain | {plain['step_ms']['median']:.1f} ({plain['step_ms']['min']:.1f}-"
        f"{plain['step_ms']['max']:.1f}) | {plain['optimizer_ms']['median']:.1f} | - | - | 0 |"
    )
    for name in METHODS[1:]:
        x = m[name]
        lines.append(
            f"| {name} | {x['step_ms']['median']:.1f} ({x['step_ms']['min']:.1f}-"
            f"{x['step_ms']['max']:.1f}) | {x['optimizer_ms']['median']:.1f} | "
            f"{_pct(x['overhead'])} {_ci(x['overhead_ci95'])} | "
            f"{_pct(x['capture_time_fraction'])} {_ci(x['capture_time_fraction_ci95'])} | "
            f"{x['record_bytes_per_rank_median'] / 1e6:.1f} MB |"
        )
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10k rows, batch 256")
    parser.add_argument("--profile", default="rm1-like")
    parser.add_argument("--rows", type=int, help="table rows (default 100k, quick 10k)")
    parser.add_argument("--batch-size", type=int, help="per rank (default 2048, quick 256)")
    parser.add_argument("--rounds", type=int, help="rounds per repetition (default 150, quick 4)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions (fresh ranks, >= 3)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per repetition")
    parser.add_argument("--work-dir", type=Path, help="keep (and reuse) the table and batches")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.rows = args.rows or (10_000 if args.quick else 100_000)
    args.batch_size = args.batch_size or (256 if args.quick else 2048)
    args.rounds = args.rounds or (4 if args.quick else 150)
    return args


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from benchmarks.trainer import describe_model

    args = parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="recd-undo-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"data: {args.profile}, {args.rows:,} rows in {work}", flush=True)
    data = prepare_tables(
        work, args.profile, rows=args.rows, seed=args.seed, num_shards=16, row_group_rows=8192
    )
    size = profile_size(args.profile, DEFAULT_SIZE)
    batches_used = WARMUP_STEPS + args.rounds
    batch_dir = work / "batches" / f"B{args.batch_size}"
    meta = write_batches(
        args.profile,
        work / "table",
        batch_dir,
        size,
        batch_size=args.batch_size,
        count=WORLD * batches_used,
    )
    load_before = load_1min()
    reps: list[list[dict[str, Any]]] = []
    failures: list[dict[str, Any]] = []
    for rep in range(args.reps):
        spec = {
            "profile": args.profile,
            "size": asdict(size),
            "batch_dir": str(batch_dir),
            "lr": args.lr,
            "seed": args.seed,
            "order": step_order(args.rounds, f"{args.seed}/{rep}"),
        }
        started = time.perf_counter()
        try:
            steps = run_rep(spec, work / "scratch", args.timeout_s)
        except RuntimeError as exc:
            failures.append({"repetition": rep, "error": str(exc)})
            print(f"repetition {rep}: failed ({exc})", flush=True)
            continue
        reps.append(steps)
        medians = {m: 1000 * _median_of(steps, m) for m in METHODS}
        print(
            f"repetition {rep}: {time.perf_counter() - started:.0f} s; median step ms "
            + ", ".join(f"{m} {v:.1f}" for m, v in medians.items()),
            flush=True,
        )
    if not reps:
        print("every repetition failed", file=sys.stderr)
        return 1
    methods = summarise(reps, args)
    peer_bytes = max(s["peer_bytes"] for rep in reps for s in rep)
    rows_read = WORLD * args.batch_size * min(batches_used, meta["count"] // WORLD)
    result = {
        "failure_free_overhead": methods["copy"]["overhead"],
        "failure_free_overhead_ci95": methods["copy"]["overhead_ci95"],
        "failure_free_overhead_upper95": methods["copy"]["overhead_ci95"][1],
        "capture_time_fraction": methods["copy"]["capture_time_fraction"],
        "capture_time_fraction_ci95": methods["copy"]["capture_time_fraction_ci95"],
        "failure_free_overhead_inverse": methods["inverse"]["overhead"],
        "failure_free_overhead_inverse_ci95": methods["inverse"]["overhead_ci95"],
        "failure_free_overhead_peer_copy": methods["copy+peer"]["overhead"],
        "failure_free_overhead_peer_copy_ci95": methods["copy+peer"]["overhead_ci95"],
        "peer_copy_bytes_per_rank": peer_bytes,
        "methods": methods,
        "model": describe_model(args.profile, size),
        "protocol": {
            "profile": args.profile,
            "world_size": WORLD,
            "plan": "table_wise",
            "dedup_mode": "full",
            "batch_size": args.batch_size,
            "threads_per_rank": 1,
            "repetitions": args.reps,
            "failed_repetitions": len(failures),
            "failures": failures,
            "rounds": args.rounds,
            "warmup_steps": WARMUP_STEPS,
            "rows_read_per_repetition": rows_read,
            "rows_in_table": data.get("rows"),
            "order_seed": args.seed,
            "interval": "paired per round (plain vs the method, adjacent steps), pooled over "
            "repetitions: benchmarks.checkpoint.paired_ratio_interval",
            "load_average_1min": {"before": load_before, "after": load_1min()},
            "command": " ".join(["python benchmarks/undo_overhead.py", *sys.argv[1:]]),
        },
        "steps": reps,
    }
    name = "undo_overhead_quick" if args.quick else "undo_overhead"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{name}.md").write_text(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
