"""Adam for every parameter: row-sparse LazyAdam (fbgemm ADAM semantics) + torch Adam, state I/O.

Float comparisons with the numpy reference use a tolerance of a few float32 ulps, not
``torch.equal``: torch's CPU kernels fuse ``m * b1 + (1 - b1) * g`` into one multiply-add (as
fbgemm's kernel does) and its vectorised ``sqrt`` is not correctly rounded, while numpy rounds
every operation; the reference's m and v therefore differ from ours in the last bit or two.
Everything that must be exact (untouched rows, resume from a checkpoint, sparse vs dense
gradient routes, the dense part vs ``torch.optim.Adam``) is compared with ``torch.equal``.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn

from recd.checkpoint import ParamLayout, read_checkpoint, write_checkpoint
from recd.models import DLRM, ModelConfig, bce_loss
from recd.optim import AdamConfig, LazyAdam, ModelAdam, embedding_parameter_names

ROWS, DIM = 7, 3
# Per step: ids looked up (repeats allowed; rows 5 and 6 are never touched, row 4 only at
# step 2) and the gradient of each occurrence.
STEP_IDS = [[0, 1, 1, 3], [1, 2, 0, 0, 0], [4, 3, 1], [2, 2], [0, 3, 1, 1]]
UNTOUCHED = [5, 6]


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread (OpenMP workers spin on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _sparse_grad(ids: list[int], rng: np.random.Generator) -> tuple[torch.Tensor, np.ndarray]:
    values = rng.standard_normal((len(ids), DIM)).astype(np.float32)
    grad = torch.sparse_coo_tensor(
        torch.tensor([ids]), torch.from_numpy(values), (ROWS, DIM), check_invariants=True
    )
    return grad, values


def _reference_lazy_adam(
    w: np.ndarray,
    steps: list[tuple[list[int], np.ndarray]],
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    weight_decay: float,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """fbgemm's ADAM (codegen/genscript/optimizers.py, adam()) by hand, row by row, float64."""
    w = w.astype(np.float64)
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    out = []
    for t, (ids, values) in enumerate(steps, start=1):
        for row in sorted(set(ids)):
            g = np.zeros(DIM)
            for i, r in enumerate(ids):
                if r == row:
                    g += values[i]
            m[row] = beta1 * m[row] + (1 - beta1) * g
            v[row] = beta2 * v[row] + (1 - beta2) * g * g
            m_hat = m[row] / (1 - beta1**t)
            v_hat = v[row] / (1 - beta2**t)
            w[row] = w[row] - lr * (m_hat / (np.sqrt(v_hat) + eps) + weight_decay * w[row])
        out.append((w.copy(), m.copy(), v.copy()))
    return out


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_lazy_adam_equals_hand_computed_reference(weight_decay: float) -> None:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    table = nn.Parameter(torch.from_numpy(w0.copy()))
    hyper = {"lr": 0.05, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": weight_decay}
    opt = LazyAdam(
        [table],
        lr=hyper["lr"],
        betas=(hyper["beta1"], hyper["beta2"]),
        eps=hyper["eps"],
        weight_decay=weight_decay,
    )
    steps = [(ids, rng.standard_normal((len(ids), DIM)).astype(np.float32)) for ids in STEP_IDS]
    expected = _reference_lazy_adam(w0, steps, **hyper)
    for t, ((ids, values), (w, m, v)) in enumerate(zip(steps, expected, strict=True), start=1):
        table.grad = torch.sparse_coo_tensor(
            torch.tensor([ids]), torch.from_numpy(values), (ROWS, DIM)
        )
        opt.step()
        assert opt.step_count == t
        state = opt.state[table]
        np.testing.assert_allclose(table.detach().numpy(), w, rtol=2e-6, atol=1e-7)
        np.testing.assert_allclose(state["exp_avg"].numpy(), m, rtol=2e-6, atol=1e-8)
        np.testing.assert_allclose(state["exp_avg_sq"].numpy(), v, rtol=2e-6, atol=1e-10)
        # Untouched rows: weights exactly as initialised, moments exactly zero.
        assert torch.equal(table.detach()[UNTOUCHED], torch.from_numpy(w0[UNTOUCHED]))
        assert not state["exp_avg"][UNTOUCHED].any() and not state["exp_avg_sq"][UNTOUCHED].any()


def test_rows_not_in_the_batch_keep_weights_and_moments_exactly() -> None:
    """No decay of m/v and no momentum step for rows the batch did not look up."""
    rng = np.random.default_rng(1)
    table = nn.Parameter(torch.randn(ROWS, DIM))
    opt = LazyAdam([table], lr=0.1)
    table.grad, _ = _sparse_grad([0, 1, 2], rng)
    opt.step()
    before = [t.clone() for t in (table.detach(), opt.state[table]["exp_avg"])]
    before.append(opt.state[table]["exp_avg_sq"].clone())
    table.grad, _ = _sparse_grad([2, 2], rng)
    opt.step()
    after = [table.detach(), opt.state[table]["exp_avg"], opt.state[table]["exp_avg_sq"]]
    for old, new in zip(before, after, strict=True):
        assert torch.equal(old[[0, 1, 3, 4, 5, 6]], new[[0, 1, 3, 4, 5, 6]])
        assert not torch.equal(old[2], new[2])


def test_a_looked_up_row_with_zero_gradient_is_still_updated() -> None:
    """Touched means looked up (fbgemm), not 'nonzero gradient': m decays and w moves."""
    table = nn.Parameter(torch.zeros(ROWS, DIM))
    opt = LazyAdam([table], lr=0.1)
    table.grad = torch.sparse_coo_tensor(
        torch.tensor([[4]]), torch.ones(1, DIM), (ROWS, DIM), check_invariants=True
    )
    opt.step()
    m1 = opt.state[table]["exp_avg"][4].clone()
    w1 = table.detach()[4].clone()
    table.grad = torch.sparse_coo_tensor(
        torch.tensor([[4]]), torch.zeros(1, DIM), (ROWS, DIM), check_invariants=True
    )
    opt.step()
    assert torch.allclose(opt.state[table]["exp_avg"][4], 0.9 * m1)
    assert (table.detach()[4] < w1).all()  # momentum keeps moving it


def test_dense_gradient_with_touched_rows_equals_sparse_gradient() -> None:
    rng = np.random.default_rng(2)
    w0 = torch.randn(ROWS, DIM)
    sparse_table, dense_table = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    sparse_opt = LazyAdam([sparse_table], lr=0.05, weight_decay=0.01)
    dense_opt = LazyAdam([dense_table], lr=0.05, weight_decay=0.01)
    for ids in STEP_IDS:
        grad, _ = _sparse_grad(ids, rng)
        sparse_table.grad = grad
        dense_table.grad = grad.to_dense()
        sparse_opt.step()
        dense_opt.step(touched_rows={dense_table: torch.tensor(ids)})
        assert torch.equal(sparse_table, dense_table)
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(
                sparse_opt.state[sparse_table][key], dense_opt.state[dense_table][key]
            )


def test_dense_gradient_needs_valid_touched_rows() -> None:
    table = nn.Parameter(torch.randn(ROWS, DIM))
    opt = LazyAdam([table])
    table.grad = torch.randn(ROWS, DIM)
    with pytest.raises(ValueError, match="touched_rows"):
        opt.step()
    with pytest.raises(ValueError, match="outside the table's 7 rows"):
        opt.step(touched_rows={table: torch.tensor([0, 7])})
    with pytest.raises(ValueError, match="2-D float32"):
        LazyAdam([nn.Parameter(torch.randn(3))])


def test_equals_torch_sparse_adam_without_eps() -> None:
    """torch.optim.SparseAdam is lazy Adam too; it places eps differently (and needs eps > 0),
    so compare with a negligible eps."""
    rng = np.random.default_rng(3)
    w0 = torch.randn(ROWS, DIM)
    ours, theirs = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    opt_ours = LazyAdam([ours], lr=0.05, eps=1e-30)
    opt_theirs = torch.optim.SparseAdam([theirs], lr=0.05, eps=1e-30)
    for ids in STEP_IDS:
        grad, _ = _sparse_grad(ids, rng)
        ours.grad, theirs.grad = grad, grad.clone()
        opt_ours.step()
        opt_theirs.step()
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------- whole model
def _model(*, sparse_grads: bool = True) -> DLRM:
    torch.manual_seed(0)
    config = ModelConfig(
        dense_in_features=3,
        num_embeddings={"a": 20, "b": 30, "c": 20},
        shared_tables=[["a", "c"]],
        embedding_dim=4,
        bottom_mlp=[8, 4],
        top_mlp=[8, 1],
        sparse_grads=sparse_grads,
    )
    return DLRM(config)


def _batches(n: int) -> list[tuple[torch.Tensor, object, torch.Tensor]]:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    gen = torch.Generator().manual_seed(5)
    out = []
    for _ in range(n):
        b = 6
        lengths = torch.randint(0, 3, (3 * b,), generator=gen)
        values = torch.randint(0, 20, (int(lengths.sum()),), generator=gen)
        kjt = KeyedJaggedTensor(keys=["a", "b", "c"], values=values, lengths=lengths, stride=b)
        dense = torch.randn(b, 3, generator=gen)
        labels = torch.randint(0, 2, (b, 1), generator=gen).float()
        out.append((dense, kjt, labels))
    return out


def _train(model: DLRM, opt: ModelAdam, batches: list, *, rows: bool = False) -> list[float]:
    losses = []
    for dense, kjt, labels in batches:
        opt.zero_grad()
        loss = bce_loss(model(dense, kjt), labels)
        loss.backward()
        opt.step(touched_rows=model.touched_rows(kjt) if rows else None)
        losses.append(loss.item())
    return losses


def test_model_adam_splits_tables_and_dense_parameters() -> None:
    model = _model()
    opt = ModelAdam.for_model(model, AdamConfig(lr=0.01))
    tables = {
        "sparse_arch.embedding_bag_collection.embedding_bags.a.weight",
        "sparse_arch.embedding_bag_collection.embedding_bags.b.weight",
    }
    assert embedding_parameter_names(model) == tables
    assert set(opt.embedding_names) == tables
    assert opt.names == [n for n, _ in model.named_parameters()]
    assert set(opt.dense_names) == set(opt.names) - tables


def test_dense_part_equals_torch_adam_and_tables_equal_lazy_adam() -> None:
    """ModelAdam == torch.optim.Adam on the dense parameters + LazyAdam on the tables."""
    model = _model()
    ref = copy.deepcopy(model)
    opt = ModelAdam.for_model(model, AdamConfig(lr=0.02, embedding_lr=0.05, weight_decay=0.01))
    tables = embedding_parameter_names(model)
    torch_adam = torch.optim.Adam(
        [p for n, p in ref.named_parameters() if n not in tables], lr=0.02, weight_decay=0.01
    )
    lazy = LazyAdam([p for n, p in ref.named_parameters() if n in tables], lr=0.05)
    for dense, kjt, labels in _batches(4):
        opt.zero_grad()
        bce_loss(model(dense, kjt), labels).backward()
        opt.step()
        ref.zero_grad(set_to_none=True)
        bce_loss(ref(dense, kjt), labels).backward()
        torch_adam.step()
        lazy.step()
        for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
            assert torch.equal(p, q), name


def test_sparse_and_dense_table_gradients_train_identically() -> None:
    """sparse_grads=False + DLRM.touched_rows gives the same run as sparse gradients."""
    a, b = _model(sparse_grads=True), _model(sparse_grads=False)
    opt_a, opt_b = ModelAdam.for_model(a), ModelAdam.for_model(b)
    batches = _batches(4)
    assert _train(a, opt_a, batches) == _train(b, opt_b, batches, rows=True)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_export_order_matches_the_checkpoint_layout() -> None:
    model = _model()
    opt = ModelAdam.for_model(model)
    _train(model, opt, _batches(2))
    layout = ParamLayout.from_named_arrays(model.named_parameters())
    state = opt.export_state()
    assert state.step == 2
    assert state.weights.shape == state.adam_m.shape == state.adam_v.shape == (layout.n_params,)
    for region, source in (
        ("weights", dict(model.named_parameters())),
        ("adam_m", opt.moments("adam_m")),
        ("adam_v", opt.moments("adam_v")),
    ):
        flat = layout.unflatten(getattr(state, region))
        for name, tensor in source.items():
            assert np.array_equal(flat[name], tensor.detach().numpy()), (region, name)
    # A table row the batches never touched has m = v = 0 in the export.
    table = "sparse_arch.embedding_bag_collection.embedding_bags.b.weight"
    untouched = sorted(
        set(range(30))
        - set(model.touched_rows(_batches(2)[0][1])[table].tolist())
        - set(model.touched_rows(_batches(2)[1][1])[table].tolist())
    )
    assert untouched and not layout.unflatten(state.adam_v)[table][untouched].any()


def test_resume_from_checkpoint_file_is_bit_exact(tmp_path: object) -> None:
    """Train 5 steps; vs train 2, write step_000002.bin, rebuild, load, train 3: identical."""
    batches = _batches(5)
    straight = _model()
    straight_opt = ModelAdam.for_model(straight)
    straight_losses = _train(straight, straight_opt, batches)

    first = _model()
    first_opt = ModelAdam.for_model(first)
    losses = _train(first, first_opt, batches[:2])
    state = first_opt.export_state()
    layout = ParamLayout.from_named_arrays(first.named_parameters())
    path = write_checkpoint(
        tmp_path / "step_000002.bin",  # type: ignore[operator]
        state.step,
        state.weights,
        state.adam_m,
        state.adam_v,
        layout=layout,
    )

    torch.manual_seed(123)  # a different init: everything must come from the file
    resumed = DLRM(first.config)
    resumed_opt = ModelAdam.for_model(resumed)
    ckpt = read_checkpoint(path, layout)
    resumed_opt.load_moments(
        step=ckpt.step, adam_m=ckpt.tensors("adam_m"), adam_v=ckpt.tensors("adam_v")
    )
    with torch.no_grad():
        for name, p in resumed.named_parameters():
            p.copy_(torch.from_numpy(np.array(ckpt.tensors("weights")[name])))
    losses += _train(resumed, resumed_opt, batches[2:])
    assert losses == straight_losses
    assert resumed_opt.step_count == straight_opt.step_count == 5
    for p, q in zip(resumed.parameters(), straight.parameters(), strict=True):
        assert torch.equal(p, q)
    for which in ("adam_m", "adam_v"):
        for name, m in resumed_opt.moments(which).items():
            assert torch.equal(m, straight_opt.moments(which)[name]), (which, name)


def test_state_dict_round_trip_and_load_state() -> None:
    batches = _batches(4)
    model = _model()
    opt = ModelAdam.for_model(model)
    _train(model, opt, batches[:2])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    flat = opt.export_state()
    expected = _train(model, opt, batches[2:])

    for restore in ("state_dict", "flat"):
        torch.manual_seed(7)
        other = DLRM(model.config)
        other_opt = ModelAdam.for_model(other)
        if restore == "state_dict":
            buffer.seek(0)
            saved = torch.load(buffer, weights_only=True)
            other.load_state_dict(saved["model"])
            other_opt.load_state_dict(saved["opt"])
        else:
            other_opt.load_state(flat)
        assert other_opt.step_count == 2
        assert _train(other, other_opt, batches[2:]) == expected, restore


def test_load_state_keeps_no_reference_to_the_arrays_it_loaded() -> None:
    """``load_state`` reads the arrays without copying them first (no temporary copy of the
    whole state); the model and the optimizer must still own their values: overwriting the
    arrays afterwards changes nothing, and the run trains on exactly as before. A read-only
    array (a checkpoint memmap) loads too."""
    batches = _batches(4)
    model = _model()
    opt = ModelAdam.for_model(model)
    _train(model, opt, batches[:2])
    flat = opt.export_state()
    expected = _train(model, opt, batches[2:])
    for writeable in (True, False):
        torch.manual_seed(7)
        other = DLRM(model.config)
        other_opt = ModelAdam.for_model(other)
        arrays = [np.array(getattr(flat, r)) for r in ("weights", "adam_m", "adam_v")]
        for array in arrays:
            array.flags.writeable = writeable
        weights, adam_m, adam_v = arrays
        other_opt.load_state(
            type(flat)(step=flat.step, weights=weights, adam_m=adam_m, adam_v=adam_v)
        )
        for array in arrays:
            array.flags.writeable = True
            array.fill(np.nan)
        assert _train(other, other_opt, batches[2:]) == expected, writeable


def test_load_moments_rejects_wrong_shapes() -> None:
    model = _model()
    opt = ModelAdam.for_model(model)
    zeros = {n: np.zeros(p.shape, np.float32) for n, p in model.named_parameters()}
    bad = dict(zeros)
    name = opt.names[0]
    bad[name] = np.zeros((1, 1), np.float32)
    with pytest.raises(ValueError, match="moment of shape"):
        opt.load_moments(step=3, adam_m=bad, adam_v=zeros)
    with pytest.raises(ValueError, match="no values for parameters"):
        opt.load_moments(step=3, adam_m={}, adam_v=zeros)
