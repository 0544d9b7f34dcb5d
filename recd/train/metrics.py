"""Evaluation metrics of a click model: normalized entropy (NE), ROC AUC, and memory peaks.

Both metrics take flat arrays of N predictions and N labels in {0, 1} (numpy or torch; a B x T
batch is flattened by the caller per task).

* **NE** (He et al., "Practical lessons from predicting clicks on ads at Facebook"): the mean
  binary cross-entropy of the predictions divided by the entropy of the base rate ``p`` (the
  mean label of the evaluated rows)::

      NE = mean_i BCE(y_i, q_i) / H(p),   H(p) = -(p log p + (1 - p) log(1 - p))

  1.0 is what predicting the base rate for every row scores; lower is better. Undefined (NaN)
  when every label is equal (H(p) = 0) or there are no rows.
* **AUC**: the probability that a random positive scores above a random negative, ties
  counting one half (Mann-Whitney U). Computed from the average ranks of the scores in one
  sort, O(N log N); NaN when a class is absent, an error on NaN scores (callers that accept a
  diverged model check ``np.isfinite`` first). Monotone in the scores, so logits and
  probabilities give the same AUC.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from recd.errors import ConfigError
from recd.progress import peak_rss_bytes

__all__ = [
    "base_rate_entropy",
    "bce_from_logits",
    "normalized_entropy",
    "peak_cuda_bytes",
    "peak_rss_bytes",
    "roc_auc",
]


def _flat(values: Any) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().to("cpu", torch.float64).numpy()
    return np.asarray(values, dtype=np.float64).reshape(-1)


def _check_pair(scores: np.ndarray, labels: np.ndarray) -> None:
    if scores.shape != labels.shape:
        raise ConfigError(f"metrics: {scores.shape[0]} predictions for {labels.shape[0]} labels")
    if labels.size and not np.all((labels == 0.0) | (labels == 1.0)):
        bad = labels[(labels != 0.0) & (labels != 1.0)][0]
        raise ConfigError(f"metrics: labels must be 0 or 1, got {bad}")


def base_rate_entropy(labels: Any) -> float:
    """H(p) in nats of the base rate p = mean(labels); 0 when all labels are equal."""
    y = _flat(labels)
    if y.size == 0:
        return math.nan
    p = float(y.mean())
    if p <= 0.0 or p >= 1.0:
        return 0.0
    return -(p * math.log(p) + (1.0 - p) * math.log(1.0 - p))


def bce_from_logits(logits: Any, labels: Any) -> float:
    """Mean binary cross-entropy (nats) of N logits against N labels, computed stably in float64:
    ``max(x, 0) - x * y + log(1 + exp(-|x|))``."""
    x, y = _flat(logits), _flat(labels)
    _check_pair(x, y)
    if x.size == 0:
        return math.nan
    return float(np.mean(np.maximum(x, 0.0) - x * y + np.log1p(np.exp(-np.abs(x)))))


def normalized_entropy(logits: Any, labels: Any) -> float:
    """NE = mean BCE(logits, labels) / H(mean label); NaN when undefined (see module docs)."""
    entropy = base_rate_entropy(labels)
    if not entropy > 0.0:  # also catches NaN (no rows)
        return math.nan
    return bce_from_logits(logits, labels) / entropy


def roc_auc(scores: Any, labels: Any) -> float:
    """Area under the ROC curve of N scores for N labels in {0, 1}; ties count 1/2.

    Mann-Whitney: ``(R_pos - n_pos (n_pos + 1) / 2) / (n_pos n_neg)`` with ``R_pos`` the sum of
    the positives' ranks, tied scores sharing their average rank. NaN if a class is absent.
    """
    s, y = _flat(scores), _flat(labels)
    _check_pair(s, y)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    if np.isnan(s).any():
        raise ConfigError(
            f"metrics: AUC of NaN scores ({int(np.isnan(s).sum()):,} of {s.size:,}): the model's "
            "outputs are not finite (its weights or Adam state hold NaN/inf: training diverged)"
        )
    order = np.argsort(s, kind="stable")
    sorted_scores = s[order]
    # Runs of equal scores: run k spans sorted positions [starts[k], ends[k]).
    new_run = np.empty(s.size, dtype=bool)
    new_run[0] = True
    np.not_equal(sorted_scores[1:], sorted_scores[:-1], out=new_run[1:])
    starts = np.flatnonzero(new_run)
    ends = np.append(starts[1:], s.size)
    average_rank = (starts + ends + 1) / 2.0  # mean of the 1-based ranks starts+1 .. ends
    run_of = np.cumsum(new_run) - 1  # sorted position -> run index
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = average_rank[run_of]
    rank_sum = float(ranks[y == 1.0].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def peak_cuda_bytes(device: torch.device) -> int | None:
    """``torch.cuda.max_memory_allocated`` on a CUDA device, else None."""
    if device.type != "cuda":
        return None
    return int(torch.cuda.max_memory_allocated(device))
