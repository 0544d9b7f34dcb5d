"""The trainer's side of a dedup configuration's price: the job's own training step, timed.

:class:`TrainerStep` builds what ``recd train`` builds in one process from a
:class:`recd.train.config.TrainConfig`: the table's catalogue and the reader config with the
``hash_modulo`` the trainer adds (:func:`recd.train.build.prepare_reader`), the model
(:func:`recd.train.build.build_model_config`, :class:`recd.models.DLRM` seeded with
``train.seed``) and its optimizer (:class:`recd.optim.ModelAdam`). :meth:`TrainerStep.seconds`
runs one step per batch, as :meth:`recd.train.loop.Trainer.train_step` does::

    sparse = batch.to(device)                         plain KJT + the configuration's IKJTs
    logits = model(zeros(B, N), sparse)               B x T
    loss   = bce_loss(logits, zeros(B, T)); zero_grad; loss.backward(); adam.step()

on the job's ``train.num_threads`` (1 if unset). The dense features and labels are zeros: the
dense arch, the interaction and the top MLP do the same work in every configuration of dedup
groups, so they cancel in the paired differences that decide (:mod:`recd.analyze.costs`);
only the sparse side (lookups and sequence transformers once per distinct row, the
``index_select`` expansions and their backward, the touched rows Adam updates) differs. One
model and optimizer serve every configuration (their weights drift with the steps; a step's
cost does not depend on them). A job of several processes is priced as one: the collectives
of a sharded job are not in the price.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from recd.analyze.costs import torch_threads
from recd.errors import ConfigError
from recd.tensors.batch import SparseFeatures

if TYPE_CHECKING:
    from recd.schema import Catalogue
    from recd.train.config import TrainConfig


class TrainerStep:
    """The training step of ``config``'s model, timed on given sparse features.

    Args:
        config: the job (its ``reader.table`` the analysed table).
        name: how reports name the job (``the job PATH``, ``the default training config``).
        with_model: build the model's config now (False: only the job's reader is used, e.g.
            its preprocessing for a reader-only price; :meth:`seconds` then fails).
    """

    def __init__(self, config: TrainConfig, *, name: str, with_model: bool = True) -> None:
        from recd.train.build import build_model_config, prepare_reader

        self.config = config
        self.name = name
        self.catalogue: Catalogue
        self.catalogue, self.reader = prepare_reader(config, 0, 1)
        self.model_config = build_model_config(config, self.catalogue) if with_model else None
        self.num_threads = config.train.num_threads or 1
        """torch intra-op threads of the step (the job's ``train.num_threads``, 1 if unset)."""
        self.device = _device(config.train.device)
        self._model: Any = None
        self._zeros: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def sparse(self) -> list[str]:
        """Every sparse feature the job reads (and its model looks up)."""
        return self.catalogue.sparse_names

    @property
    def preprocessing(self) -> list[dict[str, Any]]:
        """The job's reader preprocessing, with the trainer's ``hash_modulo`` added."""
        return list(self.reader.preprocessing)

    @property
    def batch_size(self) -> int:
        return self.reader.batch_size

    def describe(self) -> str:
        """``model rm1, embedding_dim 16, max_rows 100000, dedup full, 1 thread``."""
        m = self.config.model
        threads = f"{self.num_threads} thread{'s' if self.num_threads > 1 else ''}"
        where = "" if self.device.type == "cpu" else f", {self.device.type}"
        return (
            f"model {m.kind}, embedding_dim {m.embedding_dim}, max_rows {m.max_rows}, "
            f"dedup {m.dedup.value}, {threads}{where}"
        )

    def seconds(self, batches: list[SparseFeatures]) -> float:
        """Wall seconds of one training step on each of ``batches`` (in order)."""
        from recd.models import bce_loss

        model, optimizer = self._built()
        with torch_threads(self.num_threads):
            t0 = time.perf_counter()
            for features in batches:
                sparse = features.to(self.device)
                dense, labels = self._zeros_for(sparse.batch_size)
                optimizer.zero_grad()
                loss = bce_loss(model(dense, sparse), labels)  # B x T logits
                loss.backward()
                optimizer.step()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return time.perf_counter() - t0

    def _built(self) -> tuple[Any, Any]:
        """The model and its optimizer, built on first use (seeded as the trainer seeds)."""
        if self._model is None:
            from recd.models import DLRM

            if self.model_config is None:
                raise ConfigError(f"analyze: {self.name}: built without its model")
            from recd.optim import ModelAdam

            torch.manual_seed(self.config.train.seed)
            model = DLRM(self.model_config, device=self.device)
            model.train()
            self._model = (model, ModelAdam.for_model(model, self.config.optim.to_adam()))
        return self._model

    def _zeros_for(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero dense features (B x N) and labels (B x T) for a batch of ``rows``."""
        if rows not in self._zeros:
            assert self.model_config is not None
            n = self.model_config.dense_in_features
            t = self.model_config.top_mlp[-1]
            self._zeros[rows] = (
                torch.zeros(rows, n, device=self.device),
                torch.zeros(rows, t, device=self.device),
            )
        return self._zeros[rows]


def _device(name: str) -> torch.device:
    """The trainer's device for ``train.device`` in one process (as ``recd train`` picks it)."""
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise ConfigError("train.device: cuda, but no CUDA device is available")
        return torch.device("cuda", 0)
    return torch.device("cpu")
