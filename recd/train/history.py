"""A run's whole history, for its outputs: ``train.json`` and ``loss.png`` describe every step of
the run, not just the segment the last ``recd train --resume`` trained.

* **Losses** come from ``.loss.json`` (:mod:`recd.checkpoint.sidecars`): the run's canonical,
  append-only history, where a step replayed after a resume is recorded once and the
  superseded branch of a pivot is left out. A run without checkpoints has no such file (and
  cannot be resumed): its losses are the segment's own.
* **Evaluations** come from ``metrics.jsonl``, which every segment appends to: the ones up to
  the step the segment resumed from belong to the trajectory it continued (a resume is
  bit-exact), the later ones are the segment's own; an evaluation of the abandoned tail of an
  earlier segment (a resume from an older checkpoint) is left out.

Everything written is strict JSON: a value that is not a finite number (the loss of a run
that diverged, the throughput of a segment that trained no step) is written as ``null``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from recd.checkpoint.sidecars import read_loss_history

__all__ = ["RunHistory", "json_safe", "read_evals", "run_history", "write_loss_plot"]

SUMMARY_STEPS = 10
"""``loss_first10_mean`` / ``loss_last10_mean``: the mean loss of this many steps."""


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None (dicts, lists, tuples
    walked; anything else returned as is), ready for ``json.dumps(..., allow_nan=False)``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


@dataclass(kw_only=True, slots=True)
class RunHistory:
    """Every recorded step of a run and every evaluation on its trajectory."""

    steps: np.ndarray
    """int64 [n]: steps with a recorded loss, ascending."""
    losses: np.ndarray
    """float64 [n]: their losses."""
    evals: list[dict[str, Any]]
    """``EvalResult.to_dict()`` of each evaluation, in step order."""
    source: str
    """Where the losses came from: ``.loss.json`` or ``this segment``."""

    def summary(self) -> dict[str, Any]:
        """JSON-ready: steps covered, mean loss of the first and last steps, evaluations."""
        first = self.losses[:SUMMARY_STEPS]
        last = self.losses[-SUMMARY_STEPS:]
        return json_safe(
            {
                "losses_from": self.source,
                "steps_recorded": len(self.steps),
                "first_step": int(self.steps[0]) if len(self.steps) else None,
                "last_step": int(self.steps[-1]) if len(self.steps) else None,
                "loss_first10_mean": float(np.mean(first)) if len(first) else None,
                "loss_last10_mean": float(np.mean(last)) if len(last) else None,
                "evals": self.evals,
                "final_eval": self.evals[-1] if self.evals else None,
            }
        )


def read_evals(metrics_path: Path) -> list[dict[str, Any]]:
    """The ``eval`` records of ``metrics.jsonl`` in file order (none when there is no file;
    an incomplete last line, left by a crash, is skipped)."""
    if not metrics_path.exists():
        return []
    records = []
    for line in metrics_path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("kind") == "eval":
            records.append({k: v for k, v in record.items() if k != "kind"})
    return records


def run_history(
    *,
    loss_dir: Path | None,
    metrics_path: Path,
    first_step: int,
    losses: Sequence[float],
    evals: Sequence[Mapping[str, Any]],
) -> RunHistory:
    """The history of the run whose latest segment started at ``first_step`` and recorded
    ``losses`` (steps ``first_step + 1 ..``) and ``evals``; ``loss_dir``: the directory of its
    ``.loss.json`` (None: the run keeps none)."""
    steps = np.arange(first_step + 1, first_step + 1 + len(losses), dtype=np.int64)
    values = np.asarray(losses, dtype=np.float64)
    source = "this segment"
    if loss_dir is not None:
        recorded = read_loss_history(loss_dir)
        if len(recorded.steps):
            steps, values, source = recorded.steps, recorded.losses, ".loss.json"
    earlier: dict[int, dict[str, Any]] = {}
    for record in read_evals(metrics_path):
        step = record.get("step")
        if isinstance(step, int) and step <= first_step:
            earlier[step] = record  # the latest record of a step wins
    mine = [dict(e) for e in evals]
    ours = {int(e["step"]) for e in mine}
    merged = [earlier[s] for s in sorted(earlier) if s not in ours] + mine
    merged.sort(key=lambda e: int(e["step"]))
    return RunHistory(steps=steps, losses=values, evals=merged, source=source)


def write_loss_plot(history: RunHistory, path: Path, *, title: str) -> Path:
    """PNG of the training loss per step (and its running mean) and the held-out losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    try:
        losses = history.losses
        ax.plot(history.steps, losses, color="tab:blue", alpha=0.3, lw=0.8, label="train loss")
        if len(losses) >= 2:
            k = max(1, min(20, len(losses) // 10))
            smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
            ax.plot(history.steps[k - 1 :], smooth, color="tab:blue", lw=1.8, label=f"mean of {k}")
        evals = [e for e in history.evals if e.get("loss") is not None]
        if evals:
            ax.plot(
                [e["step"] for e in evals],
                [e["loss"] for e in evals],
                "o-",
                color="tab:red",
                label="held-out loss",
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("BCE loss")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path
