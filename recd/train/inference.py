"""Using a trained checkpoint outside the training loop: the model of a config with a
checkpoint's weights, predictions over a table range written to Parquet (``recd predict``).

The model is the unsharded :class:`models.DLRM` of the config (whatever world size trained
it: a ``step_NNNNNN.bin`` holds the logical model) in evaluation mode, and batches come from
the same reader the trainer uses (same preprocessing, same ``hash_modulo``), so a prediction
equals what the trainer's evaluation computes for that row.

``predict_table`` reads the range in table order (partitions in time order, files and row
groups in order, rows in file order: ``shuffle = "none"``, one epoch, the last short batch
kept) and writes one output row per table row, in that order: the row's ``session_id``,
``request_id`` and ``ts`` (read from the same row groups; those a plain Parquet table has),
its labels, and per label the
logit and the predicted probability. The labels read beside the ids are checked against the
batch's: a mismatch (the reader's order and the id stream disagree) stops with an error rather
than pairing predictions with the wrong rows.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from recd.checkpoint.atomic import newest_valid_checkpoint
from recd.checkpoint.chain import is_delta, read_any
from recd.checkpoint.format import ParamLayout
from recd.durable import replacing
from recd.errors import ConfigError, RecdError
from recd.models import DLRM
from recd.progress import progress_bar
from recd.reader import ReaderConfig, ResumableLoader, build_plan
from recd.reader.plan import ReadPlan
from recd.schema import RESERVED_COLUMNS, Catalogue
from recd.tensors.batch import Batch
from recd.train.build import build_model_config, prepare_reader
from recd.train.checkpointing import read_checkpoint_flat
from recd.train.config import TrainConfig, ordered_reader
from recd.train.metrics import bce_from_logits

__all__ = ["PredictReport", "Scorer", "predict_table", "resolve_checkpoint"]

log = logging.getLogger(__name__)


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """``path`` itself when it is a file (a full ``step_NNNNNN.bin`` or a delta
    ``step_NNNNNN.delta``, which loads through its chain); the newest valid checkpoint when it
    is a run directory (ConfigError when it holds none), full or delta. Valid includes the
    checksum: a newest file whose bytes fail it (a delta: any link of its chain torn, missing
    or damaged) is skipped with a warning, like a truncated one."""
    path = Path(path)
    if path.is_dir():
        newest = newest_valid_checkpoint(path)
        if newest is None:
            raise ConfigError(
                f"{path}: no valid checkpoint (step_NNNNNN.bin or .delta) in this directory"
            )
        return newest
    if not path.exists():
        raise ConfigError(f"{path}: no such checkpoint file or run directory")
    return path


@dataclass(eq=False)
class Scorer:
    """A config's model with a checkpoint's weights, in evaluation mode, and the reader
    config (catalogue, preprocessing, ``hash_modulo``) the trainer used."""

    config: TrainConfig
    model: DLRM
    catalogue: Catalogue
    reader_config: ReaderConfig
    checkpoint: Path
    step: int
    """Optimizer steps of the checkpoint."""

    @classmethod
    def from_checkpoint(cls, config: TrainConfig, checkpoint: str | os.PathLike[str]) -> Scorer:
        """Build the model of ``config`` on the CPU and load ``checkpoint``'s weights (a
        file, or a run directory: its newest valid checkpoint). The bytes read are checked
        against the checkpoint's checksum (``CheckpointChecksumError`` when they differ; a
        checkpoint without one, from an older recd, loads unverified)."""
        path = resolve_checkpoint(checkpoint)
        catalogue, reader_config = prepare_reader(config, 0, 1)
        model = DLRM(build_model_config(config, catalogue), device=torch.device("cpu"))
        layout = ParamLayout.from_named_arrays(model.named_parameters())
        if is_delta(path):  # the chain applied in memory, every link's CRC checked
            chained = read_any(path, layout, verify=True)
            step, flat = chained.step, chained.weights
        else:
            state = read_checkpoint_flat(path, layout)  # n_params and the checksum checked
            step, flat = state.step, state.weights
        offset = 0
        with torch.no_grad():
            for _, param in model.named_parameters():
                n = param.numel()
                weights = flat[offset : offset + n].reshape(param.shape)
                param.copy_(torch.from_numpy(np.array(weights, dtype=np.float32)))
                offset += n
        model.eval()
        return cls(config, model, catalogue, reader_config, path, step)

    @torch.no_grad()
    def logits(self, batch: Batch) -> torch.Tensor:
        """float32 (B x labels): the model's logits for ``batch``."""
        return self.model(batch.dense, batch.sparse).float()

    def range_reader(
        self,
        *,
        start: str | None,
        end: str | None,
        batch_size: int | None = None,
        table: str | None = None,
    ) -> ReaderConfig:
        """The reader config of a scoring pass over ``[start, end)`` in table order, of the
        training table or of ``table`` (the same columns)."""
        reader = self.reader_config
        if table is not None:
            reader = dataclasses.replace(reader, table=str(table), snapshot=None)
        return ordered_reader(
            reader,
            start=start,
            end=end,
            batch_size=batch_size or self.reader_config.batch_size,
        )


@dataclass(kw_only=True, slots=True)
class PredictReport:
    """What ``predict_table`` wrote."""

    out: Path
    checkpoint: Path
    step: int
    rows: int
    labels: list[str]
    loss: float | None
    """Mean BCE of the logits against the labels (None: no rows)."""


def _id_stream(plan: ReadPlan, columns: list[str]) -> Iterator[pa.Table]:
    """``columns`` of every row group the plan's reader reads, in its order."""
    files: dict[str, pq.ParquetFile] = {}
    for unit in plan.units:
        file = files.get(unit.path) or files.setdefault(unit.path, pq.ParquetFile(unit.path))
        yield file.read_row_group(unit.row_group, columns=columns)


class _Rows:
    """Takes the next ``n`` rows of a stream of tables (zero-copy slices)."""

    def __init__(self, tables: Iterator[pa.Table]) -> None:
        self._tables = tables
        self._current: pa.Table | None = None
        self._offset = 0

    def take(self, n: int) -> pa.Table:
        pieces: list[pa.Table] = []
        wanted = n
        while wanted:
            if self._current is None or self._offset == self._current.num_rows:
                self._current, self._offset = next(self._tables, None), 0
                if self._current is None:
                    raise RecdError(f"predict: the table ran out of rows ({n - wanted} < {n})")
                continue
            piece = self._current.slice(self._offset, wanted)
            self._offset += piece.num_rows
            wanted -= piece.num_rows
            pieces.append(piece)
        return pa.concat_tables(pieces)


def predict_table(
    config: TrainConfig,
    checkpoint: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    start: str | None = None,
    end: str | None = None,
    batch_size: int | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    table: str | None = None,
) -> PredictReport:
    """Score every row of ``config``'s table (or of ``table``, with the same columns) in
    ``[start, end)`` with ``checkpoint`` and write the predictions to the Parquet file
    ``out`` (see the module docstring)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out}: already exists; pass --overwrite to replace it")
    scorer = Scorer.from_checkpoint(config, checkpoint)
    reader = scorer.range_reader(start=start, end=end, batch_size=batch_size, table=table)
    labels = list(scorer.catalogue.labels)
    plan = build_plan(reader)
    present = set(pq.read_schema(plan.units[0].path).names) if plan.units else set()
    id_columns = [c for c in RESERVED_COLUMNS if c in present]  # a plain table may lack some
    ids = _Rows(_id_stream(plan, [*id_columns, *labels]))
    fields = [pa.field(name, pa.int64()) for name in id_columns]
    fields += [pa.field(name, pa.float32()) for name in labels]
    for name in labels:
        fields += [pa.field(f"logit_{name}", pa.float32())]
        fields += [pa.field(f"prediction_{name}", pa.float32())]
    schema = pa.schema(fields)
    out.parent.mkdir(parents=True, exist_ok=True)
    rows, loss_sum = 0, 0.0
    total = sum(unit.num_rows for unit in plan.units)
    loader = ResumableLoader(reader, plan=plan)
    with replacing(out) as tmp, pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        bar = (
            progress_bar(desc="predict", total=total, unit="row")
            if show_progress
            else tqdm(disable=True)
        )
        with bar:
            for batch in loader:
                logits = scorer.logits(batch)
                part = ids.take(batch.batch_size)
                read_labels = np.stack(
                    [part.column(n).to_numpy().astype(np.float32) for n in labels], axis=1
                )
                if not np.array_equal(read_labels, batch.labels.numpy()):
                    raise RecdError(
                        f"predict: rows {rows}..{rows + batch.batch_size} of the reader "
                        "and of the id columns disagree; predictions not written"
                    )
                columns = [part.column(n).cast(pa.int64()) for n in id_columns]
                columns += [pa.array(read_labels[:, i]) for i in range(len(labels))]
                x = logits.numpy()
                probs = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
                for i in range(len(labels)):
                    columns += [pa.array(x[:, i]), pa.array(probs[:, i].astype(np.float32))]
                writer.write_table(pa.Table.from_arrays(columns, schema=schema))
                loss_sum += bce_from_logits(x, read_labels) * x.size
                rows += batch.batch_size
                bar.update(batch.batch_size)
    loss = loss_sum / (rows * len(labels)) if rows and labels else None
    return PredictReport(
        out=out, checkpoint=scorer.checkpoint, step=scorer.step, rows=rows, labels=labels, loss=loss
    )
