"""Rows -> tensors (feature conversion, O3) and preprocessing (O4) for one read plan.

Preprocessing specs from the config become ``recd.tensors.preprocess`` modules, compiled with
TorchScript: sparse kinds (hash_modulo, truncate_last) form one ``SparseChain`` run over the
plain KJT and, deduplicated, over each IKJT's distinct rows (``preprocess_sparse``); dense
kinds (log1p, clamp, normalize) run on the listed columns of the B x D dense tensor. Sparse
kinds on features a table stores in the dedup layout ran already, once per stored id, when
their row group was read (``recd.reader.stored_ops``): the chain leaves those features out.
"""

from __future__ import annotations

import io
import logging
import math
import warnings
from typing import Any

import pyarrow as pa
import torch
from torch import nn

from recd.reader.plan import ReadPlan
from recd.reader.stored_ops import split_preprocessing
from recd.tensors.batch import Batch
from recd.tensors.convert import FeatureSpec, convert_batch
from recd.tensors.preprocess import Clamp, HashModulo, Log1p, Normalize, SparseChain, TruncateLast
from recd.tensors.preprocess import preprocess_batch as apply_preprocessing

log = logging.getLogger(__name__)


class DenseColumns(nn.Module):
    """Apply a B x C -> B x C module to the given columns of a B x D tensor only."""

    def __init__(self, module: nn.Module, columns: list[int]) -> None:
        super().__init__()
        self.module = module
        self.columns = list(columns)

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        index = torch.tensor(self.columns, dtype=torch.int64, device=dense.device)
        out = dense.clone()
        out[:, index] = self.module(dense.index_select(1, index))
        return out


class BatchTransform:
    """Converts checked Arrow rows of one plan to a Batch and runs its preprocessing modules."""

    def __init__(self, plan: ReadPlan) -> None:
        self.spec = FeatureSpec(
            dense=plan.dense,
            sparse=plan.sparse,
            labels=plan.labels,
            dedup_sparse_features=plan.config.dedup_sparse_features,
        )
        self.source = plan.config.table
        # Sparse specs on the dedup layout's features run on their stored ids as units are
        # read (recd.reader.stored_ops): the batch modules leave those features out.
        specs = split_preprocessing(plan.config.preprocessing, plan.encoded)[1]
        self.sparse_module, self.dense_module = build_preprocessing(specs, dense=plan.dense)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable for spawned workers: compiled modules travel as TorchScript archives."""
        return {
            "spec": self.spec,
            "source": self.source,
            "sparse_module": _dump_module(self.sparse_module),
            "dense_module": _dump_module(self.dense_module),
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.spec = state["spec"]
        self.source = state["source"]
        self.sparse_module = _load_module(state["sparse_module"])
        self.dense_module = _load_module(state["dense_module"])

    def convert(self, rows: pa.RecordBatch) -> Batch:
        """Dense B x D, labels B x L, plain KJT and one IKJT per dedup group."""
        return convert_batch(rows, self.spec, source=self.source)

    def process(self, batch: Batch) -> Batch:
        """Apply the preprocessing modules (sparse ones over IKJT distinct rows only)."""
        if self.sparse_module is None and self.dense_module is None:
            return batch
        return apply_preprocessing(batch, sparse=self.sparse_module, dense=self.dense_module)


def build_preprocessing(
    specs: list[dict[str, Any]], *, dense: list[str]
) -> tuple[nn.Module | None, nn.Module | None]:
    """(sparse module, dense module) of the config's preprocessing specs, in spec order.

    Specs were checked by ReaderConfig and the plan (kinds, keys, feature names).
    """
    sparse_stages: list[nn.Module] = []
    dense_stages: list[nn.Module] = []
    for spec in specs:
        kind, features = spec["kind"], list(spec["features"])
        if kind in ("hash_modulo", "truncate_last"):
            key = "modulo" if kind == "hash_modulo" else "n"
            sizes = {f: int(spec[key]) for f in features}
            stage_type = HashModulo if kind == "hash_modulo" else TruncateLast
            last = sparse_stages[-1] if sparse_stages else None
            # Consecutive specs of one kind on disjoint features act per key: one module
            # (TorchScript cannot hold two instances of one module class in a chain).
            attr = "table_sizes" if kind == "hash_modulo" else "max_lengths"
            merged = dict(getattr(last, attr)) if type(last) is stage_type else None
            if merged is not None and not set(sizes) & set(merged):
                sparse_stages[-1] = stage_type({**merged, **sizes})
            else:
                sparse_stages.append(stage_type(sizes))
        else:
            columns = [dense.index(f) for f in features]
            module = _dense_module(kind, spec, len(features))
            # Every column in order (the usual "log1p all dense features"): no column gather.
            whole = columns == list(range(len(dense)))
            dense_stages.append(module if whole else DenseColumns(module, columns))
    sparse_module = _script(SparseChain(sparse_stages)) if sparse_stages else None
    dense_module = _script(nn.Sequential(*dense_stages)) if dense_stages else None
    return sparse_module, dense_module


def _dense_module(kind: str, spec: dict[str, Any], n: int) -> nn.Module:
    if kind == "log1p":
        return Log1p()
    if kind == "clamp":
        return Clamp(float(spec.get("min", -math.inf)), float(spec.get("max", math.inf)))
    mean, std = spec["mean"], spec["std"]
    return Normalize(
        mean if isinstance(mean, list) else [mean] * n,
        std if isinstance(std, list) else [std] * n,
    )


def _dump_module(module: nn.Module | None) -> nn.Module | bytes | None:
    if isinstance(module, torch.jit.ScriptModule):
        buffer = io.BytesIO()
        torch.jit.save(module, buffer)
        return buffer.getvalue()
    return module


def _load_module(blob: nn.Module | bytes | None) -> nn.Module | None:
    if isinstance(blob, bytes):
        return torch.jit.load(io.BytesIO(blob))
    return blob


def _script(module: nn.Module) -> nn.Module:
    """TorchScript-compile ``module``; keep it eager (same results) if it does not compile.

    torch's own notices about TorchScript (its deprecation, and that dtype-specific tensor
    annotations are treated as plain tensors) are silenced here, where they arise: they are
    about TorchScript, not about the user's run, and came out on every run."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message="TorchScript will treat", category=UserWarning
            )
            warnings.filterwarnings("ignore", message=r"`torch\.jit\.", category=DeprecationWarning)
            return torch.jit.script(module)
    except Exception as exc:  # TorchScript raises many types; eager is exact, only slower
        log.warning(
            "preprocessing %s runs eagerly: TorchScript failed: %s", type(module).__name__, exc
        )
        return module
