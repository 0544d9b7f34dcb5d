"""Update-undo in numbers: how inexact the pure float inverse is, what exactness costs.

``python -m recd.recovery.measure [--catalogue small] [--steps 12] [--out FILE]`` prints JSON:

* ``random``: for each update (``adam``, ``adam_l2``, ``adamw``, ``lazy_adam``,
  ``sgd_momentum``, ``sgd_nesterov``) on random tensors (weights N(0, 0.05^2), gradients
  N(0, 0.01^2) with a per-step scale), at steps t = 1, 2, 10, 100: the pure inverse's misses
  per state tensor (fraction of elements not bit-exact, largest distance in ulps) and the
  exact record's bytes per updated element against a 12-byte (8 for SGD) snapshot;
* ``adam_gradient_kept``: the textbook alternative (keep the gradient, invert m as
  ``(m' - (1 - beta1) g) / beta1``): its misses on m, for comparison;
* ``dlrm``: ``models.DLRM`` of a catalogue (default ``small``), trained on random Zipf
  batches with :class:`recd.optim.ModelAdam` and every step captured: parameters, elements
  each step updated, record bytes per updated element and per model parameter (against a
  CheckFreq-style snapshot of w, m, v: 12 bytes per parameter), the pure inverse's misses,
  and the time of a captured step and of an undo against the plain ``optimizer.step()``,
  the whole training step (forward + backward + step) and a full in-memory snapshot.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from recd.models import DLRM, bce_loss, dlrm_config
from recd.optim import AdamConfig, LazyAdam, ModelAdam
from recd.recovery.bits import Inexactness, measure_inexactness
from recd.recovery.undo import UndoRecord, step_with_undo, undo_step
from recd.schema import load_catalogue

__all__ = ["main", "measure_dlrm", "measure_gradient_kept", "measure_random", "random_batch"]

STEPS_OF_INTEREST = (1, 2, 10, 100)
UPDATES: dict[str, Callable[[list[torch.nn.Parameter]], Any]] = {
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3),
    "adam_l2": lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=1e-2),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=1e-2),
    "lazy_adam": lambda ps: LazyAdam(ps, lr=1e-3),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
}


def _stats(record: UndoRecord) -> dict[str, Any]:
    per_role = {role: s.as_dict() for role, s in record.inexactness().items()}
    snapshot = record.snapshot_nbytes
    return {
        "inverse_misses": per_role,
        "record_bytes_per_element": record.nbytes / max(record.elements, 1),
        "snapshot_bytes_per_element": snapshot / max(record.elements, 1),
    }


def measure_random(
    name: str, *, elements: int, seed: int = 0, steps: Sequence[int] = STEPS_OF_INTEREST
) -> dict[str, Any]:
    """Pure inverse misses and record size of update ``name`` (``UPDATES``) at ``steps``."""
    gen = torch.Generator().manual_seed(seed)
    lazy = name == "lazy_adam"
    shape = (elements // 16, 16) if lazy else (elements,)
    param = torch.nn.Parameter(torch.randn(shape, generator=gen) * 0.05)
    opt = UPDATES[name]([param])
    out: dict[str, Any] = {}
    for t in range(1, max(steps) + 1):
        scale = 1e-2 * float(torch.empty(1).uniform_(0.5, 2.0, generator=gen))
        param.grad = torch.randn(shape, generator=gen) * scale
        kwargs: dict[str, Any] = {}
        if lazy:  # a random half of the rows, as a batch would touch
            rows = torch.randperm(shape[0], generator=gen)[: shape[0] // 2]
            kwargs["touched_rows"] = {param: rows}
        if t in steps:
            out[str(t)] = _stats(step_with_undo(opt, measure=True, **kwargs))
        else:
            opt.step(**kwargs)
    return out


def measure_gradient_kept(*, elements: int, seed: int = 0) -> dict[str, Any]:
    """Misses of m when the gradient is kept instead of m: ``(m' - c1 g) / beta1``."""
    gen = torch.Generator().manual_seed(seed)
    param = torch.nn.Parameter(torch.randn(elements, generator=gen) * 0.05)
    opt = torch.optim.Adam([param], lr=1e-3)
    beta1 = 0.9
    out: dict[str, Any] = {}
    for t in range(1, max(STEPS_OF_INTEREST) + 1):
        param.grad = torch.randn(elements, generator=gen) * 1e-2
        state = opt.state.get(param, {})
        m_before = state["exp_avg"].clone() if "exp_avg" in state else None
        opt.step()
        if t in STEPS_OF_INTEREST and m_before is not None:
            m_after = opt.state[param]["exp_avg"]
            candidate = torch.add(m_after, param.grad, alpha=-(1 - beta1)).div_(beta1)
            out[str(t)] = measure_inexactness(candidate, m_before).as_dict()
    return out


def random_batch(
    model: DLRM, *, batch_size: int, ids_per_bag: int, gen: torch.Generator
) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    """(dense B x N, KJT of every pooled feature with Zipf-skewed ids, labels B x T)."""
    config = model.config
    keys = config.pooled_features
    lengths = torch.randint(1, 2 * ids_per_bag, (len(keys) * batch_size,), generator=gen)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    rng = np.random.default_rng(seed)
    values = []
    for i, key in enumerate(keys):
        n = int(lengths[i * batch_size : (i + 1) * batch_size].sum())
        values.append(torch.from_numpy((rng.zipf(1.2, n) - 1) % config.num_embeddings[key]))
    kjt = KeyedJaggedTensor(keys=keys, values=torch.cat(values), lengths=lengths, stride=batch_size)
    dense = torch.randn(batch_size, config.dense_in_features, generator=gen)
    labels = torch.randint(0, 2, (batch_size, config.top_mlp[-1]), generator=gen).float()
    return dense, kjt, labels


def measure_dlrm(
    *,
    catalogue: str = "small",
    steps: int = 12,
    batch_size: int = 512,
    ids_per_bag: int = 4,
    max_rows: int = 100_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Train a DLRM of ``catalogue`` for ``steps`` captured steps; sizes, misses, times."""
    torch.manual_seed(seed)
    model = DLRM(dlrm_config(load_catalogue(catalogue), max_rows=max_rows))
    opt = ModelAdam.for_model(model, AdamConfig(lr=1e-3))
    n_params = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(seed)
    per_step: list[dict[str, Any]] = []
    misses: dict[str, Inexactness] = {}
    times: dict[str, list[float]] = {
        "forward_backward_s": [],
        "step_s": [],
        "captured_step_s": [],
        "undo_s": [],
        "full_snapshot_s": [],
    }
    for _ in range(steps):
        dense, kjt, labels = random_batch(
            model, batch_size=batch_size, ids_per_bag=ids_per_bag, gen=gen
        )
        start = time.perf_counter()
        opt.zero_grad()
        bce_loss(model(dense, kjt), labels).backward()
        times["forward_backward_s"].append(time.perf_counter() - start)
        measured = step_with_undo(opt, measure=True)  # the misses (extra passes: not timed)
        if not undo_step(measured).exact:
            raise AssertionError("undo was not exact")
        start = time.perf_counter()
        record = step_with_undo(opt)
        times["captured_step_s"].append(time.perf_counter() - start)
        start = time.perf_counter()
        result = undo_step(record)
        times["undo_s"].append(time.perf_counter() - start)
        if not result.exact:
            raise AssertionError(f"undo was not exact for {result.inexact}")
        start = time.perf_counter()
        snapshot = _full_snapshot(opt)  # what CheckFreq / Elastic Horovod copy every step
        times["full_snapshot_s"].append(time.perf_counter() - start)
        del snapshot
        start = time.perf_counter()
        opt.step()  # the same update, uncaptured: the baseline
        times["step_s"].append(time.perf_counter() - start)
        for role, s in measured.inexactness().items():
            misses[role] = misses[role].merge(s) if role in misses else s
        summary = record.summary()
        summary["record_bytes_per_element"] = record.nbytes / record.elements
        per_step.append(summary)
    record_bytes = [s["record_bytes"] for s in per_step]
    elements = [s["elements"] for s in per_step]
    medians = {k: statistics.median(v) for k, v in times.items()}
    return {
        "catalogue": catalogue,
        "n_params": n_params,
        "batch_size": batch_size,
        "steps": steps,
        "updated_elements_per_step": statistics.median(elements),
        "record_bytes_per_step": statistics.median(record_bytes),
        "record_bytes_per_updated_element": sum(record_bytes) / sum(elements),
        "record_bytes_per_parameter": statistics.median(record_bytes) / n_params,
        "snapshot_bytes_per_parameter": 12.0,
        "touched_snapshot_bytes_per_updated_element": 12.0,
        "inverse_misses": {role: s.as_dict() for role, s in misses.items()},
        "median_times_s": medians,
        "min_times_s": {k: min(v) for k, v in times.items()},
        "capture_overhead_vs_optimizer_step": medians["captured_step_s"] / medians["step_s"],
        "capture_overhead_vs_training_step": (medians["captured_step_s"] - medians["step_s"])
        / (medians["forward_backward_s"] + medians["step_s"]),
        "per_step": per_step,
    }


def _full_snapshot(opt: ModelAdam) -> list[torch.Tensor]:
    """In-memory copies of every weight, m and v (a CheckFreq-style snapshot)."""
    out = [p.detach().clone() for p in opt.params.values()]
    out.extend(t.clone() for t in opt.moments("adam_m").values())
    out.extend(t.clone() for t in opt.moments("adam_v").values())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalogue", default="small")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--elements", type=int, default=200_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = {
        "random": {name: measure_random(name, elements=args.elements) for name in UPDATES},
        "adam_gradient_kept": measure_gradient_kept(elements=args.elements),
        "dlrm": measure_dlrm(
            catalogue=args.catalogue, steps=args.steps, batch_size=args.batch_size
        ),
    }
    text = json.dumps(result, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
