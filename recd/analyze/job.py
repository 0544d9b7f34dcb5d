"""One dedup proposal for a table and a training job: what ``recd analyze`` and ``recd run`` call.

:func:`analyze_for_job` turns the command line's (or the pipeline's ``[analyze]``) inputs into
the arguments of :func:`recd.analyze.table.analyze_table`, so that both commands reach the same
decision with the same inputs::

    job    = load_job(config)  or  the default training config (every [model] key at its
             default: rm1, embedding_dim 16, max_rows 100000, ...; [reader] the table)
    B      = batch_size  or  job's [reader] batch_size  or  512
    job'   = job with reader.table = TABLE, the analysed window, batch B, no dedup groups,
             no [eval]                                          (the job as it would read TABLE)
    pricing "job":    reader + trainer step of job' (TrainerStep: its model, preprocessing
                      with the trainer's hash_modulo, train.num_threads)
    pricing "reader": the reader alone, with job' 's preprocessing (today's rule without a
                      training config: no preprocessing, or --preprocessed: hash every id)
    pricing "factor": the dedup factor alone (the paper's rule)

``recd run`` passes its training template (``[train] config``) where ``recd analyze`` is given
``WORK/train.toml``, the job ``recd run`` writes from that template: the two differ only in the
table, window, dedup groups and step count, which the analysis replaces or does not read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recd.analyze.costs import hash_all_preprocessing
from recd.analyze.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SYNC_THRESHOLD,
    DEFAULT_THRESHOLD,
    PRICINGS,
    Pricing,
)
from recd.analyze.table import TableAnalysis, analyze_table, table_sparse_features
from recd.config_types import load_toml
from recd.errors import ConfigError
from recd.reader.memory import keep_freed_memory

if TYPE_CHECKING:
    from recd.analyze.trainer_cost import TrainerStep
    from recd.train.config import TrainConfig

DEFAULT_JOB = "the default training config"
"""How reports name the job priced without a training config."""


def analyze_for_job(
    table: str | Path,
    *,
    config: str | Path | None = None,
    pricing: Pricing = "job",
    batch_size: int | None = None,
    threshold: float = DEFAULT_THRESHOLD,
    sync_threshold: float = DEFAULT_SYNC_THRESHOLD,
    features: list[str] | None = None,
    start: str | None = None,
    end: str | None = None,
    preprocessed: bool = False,
    show_progress: bool = False,
) -> TableAnalysis:
    """The dedup analysis of ``table`` with its proposal priced for a training job (module doc).

    Args:
        table: the table's root directory.
        config: the training TOML whose job is priced (its model, preprocessing, threads and,
            unless ``batch_size`` is given, batch size); None: the default training config.
        pricing: ``job`` (reader + trainer), ``reader`` or ``factor``.
        batch_size: B; None: the job's ``[reader] batch_size`` (512 without a config).
        preprocessed: the default job's reader hashes every sparse id (``hash_modulo``); not
            with ``config``, which names its own preprocessing.

    Timed, this process keeps freed memory from then on (fixed malloc thresholds, as reader
    worker processes run: :func:`recd.reader.memory.keep_freed_memory`).
    """
    if pricing not in PRICINGS:
        raise ConfigError(
            f"analyze: pricing = {pricing!r}: expected one of {', '.join(map(repr, PRICINGS))}"
        )
    if config is not None and preprocessed:
        raise ConfigError(
            f"analyze: --preprocessed describes the default job's reader; the training config "
            f"{config} names its own ([reader] preprocessing)"
        )
    job = load_job(config, table) if config is not None else None
    if batch_size is None:
        batch_size = job.reader.batch_size if job is not None else DEFAULT_BATCH_SIZE

    def run(**kwargs: Any) -> TableAnalysis:
        return analyze_table(
            table,
            batch_size=batch_size,
            threshold=threshold,
            sync_threshold=sync_threshold,
            features=features,
            start=start,
            end=end,
            show_progress=show_progress,
            **kwargs,
        )

    if pricing == "factor":
        return run(pricing="factor")
    keep_freed_memory()  # time the reader as its worker processes run
    if pricing == "reader" and job is None:  # the reader-only rule as it always was
        sparse = features or table_sparse_features(table)
        return run(
            pricing="reader", preprocessing=hash_all_preprocessing(sparse) if preprocessed else []
        )
    if job is None:
        job = default_train_config(table, batch_size=batch_size, preprocessed=preprocessed)
    trainer = trainer_step(
        job_for_table(job, table, batch_size=batch_size, start=start, end=end),
        name=f"the job {config}" if config is not None else DEFAULT_JOB,
        with_model=pricing == "job",
    )
    return run(pricing=pricing, trainer=trainer)


def default_train_config(
    table: str | Path, *, batch_size: int = DEFAULT_BATCH_SIZE, preprocessed: bool = False
) -> TrainConfig:
    """The job of a training config that names only its table: every ``[model]``, ``[optim]``
    and ``[train]`` key at its default, ``[reader]`` batch ``batch_size``; ``preprocessed``:
    its reader hashes every sparse id into the tables (``hash_modulo`` by ``model.max_rows``)."""
    from recd.reader.config import ReaderConfig
    from recd.train.config import ModelSection, TrainConfig

    specs = []
    if preprocessed:
        rows = ModelSection().max_rows
        specs = hash_all_preprocessing(table_sparse_features(table), modulo=rows)
    reader = ReaderConfig(table=str(table), batch_size=batch_size, preprocessing=specs)
    return TrainConfig(reader=reader)


def job_for_table(
    config: TrainConfig,
    table: str | Path,
    *,
    batch_size: int,
    start: str | None = None,
    end: str | None = None,
) -> TrainConfig:
    """``config`` as it would read ``table``: its reader's table, window (``start``/``end``,
    None: the whole table) and batch size replaced, no dedup groups (the analysis proposes
    them), no held-out range (nothing is evaluated)."""
    reader = dataclasses.replace(
        config.reader,
        table=str(table),
        snapshot=None,
        start=start,
        end=end,
        batch_size=batch_size,
        dedup_sparse_features=[],
    )
    return dataclasses.replace(config, reader=reader, eval=None)


def trainer_step(config: TrainConfig, *, name: str, with_model: bool = True) -> TrainerStep:
    """The :class:`TrainerStep` of ``config`` (a ConfigError names the job when it cannot
    read the table or, ``with_model``, its model cannot be built for it)."""
    from recd.analyze.trainer_cost import TrainerStep

    try:
        return TrainerStep(config, name=name, with_model=with_model)
    except ConfigError as exc:
        raise ConfigError(
            f"analyze: {name} cannot train on {config.reader.table}: {exc} (price the reader "
            "alone with --reader-only, or the factor with --factor-only)"
        ) from exc


def analyze_command(
    table: str | Path,
    *,
    config: str | Path | None,
    pricing: Pricing,
    batch_size: int | None,
    threshold: float,
) -> str:
    """The ``recd analyze`` command line that reruns :func:`analyze_for_job` with these inputs."""
    parts = ["recd", "analyze", str(table)]
    if config is not None:
        parts += ["--config", str(config)]
    if batch_size is not None:
        parts += ["--batch-size", str(batch_size)]
    if threshold != DEFAULT_THRESHOLD:
        parts += ["--threshold", repr(threshold)]
    if pricing != "job":
        parts.append(f"--{pricing}-only")
    return " ".join(parts)


def load_job(config: str | Path, table: str | Path) -> TrainConfig:
    """The training config ``config`` as the analysis of ``table`` prices it: parsed and
    checked as :func:`recd.train.config.load_train_config` does, with its ``[reader] table``
    replaced by ``table`` and its ``[eval]`` left out (a template may hold out a range only
    its pipeline defines, e.g. ``[train] holdout_hours``)."""
    from recd.train.config import TrainConfig

    path = Path(config)
    data = load_toml(path, "analyze: train config")
    data.pop("eval", None)
    if isinstance(data.get("reader"), dict):
        data["reader"] = {**data["reader"], "table": str(Path(table).resolve())}
    return TrainConfig.from_dict(data, base_dir=path.resolve().parent, source=str(path))
