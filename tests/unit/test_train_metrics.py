"""NE and AUC against hand computations and plain reference implementations (no sklearn)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recd.errors import ConfigError
from recd.train.metrics import (
    base_rate_entropy,
    bce_from_logits,
    normalized_entropy,
    roc_auc,
)


def pairwise_auc(scores: list[float], labels: list[int]) -> float:
    """Reference: count (positive, negative) pairs, a tie counting 1/2. O(n^2)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y == 0]
    wins = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


# ---------------------------------------------------------------------- AUC
@pytest.mark.parametrize(
    ("scores", "labels", "expected"),
    [
        ([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1], 0.75),  # 3 of 4 pairs ordered
        ([0.1, 0.2, 0.3], [0, 1, 1], 1.0),  # perfect
        ([0.3, 0.2, 0.1], [0, 1, 1], 0.0),  # reversed
        ([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1], 0.5),  # all tied
        ([1.0, 1.0, 2.0, 2.0], [0, 1, 0, 1], 0.5),  # (1/2 + 0 + 1 + 1/2) / 4
        ([0.5, 0.5, 0.7], [0, 1, 1], 0.75),  # (1/2 + 1) / 2
        ([3.0, 1.0, 2.0, 2.0, 0.0], [1, 0, 1, 0, 0], 5.5 / 6.0),  # one tie among 6 pairs
    ],
)
def test_auc_hand_computed(scores: list[float], labels: list[int], expected: float) -> None:
    assert roc_auc(np.array(scores), np.array(labels)) == pytest.approx(expected, abs=1e-12)
    assert pairwise_auc(scores, labels) == pytest.approx(expected, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(min_value=-3, max_value=3), st.integers(min_value=0, max_value=1)),
        min_size=2,
        max_size=60,
    )
)
def test_auc_equals_pairwise_reference_with_many_ties(pairs: list[tuple[int, int]]) -> None:
    scores = [float(s) for s, _ in pairs]
    labels = [y for _, y in pairs]
    if len(set(labels)) < 2:
        assert math.isnan(roc_auc(scores, labels))
        return
    assert roc_auc(scores, labels) == pytest.approx(pairwise_auc(scores, labels), abs=1e-12)


def test_auc_is_monotone_invariant_and_accepts_tensors() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=500)
    labels = (rng.random(500) < 1 / (1 + np.exp(-2 * logits))).astype(np.float32)
    from_logits = roc_auc(torch.from_numpy(logits), torch.from_numpy(labels))
    from_probs = roc_auc(1 / (1 + np.exp(-logits)), labels)
    assert from_logits == pytest.approx(from_probs, abs=1e-12)
    assert from_logits > 0.7  # labels drawn from the scores: well above chance
    assert roc_auc(-logits, labels) == pytest.approx(1.0 - from_logits, abs=1e-12)


def test_auc_undefined_without_both_classes() -> None:
    assert math.isnan(roc_auc([0.1, 0.9], [1, 1]))
    assert math.isnan(roc_auc([0.1, 0.9], [0, 0]))
    assert math.isnan(roc_auc([], []))


# ---------------------------------------------------------------------- BCE and NE
def test_bce_matches_torch_and_is_stable() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(scale=4.0, size=1000)
    y = (rng.random(1000) < 0.3).astype(np.float64)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        torch.from_numpy(x), torch.from_numpy(y)
    ).item()
    assert bce_from_logits(x, y) == pytest.approx(expected, rel=1e-12)
    # Extreme logits: exact limits, no overflow.
    assert bce_from_logits([1000.0, -1000.0], [1.0, 0.0]) == 0.0
    assert bce_from_logits([1000.0], [0.0]) == pytest.approx(1000.0)


def test_entropy_of_base_rate_by_hand() -> None:
    assert base_rate_entropy([1, 0]) == pytest.approx(math.log(2))
    p = 0.25
    assert base_rate_entropy([1, 0, 0, 0]) == pytest.approx(
        -(p * math.log(p) + (1 - p) * math.log(1 - p))
    )
    assert base_rate_entropy([1, 1, 1]) == 0.0


def test_ne_hand_computed() -> None:
    # Predicting the base rate for every row scores NE = 1 exactly (up to rounding).
    labels = [1, 0, 0, 0]
    assert normalized_entropy([logit(0.25)] * 4, labels) == pytest.approx(1.0, abs=1e-12)
    # labels [1, 0], logits [2, -2]: BCE = log(1 + e^-2) for both rows, H(1/2) = log 2.
    expected = math.log1p(math.exp(-2.0)) / math.log(2.0)
    assert normalized_entropy([2.0, -2.0], [1, 0]) == pytest.approx(expected, abs=1e-12)
    # A confidently wrong model is worse than the base rate.
    assert normalized_entropy([-2.0, 2.0], [1, 0]) > 1.0


def test_ne_undefined_when_labels_are_constant() -> None:
    assert math.isnan(normalized_entropy([0.3, -0.1], [0, 0]))
    assert math.isnan(normalized_entropy([], []))


def test_bad_inputs_are_reported() -> None:
    with pytest.raises(ConfigError, match="3 predictions for 2 labels"):
        roc_auc([0.1, 0.2, 0.3], [0, 1])
    with pytest.raises(ConfigError, match=r"labels must be 0 or 1, got 0\.5"):
        normalized_entropy([0.0, 0.0], [0.5, 1.0])
    with pytest.raises(ConfigError, match="NaN"):
        roc_auc([float("nan"), 0.2], [0, 1])
