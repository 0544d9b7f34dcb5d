"""Cost per training step of the embedding optimizers available on CPU.

Three ways to train T tables of R rows x E on a batch of B bags per table (sum pooling),
forward + backward + optimizer update, same ids for all:

* ``fused_sgd``: fbgemm's ``SplitTableBatchedEmbeddingBagsCodegen`` (torchrec's fused
  compute kernel) with ``EXACT_SGD``: the update is fused into the backward, touched rows only;
* ``dense_kernel_adam``: fbgemm's ``DenseTableBatchedEmbeddingBagsCodegen`` (torchrec's dense
  compute kernel: a dense gradient over every table) + ``torch.optim.Adam``, which updates
  every row every step;
* ``lazy_adam``: torchrec's ``EmbeddingBagCollection`` with sparse gradients +
  :class:`recd.optim.LazyAdam` (touched rows only; fbgemm fused-ADAM semantics).

Run ``python -m recd.optim.measure`` (prints JSON: milliseconds per step, median of a few
steps). Sizes default to 8 tables x 100k rows x 64, batch 2048.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    DenseTableBatchedEmbeddingBagsCodegen,
    SplitTableBatchedEmbeddingBagsCodegen,
)
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.optim.lazy_adam import LazyAdam

__all__ = ["main", "measure_embedding_optimizers"]


def _inputs(
    num_tables: int, rows: int, batch_size: int, ids_per_bag: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Zipf-skewed ids, key-major: (indices, lengths (T*B,), offsets (T*B + 1,))."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * ids_per_bag, num_tables * batch_size)
    ids = (rng.zipf(1.1, int(lengths.sum())) - 1) % rows
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return (torch.from_numpy(ids), torch.from_numpy(lengths), torch.from_numpy(offsets))


def _time_steps(step: Callable[[], None], *, steps: int, budget_s: float) -> float:
    """Median milliseconds of ``step`` (one warm-up call; at most ``steps`` or ``budget_s``)."""
    step()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < steps and (not times or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def _fused_sgd_step(
    num_tables: int, rows: int, dim: int, lr: float, inputs: tuple[torch.Tensor, ...]
) -> Callable[[], None]:
    indices, _, offsets, grad_out = inputs
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        embedding_specs=[(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * num_tables,
        optimizer=EmbOptimType.EXACT_SGD,
        learning_rate=lr,
    )

    def step() -> None:
        tbe(indices, offsets).backward(grad_out)  # the update is fused into the backward

    return step


def _dense_kernel_adam_step(
    num_tables: int, rows: int, dim: int, lr: float, inputs: tuple[torch.Tensor, ...]
) -> Callable[[], None]:
    indices, _, offsets, grad_out = inputs
    tbe = DenseTableBatchedEmbeddingBagsCodegen([(rows, dim)] * num_tables, use_cpu=True)
    adam = torch.optim.Adam(tbe.parameters(), lr=lr)

    def step() -> None:
        adam.zero_grad(set_to_none=False)
        tbe(indices, offsets).backward(grad_out)
        adam.step()

    return step


def _lazy_adam_step(
    num_tables: int, rows: int, dim: int, lr: float, inputs: tuple[torch.Tensor, ...]
) -> Callable[[], None]:
    indices, lengths, _, grad_out = inputs
    names = [f"t{i}" for i in range(num_tables)]
    ebc = EmbeddingBagCollection(
        tables=[
            EmbeddingBagConfig(name=n, embedding_dim=dim, num_embeddings=rows, feature_names=[n])
            for n in names
        ]
    )
    for bag in ebc.embedding_bags.values():
        bag.sparse = True
    lazy = LazyAdam(ebc.parameters(), lr=lr)
    kjt = KeyedJaggedTensor(keys=names, values=indices, lengths=lengths, stride=grad_out.shape[0])

    def step() -> None:
        lazy.zero_grad(set_to_none=True)
        ebc(kjt).values().backward(grad_out)
        lazy.step()

    return step


def measure_embedding_optimizers(
    *,
    num_tables: int = 8,
    rows: int = 100_000,
    dim: int = 64,
    batch_size: int = 2048,
    ids_per_bag: int = 4,
    steps: int = 5,
    budget_s: float = 4.0,
    seed: int = 0,
) -> dict[str, float]:
    """Milliseconds per step (forward + backward + update) of each way, plus the sizes."""
    indices, lengths, offsets = _inputs(num_tables, rows, batch_size, ids_per_bag, seed)
    inputs = (indices, lengths, offsets, torch.randn(batch_size, num_tables * dim))
    out: dict[str, float] = {}
    for name, build in (
        ("fused_sgd_ms", _fused_sgd_step),
        ("dense_kernel_adam_ms", _dense_kernel_adam_step),
        ("lazy_adam_ms", _lazy_adam_step),
    ):
        step = build(num_tables, rows, dim, 0.01, inputs)
        out[name] = _time_steps(step, steps=steps, budget_s=budget_s)
        del step  # free this way's tables before building the next
    out.update(
        num_tables=num_tables,
        rows=rows,
        dim=dim,
        batch_size=batch_size,
        ids_per_step=int(indices.numel()),
        threads=torch.get_num_threads(),
    )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recd.optim.measure", description=__doc__)
    parser.add_argument("--tables", type=int, default=8)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: keep)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    result = measure_embedding_optimizers(
        num_tables=args.tables,
        rows=args.rows,
        dim=args.dim,
        batch_size=args.batch_size,
        steps=args.steps,
    )
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
