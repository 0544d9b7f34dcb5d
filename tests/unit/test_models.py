"""DLRM / RM1-like models from torchrec parts: configs, shapes, packing, sequence encoder."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

import pyarrow as pa
import pytest
import torch
from torchrec.models.dlrm import DenseArch, InteractionArch, OverArch
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.errors import ConfigError, TensorFormatError
from recd.models import (
    DLRM,
    ModelConfig,
    SequenceConfig,
    SequenceEncoder,
    as_sparse_features,
    bce_loss,
    dedup_groups,
    pack_features,
    rm1_config,
    table_sizes,
)
from recd.optim import AdamConfig, ModelAdam
from recd.schema import load_catalogue
from recd.tensors.convert import FeatureSpec, convert_batch

IDS = pa.list_(pa.int64())


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    """Tiny tensors: one intra-op thread (OpenMP workers spin on a shared 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def figure5_batch() -> pa.RecordBatch:
    """The RecD paper's Figure 5 batch: a plain; b deduplicated; c, d one group."""
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


def small_config(**overrides: object) -> ModelConfig:
    kwargs: dict[str, object] = {
        "dense_in_features": 1,
        "num_embeddings": {"a": 16, "b": 16, "c": 16, "d": 16},
        "embedding_dim": 4,
        "bottom_mlp": [8, 4],
        "top_mlp": [8, 1],
        "sequence": SequenceConfig(num_heads=2, ff_dim=8, max_seq_len=4),
    }
    kwargs.update(overrides)
    return ModelConfig(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- configs
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"bottom_mlp": [8, 5]}, "bottom_mlp"),
        ({"top_mlp": [1]}, "top_mlp"),
        ({"num_embeddings": {}}, "num_embeddings"),
        ({"num_embeddings": {"a": 0}}, r"num_embeddings\['a'\]"),
        ({"sequence_groups": [["a", "zz"]]}, "'zz' is not in model.num_embeddings"),
        ({"sequence_groups": [["a"], ["a"]]}, "'a' appears twice"),
        ({"sequence_groups": [["c"]], "shared_tables": [["a", "c"]]}, "mixes sequence"),
        (
            {"num_embeddings": {"a": 3, "b": 4}, "shared_tables": [["a", "b"]]},
            "different num_embeddings",
        ),
        ({"embedding_dim": 0}, "embedding_dim"),
    ],
)
def test_config_errors_name_the_field(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        small_config(**overrides)


def test_sequence_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"sequence\.pooling"):
        SequenceConfig(pooling="max")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"sequence\.max_seq_len"):
        SequenceConfig(max_seq_len=0)
    with pytest.raises(ConfigError, match="num_heads = 3 does not divide embedding_dim = 4"):
        DLRM(small_config(sequence_groups=[["c"]], sequence=SequenceConfig(num_heads=3)))


def test_rm1_config_from_the_tiny_catalogue() -> None:
    catalogue = load_catalogue("tiny")
    config = rm1_config(catalogue, embedding_dim=8, max_rows=1000)
    assert config.sequence_groups == [["user_history"], ["cart_item_ids", "cart_seller_ids"]]
    assert config.pooled_features == ["user_country", "item_id"]
    assert config.num_embeddings == table_sizes(catalogue, max_rows=1000)
    assert config.num_embeddings["user_country"] == 50  # cardinality below max_rows
    assert config.num_embeddings["item_id"] == 1000
    assert config.sequence.max_seq_len == 12  # user_history's max_length
    assert dedup_groups(catalogue) == [
        ["user_history"],
        ["cart_item_ids", "cart_seller_ids"],
        ["user_country"],
    ]
    rm1_like = load_catalogue("rm1-like")
    rm1 = rm1_config(rm1_like)
    assert rm1.sequence_groups == [
        ["seq_click_items", "seq_click_categories"],
        ["seq_cart_items", "seq_cart_sellers"],
        ["seq_watch_items"],
        ["seq_search_terms"],
    ]
    assert rm1.pooled_features == [f.name for f in rm1_like.sparse if f.kind != "history"]


# ---------------------------------------------------------------------- model structure
def test_dlrm_is_built_from_torchrec_parts_with_a_documented_parameter_order() -> None:
    model = DLRM(small_config(sequence_groups=[["c", "d"]], top_mlp=[8, 2]))
    assert model.sparse_arch is not None and model.sequence_arch is not None
    assert isinstance(model.sparse_arch.embedding_bag_collection, EmbeddingBagCollection)
    assert isinstance(model.sequence_arch.embedding_collection, EmbeddingCollection)
    assert isinstance(model.dense_arch, DenseArch)
    assert isinstance(model.inter_arch, InteractionArch)
    assert isinstance(model.over_arch, OverArch)
    prefixes = [name.split(".")[0] for name, _ in model.named_parameters()]
    order = ["sparse_arch", "sequence_arch", "dense_arch", "over_arch"]
    assert sorted(set(prefixes), key=prefixes.index) == order
    names = [n for n, _ in model.named_parameters()]
    assert names[:2] == [
        "sparse_arch.embedding_bag_collection.embedding_bags.a.weight",
        "sparse_arch.embedding_bag_collection.embedding_bags.b.weight",
    ]
    batch = convert_batch(figure5_batch(), FIGURE5_SPEC, source="fig5")
    logits = model.forward_batch(batch)
    assert logits.shape == (3, 2)  # B x T
    # F = 2 pooled + 1 group; over arch input = E + F + F choose 2 = 4 + 3 + 3.
    assert model.over_arch.model[0]._mlp[0]._linear.in_features == 10


def test_shared_table_serves_both_features() -> None:
    model = DLRM(small_config(shared_tables=[["a", "c"]]))
    assert model.sparse_arch is not None
    tables = [n for n, _ in model.named_parameters() if "embedding_bags" in n]
    assert tables == [
        "sparse_arch.embedding_bag_collection.embedding_bags.a.weight",
        "sparse_arch.embedding_bag_collection.embedding_bags.b.weight",
        "sparse_arch.embedding_bag_collection.embedding_bags.d.weight",
    ]
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c", "d"],
        values=torch.tensor([5, 6, 1, 5, 6, 2]),
        lengths=torch.tensor([2, 1, 2, 1]),
        stride=1,
    )
    pooled = model.sparse_arch(as_sparse_features(kjt))  # 1 x 4 x E
    assert torch.equal(pooled[0, 0], pooled[0, 2])  # a and c: same ids, same table
    assert not torch.equal(pooled[0, 0], pooled[0, 3])


def test_missing_feature_is_a_clear_error() -> None:
    model = DLRM(small_config())
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.tensor([1, 2]), lengths=torch.tensor([1, 1]), stride=1
    )
    with pytest.raises(TensorFormatError, match=r"\['c', 'd'\] are missing"):
        model(torch.zeros(1, 1), kjt)


# ---------------------------------------------------------------------- packing
def test_pack_features_figure5_golden() -> None:
    sparse = convert_batch(figure5_batch(), FIGURE5_SPEC, source="fig5").sparse
    packed = pack_features(sparse, ["a", "b", "c", "d"])
    kjt = packed.kjt
    assert kjt.keys() == ["a", "b", "c", "d"] and kjt.stride() == 3
    # a plain (3 rows); b: 2 distinct rows + 1 empty; c, d: 2 distinct rows + 1 empty.
    assert kjt.lengths().tolist() == [2, 1, 2, 3, 1, 0, 2, 1, 0, 1, 1, 0]
    assert kjt.values().tolist() == [1, 2, 6, 1, 2, 3, 4, 5, 10, 7, 8, 11, 9, 12]
    assert packed.group("a") is None and packed.num_rows("a") == 3
    assert packed.num_rows("b") == 2 and packed.num_rows("d") == 2
    assert packed.group("c") is packed.group("d")
    rows = torch.tensor([[10.0], [20.0], [0.0]])
    assert packed.expand("b", rows).flatten().tolist() == [10.0, 20.0, 10.0]
    assert packed.expand("c", rows).flatten().tolist() == [10.0, 10.0, 20.0]
    # expand_keys: the group is looked up on the batch's rows instead.
    expanded = pack_features(sparse, ["c", "d"], expand_keys=frozenset({"c", "d"}))
    assert expanded.groups == [] and expanded.kjt.lengths().tolist() == [2, 2, 1, 1, 1, 1]


# ---------------------------------------------------------------------- sequence encoder
def _sequences(lengths: list[int], dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(sum(lengths), dim, generator=gen), torch.tensor(lengths)


@pytest.mark.parametrize("pooling", ["mean", "first"])
def test_sequence_encoder_is_batch_invariant(pooling: Literal["mean", "first"]) -> None:
    """A row's output does not depend on how many other rows share its batch (bitwise, with
    enough token rows for the CPU GEMM's large-matrix path, see recd.models.sequence): what lets
    the transformer run once per distinct sequence."""
    torch.manual_seed(0)
    config = SequenceConfig(num_heads=2, ff_dim=16, max_seq_len=6, pooling=pooling)
    encoder = SequenceEncoder(2, 8, config)
    lengths = [3, 0, 6, 1, 2]
    seqs = [_sequences(lengths, 8, seed) for seed in (1, 2)]
    out = encoder(seqs)  # 5 x 8
    assert out.shape == (5, 8) and torch.isfinite(out).all()  # the empty row too
    inverse = torch.tensor([2, 0, 0, 4, 1, 2, 3, 0, 4, 4, 2])
    expanded = [
        torch.ops.fbgemm.jagged_index_select(values, lens, inverse) for values, lens in seqs
    ]
    assert torch.equal(encoder(expanded), out[inverse])


def test_sequence_encoder_truncates_and_pools() -> None:
    torch.manual_seed(0)
    encoder = SequenceEncoder(1, 4, SequenceConfig(max_seq_len=3, ff_dim=8))
    long_values, _ = _sequences([5], 4, 3)
    full = encoder([(long_values, torch.tensor([5]))])
    truncated = encoder([(long_values[:3], torch.tensor([3]))])
    assert torch.equal(full, truncated)  # positions beyond max_seq_len are dropped
    first = SequenceEncoder(1, 4, SequenceConfig(max_seq_len=3, ff_dim=8, pooling="first"))
    first.load_state_dict(encoder.state_dict())
    assert not torch.allclose(first([(long_values, torch.tensor([5]))]), full)


# ---------------------------------------------------------------------- training
def test_training_the_rm1_like_model_reduces_the_loss() -> None:
    torch.manual_seed(0)
    model = DLRM(small_config(sequence_groups=[["c", "d"]]))
    optimizer = ModelAdam.for_model(model, AdamConfig(lr=0.02))
    batch = convert_batch(figure5_batch(), FIGURE5_SPEC, source="fig5")
    losses = []
    for _ in range(40):
        optimizer.zero_grad()
        loss = bce_loss(model.forward_batch(batch), batch.labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
