"""The run history behind train.json and loss.png: which losses and evaluations count."""

from __future__ import annotations

import json
import math
from pathlib import Path

from recd.checkpoint.sidecars import LossLog
from recd.train.history import json_safe, read_evals, run_history


def write_metrics(path: Path, records: list[dict[str, object]], torn: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + torn)


def an_eval(step: int, loss: float) -> dict[str, object]:
    return {"kind": "eval", "step": step, "loss": loss, "ne": 1.0, "auc": 0.5, "rows": 8}


def test_evals_of_an_abandoned_tail_are_left_out(tmp_path: Path) -> None:
    """Segment A evaluated at 10, 20, 30; the run resumed from step 20 (an older checkpoint)
    and its new segment evaluated at 30 again: A's 30 is not on the run's trajectory."""
    metrics = tmp_path / "metrics.jsonl"
    write_metrics(
        metrics,
        [an_eval(10, 0.7), {"kind": "train", "step": 10}, an_eval(20, 0.6), an_eval(30, 0.9)],
        torn='{"kind": "eval", "st',  # a crash mid-line
    )
    assert [e["step"] for e in read_evals(metrics)] == [10, 20, 30]
    history = run_history(
        loss_dir=None,
        metrics_path=metrics,
        first_step=20,
        losses=[0.5] * 10,
        evals=[{"step": 30, "loss": 0.4, "ne": 0.9, "auc": 0.6, "rows": 8}],
    )
    assert [(e["step"], e["loss"]) for e in history.evals] == [(10, 0.7), (20, 0.6), (30, 0.4)]
    assert history.steps.tolist() == list(range(21, 31)) and history.source == "this segment"


def test_losses_come_from_the_loss_history_when_there_is_one(tmp_path: Path) -> None:
    with LossLog(tmp_path) as log:
        for step in range(1, 6):
            log.append(step, 1.0 / step)
    history = run_history(
        loss_dir=tmp_path,
        metrics_path=tmp_path / "metrics.jsonl",  # none
        first_step=3,
        losses=[1 / 4, 1 / 5],
        evals=[],
    )
    assert history.steps.tolist() == [1, 2, 3, 4, 5] and history.source == ".loss.json"
    summary = history.summary()
    assert summary["loss_first10_mean"] == sum(1.0 / s for s in range(1, 6)) / 5
    assert summary["final_eval"] is None and summary["evals"] == []


def test_json_safe_turns_non_finite_numbers_into_null() -> None:
    value = {"a": math.nan, "b": [1.0, math.inf, (2, -math.inf)], "c": "nan", "d": 3}
    text = json.dumps(json_safe(value), allow_nan=False)
    assert json.loads(text) == {"a": None, "b": [1.0, None, [2, None]], "c": "nan", "d": 3}
