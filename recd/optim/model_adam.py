"""Adam for a whole recommendation model: dense layers and embedding tables, one step counter.

* Dense parameters (MLPs, transformers): ``torch.optim.Adam`` (L2 ``weight_decay`` as torch
  defines it).
* Embedding tables (the weights of ``nn.EmbeddingBag`` / ``nn.Embedding`` modules, i.e. of
  torchrec's unsharded EBC/EC): :class:`~recd.optim.lazy_adam.LazyAdam`, fbgemm's fused-ADAM
  semantics on the touched rows only (on GPU a sharded model uses fbgemm's fused ADAM itself).

The checkpoint (:mod:`recd.checkpoint.format`) stores weights, Adam m and Adam v of every
parameter, flattened in the logical model's ``named_parameters()`` order, plus the step: that
order is the order this class keeps (``names``), and :meth:`ModelAdam.export_state` /
:meth:`ModelAdam.load_state` move those three regions in and out (``ParamLayout`` from
``recd.checkpoint.format`` says where each tensor lies). A parameter that has not been
updated yet has m = v = 0, exactly what a fresh Adam holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from recd.checkpoint.delta import Block
from recd.checkpoint.format import ParamLayout
from recd.optim.config import AdamConfig
from recd.optim.lazy_adam import LazyAdam, RowUpdate, lazy_adam_update_rows
from recd.optim.row_log import RowLog

__all__ = ["AdamConfig", "FlatState", "ModelAdam", "embedding_parameter_names"]

Moment = Literal["adam_m", "adam_v"]
DeltaPart = tuple[Block, tuple[np.ndarray, ...]]
"""One block of a delta checkpoint and its weights, adam_m, adam_v (float32, row after row)."""
_STATE_KEY: dict[str, str] = {"adam_m": "exp_avg", "adam_v": "exp_avg_sq"}


@dataclass(kw_only=True, slots=True)
class FlatState:
    """The three checkpoint regions of a model + optimizer, flat float32 in layout order."""

    step: int
    """Optimizer steps completed."""
    weights: np.ndarray
    """(n_params,) float32."""
    adam_m: np.ndarray
    """(n_params,) float32."""
    adam_v: np.ndarray
    """(n_params,) float32."""


def embedding_parameter_names(model: nn.Module) -> set[str]:
    """Names of the weights of every ``nn.Embedding`` / ``nn.EmbeddingBag`` in ``model``."""
    out = set()
    for module_name, module in model.named_modules():
        if isinstance(module, nn.Embedding | nn.EmbeddingBag):
            out.add(f"{module_name}.weight" if module_name else "weight")
    return out


class ModelAdam:
    """``torch.optim.Adam`` for dense parameters + :class:`LazyAdam` for embedding tables.

    Args:
        named_parameters: the model's ``named_parameters()`` (their order is the checkpoint's).
        config: hyper-parameters.
        is_embedding: which names are embedding tables (default: none; see
            :meth:`for_model`).
    """

    def __init__(
        self,
        named_parameters: Iterable[tuple[str, torch.Tensor]],
        *,
        config: AdamConfig | None = None,
        is_embedding: Callable[[str], bool] = lambda name: False,
    ) -> None:
        self.config = config or AdamConfig()
        named = [(n, p) for n, p in named_parameters if p.requires_grad]
        self.names: list[str] = [n for n, _ in named]
        """Parameter names in the checkpoint order."""
        self.params: dict[str, torch.Tensor] = dict(named)
        self.embedding_names = [n for n in self.names if is_embedding(n)]
        self.dense_names = [n for n in self.names if not is_embedding(n)]
        self.dense: torch.optim.Adam | None = None
        if self.dense_names:
            self.dense = torch.optim.Adam(
                [self.params[n] for n in self.dense_names],
                **self.config.dense_hyper().torch_kwargs(),
            )
        self.embeddings: LazyAdam | None = None
        if self.embedding_names:
            self.embeddings = LazyAdam(
                [self.params[n] for n in self.embedding_names],
                **self.config.embedding_hyper().torch_kwargs(),
            )
        self.step_count = 0
        """Optimizer steps completed."""

    @classmethod
    def for_model(cls, model: nn.Module, config: AdamConfig | None = None) -> ModelAdam:
        """Split ``model``'s parameters: embedding-module weights -> LazyAdam, rest -> Adam."""
        embedding = embedding_parameter_names(model)
        return cls(model.named_parameters(), config=config, is_embedding=embedding.__contains__)

    # ------------------------------------------------------------------ training
    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self._optimizers():
            opt.zero_grad(set_to_none=set_to_none)

    def step(
        self,
        *,
        touched_rows: Mapping[str, torch.Tensor] | None = None,
        update_rows: RowUpdate = lazy_adam_update_rows,
    ) -> None:
        """One Adam step for every parameter.

        ``touched_rows`` (parameter name -> rows) is needed only for embedding tables whose
        gradient is dense (e.g. ``DLRM.touched_rows(batch.sparse)``). ``update_rows``: see
        :meth:`LazyAdam.step` (an update-undo capture passes its own).
        """
        if self.dense is not None:
            self.dense.step()
        if self.embeddings is not None:
            self.embeddings.step(
                touched_rows=self.touched_rows_by_param(touched_rows), update_rows=update_rows
            )
        self.step_count += 1

    def touched_rows_by_param(
        self, touched_rows: Mapping[str, torch.Tensor] | None
    ) -> dict[torch.Tensor, torch.Tensor] | None:
        """``touched_rows`` keyed by parameter (what :meth:`LazyAdam.step` takes)."""
        if touched_rows is None:
            return None
        return {self.params[n]: rows for n, rows in touched_rows.items()}

    def log_rows(self) -> bool:
        """Remember the embedding rows each step updates (for delta checkpoints); True (the
        rows of every table can be logged)."""
        if self.embeddings is not None:
            self.embeddings.log_rows()
        return True

    @torch.no_grad()
    def delta_blocks(self, layout: ParamLayout) -> list[DeltaPart]:
        """A delta checkpoint's share of this optimizer (and a fresh row log): each embedding
        table's rows updated since the last call, each dense tensor whole, as blocks of the
        flat ``layout`` with their weights, m and v (CPU float32 copies, row after row)."""
        touched = self.take_logged_rows()
        moments = (self.moments("adam_m"), self.moments("adam_v"))
        parts: list[DeltaPart] = []
        for name in self.names:
            spec, offset = layout.spec(name), layout.offset_of(name)
            sources = (self.params[name], *(m[name] for m in moments))
            if name in self.embedding_names:
                rows = touched.get(name)
                if rows is None:
                    continue
                width = spec.numel // spec.shape[0]
                block = Block(offset, width, width, rows.cpu().numpy().astype(np.int32))
                values = tuple(s.index_select(0, rows).reshape(-1).cpu().numpy() for s in sources)
            else:
                block = Block(offset, spec.numel, spec.numel, np.zeros(1, np.int32))
                values = tuple(s.reshape(-1).cpu().numpy().copy() for s in sources)
            parts.append((block, values))
        return parts

    def reset_logged_rows(self) -> None:
        """Forget the rows logged so far (a full checkpoint was taken)."""
        if self.embeddings is not None:
            self.embeddings.reset_logged_rows()

    def detach_row_logs(self) -> dict[str, RowLog]:
        """Each embedding table's row log as it is (name -> :class:`recd.optim.RowLog`;
        tables not updated are absent), fresh logs taking the next steps' rows."""
        if self.embeddings is None:
            return {}
        return self._by_name(self.embeddings.detach_row_logs())

    def take_logged_rows(self) -> dict[str, torch.Tensor]:
        """Each embedding table's rows updated since the last call or since :meth:`log_rows`
        (name -> int64 sorted rows; tables not updated are absent)."""
        if self.embeddings is None:
            return {}
        return self._by_name(self.embeddings.take_logged_rows())

    def _by_name(self, by_param: Mapping[torch.Tensor, Any]) -> dict[str, Any]:
        """A per-table mapping keyed by parameter, keyed by name instead (absent stay absent)."""
        return {
            n: by_param[self.params[n]] for n in self.embedding_names if self.params[n] in by_param
        }

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Both optimizers' state dicts and the step counter (for ``torch.save``)."""
        return {
            "step": self.step_count,
            "dense": None if self.dense is None else self.dense.state_dict(),
            "embeddings": None if self.embeddings is None else self.embeddings.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if self.dense is not None:
            self.dense.load_state_dict(state["dense"])
        if self.embeddings is not None:
            self.embeddings.load_state_dict(state["embeddings"])
        self.step_count = int(state["step"])

    def moments(self, which: Moment) -> dict[str, torch.Tensor]:
        """Name -> Adam m (``adam_m``) or v (``adam_v``) of every parameter, checkpoint order.

        Tensors have the parameter's shape; they are the live state (zeros, freshly made, for a
        parameter with no state yet). Detach/copy before mutating.
        """
        key = _STATE_KEY[which]
        out = {}
        for name in self.names:
            p = self.params[name]
            state = self._optimizer_of(name).state.get(p, {})
            value = state.get(key)
            out[name] = torch.zeros_like(p).detach() if value is None else value.detach()
        return out

    def load_moments(
        self,
        *,
        step: int,
        adam_m: Mapping[str, Any],
        adam_v: Mapping[str, Any],
    ) -> None:
        """Set m, v of every parameter and every step counter (resuming from a checkpoint).

        ``adam_m``/``adam_v`` map each name to an array or tensor of the parameter's shape.
        After this, training continues exactly as the run that wrote them would have.
        """
        if step < 0:
            raise ValueError(f"ModelAdam.load_moments: step must be >= 0, got {step}")
        for region, values in (("adam_m", adam_m), ("adam_v", adam_v)):
            missing = [n for n in self.names if n not in values]
            if missing:
                raise ValueError(f"{region}: no values for parameters {missing[:5]}")
        for name in self.names:
            p = self.params[name]
            m = _as_tensor(adam_m[name], p, name)
            v = _as_tensor(adam_v[name], p, name)
            if name in self.embedding_names:
                assert self.embeddings is not None
                state = self.embeddings.state[p]
                state["exp_avg"].copy_(m)
                state["exp_avg_sq"].copy_(v)
            else:
                assert self.dense is not None
                if step == 0:
                    self.dense.state.pop(p, None)
                else:
                    self.dense.state[p] = {
                        "step": torch.tensor(float(step), dtype=torch.float32),
                        "exp_avg": m.clone(),
                        "exp_avg_sq": v.clone(),
                    }
        if self.embeddings is not None:
            self.embeddings.set_step_count(step)
        self.step_count = int(step)

    def export_state(self) -> FlatState:
        """Weights, m and v of every parameter, flattened and concatenated in ``names`` order.

        The arrays are the checkpoint's three regions (``ParamLayout.from_named_arrays(
        model.named_parameters())`` has the same order). Copies: safe to write in the
        background while training goes on.
        """
        weights = {n: self.params[n].detach() for n in self.names}
        return FlatState(
            step=self.step_count,
            weights=_flatten(weights),
            adam_m=_flatten(self.moments("adam_m")),
            adam_v=_flatten(self.moments("adam_v")),
        )

    def load_state(self, state: FlatState) -> None:
        """Inverse of :meth:`export_state`: set weights, m, v and the step counter."""
        named = _unflatten(state, self.names, self.params)
        with torch.no_grad():
            for name in self.names:
                self.params[name].copy_(named["weights"][name])
        self.load_moments(step=state.step, adam_m=named["adam_m"], adam_v=named["adam_v"])

    # ------------------------------------------------------------------ helpers
    def _optimizers(self) -> list[torch.optim.Optimizer]:
        return [o for o in (self.dense, self.embeddings) if o is not None]

    def _optimizer_of(self, name: str) -> torch.optim.Optimizer:
        opt = self.embeddings if name in self.embedding_names else self.dense
        assert opt is not None
        return opt


def _as_tensor(value: Any, p: torch.Tensor, name: str) -> torch.Tensor:
    # Copy arrays: checkpoint regions are read-only memmaps.
    t = value if isinstance(value, torch.Tensor) else torch.from_numpy(np.array(value, np.float32))
    if tuple(t.shape) != tuple(p.shape):
        raise ValueError(f"{name}: moment of shape {tuple(t.shape)}, parameter {tuple(p.shape)}")
    return t.to(device=p.device, dtype=torch.float32)


def _flatten(named: Mapping[str, torch.Tensor]) -> np.ndarray:
    parts = [t.detach().to("cpu", torch.float32).reshape(-1).numpy() for t in named.values()]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def _unflatten(
    state: FlatState, names: list[str], params: Mapping[str, torch.Tensor]
) -> dict[str, dict[str, torch.Tensor]]:
    total = sum(params[n].numel() for n in names)
    out: dict[str, dict[str, torch.Tensor]] = {}
    for region in ("weights", "adam_m", "adam_v"):
        flat = np.asarray(getattr(state, region), dtype=np.float32)
        if flat.shape != (total,):
            raise ValueError(f"{region}: {flat.shape[0]} values, the model has {total}")
        if not flat.flags.writeable:  # a read-only memmap: torch needs writable memory
            flat = flat.copy()
        out[region] = {}
        offset = 0
        for name in names:
            p = params[name]
            # Views, no copy: every caller copies them into the model and the optimizer
            # (a 3 x n temporary copy cost a fresh process ~0.1 s of page faults per GB).
            out[region][name] = torch.from_numpy(flat[offset : offset + p.numel()]).view(p.shape)
            offset += p.numel()
    return out
