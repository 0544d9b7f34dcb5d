"""Preprocessing: TorchScript modules over KJTs; deduplicated runs equal the expanded ones."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from recd.errors import ConfigError
from recd.tensors.convert import FeatureSpec, convert_batch
from recd.tensors.ikjt import IKJT, kjt_equal
from recd.tensors.preprocess import (
    Clamp,
    DedupPreprocess,
    HashModulo,
    Log1p,
    Normalize,
    SparseChain,
    TruncateLast,
    apply_to_ikjt,
    preprocess_batch,
)

IDS = pa.list_(pa.int64())


def sparse_modules() -> dict[str, nn.Module]:
    return {
        "hash": HashModulo({"f0": 5, "f2": 3}),
        "truncate": TruncateLast({"f0": 2, "f1": 0}),
        "chain": SparseChain([TruncateLast({"f1": 1, "f2": 3}), HashModulo({"f1": 4, "f0": 1})]),
    }


@st.composite
def ikjts(draw: st.DrawFn) -> IKJT:
    k = draw(st.integers(1, 3))
    b = draw(st.integers(0, 10))
    ids = st.integers(-50, 50) | st.sampled_from([-(2**63), 2**63 - 1])
    pools = [draw(st.lists(st.lists(ids, max_size=5), min_size=1, max_size=3)) for _ in range(k)]
    rows = [[draw(st.sampled_from(pool)) for _ in range(b)] for pool in pools]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{j}" for j in range(k)],
        values=torch.tensor([v for per_key in rows for r in per_key for v in r], dtype=torch.int64),
        lengths=torch.tensor([len(r) for per_key in rows for r in per_key], dtype=torch.int64),
        stride=b,
    )
    return IKJT.from_kjt(kjt)


SCRIPTED = {name: torch.jit.script(m) for name, m in sparse_modules().items()}


@settings(max_examples=80, deadline=None)
@given(ikjts(), st.sampled_from(sorted(sparse_modules())))
def test_dedup_preprocessing_equals_preprocessing_the_expanded_kjt(ikjt: IKJT, name: str) -> None:
    eager = sparse_modules()[name]
    expected = eager(ikjt.to_kjt())
    for module in (eager, SCRIPTED[name]):
        out = apply_to_ikjt(module, ikjt)
        out.validate()
        assert torch.equal(out.inverse_lookup(), ikjt.inverse_lookup())
        assert kjt_equal(out.to_kjt(), expected)
    assert kjt_equal(SCRIPTED[name](ikjt.to_kjt()), expected)


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6), max_size=4),
        min_size=1,
        max_size=5,
    ),
    st.lists(st.sampled_from([0, 1, 3, 7, 2**40]), min_size=5, max_size=5),
    st.lists(st.sampled_from([-1, 0, 1, 2, 5]), min_size=5, max_size=5),
)
def test_sparse_modules_equal_a_row_by_row_reference(
    per_key: list[list[list[int]]], sizes: list[int], caps: list[int]
) -> None:
    """Each key's rows (keys of one table size in runs, untouched keys among them, empty
    rows, caps of 0): ``id mod size`` and "the last cap ids", row by row in Python."""
    b = max(len(rows) for rows in per_key)
    rows = [r + [[]] * (b - len(r)) for r in per_key]
    keys = [f"k{j}" for j in range(len(rows))]
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor([v for r in rows for row in r for v in row], dtype=torch.int64),
        lengths=torch.tensor([len(row) for r in rows for row in r], dtype=torch.int32),
        stride=b,
    )
    table_sizes = {k: m for k, m in zip(keys, sizes, strict=False) if m > 0}
    max_lengths = {k: c for k, c in zip(keys, caps, strict=False) if c >= 0}
    hashed = [
        [[v % table_sizes[k] for v in row] if k in table_sizes else row for row in r]
        for k, r in zip(keys, rows, strict=True)
    ]
    truncated = [
        [row[max(len(row) - max_lengths[k], 0) :] if k in max_lengths else row for row in r]
        for k, r in zip(keys, rows, strict=True)
    ]
    for module, expected in (
        (HashModulo(table_sizes), hashed),
        (TruncateLast(max_lengths), truncated),
    ):
        for run in (module, torch.jit.script(module)):
            out = run(kjt)
            assert out.keys() == keys and out.stride() == b
            assert out.lengths().dtype == torch.int32
            got = [[t.tolist() for t in out[k].to_dense()] for k in keys]
            assert got == expected


def test_hash_modulo_golden() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=torch.tensor([7, -1, 12, 9, 5]), lengths=torch.tensor([2, 1, 2, 0])
    )
    out = torch.jit.script(HashModulo({"a": 5}))(kjt)
    assert torch.equal(out.values(), torch.tensor([2, 4, 2, 9, 5]))  # -1 mod 5 = 4; b untouched
    assert torch.equal(out.lengths(), kjt.lengths()) and out.stride() == 2
    with pytest.raises(ConfigError, match="table size of 'a' must be > 0"):
        HashModulo({"a": 0})


def test_truncate_last_golden() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["h", "s"],
        values=torch.tensor([1, 2, 3, 4, 5, 6, 7, 8]),
        lengths=torch.tensor([4, 0, 1, 2, 0, 1], dtype=torch.int32),
    )
    out = torch.jit.script(TruncateLast({"h": 2, "s": 1}))(kjt)
    assert [t.tolist() for t in out["h"].to_dense()] == [[3, 4], [], [5]]  # last two of 1..4
    assert [t.tolist() for t in out["s"].to_dense()] == [[7], [], [8]]
    assert out.lengths().dtype == torch.int32 and out.stride() == 3
    with pytest.raises(ConfigError, match="must be >= 0"):
        TruncateLast({"h": -1})


def test_modules_keep_variable_batch_layout_and_feed_torchrec() -> None:
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["h", "s"],
        values=torch.tensor([11, 12, 13, 11, 12, 13, 14, 15, 16, 11, 12, 13, 21, 21]),
        lengths=torch.tensor([3, 3, 3, 3, 0, 1, 1, 0]),
    )
    ikjt = IKJT.from_kjt(kjt)
    assert ikjt.num_distinct() == 3
    module = torch.jit.script(SparseChain([TruncateLast({"h": 2}), HashModulo({"h": 10, "s": 10})]))
    vbe_out = module(ikjt.to_variable_batch_kjt())
    assert vbe_out.variable_stride_per_key() and vbe_out.stride_per_key() == [3, 3]
    assert torch.equal(vbe_out.inverse_indices()[1][0], ikjt.inverse_lookup())
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name="t", embedding_dim=4, num_embeddings=10, feature_names=["h", "s"]
            )
        ]
    )
    assert torch.equal(ebc(vbe_out).values(), ebc(module(kjt)).values())


def test_dedup_preprocess_module_and_row_wise_guard() -> None:
    ikjt = IKJT.from_kjt(
        KeyedJaggedTensor.from_lengths_sync(
            keys=["h"], values=torch.tensor([1, 2, 1, 2, 3]), lengths=torch.tensor([2, 2, 1])
        )
    )
    wrapped = DedupPreprocess(torch.jit.script(HashModulo({"h": 2})))
    out = wrapped(ikjt)
    assert torch.equal(out.values(), torch.tensor([1, 0, 1])) and out.num_distinct() == 2

    class DropKeys(nn.Module):
        def forward(self, kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
            return KeyedJaggedTensor(keys=[], values=kjt.values()[:0], lengths=kjt.lengths()[:0])

    with pytest.raises(ConfigError, match="only row-wise modules"):
        apply_to_ikjt(DropKeys(), ikjt)


def test_dense_modules_golden_and_scripted() -> None:
    x = torch.tensor([[0.0, -2.0, 3.0], [float(torch.e) - 1, 10.0, -0.5]])
    log1p = torch.jit.script(Log1p())
    assert torch.equal(log1p(x), torch.log1p(x.clamp_min(0)))
    assert log1p(x)[1, 0].item() == pytest.approx(1.0)
    clamp = torch.jit.script(Clamp(-1.0, 2.0))
    assert torch.equal(clamp(x), torch.tensor([[0.0, -1.0, 2.0], [float(torch.e) - 1, 2.0, -0.5]]))
    norm = torch.jit.script(Normalize([1.0, 0.0, 2.0], [2.0, 1.0, 0.5]))
    assert torch.equal(norm(x), (x - torch.tensor([1.0, 0.0, 2.0])) / torch.tensor([2.0, 1.0, 0.5]))
    with pytest.raises(ConfigError, match=r"std\[1\] = 0.0 must be > 0"):
        Normalize([0.0, 0.0], [1.0, 0.0])
    with pytest.raises(ConfigError, match="2 means but 1 stds"):
        Normalize([0.0, 0.0], [1.0])
    with pytest.raises(ConfigError, match="min_value"):
        Clamp(2.0, 1.0)


def test_preprocess_converted_batch_equals_expanded_path() -> None:
    record = pa.record_batch(
        {
            "label": pa.array([1.0, 0.0, 0.0, 1.0], pa.float32()),
            "x": pa.array([1.0, -1.0, 3.0, 100.0], pa.float32()),
            "a": pa.array([[1], [22], [1], [40]], IDS),
            "h": pa.array([[5, 6, 7], [5, 6, 7], [5, 6], [5, 6, 7]], IDS),
            "s": pa.array([[9], [9], [9], [9]], IDS),
        }
    )
    spec = FeatureSpec(dense=["x"], sparse=["a", "h", "s"], dedup_sparse_features=[["h", "s"]])
    batch = convert_batch(record, spec, source="p")
    sparse = torch.jit.script(SparseChain([HashModulo({"a": 7, "h": 6}), TruncateLast({"h": 2})]))
    dense = torch.jit.script(Log1p())
    out = preprocess_batch(batch, sparse=sparse, dense=dense)
    out.validate()
    assert out.sparse.ikjts[0].num_distinct() == 2
    assert kjt_equal(out.sparse.to_kjt(), sparse(batch.sparse.to_kjt()))
    assert torch.equal(out.dense, torch.log1p(batch.dense.clamp_min(0)))
    assert out.sparse.wire_bytes() < preprocess_batch(batch).sparse.wire_bytes()
