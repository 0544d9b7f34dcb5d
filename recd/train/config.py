"""TrainConfig: what ``recd train`` reads, builds and runs, loaded from one TOML file.

::

    [reader]                 # a ReaderConfig table (recd.reader.config): the training partitions
    table = "../runs/small/table"
    end = "2026-11-01T02:00"
    batch_size = 256
    dedup_sparse_features = [["user_click_history"], ["cart_item_ids", "cart_seller_ids"]]
    num_epochs = 20

    [eval]                   # held-out partitions of the same table
    start = "2026-11-01T02:00"
    batch_size = 1024
    max_batches = 8

    [model]                  # kind = "rm1" | "dlrm"
    kind = "rm1"
    embedding_dim = 16
    max_rows = 20000
    dedup = "full"           # off | lookup | full
    [model.sequence]
    num_heads = 2

    [optim]
    lr = 0.003

    [train]
    steps = 300
    log_every = 10
    eval_every = 100
    seed = 0
    run_dir = "../runs/small/train"

    [checkpoint]             # optional: these are the defaults (recd.train.checkpointing)
    checkpoint_every = 100   # step_NNNNNN.bin + a sample audit every 100 steps, and at the end
    keep_last = 3            # retention: the newest 3 ...
    keep_every = 10          # ... plus every checkpoint at a multiple of 10 x 100 steps

Relative paths (``reader.table``, ``eval.table``, ``train.run_dir``, ``checkpoint.dir``) are
resolved against
the TOML file's directory, as :func:`recd.reader.config.load_reader_config` does. Every check
names the field and the offending value (``ConfigError``, exit code 2 in the CLI). A
``[reader]`` table without ``seed`` uses ``train.seed``, so one seed fixes the whole run
(weights and data order).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from recd.config_types import (
    NonNegativeFloat,
    NonNegativeInt,
    OneOf,
    PositiveInt,
    build_section,
    check_fields,
    check_keys,
    load_toml,
)
from recd.errors import ConfigError
from recd.models.options import DedupMode, SequenceConfig
from recd.optim.config import AdamConfig
from recd.reader.config import ReaderConfig, Shuffle

__all__ = [
    "CheckpointSection",
    "EvalConfig",
    "ModelSection",
    "OptimSection",
    "RunSection",
    "SequenceSection",
    "TrainConfig",
    "load_train_config",
]

ModelKind = Literal["dlrm", "rm1"]
Device = Literal["auto", "cpu", "cuda"]
SHARDING_PLANS = (
    "table_wise",
    "row_wise",
    "table_row_wise",
    "column_wise",
    "data_parallel",
    "auto",
)
"""Values of ``train.sharding`` (``recd.train.sharding.SHARDING_KINDS``)."""


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    """The held-out partitions, read with the training reader's features and preprocessing."""

    table: str | None = None
    """A held-out table of its own (same columns as ``reader.table``; e.g. a plain Parquet
    table with no time partitions to hold rows out by); None: the training table."""
    start: str | None = None
    """First held-out partition hour (inclusive; formats of ``reader.start``)."""
    end: str | None = None
    """Partition hour to stop before (exclusive); None: to the end of the table."""
    batch_size: PositiveInt = 1024
    """Rows per evaluation batch (no gradients: can be larger than the training batch)."""
    max_batches: PositiveInt | None = None
    """Evaluate at most this many batches (None: the whole held-out range)."""

    def __post_init__(self) -> None:
        if self.start is None and self.end is None and self.table is None:
            raise ConfigError(
                "eval: give eval.start and/or eval.end (the held-out partitions), or eval.table"
            )
        check_fields(self, "eval.")


@dataclass(kw_only=True, slots=True)
class SequenceSection:
    """The transformers that pool sequence groups (``kind = "rm1"`` only)."""

    num_layers: PositiveInt = 1
    """Encoder layers per group."""
    num_heads: PositiveInt = 2
    """Attention heads; must divide ``model.embedding_dim``."""
    ff_dim: PositiveInt = 32
    """Feed-forward width of each layer."""
    max_seq_len: PositiveInt | None = None
    """Positions kept per sequence; None: the longest history's ``max_length`` (catalogue)."""
    pooling: Literal["mean", "first"] = "mean"
    """``mean`` over [CLS] and valid positions, or the [CLS] output (``first``)."""

    def __post_init__(self) -> None:
        check_fields(self, "model.sequence.")

    def to_sequence_config(self, *, longest_history: int) -> SequenceConfig:
        """The model's :class:`SequenceConfig` (dropout 0: the IKJT path must equal the KJT one)."""
        return SequenceConfig(
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            ff_dim=self.ff_dim,
            max_seq_len=self.max_seq_len if self.max_seq_len is not None else longest_history,
            pooling=self.pooling,
        )


@dataclass(kw_only=True, slots=True)
class ModelSection:
    """The model built from the table's catalogue (``recd.models.rm1_config`` / ``dlrm_config``)."""

    kind: ModelKind = "rm1"
    """``rm1``: history features pooled by per-group transformers (RM1-like);
    ``dlrm``: every sparse feature sum-pooled by the EmbeddingBagCollection."""
    embedding_dim: PositiveInt = 16
    """E: embedding width (also the bottom MLP output and the transformer width)."""
    max_rows: PositiveInt = 100_000
    """Rows per table: ``min(cardinality, max_rows)``."""
    hash_ids: bool = True
    """Add a reader ``hash_modulo`` step (modulo ``max_rows``) for every feature whose
    catalogue cardinality exceeds ``max_rows``, so its ids fit the table. False: the reader's
    own preprocessing must map ids into ``[0, rows)``."""
    bottom_mlp: list[PositiveInt] | None = None
    """Bottom MLP sizes, the last equal to ``embedding_dim``; None: ``[4 E, E]``."""
    top_mlp: list[PositiveInt] | None = None
    """Top MLP sizes, the last equal to the number of labels; None: ``[4 E, labels]``."""
    dedup: DedupMode = DedupMode.FULL
    """How IKJT batches are used: ``off`` (expand to KJT first), ``lookup`` (embedding lookups
    on distinct rows), ``full`` (and transformers on distinct sequences)."""
    sequence: SequenceSection = field(default_factory=SequenceSection)
    """``[model.sequence]``: the sequence-group transformers."""

    def __post_init__(self) -> None:
        for name in ("bottom_mlp", "top_mlp"):
            sizes = getattr(self, name)
            if sizes is not None and (not isinstance(sizes, list) or not sizes):
                raise ConfigError(f"model.{name}: expected a list of layer sizes, got {sizes!r}")
        check_fields(self, "model.")
        self.dedup = DedupMode(self.dedup)
        if self.bottom_mlp is not None and self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(
                f"model.bottom_mlp: the last size {self.bottom_mlp[-1]} must equal "
                f"model.embedding_dim = {self.embedding_dim}"
            )
        if self.kind == "rm1" and self.embedding_dim % self.sequence.num_heads:
            raise ConfigError(
                f"model.sequence.num_heads: {self.sequence.num_heads} does not divide "
                f"model.embedding_dim = {self.embedding_dim}"
            )


@dataclass(kw_only=True, slots=True)
class OptimSection:
    """Adam for every parameter (dense: torch Adam; tables: lazy Adam / fbgemm fused ADAM)."""

    lr: NonNegativeFloat = 1e-3
    """Learning rate of the dense parameters."""
    embedding_lr: NonNegativeFloat | None = None
    """Learning rate of the embedding tables; None: ``lr``."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam (beta1, beta2): the decays of m and v."""
    eps: NonNegativeFloat = 1e-8
    """Added to the bias-corrected sqrt(v)."""
    weight_decay: NonNegativeFloat = 0.0
    """L2 penalty of the dense parameters (torch Adam)."""
    embedding_weight_decay: NonNegativeFloat = 0.0
    """Decoupled decay of the touched embedding rows (fbgemm ADAM)."""

    def __post_init__(self) -> None:
        # A float with a range must be finite: NaN passes every comparison's "not < 0" and
        # infinity every ">= 0"; both would reach the optimizer or train to NaN weights.
        check_fields(self, "optim.")
        if not isinstance(self.betas, list | tuple) or len(self.betas) != 2:
            raise ConfigError(f"optim.betas: expected [beta1, beta2], got {self.betas!r}")
        self.betas = [float(b) for b in self.betas]
        try:
            self.to_adam()
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("optimizer.", "optim.")) from exc

    def to_adam(self) -> AdamConfig:
        """The :class:`recd.optim.AdamConfig` of these settings."""
        return AdamConfig(
            lr=self.lr,
            embedding_lr=self.embedding_lr,
            beta1=self.betas[0],
            beta2=self.betas[1],
            eps=self.eps,
            weight_decay=self.weight_decay,
            embedding_weight_decay=self.embedding_weight_decay,
        )


@dataclass(kw_only=True, slots=True)
class RunSection:
    """The ``[train]`` table: length, cadences, seed, output, devices and sharding."""

    steps: PositiveInt = 300
    """Optimizer steps (fewer if the reader runs out of batches first: raise
    ``reader.num_epochs``)."""
    log_every: PositiveInt = 10
    """Write a ``metrics.jsonl`` line (and update the progress display) every this many steps."""
    eval_every: NonNegativeInt = 100
    """Evaluate on the held-out partitions every this many steps (0: only at the end). The
    last step is always evaluated when ``[eval]`` is given."""
    seed: NonNegativeInt = 0
    """Seeds the weights (and the reader's shuffle unless ``reader.seed`` is given): the same
    seed and config give bit-identical losses."""
    run_dir: Path = Path("runs/train")
    """Where ``metrics.jsonl``, ``loss.png`` and ``train.json`` go (created if missing)."""
    device: Device = "auto"
    """``cpu``, ``cuda`` (this rank's local GPU) or ``auto`` (cuda when available)."""
    world_size: PositiveInt = 1
    """Trainer processes (``recd train --nproc`` overrides): > 1 launches torchrun, shards the
    embedding tables (DMP) and runs the dense layers data-parallel."""
    sharding: Annotated[str, OneOf(SHARDING_PLANS)] = "table_wise"
    """Embedding sharding when ``world_size > 1`` (``recd.train.sharding``): table_wise,
    row_wise, table_row_wise, column_wise, data_parallel (tables replicated) or auto
    (torchrec's planner)."""
    num_threads: PositiveInt | None = None
    """torch intra-op threads per process (None: torch's default)."""
    plot: bool = True
    """Write the loss plot ``loss.png`` at the end."""
    accept_nonfinite: bool = False
    """Accept NaN / infinity (``recd train --accept-nonfinite``): resume from a checkpoint
    whose weights or Adam state hold them, and train on when a step's loss is not finite.
    False: such a checkpoint is skipped on resume like a corrupt one (the previous valid one
    is used), and a non-finite loss stops training with an error naming the step."""

    def __post_init__(self) -> None:
        check_fields(self, "train.")
        self.run_dir = Path(self.run_dir)


@dataclass(kw_only=True, slots=True)
class CheckpointSection:
    """The ``[checkpoint]`` table: cadence, retention and where the run directory is.

    The run directory (``dir``) holds ``step_NNNNNN.bin``, ``_layout.json`` and the three
    sidecars ``.loss.json``, ``.samples.json``, ``.state.json`` (docs/checkpoints.md; :mod:`recd.checkpoint.state_file`).
    """

    enabled: bool = True
    """Write checkpoints (periodic, on SIGTERM / SIGUSR1, at the end) and the sidecars."""
    dir: Path | None = None
    """The run directory of the checkpoints and sidecars; None: ``train.run_dir``."""
    checkpoint_every: PositiveInt = 100
    """Write ``step_NNNNNN.bin`` every this many optimizer steps (and at the last step)."""
    sample_every: NonNegativeInt | None = None
    """Write a sample audit to ``.samples.json`` every this many steps; None: equal to
    ``checkpoint_every`` (the default: every checkpoint has an audit and every audit a
    recovery point). Must be a multiple of ``checkpoint_every`` (so every audit still lands on
    a checkpoint); 0 disables the audits."""
    full_every: PositiveInt = 1
    """Every this many-th checkpoint is a full ``step_NNNNNN.bin``; the ones between are
    deltas (``step_NNNNNN.delta``: the embedding rows updated since the previous checkpoint,
    every dense parameter). 1: every checkpoint full. The last checkpoint of a run, and the
    first after a start or resume, are always full. Tables updated by fbgemm's fused ADAM
    (on a GPU) cannot log their rows: such a run writes full checkpoints whatever this says
    (with a warning)."""
    keep_last: PositiveInt = 3
    """Retention: always keep the newest K checkpoints (a kept delta keeps its chain)."""
    keep_every: NonNegativeInt = 10
    """Retention: also keep forever every checkpoint whose step is a multiple of
    ``keep_every * checkpoint_every``; 0: none."""
    background: bool = True
    """Snapshot at the step boundary, then write on a background thread (one write in flight;
    the next snapshot waits for it). False: write before the next step starts."""
    audit_keep: PositiveInt = 100
    """``.samples.json`` keeps the most recent this many audits."""
    on_replay_mismatch: Literal["warn", "raise"] = "warn"
    """A resumed run replays the steps after its checkpoint; when a replayed loss differs
    (bitwise) from the one in ``.loss.json`` the resume was not bit-exact: ``raise``
    (SidecarError, stops training) or ``warn``. CPU training here is deterministic; fused GPU
    kernels may not be, hence the default."""

    def __post_init__(self) -> None:
        check_fields(self, "checkpoint.")
        if self.sample_every is None:
            self.sample_every = self.checkpoint_every
        if self.sample_every % self.checkpoint_every:
            raise ConfigError(
                f"checkpoint.sample_every: {self.sample_every} is not a multiple of "
                f"checkpoint.checkpoint_every = {self.checkpoint_every} (every sample audit "
                "must match a recovery point)"
            )
        if self.dir is not None:
            self.dir = Path(self.dir)


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """One training job: ``[reader]``, ``[eval]``, ``[model]``, ``[optim]``, ``[train]``,
    ``[checkpoint]``."""

    reader: ReaderConfig
    """The training partitions and how they are batched (rank / world_size are set per
    process by the trainer)."""
    eval: EvalConfig | None = None
    """The held-out partitions; None: no evaluation."""
    model: ModelSection = field(default_factory=ModelSection)
    """The model."""
    optim: OptimSection = field(default_factory=OptimSection)
    """Adam hyper-parameters."""
    train: RunSection = field(default_factory=RunSection)
    """Steps, cadences, seed, output directory, devices."""
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    """Checkpoints, sample audits, retention (``[checkpoint]``)."""

    @property
    def checkpoint_dir(self) -> Path:
        """The run directory of the checkpoints and sidecars (``checkpoint.dir`` or
        ``train.run_dir``)."""
        return self.checkpoint.dir if self.checkpoint.dir is not None else self.train.run_dir

    def __post_init__(self) -> None:
        same_table = self.eval is not None and (
            self.eval.table is None
            or Path(self.eval.table).resolve() == Path(self.reader.table).resolve()
        )
        if (
            self.eval is not None
            and same_table
            and _overlap((self.reader.start_ms, self.reader.end_ms), self._eval_range_ms())
        ):
            raise ConfigError(
                f"eval: the held-out range [{self.eval.start}, {self.eval.end}) overlaps the "
                f"training partitions [reader.start = {self.reader.start}, reader.end = "
                f"{self.reader.end}): held-out data must not be trained on"
            )
        if self.train.eval_every and self.eval is None:
            self.train.eval_every = 0  # nothing to evaluate

    def _eval_range_ms(self) -> tuple[int | None, int | None]:
        assert self.eval is not None
        probe = dataclasses.replace(self.reader, start=self.eval.start, end=self.eval.end)
        return probe.start_ms, probe.end_ms

    def eval_reader(self) -> ReaderConfig:
        """Reader of the held-out partitions: the training features and preprocessing, table
        order, one epoch, read whole by every rank (so every rank sees the same batches)."""
        if self.eval is None:
            raise ConfigError("eval: this config has no [eval] table")
        reader = self.reader
        if self.eval.table is not None:
            reader = dataclasses.replace(reader, table=self.eval.table, snapshot=None)
        return ordered_reader(
            reader, start=self.eval.start, end=self.eval.end, batch_size=self.eval.batch_size
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (for ``train.json`` and reports)."""
        return {
            "reader": self.reader.to_dict(),
            "eval": None if self.eval is None else dataclasses.asdict(self.eval),
            "model": {**dataclasses.asdict(self.model), "dedup": self.model.dedup.value},
            "optim": dataclasses.asdict(self.optim),
            "train": {**dataclasses.asdict(self.train), "run_dir": str(self.train.run_dir)},
            "checkpoint": {
                **dataclasses.asdict(self.checkpoint),
                "dir": None if self.checkpoint.dir is None else str(self.checkpoint.dir),
            },
        }

    @classmethod
    def from_dict(
        cls, data: dict[str, Any], *, base_dir: Path | None = None, source: str = "<dict>"
    ) -> TrainConfig:
        """Build from parsed TOML; relative paths are resolved against ``base_dir``.

        Unknown tables or keys are errors naming ``source`` and the key.
        """
        known = ("reader", "eval", "model", "optim", "train", "checkpoint")
        check_keys(data, known, f"{source}: ", what="table")
        for name in known:
            if name in data and not isinstance(data[name], dict):
                raise ConfigError(f"{source}: [{name}] must be a table")
        if "reader" not in data:
            raise ConfigError(f"{source}: missing [reader] table (the training partitions)")
        try:
            train = build_section(RunSection, dict(data.get("train", {})), "train")
            if base_dir is not None and not train.run_dir.is_absolute():
                train.run_dir = base_dir / train.run_dir
            reader_data = dict(data["reader"])
            reader_data.setdefault("seed", train.seed)
            table = reader_data.get("table")
            if base_dir is not None and isinstance(table, str) and not Path(table).is_absolute():
                reader_data["table"] = str(base_dir / table)
            reader = ReaderConfig.from_dict(reader_data, source=f"{source}[reader]")
            model_data = dict(data.get("model", {}))
            sequence = build_section(
                SequenceSection, dict(model_data.pop("sequence", {})), "model.sequence"
            )
            model = build_section(ModelSection, {**model_data, "sequence": sequence}, "model")
            optim = build_section(OptimSection, dict(data.get("optim", {})), "optim")
            evaluation = (
                build_section(EvalConfig, dict(data["eval"]), "eval") if "eval" in data else None
            )
            if (
                evaluation is not None
                and evaluation.table is not None
                and base_dir is not None
                and not Path(evaluation.table).is_absolute()
            ):
                evaluation.table = str(base_dir / evaluation.table)
            checkpoint = build_section(
                CheckpointSection, dict(data.get("checkpoint", {})), "checkpoint"
            )
            if (
                base_dir is not None
                and checkpoint.dir is not None
                and not checkpoint.dir.is_absolute()
            ):
                checkpoint.dir = base_dir / checkpoint.dir
            return cls(
                reader=reader,
                eval=evaluation,
                model=model,
                optim=optim,
                train=train,
                checkpoint=checkpoint,
            )
        except ConfigError as exc:
            if str(exc).startswith(source):
                raise
            raise ConfigError(f"{source}: {exc}") from exc


def ordered_reader(
    reader: ReaderConfig, *, start: str | None, end: str | None, batch_size: int
) -> ReaderConfig:
    """``reader`` over ``[start, end)`` in table order, one epoch, the last short batch kept,
    read whole by one process: what evaluation and scoring read."""
    return dataclasses.replace(
        reader,
        start=start,
        end=end,
        batch_size=batch_size,
        shuffle=Shuffle.NONE,
        streams=1,
        num_epochs=1,
        drop_last=False,
        rank=0,
        world_size=1,
        num_workers=0,
    )


def load_train_config(path: str | Path) -> TrainConfig:
    """Load a :class:`TrainConfig` from a TOML file (paths relative to its directory)."""
    path = Path(path)
    data = load_toml(path, "train config")
    return TrainConfig.from_dict(data, base_dir=path.resolve().parent, source=str(path))


def _overlap(a: tuple[int | None, int | None], b: tuple[int | None, int | None]) -> bool:
    """Whether half-open ranges [a0, a1) and [b0, b1) intersect (None = unbounded)."""
    lo = max(x for x in (a[0], b[0], -(2**63)) if x is not None)
    hi = min(x for x in (a[1], b[1], 2**63) if x is not None)
    return lo < hi
