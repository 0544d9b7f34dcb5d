"""Sharded (torchrec DMP over gloo, 2 processes and 1) == unsharded, on the same batches.

Each scenario trains the same DLRM (same seed, same initial weights) for STEPS Adam steps on
the same global batches of B rows: the reference on one process with all B rows, the sharded
model on R ranks with B/R rows each (rank r gets rows ``[r B/R, (r+1) B/R)``). Compared: the
predictions and loss of every step, the logical weights / Adam m / Adam v gathered from the
shards (``ShardedAdam.gather_flat``) against the reference's ``ModelAdam.export_state``, one
checkpoint file written by all ranks with ranged pwrites, and a checkpoint loaded into the
shards (1 rank -> R ranks) and trained one more step.

Why a tolerance and not ``torch.equal`` for the state. The arithmetic is the same but not the
order of the sums: DDP averages two half-batch gradients (``(g0 + g1) / 2``) where the
reference sums all B rows at once, and fbgemm's dense backward accumulates an embedding row's
gradient in another order than ``nn.EmbeddingBag``'s sparse-gradient coalescing. Measured
(``python -m tests.distributed.test_sharded_equals_unsharded``): 2 processes, DLRM: logits
within 1.2e-7, weights 3e-8, m 4e-9, v 7e-12 after 3 steps; RM1-like: weights 2e-6 (its
transformers amplify rounding) apart from the attention key biases (see
KEY_BIAS_ATOL_PER_STEP). 1 process: logits bitwise at every step and dense layers bitwise; a
few embedding elements differ in the last bit (the backward's summation order). The step-0
forward runs identical weights on batch-invariant kernels and is compared exactly.

One group of processes runs every scenario of a world size (process start dominates the
cost); the workers are bounded by a timeout, so a hang fails the test instead of stalling CI.
"""

from __future__ import annotations

import copy
import functools
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.checkpoint import (
    checkpoint_filename,
    commit,
    preallocate,
    read_checkpoint,
    write_checkpoint,
)
from recd.durable import temp_path_for
from recd.models import DLRM, ModelConfig, SequenceConfig, bce_loss, dedup_groups, dlrm_config
from recd.models.rm1 import rm1_config
from recd.optim import AdamConfig, FlatState, ModelAdam
from recd.schema import load_catalogue
from recd.tensors.batch import Batch
from recd.tensors.convert import FeatureSpec, convert_batch
from tests.distributed.spawn import run_workers

CATALOGUE = load_catalogue("tiny")
SPEC = FeatureSpec.from_catalogue(CATALOGUE, dedup_sparse_features=dedup_groups(CATALOGUE))
ROWS = 64  # rows of every table; ids are drawn below it
BATCH = 32  # global batch; 16 rows per rank
STEPS = 3
LR = 0.01
WORLD = 2
ADAM = AdamConfig(lr=LR)
LOGIT_ATOL = 1e-6
STATE_ATOL = {"dlrm": 1e-6, "rm1": 1e-5}
"""Largest |sharded - unsharded| of weights, m, v after the steps (measured: 3e-8 for the
DLRM; 2e-6 for rm1, whose transformers amplify rounding more)."""
KEY_BIAS_ATOL_PER_STEP = 2 * LR
"""Attention key biases have a zero gradient in exact arithmetic (softmax is invariant to a
per-query constant), so their gradient is rounding noise that Adam normalises to steps of
about lr in either direction: they are only bounded by the Adam step size."""
IDS = pa.list_(pa.int64())


@dataclass(frozen=True)
class Scenario:
    plan: str
    inputs: str  # "kjt" or "ikjt"
    model: str  # "dlrm" (pooled features) or "rm1" (sequence groups + transformers)
    world: int = WORLD  # processes

    @property
    def id(self) -> str:
        return f"{self.world}proc-{self.plan}-{self.inputs}-{self.model}"


SCENARIOS = [
    Scenario(plan="table_wise", inputs="kjt", model="dlrm"),
    Scenario(plan="table_wise", inputs="ikjt", model="dlrm"),
    Scenario(plan="row_wise", inputs="kjt", model="dlrm"),
    Scenario(plan="row_wise", inputs="ikjt", model="dlrm"),
    Scenario(plan="row_wise", inputs="ikjt", model="rm1"),
    Scenario(plan="column_wise", inputs="kjt", model="dlrm"),
    Scenario(plan="data_parallel", inputs="ikjt", model="dlrm"),
    # One process: DMP + DDP with a world of one still runs the sharded code paths.
    Scenario(plan="table_wise", inputs="ikjt", model="dlrm", world=1),
    Scenario(plan="row_wise", inputs="kjt", model="rm1", world=1),
]


def model_config(name: str) -> ModelConfig:
    if name == "rm1":
        return rm1_config(
            CATALOGUE,
            embedding_dim=8,
            max_rows=ROWS,
            sequence=SequenceConfig(num_heads=2, ff_dim=16, max_seq_len=8),
            bottom_mlp=[16, 8],
            top_mlp=[16, 1],
        )
    return dlrm_config(CATALOGUE, embedding_dim=8, max_rows=ROWS, bottom_mlp=[16, 8])


# ---------------------------------------------------------------------- data
def global_rows(seed: int) -> pa.RecordBatch:
    """BATCH rows of interleaved sessions: the grouped features repeat within a session."""
    rng = np.random.default_rng(seed)
    sessions = rng.integers(0, 6, BATCH)
    k = np.array([int((sessions[:i] == s).sum()) for i, s in enumerate(sessions)])
    base = {int(s): rng.integers(0, ROWS, 12) for s in np.unique(sessions)}
    history = [base[int(s)][: 1 + i // 2].tolist() for s, i in zip(sessions, k, strict=True)]
    items = [
        (base[int(s)][: 1 + (i // 3) % 3] * 3 % ROWS).tolist()
        for s, i in zip(sessions, k, strict=True)
    ]
    sellers = [[(x + int(s)) % ROWS for x in row] for s, row in zip(sessions, items, strict=True)]
    return pa.record_batch(
        {
            "label": pa.array(rng.integers(0, 2, BATCH).astype(np.float32)),
            "user_age_days": pa.array((sessions * 3.0 + 1).astype(np.float32)),
            "item_price": pa.array(rng.random(BATCH).astype(np.float32)),
            "user_country": pa.array([[int(s) % 5] for s in sessions], IDS),
            "user_history": pa.array(history, IDS),
            "cart_item_ids": pa.array(items, IDS),
            "cart_seller_ids": pa.array(sellers, IDS),
            "item_id": pa.array([[int(x)] for x in rng.integers(0, ROWS, BATCH)], IDS),
        }
    )


def make_batch(rows: pa.RecordBatch, inputs: str) -> Batch:
    batch = convert_batch(rows, SPEC, source="test")
    if inputs == "kjt":
        from recd.tensors.batch import SparseFeatures

        batch = Batch(
            dense=batch.dense,
            labels=batch.labels,
            sparse=SparseFeatures(batch_size=batch.batch_size, kjt=batch.sparse.to_kjt()),
        )
    return batch


def local_batch(step: int, rank: int, inputs: str, world: int = WORLD) -> Batch:
    """Rank ``rank``'s rows of the global batch of ``step``: ``[rank B/world, (rank+1) B/world)``."""
    rows = BATCH // world
    return make_batch(global_rows(step).slice(rank * rows, rows), inputs)


def random_state(layout_n: int, seed: int) -> FlatState:
    """A made-up logical state (any values will do to test load/gather round trips)."""
    rng = np.random.default_rng(seed)
    return FlatState(
        step=7,
        weights=rng.normal(0, 0.1, layout_n).astype(np.float32),
        adam_m=rng.normal(0, 1e-3, layout_n).astype(np.float32),
        adam_v=rng.random(layout_n).astype(np.float32) * 1e-5,
    )


# ---------------------------------------------------------------------- workers
def random_checkpoint(ckpt_dir: Path, model: str) -> Path:
    """``random_state`` of ``model``'s layout as a checkpoint file (what a 1-rank run writes)."""
    from recd.optim.sharded_adam import logical_layout

    state = random_state(logical_layout(model_config(model)).n_params, seed=1)
    path = ckpt_dir / f"random-{model}" / checkpoint_filename(state.step)
    if not path.exists():
        write_checkpoint(path, state.step, state.weights, state.adam_m, state.adam_v)
    return path


def write_distributed_checkpoint(opt: Any, final: Path, rank: int) -> None:
    """The distributed save: rank 0 preallocates, every rank pwrites its blocks, rank 0
    commits."""
    import torch.distributed as dist

    tmp = temp_path_for(final, tag="job")
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        preallocate(tmp, opt.step_count, opt.layout.n_params)
    dist.barrier()
    opt.write_local_ranges(tmp)
    dist.barrier()
    if rank == 0:
        commit(tmp, final)
    dist.barrier()


def sharded_worker(
    rank: int, world_size: int, scenarios: list[Scenario], ckpt_dir: Path
) -> dict[str, Any]:
    """Every scenario on this rank: per-step logits/loss, the gathered state, round trips."""
    import time

    from recd.train.sharding import build_sharded_training

    torch.set_num_threads(1)
    out: dict[str, Any] = {}
    for sc in scenarios:
        dmp, opt = build_sharded_training(model_config(sc.model), ADAM, plan=sc.plan, seed=0)
        logits, losses, times = [], [], []
        for step in range(STEPS):
            batch = local_batch(step, rank, sc.inputs, world_size)
            start = time.perf_counter()
            opt.zero_grad()
            step_logits = dmp(batch.dense, batch.sparse)
            loss = bce_loss(step_logits, batch.labels)
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - start)
            logits.append(step_logits.detach())
            losses.append(loss.detach())
        trained = opt.gather_flat()
        written = ckpt_dir / sc.id / checkpoint_filename(STEPS)
        write_distributed_checkpoint(opt, written, rank)
        shards = [
            (s.name, s.row_start, s.row_end, s.col_start, s.col_end, s.owner)
            for s in opt.local_shards(copy=False)
        ]
        # 1 rank -> 2 ranks: load a logical checkpoint (read-only memmaps), gather it back,
        # train one more step.
        ckpt = read_checkpoint(random_checkpoint(ckpt_dir, sc.model))
        opt.load_flat(step=ckpt.step, weights=ckpt.weights, adam_m=ckpt.adam_m, adam_v=ckpt.adam_v)
        loaded = opt.gather_flat()
        batch = local_batch(STEPS, rank, sc.inputs, world_size)
        opt.zero_grad()
        bce_loss(dmp(batch.dense, batch.sparse), batch.labels).backward()
        opt.step()
        resumed = opt.gather_flat()
        opt.close()
        ddp = dmp._dmp_wrapped_module
        out[sc.id] = {
            "sparse_grads_under_ddp": [
                name
                for name, p in ddp.named_parameters()
                if p.grad is not None and p.grad.is_sparse
            ]
            if isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
            else [],
            "comm_hooks": [hook.__name__ for hook, _ in getattr(ddp, "_comm_hooks", [])],
            "logits": logits,
            "losses": losses,
            "trained": trained,
            "written": written,
            "shards": shards,
            "loaded": loaded,
            "resumed": resumed,
            "step_s": times,
        }
    return out


# ---------------------------------------------------------------------- reference
@functools.cache
def reference_run(sc: Scenario) -> dict[str, Any]:
    """The same training on one process with the whole batch."""
    torch.manual_seed(0)
    model = DLRM(model_config(sc.model))
    opt = ModelAdam.for_model(model, ADAM)
    logits, losses = [], []
    for step in range(STEPS):
        batch = make_batch(global_rows(step), sc.inputs)
        opt.zero_grad()
        step_logits = model(batch.dense, batch.sparse)
        loss = bce_loss(step_logits, batch.labels)
        loss.backward()
        opt.step()
        logits.append(step_logits.detach())
        losses.append(loss.detach())
    trained = opt.export_state()
    resume_model = copy.deepcopy(model)
    resume_opt = ModelAdam.for_model(resume_model, ADAM)
    resume_opt.load_state(random_state(len(trained.weights), seed=1))
    batch = make_batch(global_rows(STEPS), sc.inputs)
    resume_opt.zero_grad()
    bce_loss(resume_model(batch.dense, batch.sparse), batch.labels).backward()
    resume_opt.step()
    return {
        "logits": logits,
        "losses": losses,
        "trained": trained,
        "resumed": resume_opt.export_state(),
        "names": opt.names,
    }


# ---------------------------------------------------------------------- tests
def test_local_batches_really_deduplicate() -> None:
    """The IKJT scenarios feed real duplicates: each rank's groups have fewer distinct rows."""
    for rank in range(WORLD):
        batch = local_batch(0, rank, "ikjt")
        assert batch.batch_size == BATCH // WORLD
        assert batch.sparse.ikjts
        assert any(ikjt.num_distinct() < batch.batch_size for ikjt in batch.sparse.ikjts)
        assert batch.sparse.to_kjt().keys() == local_batch(0, rank, "kjt").sparse.to_kjt().keys()


def test_named_plans() -> None:
    """Plans are built without a process group: the same on every rank."""
    from torchrec.distributed.types import ShardingType

    from recd.errors import ConfigError
    from recd.train.sharding import build_sharding_plan

    torch.manual_seed(0)
    model = DLRM(model_config("dlrm"))
    cpu = torch.device("cpu")
    path = "sparse_arch.embedding_bag_collection"
    tw = build_sharding_plan(model, "table_wise", world_size=WORLD, device=cpu).plan[path]
    ranks = {t: p.ranks for t, p in tw.items()}
    assert all(len(r) == 1 for r in ranks.values())
    assert {r[0] for r in ranks.values()} == {0, 1}  # both ranks hold tables
    assert all(p.compute_kernel == "dense" for p in tw.values())
    rw = build_sharding_plan(model, "row_wise", world_size=WORLD, device=cpu).plan[path]
    for p in rw.values():
        assert p.sharding_type == ShardingType.ROW_WISE.value and p.ranks == [0, 1]
    pinned = build_sharding_plan(
        model, {"item_id": "table_wise:1", "user_history": "row_wise"}, world_size=WORLD, device=cpu
    ).plan[path]
    assert pinned["item_id"].ranks == [1]
    assert pinned["user_history"].sharding_type == "row_wise"
    assert pinned["user_country"].sharding_type == "table_wise"
    cases: list[tuple[Any, str]] = [
        ("diagonal", "not one of"),
        ({"nope": "row_wise"}, "not in the model"),
        ({"item_id": "row_wise:1"}, "only table_wise takes a rank"),
        ({"item_id": "table_wise:5"}, "world size is 2"),
    ]
    for bad, message in cases:
        with pytest.raises(ConfigError, match=message):
            build_sharding_plan(model, bad, world_size=WORLD, device=cpu)


def run_scenarios(
    scenarios: list[Scenario], ckpt_dir: Path, timeout_s: float
) -> dict[str, list[dict[str, Any]]]:
    """Scenario id -> per-rank results; one group of processes per world size."""
    for model in {sc.model for sc in scenarios}:
        random_checkpoint(ckpt_dir, model)
    out: dict[str, list[dict[str, Any]]] = {}
    for world in sorted({sc.world for sc in scenarios}):
        mine = [sc for sc in scenarios if sc.world == world]
        ranks = run_workers(
            sharded_worker, world_size=world, timeout_s=timeout_s, args=(mine, ckpt_dir)
        )
        out.update({sc.id: [ranks[r][sc.id] for r in range(world)] for sc in mine})
    return out


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return run_scenarios(SCENARIOS, tmp_path_factory.mktemp("checkpoints"), timeout_s=180)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max()) if a.size else 0.0


def assert_state_close(got: FlatState, want: FlatState, sc: Scenario, *, steps: int) -> None:
    """Every region within the model's tolerance (attention key biases: within Adam's step)."""
    from recd.optim.sharded_adam import logical_layout

    layout = logical_layout(model_config(sc.model))
    assert got.step == want.step
    key_bias = np.zeros(layout.n_params, dtype=bool)
    for name in layout.names:
        if name.endswith("self_attn.in_proj_bias"):
            view = layout.slice_of(name)
            e = layout.spec(name).numel // 3
            key_bias[view.start + e : view.start + 2 * e] = True
    for region in ("weights", "adam_m", "adam_v"):
        a, b = getattr(got, region), getattr(want, region)
        assert a.shape == b.shape == (layout.n_params,)
        diff = _max_diff(a[~key_bias], b[~key_bias])
        assert diff <= STATE_ATOL[sc.model], (region, diff)
        if region == "weights":
            bound = KEY_BIAS_ATOL_PER_STEP * steps
            assert _max_diff(a[key_bias], b[key_bias]) <= bound, region
    # Embedding rows no batch touched keep m = v = 0 exactly, in both.
    for name in layout.names:
        if ".embedding" in name:
            view = layout.slice_of(name)
            assert np.array_equal(got.adam_v[view] == 0, want.adam_v[view] == 0), name


@pytest.mark.distributed
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.id)
def test_predictions_and_loss_equal(sc: Scenario, sharded: dict[str, list[dict[str, Any]]]) -> None:
    ref = reference_run(sc)
    for step in range(STEPS):
        got = torch.cat([sharded[sc.id][r]["logits"][step] for r in range(sc.world)])
        want = ref["logits"][step]
        assert got.shape == want.shape == (BATCH, 1)
        torch.testing.assert_close(got, want, rtol=0, atol=LOGIT_ATOL, msg=f"step {step}")
        # Each rank's loss is the mean over its half: the global loss is their mean.
        got_loss = sum(sharded[sc.id][r]["losses"][step] for r in range(sc.world)) / sc.world
        torch.testing.assert_close(got_loss, ref["losses"][step], rtol=0, atol=LOGIT_ATOL)
    # Step 0 runs identical weights: batch-invariant kernels give the same bits.
    first = torch.cat([sharded[sc.id][r]["logits"][0] for r in range(sc.world)])
    assert torch.equal(first, ref["logits"][0])


@pytest.mark.distributed
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.id)
def test_sparse_gradients_are_averaged_by_the_training_thread_hook(
    sc: Scenario, sharded: dict[str, list[dict[str, Any]]]
) -> None:
    """DDP's sparse gradients (rm1's unsharded sequence tables on CPU) go through
    recd.train.data_parallel's comm hook, never through gloo's asynchronous sparse all-reduce
    (which corrupted the heap, see that module)."""
    for r in range(sc.world):
        got = sharded[sc.id][r]
        if sc.model == "rm1":
            assert got["sparse_grads_under_ddp"], "rm1's sequence tables should be under DDP"
        if got["sparse_grads_under_ddp"]:
            assert got["comm_hooks"] == ["mean_allreduce_hook"]


@pytest.mark.distributed
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.id)
def test_gathered_state_equals_unsharded(
    sc: Scenario, sharded: dict[str, list[dict[str, Any]]]
) -> None:
    ref = reference_run(sc)
    assert ref["trained"].step == STEPS
    for r in range(sc.world):
        assert_state_close(sharded[sc.id][r]["trained"], ref["trained"], sc, steps=STEPS)


@pytest.mark.distributed
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.id)
def test_ranks_write_one_logical_checkpoint(
    sc: Scenario, sharded: dict[str, list[dict[str, Any]]]
) -> None:
    """Each rank pwrites its blocks into one file: the file is the gathered logical state."""
    got = sharded[sc.id][0]
    ckpt = read_checkpoint(got["written"])
    assert ckpt.step == STEPS
    for region in ("weights", "adam_m", "adam_v"):
        assert np.array_equal(ckpt.region(region), getattr(got["trained"], region)), region


@pytest.mark.distributed
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.id)
def test_shards_cover_every_parameter_once(
    sc: Scenario, sharded: dict[str, list[dict[str, Any]]]
) -> None:
    from recd.optim.sharded_adam import logical_layout

    layout = logical_layout(model_config(sc.model))
    covered = {name: np.zeros(layout.spec(name).numel, np.int32) for name in layout.names}
    for r in range(sc.world):
        for name, r0, r1, c0, c1, owner in sharded[sc.id][r]["shards"]:
            if not owner:
                continue
            shape = layout.spec(name).shape
            width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            block = covered[name].reshape(-1, width) if len(shape) > 1 else covered[name]
            if len(shape) > 1:
                block[r0:r1, c0:c1] += 1
            else:
                block[:] += 1
    for name, counts in covered.items():
        assert (counts == 1).all(), name
    if sc.plan == "row_wise" and sc.world == 2:  # every table split between the two ranks
        tables = [n for n in layout.names if "embedding_bags" in n]
        for name in tables:
            holders = [
                r for r in range(sc.world) for s in sharded[sc.id][r]["shards"] if s[0] == name
            ]
            assert holders == [0, 1], name


@pytest.mark.distributed
@pytest.mark.parametrize("sc", SCENARIOS, ids=lambda s: s.id)
def test_load_then_gather_round_trips_and_resumes(
    sc: Scenario, sharded: dict[str, list[dict[str, Any]]]
) -> None:
    ref = reference_run(sc)
    n = len(ref["trained"].weights)
    state = random_state(n, seed=1)
    for r in range(sc.world):
        loaded: FlatState = sharded[sc.id][r]["loaded"]
        assert loaded.step == state.step
        for region in ("weights", "adam_m", "adam_v"):
            assert np.array_equal(getattr(loaded, region), getattr(state, region)), region
        resumed: FlatState = sharded[sc.id][r]["resumed"]
        assert resumed.step == state.step + 1
        assert_state_close(resumed, ref["resumed"], sc, steps=1)


# ---------------------------------------------------------------------- measurements
def measure_worker(
    rank: int, world_size: int, route: str, tables: int, rows: int, dim: int, batch: int
) -> float:
    """Median seconds per training step of a DLRM with big tables, row-wise on 2 ranks.

    Routes for the tables: ``lazy_adam`` (DENSE kernel + ShardedAdam on touched rows),
    ``dense_adam`` (DENSE kernel + torch.optim.Adam over every local row), ``fused_sgd``
    (FUSED kernel, fbgemm's EXACT_SGD fused into the backward: the CPU speed limit).
    """
    import time

    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from recd.optim.sharded_adam import ShardedAdam
    from recd.train.sharding import shard_model

    config = ModelConfig(
        dense_in_features=2,
        num_embeddings={f"t{i}": rows for i in range(tables)},
        embedding_dim=dim,
        bottom_mlp=[dim],
        top_mlp=[dim, 1],
    )
    torch.manual_seed(0)
    model = DLRM(config)
    rng = np.random.default_rng(rank)
    local = batch // world_size
    lengths = torch.from_numpy(rng.integers(1, 8, tables * local))
    ids = torch.from_numpy((rng.zipf(1.1, int(lengths.sum())) - 1) % rows)
    kjt = KeyedJaggedTensor(keys=list(config.num_embeddings), values=ids, lengths=lengths)
    dense = torch.from_numpy(rng.random((local, 2)).astype(np.float32))
    labels = torch.from_numpy(rng.integers(0, 2, (local, 1)).astype(np.float32))
    step: Callable[[], Any]
    zero: Callable[[], Any]
    if route == "fused_sgd":
        ebc = model.sparse_arch.embedding_bag_collection  # type: ignore[union-attr]
        fused = {"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": LR}
        sharder = EmbeddingBagCollectionSharder(fused_params=fused)
        plan = construct_module_sharding_plan(
            ebc,
            {t: row_wise(compute_kernel="fused") for t in config.num_embeddings},
            sharder=sharder,
            local_size=world_size,
            world_size=world_size,
            device_type="cpu",
        )
        dmp = DistributedModelParallel(
            model,
            env=ShardingEnv.from_process_group(torch.distributed.group.WORLD),
            plan=ShardingPlan({"sparse_arch.embedding_bag_collection": plan}),
            sharders=[sharder],
        )
        dense_opt = torch.optim.Adam(
            [p for n, p in dmp.named_parameters() if "embedding_bags" not in n], lr=LR
        )
        step, zero = dense_opt.step, dense_opt.zero_grad
    else:
        dmp = shard_model(model, plan="row_wise")
        opt = ShardedAdam(dmp, ADAM)
        step, zero = opt.step, opt.zero_grad
        if route == "dense_adam":
            opt.close()  # no touched-row tracking
            flat = {id(t.kernel): t.kernel.emb_module.weights for t in opt.tables}
            every_row = torch.optim.Adam(list(flat.values()), lr=LR)

            def step_every_row() -> None:
                opt.dense.step()
                every_row.step()

            def zero_every_row() -> None:
                opt.zero_grad()
                every_row.zero_grad()

            step, zero = step_every_row, zero_every_row

    times = []
    for _ in range(6):
        start = time.perf_counter()
        zero()
        bce_loss(dmp(dense, kjt), labels).backward()
        step()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measure", action="store_true", help="time the CPU table optimizers")
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=2048)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.measure:
        for route in ("lazy_adam", "dense_adam", "fused_sgd"):
            seconds = run_workers(
                measure_worker,
                world_size=WORLD,
                timeout_s=600,
                args=(route, args.tables, args.rows, args.dim, args.batch),
            )
            print(f"{route}: {1000 * max(seconds):.0f} ms/step (2 ranks, row-wise)")
        return
    import time

    with tempfile.TemporaryDirectory() as ckpt_dir:
        results = run_scenarios(SCENARIOS, Path(ckpt_dir), timeout_s=600)
    for sc in SCENARIOS:
        start = time.perf_counter()
        reference_run.cache_clear()
        ref = reference_run(sc)
        unsharded_s = (time.perf_counter() - start) / (STEPS + 1)
        logit_diff = max(
            float(
                (
                    torch.cat([results[sc.id][r]["logits"][s] for r in range(sc.world)])
                    - ref["logits"][s]
                )
                .abs()
                .max()
            )
            for s in range(STEPS)
        )
        diffs = {
            region: f"{_max_diff(getattr(results[sc.id][0]['trained'], region), getattr(ref['trained'], region)):.1e}"
            for region in ("weights", "adam_m", "adam_v")
        }
        sharded_s = max(float(np.median(results[sc.id][r]["step_s"])) for r in range(sc.world))
        print(
            f"{sc.id}: logits {logit_diff:.1e} state {diffs} step {1000 * sharded_s:.0f} ms "
            f"sharded ({sc.world} ranks x {BATCH // sc.world} rows) vs ~{1000 * unsharded_s:.0f} ms "
            f"unsharded ({BATCH} rows, incl. batch conversion)"
        )


if __name__ == "__main__":  # measured differences, step times, optimizer costs
    main()
