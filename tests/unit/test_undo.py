"""Update-undo: every captured step is taken back to the exact pre-update bits.

Exactness is checked with ``torch.equal`` on weights, moments / momentum buffers and step
counters (plus the set of parameters that have optimizer state at all). The pure float
inverse is *not* exact: ``test_pure_inverse_*`` assert how far off it is (a few percent of the
elements, by less than the float spacing at the post-update value in steady state) and that it
is not always zero, which is why the records carry corrections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import UndoError
from recd.models import DLRM, ModelConfig, bce_loss, dlrm_config
from recd.optim import AdamConfig, LazyAdam, ModelAdam, lazy_adam_update_rows
from recd.recovery import (
    Correction,
    CounterUndo,
    UndoLog,
    UndoRecord,
    measure_inexactness,
    step_with_undo,
    undo_step,
    update_rows_with_undo,
)
from recd.recovery.bits import from_ordered_bits, ordered_bits
from recd.recovery.inverse import adam_second_moment_before, adam_weight_before
from recd.recovery.undo import UNDO_METHODS, StepCapture, UndoMethod
from recd.schema import load_catalogue

FAST = settings(max_examples=12, deadline=None)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread (OpenMP workers spin on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------- helpers
def _state_of(opt: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> list[Any]:
    """Weights, every state entry of every parameter (or its absence) and group counters."""
    out: list[Any] = [p.detach().clone() for p in params]
    for p in params:
        state = opt.state.get(p, {})
        out.append(sorted(state))
        out.extend(
            v.clone() if isinstance(v, torch.Tensor) else v for _, v in sorted(state.items())
        )
    out.extend(g.get("step") for g in opt.param_groups)
    return out


def _same(a: list[Any], b: list[Any]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if not torch.equal(x, y):
                return False
        elif x != y:
            return False
    return True


def _params(seed: int, shapes: list[tuple[int, ...]]) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen) * 0.05) for s in shapes]


def _run_undo_redo(
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    *,
    steps: int,
    seed: int,
    grad_scale: float,
    step_kwargs: Callable[[int], dict[str, Any]] = lambda t: {},
    sparse: bool = False,
    method: UndoMethod = "inverse",
) -> None:
    """Each step: capture, undo (== before, bitwise), redo (== the captured post state)."""
    gen = torch.Generator().manual_seed(seed + 1)
    for t in range(steps):
        for p in params:
            g = torch.randn(p.shape, generator=gen) * grad_scale
            if sparse:
                ids = torch.randint(0, p.shape[0], (5,), generator=gen)  # repeats allowed
                values = torch.randn(5, p.shape[1], generator=gen) * grad_scale
                g = torch.sparse_coo_tensor(ids[None], values, p.shape, check_invariants=True)
            p.grad = g
        before = _state_of(opt, params)
        record = step_with_undo(opt, method=method, **step_kwargs(t))
        after = _state_of(opt, params)
        assert not _same(before, after)
        result = undo_step(record)
        assert result.exact and result.inexact == []
        assert _same(_state_of(opt, params), before), f"step {t}: undo is not bit-exact"
        opt.step(**step_kwargs(t))  # redo with the same gradients
        assert _same(_state_of(opt, params), after), f"step {t}: redo differs"


SHAPES = st.lists(st.tuples(st.integers(1, 9), st.integers(1, 12)), min_size=1, max_size=3).map(
    lambda shapes: [s if i % 2 else (s[0] * s[1],) for i, s in enumerate(shapes)]
)


# ----------------------------------------------------------------------------- per optimizer
@FAST
@given(
    shapes=SHAPES,
    seed=st.integers(0, 2**16),
    lr=st.sampled_from([1e-3, 1e-2, 0.1]),
    betas=st.sampled_from([(0.9, 0.999), (0.8, 0.99), (0.5, 0.9), (0.0, 0.999)]),
    weight_decay=st.sampled_from([0.0, 1e-2, 0.1]),
    maximize=st.booleans(),
    grad_scale=st.sampled_from([1e-4, 1e-2, 1.0]),
    kernel=st.sampled_from(["single", "foreach", "fused"]),
)
def test_adam_undo_is_exact(
    shapes: list[tuple[int, ...]],
    seed: int,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    maximize: bool,
    grad_scale: float,
    kernel: str,
) -> None:
    """Any of torch's Adam kernels: the inverse mirrors the single-tensor one, the
    corrections make the others exact too."""
    params = _params(seed, shapes)
    opt = torch.optim.Adam(
        params,
        lr=lr,
        betas=betas,
        weight_decay=weight_decay,
        maximize=maximize,
        foreach=kernel == "foreach",
        fused=True if kernel == "fused" else None,
    )
    _run_undo_redo(opt, params, steps=4, seed=seed, grad_scale=grad_scale)


@FAST
@given(
    shapes=SHAPES,
    seed=st.integers(0, 2**16),
    lr=st.sampled_from([1e-3, 1e-2]),
    weight_decay=st.sampled_from([1e-2, 0.1, 0.5]),
    grad_scale=st.sampled_from([1e-4, 1e-2, 1.0]),
)
def test_adamw_undo_is_exact(
    shapes: list[tuple[int, ...]], seed: int, lr: float, weight_decay: float, grad_scale: float
) -> None:
    params = _params(seed, shapes)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    _run_undo_redo(opt, params, steps=4, seed=seed, grad_scale=grad_scale)


@FAST
@given(
    shapes=SHAPES,
    seed=st.integers(0, 2**16),
    momentum=st.sampled_from([0.0, 0.5, 0.9]),
    variant=st.sampled_from(["plain", "nesterov", "dampening"]),
    weight_decay=st.sampled_from([0.0, 1e-2]),
    maximize=st.booleans(),
)
def test_sgd_undo_is_exact(
    shapes: list[tuple[int, ...]],
    seed: int,
    momentum: float,
    variant: str,
    weight_decay: float,
    maximize: bool,
) -> None:
    params = _params(seed, shapes)
    nesterov = variant == "nesterov" and momentum > 0
    dampening = 0.3 if variant == "dampening" else 0.0
    opt = torch.optim.SGD(
        params,
        lr=0.05,
        momentum=momentum,
        dampening=dampening,
        nesterov=nesterov,
        weight_decay=weight_decay,
        maximize=maximize,
    )
    _run_undo_redo(opt, params, steps=4, seed=seed, grad_scale=1e-2)


@FAST
@given(
    rows=st.integers(1, 12),
    dim=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    weight_decay=st.sampled_from([0.0, 0.05]),
    dense_grad=st.booleans(),
)
def test_lazy_adam_rows_undo_is_exact(
    rows: int, dim: int, seed: int, weight_decay: float, dense_grad: bool
) -> None:
    """Touched rows go back exactly; untouched rows (never updated, or not this step) stay."""
    params = _params(seed, [(rows, dim), (rows + 3, dim)])
    opt = LazyAdam(params, lr=0.05, weight_decay=weight_decay)
    if dense_grad:
        _run_lazy_dense(opt, params, seed=seed)
    else:
        _run_undo_redo(opt, params, steps=5, seed=seed, grad_scale=1e-2, sparse=True)


@FAST
@given(
    shapes=SHAPES,
    seed=st.integers(0, 2**16),
    grad_scale=st.sampled_from([1e-4, 1e-2, 1.0]),
    optimizer=st.sampled_from(["adam", "adam_foreach", "adamw", "sgd", "sgd_momentum"]),
)
def test_copy_method_undo_is_exact(
    shapes: list[tuple[int, ...]], seed: int, grad_scale: float, optimizer: str
) -> None:
    """The ``copy`` method: the pre-update values kept, written back; bit-exact for any
    optimizer the capture takes, and its record holds no corrections."""
    params = _params(seed, shapes)
    opt: torch.optim.Optimizer
    if optimizer.startswith("adam"):
        kind = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
        opt = kind(params, lr=1e-2, weight_decay=1e-2, foreach=optimizer == "adam_foreach")
    else:
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9 if "momentum" in optimizer else 0.0)
    _run_undo_redo(opt, params, steps=4, seed=seed, grad_scale=grad_scale, method="copy")


@FAST
@given(rows=st.integers(1, 12), dim=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_copy_method_lazy_rows_undo_is_exact(rows: int, dim: int, seed: int) -> None:
    params = _params(seed, [(rows, dim), (rows + 3, dim)])
    opt = LazyAdam(params, lr=0.05, weight_decay=0.05)
    _run_lazy_dense(opt, params, seed=seed, method="copy")
    _run_undo_redo(opt, params, steps=3, seed=seed, grad_scale=1e-2, sparse=True, method="copy")


def test_copy_method_refuses_measure_and_unknown_methods() -> None:
    with pytest.raises(UndoError, match="method='inverse'"):
        StepCapture(measure=True, method="copy")
    with pytest.raises(UndoError, match="undo method"):
        StepCapture(method="snapshot")  # type: ignore[arg-type]


def _run_lazy_dense(
    opt: LazyAdam, params: list[torch.nn.Parameter], *, seed: int, method: UndoMethod = "inverse"
) -> None:
    """Dense gradients with touched rows: the rows passed are the only ones updated/undone."""
    gen = torch.Generator().manual_seed(seed + 3)
    for _ in range(5):
        rows: dict[torch.Tensor, torch.Tensor] = {
            p: torch.randint(0, p.shape[0], (3,), generator=gen) for p in params
        }
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen) * 1e-2
        before = _state_of(opt, params)
        record = step_with_undo(opt, touched_rows=rows, method=method)
        after = _state_of(opt, params)
        assert record.elements == sum(r.unique().numel() * p.shape[1] for p, r in rows.items())
        assert undo_step(record).exact
        assert _same(_state_of(opt, params), before)
        opt.step(touched_rows=rows)
        assert _same(_state_of(opt, params), after)


def test_update_rows_with_undo_restores_the_rows_of_a_shard() -> None:
    """The building block for optimizers that update table shards themselves; records
    built from its entries undo the rows and the step counter together."""
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(10, 4, generator=gen)
    m, v = torch.zeros(10, 4), torch.zeros(10, 4)
    hyper = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}
    counter = {"step": 0}
    for step in range(1, 6):
        rows = torch.unique(torch.randint(0, 10, (4,), generator=gen))
        grad = torch.randn(rows.numel(), 4, generator=gen)
        before = [t.clone() for t in (weight, m, v)]
        entry = update_rows_with_undo(
            weight,
            m,
            v,
            rows,
            grad,
            name="shard0",
            step=step,
            **hyper,  # type: ignore[arg-type]
        )
        counter["step"] = step
        record = UndoRecord(
            step=step,
            params=[entry],
            counters=[CounterUndo(target=counter, key="step", before=step - 1, after=step)],
        )
        after = [t.clone() for t in (weight, m, v)]
        assert record.elements == rows.numel() * 4 and record.nbytes < record.snapshot_nbytes
        assert undo_step(record).exact and counter["step"] == step - 1
        assert all(torch.equal(a, b) for a, b in zip((weight, m, v), before, strict=True))
        lazy_adam_update_rows(weight, m, v, rows, grad, step=step, **hyper)
        assert all(torch.equal(a, b) for a, b in zip((weight, m, v), after, strict=True))


# ----------------------------------------------------------------------------- whole model
def _dlrm(*, sparse_grads: bool = True) -> DLRM:
    torch.manual_seed(0)
    config = dlrm_config(load_catalogue("tiny"), embedding_dim=8, max_rows=300)
    if not sparse_grads:
        config = ModelConfig(
            dense_in_features=config.dense_in_features,
            num_embeddings=config.num_embeddings,
            embedding_dim=8,
            bottom_mlp=config.bottom_mlp,
            top_mlp=config.top_mlp,
            sparse_grads=False,
        )
    return DLRM(config)


def _batch(model: DLRM, gen: torch.Generator, b: int = 16) -> tuple[Any, ...]:
    keys = model.config.pooled_features
    lengths = torch.randint(0, 4, (len(keys) * b,), generator=gen)
    values = torch.cat(
        [
            torch.randint(0, model.config.num_embeddings[k], (int(n),), generator=gen)
            for k, n in zip(keys, lengths.view(len(keys), b).sum(1), strict=True)
        ]
    )
    kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, stride=b)
    dense = torch.randn(b, model.config.dense_in_features, generator=gen)
    labels = torch.randint(0, 2, (b, 1), generator=gen).float()
    return dense, kjt, labels


def _model_state(opt: ModelAdam) -> list[Any]:
    """Flat weights/m/v (as bits), every step counter and which params have dense state."""
    flat = opt.export_state()
    out: list[Any] = [flat.step, opt.step_count]
    out += [
        torch.from_numpy(a.view(np.int32).copy()) for a in (flat.weights, flat.adam_m, flat.adam_v)
    ]
    if opt.embeddings is not None:
        out.append(opt.embeddings.step_count)
    if opt.dense is not None:
        out += [
            opt.dense.state[p]["step"].clone() if p in opt.dense.state else None
            for p in (opt.params[n] for n in opt.dense_names)
        ]
    return out


@pytest.mark.parametrize("method", UNDO_METHODS)
@pytest.mark.parametrize("sparse_grads", [True, False])
def test_model_adam_on_a_dlrm_undo_then_redo_is_exact(
    sparse_grads: bool, method: UndoMethod
) -> None:
    model = _dlrm(sparse_grads=sparse_grads)
    opt = ModelAdam.for_model(
        model, AdamConfig(lr=0.01, weight_decay=1e-3, embedding_weight_decay=1e-3)
    )
    log = UndoLog(opt, method=method)
    gen = torch.Generator().manual_seed(7)
    n_params = sum(p.numel() for p in model.parameters())
    for step in range(1, 6):
        dense, kjt, labels = _batch(model, gen)
        opt.zero_grad()
        bce_loss(model(dense, kjt), labels).backward()
        rows = None if sparse_grads else model.touched_rows(kjt)
        before = _model_state(opt)
        record = log.step(touched_rows=rows)
        after = _model_state(opt)
        assert record.step == step == opt.step_count
        # Only the touched rows and the dense layers are in the record, far below a snapshot.
        assert record.elements < n_params
        if method == "inverse":
            assert record.nbytes < 0.6 * record.snapshot_nbytes
        else:  # the pre-update values themselves (+ the row ids)
            assert record.snapshot_nbytes <= record.nbytes < 1.1 * record.snapshot_nbytes
            assert record.summary()["correction_bytes"] == 0
        result = log.undo()
        assert result.exact and result.step == step - 1
        assert _same(_model_state(opt), before)
        assert log.record is None
        log.step(touched_rows=rows)  # redo, captured again
        assert _same(_model_state(opt), after)


def test_a_step_that_fails_half_way_is_rolled_back() -> None:
    """The dense half of ModelAdam is applied, then the table half raises (as a failing
    collective would): the capture puts every tensor and counter back before re-raising."""
    model = _dlrm()
    opt = ModelAdam.for_model(model)
    gen = torch.Generator().manual_seed(8)
    for _ in range(2):  # some state first
        dense, kjt, labels = _batch(model, gen)
        opt.zero_grad()
        bce_loss(model(dense, kjt), labels).backward()
        opt.step()
    dense, kjt, labels = _batch(model, gen)
    opt.zero_grad()
    bce_loss(model(dense, kjt), labels).backward()
    before = _model_state(opt)
    assert opt.embeddings is not None and opt.dense is not None
    real_step = opt.embeddings.step

    def failing_step(*args: Any, **kwargs: Any) -> None:
        real_step(*args, **kwargs)  # the rows are updated, then the "collective" fails
        raise RuntimeError("peer rank 1 died")

    opt.embeddings.step = failing_step  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="peer rank 1 died"):
        step_with_undo(opt)
    assert _same(_model_state(opt), before)


# ----------------------------------------------------------------------------- misuse
@pytest.mark.parametrize("method", UNDO_METHODS)
def test_undo_refuses_a_record_whose_state_moved_on(method: UndoMethod) -> None:
    params = _params(0, [(20,)])
    opt = torch.optim.Adam(params, lr=0.01)
    params[0].grad = torch.ones(20)
    opt.step()  # a state to move on from
    record = step_with_undo(opt, method=method)
    opt.step()  # another step: the record is stale
    moved = _state_of(opt, params)
    with pytest.raises(UndoError, match="param0"):
        undo_step(record)
    assert _same(_state_of(opt, params), moved)  # nothing was changed


def test_undo_twice_and_empty_log_are_errors() -> None:
    params = _params(0, [(5,)])
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    log = UndoLog(opt, names=[("w", params[0])])
    with pytest.raises(UndoError, match="no captured step"):
        log.undo()
    params[0].grad = torch.ones(5)
    record = log.step()
    assert record.params[0].name == "w"
    record.undo()
    with pytest.raises(UndoError, match="already undone"):
        record.undo()


def test_unsupported_optimizers_are_refused_before_stepping() -> None:
    params = _params(0, [(5,)])
    params[0].grad = torch.ones(5)
    opt = torch.optim.Adam(params, amsgrad=True)
    with pytest.raises(UndoError, match="AMSGrad"):
        step_with_undo(opt)
    assert not opt.state  # the step did not run
    with pytest.raises(UndoError, match="Adagrad"):
        step_with_undo(torch.optim.Adagrad(params))


# ----------------------------------------------------------------------------- the pure inverse
def _adam_steps(n: int, steps: int, seed: int) -> tuple[Any, ...]:
    """Adam on random data; the state before and after the last step."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(n, generator=gen) * 0.05)
    opt = torch.optim.Adam([p], lr=1e-3)
    for _ in range(steps):
        p.grad = torch.randn(n, generator=gen) * 1e-2
        state = opt.state.get(p, {})
        before = [p.detach().clone()] + [
            state[k].clone() for k in ("exp_avg", "exp_avg_sq") if k in state
        ]
        opt.step()
    state = opt.state[p]
    return before, (p.detach(), state["exp_avg"], state["exp_avg_sq"])


def test_pure_inverse_is_close_but_not_exact() -> None:
    """Steady state (t = 60): the float inverse misses a few percent of the elements, by about
    an ulp of the post-update value, never zero misses over 20k elements."""
    (w0, m0, v0), (w, m, v) = _adam_steps(20_000, 60, seed=3)
    hyper = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
    w_cand = adam_weight_before(w, m, v, weight_decay=0.0, decoupled=False, step=60, **hyper)
    v_cand = adam_second_moment_before(v, m, m0, beta1=0.9, beta2=0.999)
    w_miss, v_miss = measure_inexactness(w_cand, w0), measure_inexactness(v_cand, v0)
    assert 0 < w_miss.mismatch_fraction < 0.05
    assert 0 < v_miss.mismatch_fraction < 0.08 and v_miss.max_ulp <= 4
    # The weight's error is below the spacing of floats at the post-update weight: what
    # w' = fl(w + d) could not represent is all that is lost.
    spacing = torch.nextafter(w.abs(), torch.tensor(float("inf"))) - w.abs()
    assert bool(((w_cand - w0).abs() <= spacing).all())


def test_pure_inverse_error_is_measured_in_the_record() -> None:
    params = _params(5, [(4000,)])
    opt = torch.optim.Adam(params, lr=1e-3)
    gen = torch.Generator().manual_seed(6)
    for _ in range(30):
        params[0].grad = torch.randn(4000, generator=gen) * 1e-2
        opt.step()
    params[0].grad = torch.randn(4000, generator=gen) * 1e-2
    record = step_with_undo(opt, measure=True)
    misses = record.inexactness()
    assert set(misses) == {"weight", "exp_avg_sq"}  # m is kept: exact by construction
    assert all(0 < s.mismatched < 0.1 * s.elements for s in misses.values())
    summary = record.summary()
    assert summary["corrected_elements"]["weight"] == misses["weight"].mismatched
    # 4 bytes of kept m + the corrections, against 12 for a snapshot of w, m, v.
    assert 4 * record.elements < record.nbytes < 5 * record.elements


# ----------------------------------------------------------------------------- bit tools
FLOAT_BITS = st.integers(-(2**31), 2**31 - 1)


@settings(max_examples=50, deadline=None)
@given(
    truth=st.lists(FLOAT_BITS, min_size=1, max_size=64),
    noise=st.lists(st.integers(-300, 300), min_size=64, max_size=64),
    flips=st.integers(0, 64),
)
def test_correction_restores_any_bits(truth: list[int], noise: list[int], flips: int) -> None:
    """NaNs, infinities, -0.0 and denormals included; both encodings."""
    true = torch.tensor(truth, dtype=torch.int32).view(torch.float32)
    ordered = ordered_bits(true)
    offsets = torch.tensor(noise[: true.numel()], dtype=torch.int64)
    offsets[flips:] = 0
    shifted = (ordered + offsets).clamp(-(2**31), 2**31 - 1)
    candidate = from_ordered_bits(shifted)
    fix = Correction.between(candidate, true)
    assert fix.mismatched == int((candidate.view(torch.int32) != true.view(torch.int32)).sum())
    restored = fix.apply(candidate.clone())
    assert torch.equal(restored.view(torch.int32), true.view(torch.int32))


def test_ordered_bits_is_a_monotone_bijection() -> None:
    x = torch.tensor([-float("inf"), -1.0, -1e-45, -0.0, 0.0, 1e-45, 1.0, float("inf")])
    o = ordered_bits(x)
    assert torch.equal(o, torch.sort(o).values) and o.unique().numel() == x.numel()
    assert torch.equal(from_ordered_bits(o).view(torch.int32), x.view(torch.int32))
    assert int(o[4] - o[3]) == 1  # -0.0 and +0.0 are neighbours


def test_dense_encoding_is_chosen_when_many_elements_miss_by_little() -> None:
    true = torch.randn(1000)
    near = torch.nextafter(true, torch.tensor(float("inf")))
    near[::50] = 0.0  # a few far misses: exceptions
    fix = Correction.between(near, true)
    assert fix.encoding == "dense" and fix.nbytes == 1000 + 20 * 8
    assert torch.equal(fix.apply(near.clone()), true)
    sparse = Correction.between(true, true)
    assert sparse.encoding == "sparse" and sparse.nbytes == 0
