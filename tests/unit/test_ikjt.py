"""InverseKeyedJaggedTensor: exact expansion, torchrec variable-batch form, checks, pickling."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from recd.errors import TensorFormatError
from recd.tensors.batch import Batch, SparseFeatures
from recd.tensors.ikjt import (
    IKJT,
    InverseKeyedJaggedTensor,
    fbgemm_jagged_index_select,
    jagged_index_select,
    jagged_index_select_reference,
    kjt_equal,
)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def kjt_from_rows(keys: list[str], rows: list[list[list[int]]]) -> KeyedJaggedTensor:
    """rows[k][i] = ids of key k in row i (the plain reference, built with torchrec itself)."""
    lengths = [len(r) for per_key in rows for r in per_key]
    values = [v for per_key in rows for r in per_key for v in r]
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys,
        values=torch.tensor(values, dtype=torch.int64),
        lengths=torch.tensor(lengths, dtype=torch.int64),
        stride=len(rows[0]) if rows else 0,
    )


@st.composite
def grouped_rows(draw: st.DrawFn, max_keys: int = 3, max_rows: int = 12) -> tuple[list[str], list]:
    """K keys x B rows whose lists come from tiny pools, so duplicates (A-B-A too) are common."""
    k = draw(st.integers(1, max_keys))
    b = draw(st.integers(0, max_rows))
    ids = st.integers(-3, 3) | st.sampled_from([INT64_MIN, INT64_MAX, 2**53 + 1])
    pools = [draw(st.lists(st.lists(ids, max_size=4), min_size=1, max_size=3)) for _ in range(k)]
    rows = [[draw(st.sampled_from(pool)) for _ in range(b)] for pool in pools]
    return [f"f{j}" for j in range(k)], rows


# ---------------------------------------------------------------------- goldens
def figure5_group() -> IKJT:
    """Features c and d of the RecD paper's Figure 5: rows 0 and 1 duplicate in both."""
    return IKJT(
        keys=["c", "d"],
        values=torch.tensor([7, 8, 11, 9, 12]),
        lengths=torch.tensor([2, 1, 1, 1]),
        inverse_lookup=torch.tensor([0, 0, 1]),
    )


def test_figure5_group_expands_to_the_batch() -> None:
    ikjt = figure5_group()
    ikjt.validate()
    assert ikjt.batch_size() == 3 and ikjt.num_distinct() == 2
    assert ikjt.length_per_key() == [3, 2]
    expected = kjt_from_rows(["c", "d"], [[[7, 8], [7, 8], [11]], [[9], [9], [12]]])
    assert kjt_equal(ikjt.to_kjt(), expected)
    distinct = ikjt.distinct_kjt()
    assert distinct.stride() == 2
    assert torch.equal(distinct["c"].values(), torch.tensor([7, 8, 11]))
    assert torch.equal(distinct["d"].lengths(), torch.tensor([1, 1]))


def test_from_kjt_dedups_a_b_a_rows_in_first_occurrence_order() -> None:
    kjt = kjt_from_rows(["b"], [[[3, 4, 5], [10], [3, 4, 5], [], [10], []]])
    ikjt = IKJT.from_kjt(kjt)
    assert torch.equal(ikjt.values(), torch.tensor([3, 4, 5, 10]))
    assert torch.equal(ikjt.lengths(), torch.tensor([3, 1, 0]))
    assert torch.equal(ikjt.inverse_lookup(), torch.tensor([0, 1, 0, 2, 1, 2]))
    assert kjt_equal(ikjt.to_kjt(), kjt)


def test_from_kjt_subset_of_keys_as_group() -> None:
    kjt = kjt_from_rows(
        ["a", "c", "d"], [[[1], [2], [3]], [[7, 8], [7, 8], [7, 8]], [[9], [9], [1]]]
    )
    ikjt = IKJT.from_kjt(kjt, keys=["c", "d"])
    assert ikjt.keys() == ["c", "d"]
    assert torch.equal(ikjt.inverse_lookup(), torch.tensor([0, 0, 1]))  # d differs on row 2
    assert torch.equal(ikjt.values(), torch.tensor([7, 8, 7, 8, 9, 1]))
    with pytest.raises(TensorFormatError, match="not in the KJT"):
        IKJT.from_kjt(kjt, keys=["zz"])


# ---------------------------------------------------------------------- properties
@settings(max_examples=150, deadline=None)
@given(grouped_rows())
def test_expanding_any_ikjt_gives_exactly_the_kjt_of_its_rows(case: tuple[list[str], list]) -> None:
    keys, rows = case
    kjt = kjt_from_rows(keys, rows)
    ikjt = IKJT.from_kjt(kjt)
    ikjt.validate()
    expanded = ikjt.to_kjt()
    assert expanded.keys() == keys
    assert torch.equal(expanded.lengths(), kjt.lengths())
    assert torch.equal(expanded.values(), kjt.values())
    # Rows share an entry exactly when every key holds the same ids (checked in plain Python).
    inverse = ikjt.inverse_lookup().tolist()
    b = len(rows[0])
    content = [tuple(tuple(rows[k][i]) for k in range(len(keys))) for i in range(b)]
    assert ikjt.num_distinct() == len(set(content))
    for i in range(b):
        for j in range(b):
            assert (inverse[i] == inverse[j]) == (content[i] == content[j])
    # Distinct entries appear in order of first occurrence.
    firsts = [inverse.index(d) for d in range(ikjt.num_distinct())]
    assert firsts == sorted(firsts)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 5), max_size=10).flatmap(
        lambda lengths: st.tuples(
            st.just(lengths),
            st.lists(
                st.integers(INT64_MIN, INT64_MAX), min_size=sum(lengths), max_size=sum(lengths)
            ),
            st.lists(st.integers(0, max(len(lengths) - 1, 0)), max_size=15 if lengths else 0),
        )
    )
)
def test_jagged_index_select_numpy_and_fbgemm_equal_reference(
    case: tuple[list, list, list],
) -> None:
    lengths, values, indices = case
    args = (
        torch.tensor(values, dtype=torch.int64),
        torch.tensor(lengths, dtype=torch.int64),
        torch.tensor(indices, dtype=torch.int64),
    )
    ref_values, ref_lengths = jagged_index_select_reference(*args)
    for select in (jagged_index_select, fbgemm_jagged_index_select):
        fast_values, fast_lengths = select(*args)
        assert torch.equal(fast_values, ref_values) and torch.equal(fast_lengths, ref_lengths)
    expected = [v for i in indices for v in values[sum(lengths[:i]) : sum(lengths[: i + 1])]]
    assert fast_values.tolist() == expected


def test_batch_without_duplicates_round_trips_unchanged() -> None:
    kjt = kjt_from_rows(["a", "b"], [[[1], [2], [], [1, 2]], [[5], [5], [5], [5]]])
    ikjt = IKJT.from_kjt(kjt)  # a differs on every row, so no row pair matches on both keys
    assert ikjt.num_distinct() == 4
    assert torch.equal(ikjt.inverse_lookup(), torch.arange(4))
    assert torch.equal(ikjt.values(), kjt.values())
    assert torch.equal(ikjt.lengths(), kjt.lengths())


def test_empty_batch_and_empty_lists() -> None:
    empty = IKJT(
        keys=["a", "b"],
        values=torch.zeros(0, dtype=torch.int64),
        lengths=torch.zeros(0, dtype=torch.int64),
        inverse_lookup=torch.zeros(0, dtype=torch.int64),
    )
    empty.validate()
    assert empty.batch_size() == 0 and empty.num_distinct() == 0
    assert empty.length_per_key() == [0, 0]
    out = empty.to_kjt()
    assert out.keys() == ["a", "b"] and out.values().numel() == 0 and out.lengths().numel() == 0
    lists = kjt_from_rows(["a"], [[[], [], []]])
    ikjt = IKJT.from_kjt(lists)
    assert ikjt.num_distinct() == 1 and torch.equal(
        ikjt.inverse_lookup(), torch.zeros(3, dtype=torch.int64)
    )
    assert kjt_equal(ikjt.to_kjt(), lists)


# ---------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lengths": torch.tensor([2, 1, 1, 2])}, "lengths sum to 6 but there are 5 values"),
        ({"lengths": torch.tensor([3, -1, 1, 2]), "values": torch.arange(5)}, r"lengths\[1\] = -1"),
        (
            {"inverse_lookup": torch.tensor([0, 2, 1])},
            r"inverse_lookup\[1\] = 2 is outside \[0, 2\)",
        ),
        ({"inverse_lookup": torch.tensor([0, -1, 1])}, r"inverse_lookup\[1\] = -1"),
        (
            {"inverse_lookup": torch.tensor([0, 0, 1], dtype=torch.int32)},
            "inverse_lookup has dtype",
        ),
        ({"values": torch.tensor([7.0, 8, 11, 9, 12])}, "values has dtype"),
        ({"values": torch.zeros(5, 1, dtype=torch.int64)}, "values must be 1-D"),
        ({"keys": ["c", "c"]}, "keys must be unique"),
    ],
)
def test_validate_names_the_inconsistency(change: dict, message: str) -> None:
    parts: dict[str, Any] = {
        "keys": ["c", "d"],
        "values": torch.tensor([7, 8, 11, 9, 12]),
        "lengths": torch.tensor([2, 1, 1, 1]),
        "inverse_lookup": torch.tensor([0, 0, 1]),
    }
    parts.update(change)
    with pytest.raises(TensorFormatError, match=message) as info:
        IKJT(**parts).validate()
    assert isinstance(info.value, ValueError)


def test_constructor_rejects_lengths_not_a_multiple_of_keys() -> None:
    with pytest.raises(TensorFormatError, match="len\\(keys\\) \\* num_distinct"):
        IKJT(
            keys=["c", "d"],
            values=torch.tensor([1, 2, 3]),
            lengths=torch.tensor([1, 1, 1]),
            inverse_lookup=torch.tensor([0]),
        )
    with pytest.raises(TensorFormatError, match="at least one key"):
        IKJT(keys=[], values=torch.zeros(0), lengths=torch.zeros(0), inverse_lookup=torch.zeros(0))


def test_validate_checks_cached_offsets() -> None:
    ikjt = IKJT(
        keys=["c", "d"],
        values=torch.tensor([7, 8, 11, 9, 12]),
        lengths=torch.tensor([2, 1, 1, 1]),
        inverse_lookup=torch.tensor([0, 0, 1]),
        offsets=torch.tensor([0, 2, 3, 3, 5]),
    )
    with pytest.raises(TensorFormatError, match="offsets"):
        ikjt.validate()


# ---------------------------------------------------------------------- torchrec consumers
def _ebc(seed: int = 0) -> EmbeddingBagCollection:
    torch.manual_seed(seed)
    return EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(
                name="t0", embedding_dim=4, num_embeddings=16, feature_names=["a", "c"]
            ),
            EmbeddingBagConfig(name="t1", embedding_dim=3, num_embeddings=16, feature_names=["b"]),
            EmbeddingBagConfig(name="t2", embedding_dim=5, num_embeddings=16, feature_names=["d"]),
        ]
    )


def test_variable_batch_kjt_in_torchrec_ebc_equals_expanded_path() -> None:
    ikjt = IKJT.from_kjt(
        kjt_from_rows(
            ["a", "b", "c", "d"],
            [
                [[1, 2], [1, 2], [3], [1, 2], []],
                [[4], [4], [5, 6], [4], []],
                [[7], [7], [7], [7], [8]],
                [[], [], [9], [], [9, 9]],
            ],
        )
    )
    assert ikjt.num_distinct() == 3
    vbe = ikjt.to_variable_batch_kjt()
    assert vbe.variable_stride_per_key() and vbe.stride() == 5
    assert vbe.stride_per_key() == [3, 3, 3, 3]
    ebc = _ebc()
    out_vbe = ebc(vbe)
    out_expanded = ebc(ikjt.to_kjt())
    assert out_vbe.keys() == out_expanded.keys()
    assert out_vbe.values().shape == (5, 16)
    assert torch.equal(out_vbe.values(), out_expanded.values())
    # Gradients agree too (summation order may differ, so up to float rounding).
    grads = []
    for kjt in (vbe, ikjt.to_kjt()):
        ebc.zero_grad()
        ebc(kjt).values().pow(2).sum().backward()
        grads.append([p.grad.clone() for p in ebc.parameters()])
    for g_vbe, g_exp in zip(*grads, strict=True):
        torch.testing.assert_close(g_vbe, g_exp)


def test_sparse_features_variable_batch_mixes_plain_and_groups() -> None:
    plain = kjt_from_rows(["a"], [[[1], [2], [1], []]])
    b = IKJT.from_kjt(kjt_from_rows(["b"], [[[3, 4], [5], [3, 4], [3, 4]]]))
    cd = IKJT.from_kjt(kjt_from_rows(["c", "d"], [[[7], [7], [8], [7]], [[9], [9], [9], [9]]]))
    features = SparseFeatures(batch_size=4, kjt=plain, ikjts=[b, cd])
    features.validate()
    assert features.keys() == ["a", "b", "c", "d"]
    assert features.ikjt_of("c") is cd and features.ikjt_of("a") is None
    ebc = _ebc(seed=1)
    out = ebc(features.to_variable_batch_kjt()).values()
    assert torch.equal(out, ebc(features.to_kjt()).values())
    reordered = features.to_kjt(["d", "a", "c"])
    assert reordered.keys() == ["d", "a", "c"]
    assert reordered["c"].to_dense() == features.to_kjt()["c"].to_dense()
    assert [t.tolist() for t in reordered["a"].to_dense()] == [[1], [2], [1], []]
    with pytest.raises(TensorFormatError, match="no keys"):
        features.to_kjt(["zz"])


def test_sparse_features_validate_rejects_batch_size_mismatch() -> None:
    b = IKJT.from_kjt(kjt_from_rows(["b"], [[[3], [3]]]))
    with pytest.raises(TensorFormatError, match="batch size 2"):
        SparseFeatures(batch_size=3, ikjts=[b]).validate()
    with pytest.raises(TensorFormatError, match="twice"):
        SparseFeatures(batch_size=2, kjt=kjt_from_rows(["b"], [[[1], [2]]]), ikjts=[b]).validate()


# ---------------------------------------------------------------------- devices, pickling, bytes
def _duplicated_group(rows: int = 64, repeats: int = 16) -> tuple[KeyedJaggedTensor, IKJT]:
    history = [list(range(i, i + 20)) for i in range(rows // repeats) for _ in range(repeats)]
    kjt = kjt_from_rows(
        ["h", "s"], [history, [[i % 3] for i in range(rows // repeats) for _ in range(repeats)]]
    )
    return kjt, IKJT.from_kjt(kjt)


def test_pickle_round_trip_is_compact() -> None:
    kjt, ikjt = _duplicated_group()
    data = pickle.dumps(ikjt)
    back = pickle.loads(data)
    assert back.equals(ikjt) and back.offsets_or_none() is None
    back.validate()
    assert kjt_equal(back.to_kjt(), kjt)
    expanded_size = len(pickle.dumps(SparseFeatures(batch_size=64, kjt=kjt)))
    assert len(data) < expanded_size / 4  # 16x duplication of the long feature
    # A view into a large buffer ships only its own elements.
    big = torch.arange(1_000_000)
    view = IKJT(
        keys=["x"],
        values=big[10:13],
        lengths=torch.tensor([3]),
        inverse_lookup=torch.zeros(2, dtype=torch.int64),
    )
    assert len(pickle.dumps(view)) < 4_000


def test_batch_pickle_to_and_wire_bytes() -> None:
    kjt, ikjt = _duplicated_group()
    plain = kjt_from_rows(["a"], [[[i] for i in range(64)]])
    batch = Batch(
        dense=torch.rand(64, 3),
        sparse=SparseFeatures(batch_size=64, kjt=plain, ikjts=[ikjt]),
        labels=torch.zeros(64, 1),
    )
    batch.validate()
    assert pickle.loads(pickle.dumps(batch)).equals(batch)
    expected = 64 * 3 * 4 + 64 * 4 + (64 + 64) * 8 + ikjt.wire_bytes()
    assert batch.wire_bytes() == expected
    assert ikjt.wire_bytes() == 8 * (ikjt.values().numel() + ikjt.lengths().numel() + 64)
    expanded = SparseFeatures(batch_size=64, kjt=kjt)
    assert expanded.wire_bytes() > 4 * ikjt.wire_bytes()
    meta = batch.to("meta")
    assert meta.dense.is_meta and meta.labels.is_meta
    assert meta.sparse.ikjts[0].values().is_meta and meta.sparse.ikjts[0].inverse_lookup().is_meta
    assert meta.sparse.kjt is not None and meta.sparse.kjt.values().is_meta
    with pytest.raises(TensorFormatError, match="float32"):
        Batch(
            dense=torch.zeros(64, 1, dtype=torch.float64), sparse=batch.sparse, labels=batch.labels
        ).validate()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs a CUDA device")
def test_pin_memory() -> None:  # pragma: no cover - CPU-only CI
    _, ikjt = _duplicated_group()
    pinned = ikjt.pin_memory()
    assert pinned.values().is_pinned() and pinned.inverse_lookup().is_pinned()
    assert pinned.to("cuda", non_blocking=True).to("cpu").equals(ikjt)


def test_equals_and_kjt_equal_are_exact() -> None:
    a = figure5_group()
    assert a.equals(figure5_group()) and not a.equals("x")
    other = IKJT(
        keys=["c", "d"],
        values=torch.tensor([7, 8, 11, 9, 13]),
        lengths=torch.tensor([2, 1, 1, 1]),
        inverse_lookup=torch.tensor([0, 0, 1]),
    )
    assert not a.equals(other)
    big = kjt_from_rows(["a"], [[[2**62]]])
    near = kjt_from_rows(["a"], [[[2**62 + 1]]])
    assert not kjt_equal(big, near)  # torchrec's kjt_is_equal (allclose) would call these equal
    assert isinstance(a, InverseKeyedJaggedTensor)


def test_from_kjt_rejects_inconsistent_kjt() -> None:
    broken = KeyedJaggedTensor(
        keys=["a"], values=torch.tensor([1, 2, 3]), lengths=torch.tensor([1, 1]), stride=2
    )
    with pytest.raises(TensorFormatError, match="lengths sum to 2 but there are 3 values"):
        IKJT.from_kjt(broken)


class _Batches(torch.utils.data.IterableDataset):
    def __iter__(self) -> Iterator[Batch]:
        _, ikjt = _duplicated_group()
        plain = kjt_from_rows(["a"], [[[i, i + 1] for i in range(64)]])
        for step in range(3):
            yield Batch(
                dense=torch.full((64, 2), float(step)),
                sparse=SparseFeatures(batch_size=64, kjt=plain, ikjts=[ikjt]),
                labels=torch.zeros(64, 1),
            )


def test_batches_cross_dataloader_worker_processes() -> None:
    loader = torch.utils.data.DataLoader(
        _Batches(), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    received = list(loader)
    expected = list(_Batches())
    assert len(received) == 3
    for got, want in zip(received, expected, strict=True):
        assert isinstance(got, Batch)
        got.validate()
        assert got.equals(want)
