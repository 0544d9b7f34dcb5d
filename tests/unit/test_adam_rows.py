"""The one lazy-Adam row update against plain PyTorch, and its inverse against the update.

The reference below is fbgemm's ADAM row update written out with ordinary tensor ops on the
gathered rows. It uses the same fused ops where fbgemm fuses (``add(alpha=)`` and
``addcmul`` are one multiply-add each on CPU), so the two must agree bit for bit
(``torch.equal``), not just to a tolerance.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recd.errors import ConfigError
from recd.optim import AdamConfig, AdamHyper, LazyAdam, ModelAdam, lazy_adam_update_rows
from recd.recovery import CounterUndo, UndoRecord, undo_step, update_rows_with_undo
from recd.recovery.inverse import lazy_adam_rows_before

FAST = settings(max_examples=25, deadline=None)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread (OpenMP workers spin on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _reference(
    w: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    rows: torch.Tensor,
    g: torch.Tensor,
    h: AdamHyper,
    t: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fbgemm's ADAM on ``rows``, by hand, on copies."""
    w, m, v = w.clone(), m.clone(), v.clone()
    w_rows = w[rows]
    m_rows = torch.add(m[rows] * h.beta1, g, alpha=1 - h.beta1)
    v_rows = torch.addcmul(v[rows] * h.beta2, g, g, value=1 - h.beta2)
    m_hat = m_rows / (1 - h.beta1**t)
    v_hat = v_rows / (1 - h.beta2**t)
    u = m_hat / (v_hat.sqrt() + h.eps)
    if h.weight_decay:
        u = torch.add(u, w_rows, alpha=h.weight_decay)
    w[rows] = torch.add(w_rows, u, alpha=-h.lr)
    m[rows] = m_rows
    v[rows] = v_rows
    return w, m, v


@st.composite
def _cases(draw: st.DrawFn) -> tuple[tuple[torch.Tensor, ...], AdamHyper, int]:
    """A table (w, m, v), unique rows, their gradient, hyper-parameters and a step."""
    num_rows = draw(st.integers(1, 40))
    dim = draw(st.integers(1, 33))  # across the CPU kernels' vector widths
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    w = torch.randn(num_rows, dim, generator=gen)
    m = torch.randn(num_rows, dim, generator=gen) * 1e-2
    v = torch.rand(num_rows, dim, generator=gen) * 1e-4
    fresh = torch.rand(num_rows, generator=gen) < 0.3  # rows never updated: m = v = 0
    m[fresh], v[fresh] = 0.0, 0.0
    rows = torch.unique(
        torch.randint(0, num_rows, (draw(st.integers(1, num_rows)),), generator=gen)
    )
    grad = torch.randn(rows.numel(), dim, generator=gen) * draw(st.sampled_from([1e-3, 1e-1, 10.0]))
    hyper = AdamHyper(
        lr=draw(st.sampled_from([1e-3, 0.01, 0.3])),
        beta1=draw(st.sampled_from([0.0, 0.5, 0.9])),
        beta2=draw(st.sampled_from([0.9, 0.999])),
        eps=draw(st.sampled_from([1e-8, 1e-3])),
        weight_decay=draw(st.sampled_from([0.0, 1e-3, 0.1])),
    )
    return (w, m, v, rows, grad), hyper, draw(st.integers(1, 10_000))


@FAST
@given(_cases())
def test_row_update_equals_plain_pytorch(
    case: tuple[tuple[torch.Tensor, ...], AdamHyper, int],
) -> None:
    (w, m, v, rows, grad), hyper, step = case
    expected = _reference(w, m, v, rows, grad, hyper, step)
    before = [t.clone() for t in (w, m, v)]
    done = lazy_adam_update_rows(w, m, v, rows, grad, hyper=hyper, step=step)
    for got, want in zip((w, m, v), expected, strict=True):
        assert torch.equal(got, want)
    # What it hands to a capture: the gathered rows before, the new rows.
    gathered = (done.weight_before, done.exp_avg_before, done.exp_avg_sq_before)
    for got, table in zip(gathered, before, strict=True):
        assert torch.equal(got, table[rows])
    assert torch.equal(done.weight_after, w[rows]) and torch.equal(done.exp_avg_sq_after, v[rows])


@FAST
@given(_cases())
def test_update_then_undo_restores_the_rows_bit_exactly(
    case: tuple[tuple[torch.Tensor, ...], AdamHyper, int],
) -> None:
    """The capture's inverse (plus its corrections) gives back the exact pre-update bits;
    the pure inverse keeps m exactly and lands close on w and v."""
    (w, m, v, rows, grad), hyper, step = case
    before = [t.clone() for t in (w, m, v)]
    entry = update_rows_with_undo(w, m, v, rows, grad, name="t", hyper=hyper, step=step)
    after = [t.clone() for t in (w, m, v)]
    counter = {"step": step}
    record = UndoRecord(
        step=step,
        params=[entry],
        counters=[CounterUndo(target=counter, key="step", before=step - 1, after=step)],
    )
    w_cand, v_cand = lazy_adam_rows_before(
        after[0][rows], after[1][rows], after[2][rows], before[1][rows], hyper=hyper, step=step
    )
    torch.testing.assert_close(w_cand, before[0][rows], rtol=1e-5, atol=1e-5)
    assert bool((v_cand >= 0).all())
    assert undo_step(record).exact
    for got, want in zip((w, m, v), before, strict=True):
        assert torch.equal(got, want)
    lazy_adam_update_rows(w, m, v, rows, grad, hyper=hyper, step=step)  # and forward again
    for got, want in zip((w, m, v), after, strict=True):
        assert torch.equal(got, want)


def test_keyword_fields_are_the_same_hyper() -> None:
    """``lr=..., beta1=...`` by keyword is the same update as ``hyper=``; not both; no L2."""
    gen = torch.Generator().manual_seed(0)
    tables = [[torch.randn(6, 4, generator=gen), torch.zeros(6, 4), torch.zeros(6, 4)]]
    tables.append([t.clone() for t in tables[0]])
    rows, grad = torch.tensor([1, 4]), torch.randn(2, 4, generator=gen)
    fields = {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "eps": 1e-8, "weight_decay": 0.01}
    lazy_adam_update_rows(*tables[0], rows, grad, step=3, **fields)
    lazy_adam_update_rows(*tables[1], rows, grad, step=3, hyper=AdamHyper(**fields))
    assert all(torch.equal(a, b) for a, b in zip(*tables, strict=True))
    with pytest.raises(TypeError, match="not both"):
        lazy_adam_update_rows(*tables[0], rows, grad, step=3, hyper=AdamHyper(), lr=0.1)
    with pytest.raises(TypeError, match="no hyper-parameters"):
        lazy_adam_update_rows(*tables[0], rows, grad, step=3)
    with pytest.raises(ValueError, match="decoupled"):
        lazy_adam_update_rows(
            *tables[0], rows, grad, step=3, hyper=AdamConfig(weight_decay=0.1).dense_hyper()
        )


def test_config_derives_each_groups_hyper() -> None:
    """AdamConfig -> one AdamHyper per group; ModelAdam's optimizers are built from them."""
    config = AdamConfig(lr=0.02, embedding_lr=0.05, weight_decay=0.01, embedding_weight_decay=0.1)
    assert config.dense_hyper() == AdamHyper(lr=0.02, weight_decay=0.01, decoupled=False)
    assert config.embedding_hyper() == AdamHyper(lr=0.05, weight_decay=0.1, decoupled=True)
    assert AdamConfig(lr=0.3).embedding_hyper().lr == 0.3
    model = torch.nn.Sequential(torch.nn.EmbeddingBag(5, 2), torch.nn.Linear(2, 1))
    opt = ModelAdam.for_model(model, config)
    assert opt.dense is not None and isinstance(opt.embeddings, LazyAdam)
    assert AdamHyper.from_group(opt.dense.param_groups[0]) == config.dense_hyper()
    lazy_group = opt.embeddings.param_groups[0]
    assert AdamHyper.from_group(lazy_group, decoupled=True) == config.embedding_hyper()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", -1.0, "optimizer.lr must be >= 0, got -1.0"),
        ("eps", float("nan"), "optimizer.eps must be a finite number >= 0, got nan"),
        ("embedding_lr", float("inf"), "optimizer.embedding_lr must be a finite number >= 0"),
        ("embedding_weight_decay", -1e-3, "optimizer.embedding_weight_decay must be >= 0"),
        ("beta2", 1.0, "optimizer.beta2 must be >= 0 and < 1, got 1.0"),
    ],
)
def test_config_ranges(field: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        AdamConfig(**{field: value})
