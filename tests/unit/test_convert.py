"""Feature conversion from Arrow: plain KJT, grouped IKJTs, exact dedup, clear errors."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import recd.tensors.jagged as jagged
from recd.errors import ConfigError, SchemaError
from recd.schema import Catalogue
from recd.tensors.convert import (
    FeatureSpec,
    JaggedColumn,
    convert_batch,
    convert_sparse,
    find_distinct_rows,
    read_list_column,
)
from recd.tensors.ikjt import kjt_equal

IDS = pa.list_(pa.int64())


def figure5_batch() -> pa.RecordBatch:
    """The RecD paper's Figure 5 batch (row 1 of a and b filled with ids of our choosing)."""
    return pa.record_batch(
        {
            "label": pa.array([0.0, 1.0, 0.0], pa.float32()),
            "x": pa.array([1.5, 2.0, -3.0], pa.float32()),
            "a": pa.array([[1, 2], [6], [1, 2]], IDS),
            "b": pa.array([[3, 4, 5], [10], [3, 4, 5]], IDS),
            "c": pa.array([[7, 8], [7, 8], [11]], IDS),
            "d": pa.array([[9], [9], [12]], IDS),
        }
    )


FIGURE5_SPEC = FeatureSpec(
    dense=["x"], sparse=["a", "b", "c", "d"], dedup_sparse_features=[["b"], ["c", "d"]]
)


def test_figure5_golden() -> None:
    batch = convert_batch(figure5_batch(), FIGURE5_SPEC, source="fig5.parquet")
    batch.validate()
    assert torch.equal(batch.dense, torch.tensor([[1.5], [2.0], [-3.0]]))
    assert torch.equal(batch.labels, torch.tensor([[0.0], [1.0], [0.0]]))
    sparse = batch.sparse
    # a: plain KJT, [1, 2] stored twice.
    assert sparse.kjt is not None and sparse.kjt.keys() == ["a"]
    assert torch.equal(sparse.kjt.values(), torch.tensor([1, 2, 6, 1, 2]))
    assert torch.equal(sparse.kjt.lengths(), torch.tensor([2, 1, 2]))
    b, cd = sparse.ikjts
    # b: rows 0 and 2 share the entry holding [3, 4, 5], stored once.
    inv_b = b.inverse_lookup()
    assert b.keys() == ["b"] and inv_b[0] == inv_b[2] != inv_b[1]
    assert torch.equal(b.values(), torch.tensor([3, 4, 5, 10]))
    assert torch.equal(b.lengths(), torch.tensor([3, 1]))
    # c, d: one shared inverse_lookup; row 0 -> [7, 8] for c and [9] for d.
    assert cd.keys() == ["c", "d"]
    assert torch.equal(cd.inverse_lookup(), torch.tensor([0, 0, 1]))
    assert torch.equal(cd.values(), torch.tensor([7, 8, 11, 9, 12]))
    assert torch.equal(cd.lengths(), torch.tensor([2, 1, 1, 1]))
    distinct = cd.distinct_kjt()
    row0 = int(cd.inverse_lookup()[0])
    assert distinct["c"].to_dense()[row0].tolist() == [7, 8]
    assert distinct["d"].to_dense()[row0].tolist() == [9]
    plain = convert_sparse(figure5_batch(), FeatureSpec(sparse=["a", "b", "c", "d"]), source="x")
    assert kjt_equal(sparse.to_kjt(), plain.to_kjt())


# ---------------------------------------------------------------------- properties
@st.composite
def arrow_batches(draw: st.DrawFn) -> tuple[pa.RecordBatch, list[list[str]]]:
    """3-4 sparse features drawn from tiny pools (duplicates and near-duplicates galore)."""
    n_features = draw(st.integers(2, 4))
    b = draw(st.integers(0, 14))
    ids = st.integers(-2, 3) | st.sampled_from([-(2**63), 2**63 - 1])
    columns = {}
    for j in range(n_features):
        pool = draw(st.lists(st.lists(ids, max_size=4), min_size=1, max_size=3))
        columns[f"f{j}"] = pa.array([draw(st.sampled_from(pool)) for _ in range(b)], IDS)
    names = list(columns)
    split = draw(st.integers(1, n_features))
    groups = [names[:split]] + (
        [names[split:]] if split < n_features and draw(st.booleans()) else []
    )
    return pa.record_batch(columns), groups


def _check_grouping(batch: pa.RecordBatch, spec: FeatureSpec) -> None:
    converted = convert_sparse(batch, spec, source="prop")
    converted.validate()
    plain = convert_sparse(batch, FeatureSpec(sparse=spec.sparse, labels=[]), source="prop")
    assert kjt_equal(converted.to_kjt(spec.sparse), plain.to_kjt())
    for group, ikjt in zip(spec.dedup_sparse_features, converted.ikjts, strict=True):
        per_feature = [batch.column(name).to_pylist() for name in group]
        rows = [tuple(tuple(f[i]) for f in per_feature) for i in range(batch.num_rows)]
        inverse = ikjt.inverse_lookup().tolist()
        assert ikjt.num_distinct() == len(set(rows))
        for i in range(batch.num_rows):
            for j in range(batch.num_rows):
                # Same entry iff every feature of the group matches.
                assert (inverse[i] == inverse[j]) == (rows[i] == rows[j])
        firsts = [inverse.index(d) for d in range(ikjt.num_distinct())]
        assert firsts == sorted(firsts)


@settings(max_examples=120, deadline=None)
@given(arrow_batches())
def test_ikjt_conversion_is_exact_and_groups_only_synchronised_rows(case) -> None:
    batch, groups = case
    _check_grouping(
        batch, FeatureSpec(sparse=batch.schema.names, labels=[], dedup_sparse_features=groups)
    )


@settings(max_examples=60, deadline=None)
@given(arrow_batches())
def test_large_binary_offsets_give_the_same_result(case) -> None:
    """Past 2 GiB of ids per group the rows are viewed as ``large_binary``: same results."""
    batch, groups = case
    spec = FeatureSpec(sparse=batch.schema.names, labels=[], dedup_sparse_features=groups)
    small = convert_sparse(batch, spec, source="s")
    int32_max = jagged._INT32_MAX
    jagged._INT32_MAX = -1  # every column "outgrows" int32 offsets
    try:
        assert jagged.as_binary(
            read_list_column(batch, batch.schema.names[0], source="l")
        ).type == (pa.large_binary())
        _check_grouping(batch, spec)
        assert convert_sparse(batch, spec, source="l").equals(small)
    finally:
        jagged._INT32_MAX = int32_max


def test_rows_with_equal_bytes_across_keys_or_lengths_stay_separate() -> None:
    """Byte-level dedup must not confuse ids moved between keys, empty vs zero ids, or a row
    with its neighbour in another key of the stacked group."""
    batch = pa.record_batch(
        {
            "c": pa.array([[1, 2], [1], [], [0], [5], [5]], IDS),
            "d": pa.array([[3], [2, 3], [0], [], [5], [5]], IDS),
        }
    )
    spec = FeatureSpec(sparse=["c", "d"], labels=[], dedup_sparse_features=[["c", "d"]])
    _check_grouping(batch, spec)
    (ikjt,) = convert_sparse(batch, spec, source="x").ikjts
    assert ikjt.inverse_lookup().tolist() == [0, 1, 2, 3, 4, 4]
    # Stacked key-major, row (d, 0) follows row (c, 5) == [5]; it must not count as a repeat.
    edge = pa.record_batch({"c": pa.array([[7], [9]], IDS), "d": pa.array([[9], [9]], IDS)})
    (ikjt,) = convert_sparse(edge, spec, source="x").ikjts
    assert ikjt.inverse_lookup().tolist() == [0, 1]


def test_unsynchronised_rows_stay_separate() -> None:
    batch = pa.record_batch(
        {
            "c": pa.array([[7, 8], [7, 8], [7, 8], [7, 8]], IDS),
            "d": pa.array([[9], [1], [9], [1]], IDS),
        }
    )
    ikjt = convert_sparse(
        batch,
        FeatureSpec(sparse=["c", "d"], labels=[], dedup_sparse_features=[["c", "d"]]),
        source="s",
    ).ikjts[0]
    assert torch.equal(ikjt.inverse_lookup(), torch.tensor([0, 1, 0, 1]))
    assert torch.equal(
        ikjt.values(), torch.tensor([7, 8, 7, 8, 9, 1])
    )  # c stored twice, on purpose


def test_batch_without_duplicates_round_trips_unchanged() -> None:
    batch = pa.record_batch({"h": pa.array([[1, 2], [2, 1], [1], [], [1, 2, 0]], IDS)})
    spec = FeatureSpec(sparse=["h"], labels=[], dedup_sparse_features=[["h"]])
    ikjt = convert_sparse(batch, spec, source="s").ikjts[0]
    assert ikjt.num_distinct() == 5
    assert torch.equal(ikjt.inverse_lookup(), torch.arange(5))
    plain = convert_sparse(batch, FeatureSpec(sparse=["h"], labels=[]), source="s").kjt
    assert plain is not None
    assert torch.equal(ikjt.values(), plain.values()) and torch.equal(
        ikjt.lengths(), plain.lengths()
    )


def test_empty_batch_and_empty_lists() -> None:
    empty = pa.record_batch({"label": pa.array([], pa.float32()), "h": pa.array([], IDS)})
    spec = FeatureSpec(sparse=["h"], dedup_sparse_features=[["h"]])
    batch = convert_batch(empty, spec, source="e")
    batch.validate()
    assert batch.batch_size == 0 and batch.dense.shape == (0, 0) and batch.labels.shape == (0, 1)
    assert batch.sparse.ikjts[0].num_distinct() == 0
    lists = pa.record_batch({"h": pa.array([[], [], [5], []], IDS)})
    ikjt = convert_sparse(
        lists, FeatureSpec(sparse=["h"], labels=[], dedup_sparse_features=[["h"]]), source="e"
    ).ikjts[0]
    assert torch.equal(ikjt.inverse_lookup(), torch.tensor([0, 0, 1, 0]))
    assert torch.equal(ikjt.lengths(), torch.tensor([0, 1]))


def test_sliced_batches_chunked_tables_and_narrow_ids() -> None:
    full = pa.record_batch({"h": pa.array([[9], [1, 2], [3], [1, 2], [4]], IDS)})
    sliced = full.slice(1, 3)
    col = read_list_column(sliced, "h", source="s")
    assert col.offsets.tolist() == [0, 2, 3, 5]
    spec = FeatureSpec(sparse=["h"], labels=[], dedup_sparse_features=[["h"]])
    ikjt = convert_sparse(sliced, spec, source="s").ikjts[0]
    assert torch.equal(ikjt.values(), torch.tensor([1, 2, 3]))
    assert torch.equal(ikjt.inverse_lookup(), torch.tensor([0, 1, 0]))
    table = pa.Table.from_batches([full.slice(0, 2), full.slice(2, 3)])
    from_table = convert_sparse(table, spec, source="t")
    assert from_table.equals(convert_sparse(full, spec, source="t"))
    narrow = pa.record_batch({"h": pa.array([[1, 2], [1, 2]], pa.list_(pa.int32()))})
    assert narrow_ids_ok(convert_sparse(narrow, spec, source="n"))
    unsigned = pa.record_batch({"h": pa.array([[2**63 - 1]], pa.list_(pa.uint64()))})
    assert convert_sparse(unsigned, spec, source="u").ikjts[0].values().tolist() == [2**63 - 1]


def test_stacked_group_read_equals_the_per_column_read(monkeypatch) -> None:
    full = pa.record_batch(
        {
            "g": pa.array([[9], [1, 2], [], [1, 2], [4]], IDS),
            "h": pa.array([[0], [5], [6, 7], [5], [8]], IDS),
            "n": pa.array([[1], [2], [3], [4], [5]], pa.list_(pa.int32())),
        }
    )
    chunked = pa.Table.from_batches([full.slice(0, 2), full.slice(2, 1), full.slice(3)])
    for batch in (full, full.slice(1, 3), full.slice(2), chunked, chunked.slice(1, 3)):
        for names in (["g", "h"], ["h", "g", "n"]):
            expected = jagged.stack_columns([read_list_column(batch, n, source="s") for n in names])
            got = jagged.read_stacked_columns(batch, names, source="s")
            assert got.offsets.dtype == np.int64 and got.offsets[0] == 0
            assert got.offsets.tolist() == expected.offsets.tolist()
            end = int(got.offsets[-1])
            assert got.values[:end].tolist() == expected.values[:end].tolist()

    # More ids than int32 offsets address: Arrow refuses to concatenate, the per-column path
    # (int64 offsets) takes over.
    def overflow(arrays):
        raise pa.ArrowInvalid("offset overflow while concatenating arrays")

    monkeypatch.setattr(jagged.pa, "concat_arrays", overflow)
    got = jagged.read_stacked_columns(full, ["g", "h"], source="s")
    assert got.offsets.tolist() == [0, 1, 3, 3, 5, 6, 7, 8, 10, 11, 12]


def test_bad_data_in_a_group_names_its_column_and_row() -> None:
    batch = pa.record_batch(
        {
            "label": pa.array([0.0] * 3, pa.float32()),
            "g": pa.array([[1], [2], [3]], IDS),
            "h": pa.array([[1], None, [3]], IDS),
        }
    )
    spec = FeatureSpec(sparse=["g", "h"], dedup_sparse_features=[["g", "h"]])
    with pytest.raises(SchemaError, match=r"p\.parquet: column 'h': row 11: null list"):
        convert_batch(batch, spec, source="p.parquet", row_offset=10)
    spec = FeatureSpec(sparse=["g", "h"])  # both plain: one stacked read too
    with pytest.raises(SchemaError, match=r"column 'h': row 11: null list"):
        convert_batch(batch, spec, source="p.parquet", row_offset=10)


def narrow_ids_ok(features) -> bool:
    ikjt = features.ikjts[0]
    return ikjt.values().dtype == torch.int64 and ikjt.values().tolist() == [1, 2]


def test_find_distinct_rows_on_raw_columns() -> None:
    # Offsets need not start at 0: they index into a shared values buffer.
    values = np.array([0, 5, 6, 5, 6, 7, 5, 6], dtype=np.int64)
    column = JaggedColumn(offsets=np.array([1, 3, 5, 6, 8]), values=values)
    distinct, inverse = find_distinct_rows([column], batch_size=4)
    assert distinct.tolist() == [0, 2] and inverse.tolist() == [0, 0, 1, 0]


def test_from_catalogue(tiny_catalogue: Catalogue) -> None:
    spec = FeatureSpec.from_catalogue(tiny_catalogue)
    assert spec.sparse == tiny_catalogue.sparse_names and spec.dense == tiny_catalogue.dense_names
    assert spec.plain_sparse == spec.sparse


# ---------------------------------------------------------------------- errors
def _bad(column: pa.Array, name: str = "h") -> pa.RecordBatch:
    return pa.record_batch({"label": pa.array([0.0] * len(column), pa.float32()), name: column})


@pytest.mark.parametrize(
    ("column", "message"),
    [
        (pa.array([[1], [2], None], IDS), r"part-7\.parquet: column 'h': row 102: null list"),
        (pa.array([[1], [2, None], [3]], IDS), r"part-7\.parquet: column 'h': row 101: null id"),
        (
            pa.array([[1], [2], [3, 2**63]], pa.list_(pa.uint64())),
            r"column 'h': row 102: id 9223372036854775808 is outside the int64 range",
        ),
        (
            pa.array([[1.5], [2.0], [3.0]], pa.list_(pa.float64())),
            r"column 'h' has type list<item: double>",
        ),
        (pa.array([1, 2, 3], pa.int64()), r"column 'h' has type int64, expected list<int64>"),
    ],
)
def test_bad_sparse_data_names_file_column_and_row(column: pa.Array, message: str) -> None:
    spec = FeatureSpec(sparse=["h"], dedup_sparse_features=[["h"]])
    with pytest.raises(SchemaError, match=message):
        convert_batch(_bad(column), spec, source="part-7.parquet", row_offset=100)


def test_missing_columns_and_bad_dense() -> None:
    with pytest.raises(
        SchemaError, match=r"f\.parquet: missing column 'zz' \(expected list<int64>\)"
    ):
        convert_batch(figure5_batch(), FeatureSpec(sparse=["zz"]), source="f.parquet")
    with pytest.raises(SchemaError, match=r"missing column 'nope' \(expected float32\)"):
        convert_batch(figure5_batch(), FeatureSpec(dense=["nope"]), source="f.parquet")
    nulls = pa.record_batch({"label": pa.array([0.0, None], pa.float32())})
    with pytest.raises(SchemaError, match=r"g\.parquet: column 'label': row 6: null value"):
        convert_batch(nulls, FeatureSpec(), source="g.parquet", row_offset=5)
    text = pa.record_batch({"label": pa.array(["x"])})
    with pytest.raises(SchemaError, match="column 'label' has type string"):
        convert_batch(text, FeatureSpec(), source="g.parquet")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sparse": ["a"], "dedup_sparse_features": [["b"]]}, "'b' is not one of the sparse"),
        ({"sparse": ["a", "b"], "dedup_sparse_features": [["a"], ["b", "a"]]}, "in groups 0 and 1"),
        ({"sparse": ["a"], "dedup_sparse_features": [[]]}, r"dedup_sparse_features\[0\] is empty"),
        ({"sparse": ["a", "a"]}, "listed twice"),
    ],
)
def test_feature_spec_checks(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FeatureSpec(**kwargs)
