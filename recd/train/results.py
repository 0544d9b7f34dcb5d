"""What a training run measured, and the files it leaves: ``metrics.jsonl``, ``train.json``,
``loss.png``, and the few lines ``recd train`` prints."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from recd.durable import write_json_atomic
from recd.train.config import TrainConfig
from recd.train.history import json_safe, run_history, write_loss_plot

__all__ = [
    "METRICS_FILE",
    "PLOT_FILE",
    "SUMMARY_FILE",
    "EvalResult",
    "MetricsWindow",
    "MetricsWriter",
    "TrainResult",
    "format_summary",
    "write_outputs",
]

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"
SUMMARY_FILE = "train.json"


@dataclass(kw_only=True, slots=True)
class EvalResult:
    """Metrics of the model on the held-out partitions at one step."""

    step: int
    """Optimizer steps completed when evaluated."""
    loss: float
    """Mean BCE (nats) over every held-out row (and label)."""
    ne: float
    """Normalized entropy: ``loss / H(base rate)`` (mean over labels); 1.0 = predicting the
    base rate."""
    auc: float
    """ROC AUC (mean over labels); 0.5 = chance."""
    rows: int
    """Held-out rows evaluated."""
    base_rate: float
    """Mean label of those rows."""
    seconds: float
    """Wall time of the evaluation."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(kw_only=True, slots=True)
class TrainResult:
    """What a training run did, measured."""

    first_step: int
    """Steps already done when this run started (0 unless resumed)."""
    steps: int
    """Optimizer steps completed at the end."""
    losses: list[float]
    """Training loss of each step of this run (steps ``first_step + 1 .. steps``)."""
    evals: list[EvalResult]
    """Every evaluation, in step order."""
    samples: int
    """Training rows consumed by this run (all ranks)."""
    train_s: float
    """Wall time of the training steps (reading included, evaluation excluded)."""
    wall_s: float
    """Wall time of :meth:`Trainer.train` (everything)."""
    peak_rss_bytes: int
    """Peak resident memory of rank 0's process."""
    peak_cuda_bytes: int | None
    """``torch.cuda.max_memory_allocated`` of rank 0 (None on CPU)."""
    world_size: int
    """Trainer processes."""
    run_dir: Path
    """Where the files below were written (by rank 0)."""
    stop_reason: str | None = None
    """Why training stopped before ``train.steps`` (None: it did not)."""
    already_done: bool = False
    """A resumed run that was already at ``train.steps``: nothing trained, no output
    rewritten."""
    table_snapshot: int | None = None
    """The Iceberg snapshot of the training table read (None: a Hive-layout table)."""

    @property
    def samples_per_s(self) -> float:
        """Training throughput of the whole job (rows / training wall time)."""
        return self.samples / self.train_s if self.train_s > 0 else math.nan

    @property
    def final_eval(self) -> EvalResult | None:
        """The last evaluation, if any."""
        return self.evals[-1] if self.evals else None

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_FILE

    @property
    def plot_path(self) -> Path:
        return self.run_dir / PLOT_FILE

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (per-step losses are in ``metrics.jsonl`` / the plot)."""
        first = self.losses[: min(10, len(self.losses))]
        last = self.losses[-min(10, len(self.losses)) :]
        return {
            "first_step": self.first_step,
            "steps": self.steps,
            "loss_first10_mean": float(np.mean(first)) if first else None,
            "loss_last10_mean": float(np.mean(last)) if last else None,
            "evals": [e.to_dict() for e in self.evals],
            "samples": self.samples,
            "train_s": self.train_s,
            "wall_s": self.wall_s,
            "samples_per_s": self.samples_per_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "peak_cuda_bytes": self.peak_cuda_bytes,
            "world_size": self.world_size,
            "run_dir": str(self.run_dir),
            "stop_reason": self.stop_reason,
            "table_snapshot": self.table_snapshot,
        }


@dataclass(slots=True)
class MetricsWindow:
    """Losses, rows and seconds since the last log line (wall, and CPU of this process:
    the batch's reading when the reader runs in-process, and the step)."""

    losses: list[float] = field(default_factory=list)
    rows: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0

    def add(self, loss: float, rows: int, seconds: float, cpu_seconds: float) -> None:
        self.losses.append(loss)
        self.rows += rows
        self.seconds += seconds
        self.cpu_seconds += cpu_seconds

    @property
    def mean_loss(self) -> float:
        return float(np.mean(self.losses)) if self.losses else math.nan

    @property
    def last_loss(self) -> float:
        return self.losses[-1] if self.losses else math.nan

    @property
    def samples_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else math.nan

    @property
    def samples_per_cpu_s(self) -> float:
        return self.rows / self.cpu_seconds if self.cpu_seconds > 0 else math.nan


class MetricsWriter:
    """``metrics.jsonl``: one JSON object per line, flushed per line (rank 0 only)."""

    def __init__(self, path: Path, *, fresh: bool, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            if fresh:
                path.write_text("")

    def write(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(json_safe(record), allow_nan=False) + "\n")


def write_outputs(config: TrainConfig, result: TrainResult) -> None:
    """``train.json`` (the config, this segment's ``result`` and the whole run's
    history as ``run``) and ``loss.png`` (the whole run): :mod:`recd.train.history`."""
    checkpoints = config.checkpoint.enabled
    history = run_history(
        loss_dir=config.checkpoint_dir if checkpoints else None,
        metrics_path=result.metrics_path,
        first_step=result.first_step,
        losses=result.losses,
        evals=[e.to_dict() for e in result.evals],
    )
    summary = {
        "config": json.loads(json.dumps(config.to_dict(), default=str)),
        "result": result.to_dict(),
        "run": history.summary(),
    }
    write_json_atomic(result.run_dir / SUMMARY_FILE, json_safe(summary))
    if config.train.plot:
        title = f"steps 1-{result.steps}"
        if result.steps > result.first_step:
            title += f", {result.samples_per_s:,.0f} samples/s"
            if result.first_step:
                title += f" (steps {result.first_step + 1}-{result.steps})"
        final = history.evals[-1] if history.evals else None
        if final is not None and final.get("ne") is not None and final.get("auc") is not None:
            title += f", held-out NE {final['ne']:.3f}, AUC {final['auc']:.3f}"
        write_loss_plot(history, result.run_dir / PLOT_FILE, title=title)


def format_summary(result: TrainResult) -> str:
    """A few lines for the terminal."""
    if result.already_done:
        return (
            f"already at step {result.steps}: nothing to train (raise train.steps to train "
            f"further); outputs unchanged: {result.run_dir / SUMMARY_FILE}"
        )
    lines = [
        f"trained {result.steps - result.first_step} steps ({result.samples:,} samples, "
        f"{result.world_size} process{'es' if result.world_size > 1 else ''}): "
        f"{result.samples_per_s:,.0f} samples/s, peak RSS {result.peak_rss_bytes / 2**20:,.0f} MiB"
        + (
            f", peak CUDA {result.peak_cuda_bytes / 2**20:,.0f} MiB"
            if result.peak_cuda_bytes is not None
            else ""
        ),
    ]
    if result.losses:
        head = float(np.mean(result.losses[:10]))
        tail = float(np.mean(result.losses[-10:]))
        lines.append(f"train loss {head:.4f} (first 10 steps) -> {tail:.4f} (last 10)")
    if result.final_eval is not None:
        e = result.final_eval
        lines.append(
            f"held-out ({e.rows:,} rows, base rate {e.base_rate:.3f}): loss {e.loss:.4f}, "
            f"NE {e.ne:.4f}, AUC {e.auc:.4f}"
        )
    if result.stop_reason:
        lines.append(f"stopped early: {result.stop_reason}")
    lines.append(f"metrics: {result.metrics_path}  plot: {result.plot_path}")
    return "\n".join(lines)
