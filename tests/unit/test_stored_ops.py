"""Sparse preprocessing on the dedup layout's stored ids (``recd.reader.stored_ops``) gives
the same lists, bit for bit, as the TorchScript modules run on the gathered KJT."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import SchemaError
from recd.reader.stored_ops import StoredOps, split_preprocessing
from recd.reader.transform import build_preprocessing
from recd.table.layout import encode_row_group
from recd.tensors.stacked import gather, read_stacked, stack_unit, take_rows
from tests.unit.test_layout import random_sessions

FEATURES = ["history", "static"]


def test_specs_split_into_ops_per_stored_feature_and_the_rest() -> None:
    specs: list[dict[str, Any]] = [
        {"kind": "hash_modulo", "features": ["history", "item"], "modulo": 1000},
        {"kind": "log1p", "features": ["price"]},
        {"kind": "truncate_last", "features": ["history"], "n": 8},
        {"kind": "hash_modulo", "features": ["history"], "modulo": 7},
        {"kind": "truncate_last", "features": ["history", "item"], "n": 5},
        {"kind": "truncate_last", "features": ["history"], "n": 9},
    ]
    ops, rest = split_preprocessing(specs, ["history", "static"])
    assert ops == {"history": StoredOps(moduli=(1000, 7), cap=5)}
    assert rest == [
        {"kind": "hash_modulo", "features": ["item"], "modulo": 1000},
        {"kind": "log1p", "features": ["price"]},
        {"kind": "truncate_last", "features": ["item"], "n": 5},
    ]
    assert split_preprocessing(specs, []) == ({}, specs)


def kjt_of(unit: pa.Table) -> KeyedJaggedTensor:
    stacked = read_stacked(unit)
    assert stacked is not None
    lengths, values = gather(stacked, stacked.index(FEATURES))
    return KeyedJaggedTensor.from_lengths_sync(
        keys=FEATURES, values=torch.from_numpy(values), lengths=torch.from_numpy(lengths)
    )


@pytest.mark.parametrize("seed", range(4))
def test_ops_on_stored_ids_equal_the_modules_on_the_gathered_kjt(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows = random_sessions(rng, 300)
    # negative ids too: the modulo is non-negative on both paths
    shifted = pa.array([[x - 25 for x in r] for r in rows.column("history").to_pylist()])
    rows = rows.set_column(1, "history", shifted.cast(pa.list_(pa.int64())))
    extra = [
        [int(x) for x in rng.integers(-9, 99, size=int(rng.integers(0, 3)))]
        for _ in range(rows.num_rows)
    ]
    rows = rows.append_column("extra", pa.array(extra, pa.list_(pa.int64())))
    specs: list[dict[str, Any]] = [
        {"kind": "hash_modulo", "features": ["history", "static"], "modulo": 11},
        {"kind": "truncate_last", "features": ["history"], "n": int(rng.integers(0, 5))},
        {"kind": "hash_modulo", "features": ["history"], "modulo": 4},
        {"kind": "truncate_last", "features": ["static"], "n": 1},
    ]
    module = build_preprocessing(specs, dense=[])[0]
    assert module is not None
    cases: list[tuple[list[str], list[list[str]]]] = [
        (FEATURES, []),  # encoded, each alone
        (["history"], []),  # one of them
        ([], []),  # a plain unit
        (FEATURES, [FEATURES]),  # one group, its members with different moduli
        ([*FEATURES, "extra"], [["static", "extra"]]),  # a group with a member not read
    ]
    for stored, groups in cases:
        encoded = encode_row_group(rows, stored, groups=groups)
        alone = [f for f in stored if not any(f in g for g in groups)]
        unit = stack_unit(encoded, FEATURES, alone, groups=groups, path="<test>")
        before = kjt_of(unit).values().clone()
        expected = module(kjt_of(unit))
        ops, rest = split_preprocessing(specs, FEATURES)
        assert rest == []
        seconds: list[float] = []
        processed = stack_unit(
            encoded,
            FEATURES,
            alone,
            groups=groups,
            path="<test>",
            ops=ops,
            ops_seconds=seconds,
        )
        assert len(seconds) == 1
        got = kjt_of(processed)
        assert torch.equal(got.lengths(), expected.lengths())
        assert torch.equal(got.values(), expected.values())
        assert int(got.values().min()) >= 0
        # the rows as read are not changed in place (Arrow buffers may be shared)
        again = stack_unit(encoded, FEATURES, alone, groups=groups, path="<test>")
        assert torch.equal(kjt_of(again).values(), before)


def test_the_batch_modules_leave_the_stored_features_out() -> None:
    specs: list[dict[str, Any]] = [
        {"kind": "hash_modulo", "features": ["history", "item"], "modulo": 10},
    ]
    module = build_preprocessing(split_preprocessing(specs, ["history"])[1], dense=[])[0]
    assert module is not None
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["history", "item"],
        values=torch.tensor([123, 456, 789]),
        lengths=torch.tensor([2, 1]),
    )
    assert module(kjt).values().tolist() == [123, 456, 9]


def lists_of(unit: pa.Table) -> dict[str, list[list[int]]]:
    return {f: [r.tolist() for r in jt.to_dense()] for f, jt in kjt_of(unit).to_dict().items()}


def test_slices_and_reorders_of_a_unit_read_their_own_rows() -> None:
    """The stacked positions are K-wide columns: a slice of a unit (a batch starting
    mid-unit), a reordered unit and two units in one table read exactly their rows."""
    rows = random_sessions(np.random.default_rng(3), 120)
    unit = stack_unit(encode_row_group(rows, FEATURES), FEATURES, FEATURES, path="<test>")
    whole = lists_of(unit)
    assert whole == {f: rows.column(f).to_pylist() for f in FEATURES}
    n = unit.num_rows
    for lo, hi in ((0, 1), (17, 63), (n - 1, n)):
        assert lists_of(unit.slice(lo, hi - lo)) == {f: v[lo:hi] for f, v in whole.items()}
    order = np.random.default_rng(5).permutation(n)
    assert lists_of(take_rows(unit, pa.array(order))) == {
        f: [v[i] for i in order] for f, v in whole.items()
    }
    two = pa.concat_tables([unit.slice(5, 40), unit.slice(80, 30)])
    assert lists_of(two) == {f: v[5:45] + v[80:110] for f, v in whole.items()}


def test_stacked_columns_of_the_wrong_width_are_refused() -> None:
    rows = random_sessions(np.random.default_rng(4), 20)
    unit = stack_unit(encode_row_group(rows, FEATURES), FEATURES, FEATURES, path="<test>")
    n = unit.num_rows
    narrow = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n, np.int32)), 1)
    bad = unit.set_column(unit.num_columns - 1, "__recd_lengths", narrow)
    with pytest.raises(SchemaError, match="stacked columns"):
        read_stacked(bad)


@pytest.mark.parametrize("seed", range(6))
def test_gather_over_several_chunks_equals_slicing_row_by_row(seed: int) -> None:
    from recd.tensors.stacked import Stacked, StackedChunk

    rng = np.random.default_rng(seed)
    k = 4
    chunks = []
    for _ in range(int(rng.integers(1, 4))):
        n = int(rng.integers(1, 9))
        buffer = rng.integers(-50, 50, size=40).astype(np.int64)
        lengths = (rng.integers(0, 5, size=(n, k)) * (rng.random((n, k)) < 0.8)).astype(np.int32)
        starts = rng.integers(0, 36, size=(n, k)).astype(np.int32)
        chunks.append(StackedChunk(buffer=buffer, starts=starts, lengths=lengths))
    stacked = Stacked(features=[f"f{i}" for i in range(k)], chunks=chunks)
    total = sum(c.num_rows for c in chunks)
    for keys in ([0, 1, 2, 3], [2], [3, 1], [1, 2]):
        for rows in (None, np.flatnonzero(rng.random(total) < 0.5)):
            picked = range(total) if rows is None else rows.tolist()
            expect_lengths, expect_ids = [], []
            for key in keys:  # key-major, like a KJT
                for row in picked:
                    for chunk in chunks:
                        if row < chunk.num_rows:
                            s, n = int(chunk.starts[row, key]), int(chunk.lengths[row, key])
                            expect_lengths.append(n)
                            expect_ids += chunk.buffer[s : s + n].tolist()
                            break
                        row -= chunk.num_rows
            lengths, ids = gather(stacked, keys, rows)
            assert lengths.tolist() == expect_lengths and ids.tolist() == expect_ids
            out = np.full(len(expect_ids), -999, dtype=np.int64)
            _, into = gather(stacked, keys, rows, out=out)
            assert into is out and out.tolist() == expect_ids


def stacked_lists(unit: pa.Table) -> dict[str, list[list[int]]]:
    stacked = read_stacked(unit)
    if stacked is None:
        return {}
    out = {}
    for f in stacked.features:
        lengths, values = gather(stacked, stacked.index([f]))
        ends = np.cumsum(lengths)
        out[f] = [values[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)]
    return out


@pytest.mark.parametrize("seed", range(3))
def test_features_gathered_to_plain_rows_equal_their_stacked_lists(seed: int) -> None:
    """``stack_unit(plain=...)``: the features a reader reads as plain KJT rows come out as
    plain columns equal to their stacked lists (ops applied), the rest stay stacked; group
    members of one width (1, 0) and of varying widths, a member not read, plain units."""
    rng = np.random.default_rng(seed)
    rows = random_sessions(rng, 200)
    session = rows.column("session_id").to_numpy()
    first = np.r_[True, session[1:] != session[:-1]]
    context = np.cumsum(first) * 7 + rng.integers(0, 3, size=first.size) * first
    context = np.maximum.accumulate(context)  # constant within a session
    rows = rows.append_column("context", pa.array([[int(c)] for c in context]))
    rows = rows.append_column("none", pa.array([[] for _ in context], pa.list_(pa.int64())))
    features = ["history", "static", "context", "none"]
    specs: list[dict[str, Any]] = [
        {"kind": "hash_modulo", "features": ["history", "context"], "modulo": 13},
        {"kind": "truncate_last", "features": ["history"], "n": 2},
        {"kind": "truncate_last", "features": ["static"], "n": 1},
    ]
    ops = split_preprocessing(specs, features)[0]
    cases: list[tuple[list[str], list[list[str]]]] = [
        (["history"], [["static", "context", "none"]]),
        (["history", "static", "context", "none"], []),
        (["history", "static", "context"], [["context", "none", "static"]]),
        ([], []),  # a plain unit
    ]
    for stored, groups in cases:
        encoded = encode_row_group(rows, stored, groups=groups)
        alone = [f for f in stored if not any(f in g for g in groups)]
        for unit_ops in ({}, ops):
            kwargs: dict[str, Any] = {"groups": groups, "path": "<test>", "ops": unit_ops}
            expected = stacked_lists(stack_unit(encoded, features, alone, **kwargs))
            for plain in (set(features), {"static", "none"}, {"history", "context"}):
                unit = stack_unit(encoded, features, alone, plain=plain, **kwargs)
                rest = stacked_lists(unit)
                assert sorted(rest) == sorted(set(features) - plain)
                for f in features:
                    got = unit.column(f).to_pylist() if f in plain else rest[f]
                    assert got == expected[f], (stored, groups, plain, f)
                    if f in plain:
                        assert unit.schema.field(f).type == pa.list_(pa.int64())
            if unit_ops:  # the ops did something: hashed and capped lists
                assert max(len(r) for r in expected["history"]) <= 2
                assert max(len(r) for r in expected["static"]) == 1
                assert all(x < 13 for r in expected["context"] for x in r)
