"""The end-to-end job behind ``recd run`` (and ``make run``): logs -> shards -> table -> analysis.

A pipeline config (``recd/pipelines/*.toml``) names a work directory and one table per stage::

    [run]      work_dir
    [logs]     profile or catalogue, seed, sessions / rows        (synthetic logs), or
    [ingest]   input, format, mapping (a file or [ingest.mapping]) (your own event log)
    [shard]    num_shards, block_bytes, zstd_level
    [etl]      row_group_rows, zstd_level, memory_budget_mb
    [analyze]  batch_size, threshold, pricing
    [train]    config (a training TOML), steps, holdout_hours, log1p_dense, demo_resume

Stages write into ``work_dir``: ``raw/`` (arrival order), ``shards/{session,random}/`` (O1),
``table/`` (clustered, O2) and ``table_baseline/`` (arrival order, from the random shards, the
unclustered baseline), ``train/`` (metrics, loss plot, checkpoints and their sidecars),
``train.toml`` (the training job as run, written from the ``[train] config`` template before
the analysis prices it), ``report.json`` (every stage's numbers). The training stage runs
``recd train`` as a child process; with ``[train] demo_resume`` (the ``small`` pipeline, ``make
run``) it stops it with SIGTERM once it has written its first checkpoint and finishes the run
with ``recd train --resume``.

The template is checked against the log's catalogue right after the logs stage: a feature it
names (``[reader]`` labels, dense, sparse, preprocessing) that the log lacks ends the run
there, naming the template, the key and the name, not after the ETL.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeGuard

import msgspec
import tomli_w

from recd.analyze.defaults import DEFAULT_THRESHOLD, Pricing
from recd.config_types import (
    NonNegativeInt,
    OneOf,
    PositiveInt,
    build_section,
    check_fields,
    check_keys,
    load_toml,
)
from recd.errors import ConfigError
from recd.etl import config as etl_config
from recd.etl.config import EtlConfig, ZstdLevel
from recd.logs.ingest import BAD_ROW_POLICIES, DEFAULT_MEMORY_BUDGET_BYTES, MIB
from recd.logs.ingest_mapping import IngestMapping
from recd.logs.shard import DEFAULT_BLOCK_BYTES, DEFAULT_ZSTD_LEVEL
from recd.reader.config import SPARSE_PREPROCESS_KINDS

if TYPE_CHECKING:
    from recd.analyze.table import TableAnalysis
    from recd.schema import Catalogue


@dataclass(kw_only=True, slots=True)
class LogsStage:
    """Synthetic logs to generate."""

    profile: str = "small"
    """Built-in profile (tiny, small, rm1-like, clickstream) or a catalogue TOML path."""
    seed: NonNegativeInt = 0
    """Generator seed: the same seed writes byte-identical logs."""
    sessions: PositiveInt | None = None
    """Override the profile's number of sessions."""
    rows: PositiveInt | None = None
    """Ask for about this many rows instead (scales the number of sessions)."""

    def __post_init__(self) -> None:
        check_fields(self, "[logs] ", wording="must")


@dataclass(kw_only=True, slots=True)
class IngestStage:
    """Your own event log, ingested (``recd logs ingest``) instead of synthetic logs."""

    input: str
    """The event log (CSV, JSON Lines or Parquet), relative to the pipeline TOML."""
    format: str | None = None
    """``csv``, ``jsonl`` or ``parquet``; None: from the file name's suffix."""
    mapping: str | dict[str, Any] | None = None
    """The column mapping: a mapping TOML path (relative to the pipeline TOML), or the
    mapping's keys inline as ``[ingest.mapping]``; None: the default column names."""
    on_bad_rows: Annotated[str, OneOf(BAD_ROW_POLICIES)] = "fail"
    """``fail`` at the first bad line, or ``quarantine`` bad lines and go on."""
    delimiter: str = ","
    """CSV field delimiter."""
    memory_budget_mb: Annotated[int, msgspec.Meta(ge=16)] = DEFAULT_MEMORY_BUDGET_BYTES // MIB
    """Memory the streaming read is planned for (MiB)."""

    def __post_init__(self) -> None:
        if not self.input:
            raise ConfigError("[ingest] input: the event log to ingest is required")
        check_fields(self, "[ingest] ", wording="must")
        if isinstance(self.mapping, dict):
            IngestMapping.from_dict(self.mapping, section="ingest.mapping")  # check it now

    def resolve_mapping(self, config_dir: Path) -> IngestMapping:
        """The mapping: read from its file (relative to ``config_dir``) or the inline keys."""
        if isinstance(self.mapping, dict):
            return IngestMapping.from_dict(self.mapping, section="ingest.mapping")
        if isinstance(self.mapping, str):
            return IngestMapping.from_toml(config_dir / self.mapping)
        return IngestMapping()


@dataclass(kw_only=True, slots=True)
class ShardStage:
    """Log-bus sharding (both keys are written, to report O1)."""

    num_shards: PositiveInt = 8
    """Shards (log-bus storage nodes)."""
    block_bytes: PositiveInt = DEFAULT_BLOCK_BYTES
    """Uncompressed bytes a shard buffers before it compresses and flushes a block."""
    zstd_level: int = DEFAULT_ZSTD_LEVEL
    """zstd level of the shard blocks (negative levels are zstd's fast ones)."""

    def __post_init__(self) -> None:
        check_fields(self, "[shard] ", wording="must")


@dataclass(kw_only=True, slots=True)
class EtlStage:
    """Clustering ETL."""

    row_group_rows: PositiveInt = etl_config.DEFAULT_ROW_GROUP_ROWS
    """Rows per Parquet row group (stripe)."""
    zstd_level: ZstdLevel = etl_config.DEFAULT_ZSTD_LEVEL
    """zstd level of the Parquet column chunks."""
    memory_budget_mb: PositiveInt | None = None
    """Bound on rows held in memory (MB of decoded rows); None: one shard at a time."""
    partition_by: Literal["hour", "day"] = "hour"
    """Partition granularity of the tables: ``hour``, or ``day`` for sparse logs (months of
    a small log would make thousands of hours of a few dozen rows each)."""

    def __post_init__(self) -> None:
        check_fields(self, "[etl] ", wording="must")


@dataclass(kw_only=True, slots=True)
class AnalyzeStage:
    """Per-feature dedup analysis of the clustered table and the dedup groups the training
    stage uses: ``recd analyze WORK/table --config WORK/train.toml`` (without ``--config``
    when ``[train] config`` is empty), the command the stage prints."""

    batch_size: PositiveInt | None = None
    """Batch size B of the analytic model, of the measured DedupeFactor and of the timed
    batches; None: the training job's ``[reader] batch_size`` (``[train] config``), else 512."""
    threshold: float = DEFAULT_THRESHOLD
    """Propose deduplicating features whose DedupeFactor exceeds this."""
    pricing: Pricing = "job"
    """What decides which candidates are proposed: ``job`` (the reader + the training step of
    the ``[train] config`` job, or of the default training config, timed on the table's own
    batches), ``reader`` (the reader alone, timed; one-id single features refused) or
    ``factor`` (the dedup factor alone, the paper's rule)."""

    def __post_init__(self) -> None:
        check_fields(self, "[analyze] ", wording="must")


@dataclass(kw_only=True, slots=True)
class TrainStage:
    """Training the model on the clustered table (skipped when ``config`` is empty)."""

    config: str | None = "train_small.toml"
    """Training TOML, relative to the pipeline TOML; its table and run_dir are replaced by
    this job's ``work_dir/table`` and ``work_dir/train``, its dedup groups by the analysis'."""
    steps: PositiveInt | None = None
    """Override the training config's step count."""
    holdout_hours: PositiveInt | None = None
    """Hold out the table's last N partition hours (a day-partitioned table: N / 24 days, N a
    multiple of 24): the training config's ``[reader] end`` and ``[eval] start`` become the
    first held-out partition (for tables whose hours are only known once ingested); None:
    the training config's own split."""
    log1p_dense: bool = False
    """Add a ``log1p`` step (values below 0 count as 0) for every dense feature the job reads
    that no dense step of the training config's own ``[reader] preprocessing`` names: the
    dense features of the log's catalogue, or the config's ``[reader] dense``. For a template
    that must fit any log (the ``own_data`` pipeline's), whose dense columns are only known
    once it is ingested; the job as run (``work_dir/train.toml``) holds the step."""
    demo_resume: bool = False
    """Show recovery from a checkpoint (the ``small`` pipeline, ``make run``): stop ``recd
    train`` with SIGTERM once it has written its first checkpoint, then finish the run with
    ``recd train --resume``; false: one ``recd train`` run, uninterrupted."""

    def __post_init__(self) -> None:
        check_fields(self, "[train] ", wording="must")


@dataclass(kw_only=True, slots=True)
class PipelineConfig:
    """One ``recd run`` job."""

    work_dir: Path
    """Where every stage writes (created if missing)."""
    logs: LogsStage = field(default_factory=LogsStage)
    ingest: IngestStage | None = None
    """Your own event log instead of ``logs`` (a config has one of the two)."""
    shard: ShardStage = field(default_factory=ShardStage)
    etl: EtlStage = field(default_factory=EtlStage)
    analyze: AnalyzeStage = field(default_factory=AnalyzeStage)
    train: TrainStage = field(default_factory=lambda: TrainStage(config=None))
    config_dir: Path = field(default_factory=Path.cwd)
    """Directory the stage configs' relative paths are resolved against."""

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir)

    @classmethod
    def from_toml(cls, path: Path) -> PipelineConfig:
        data = load_toml(path, "pipeline config")
        stages: dict[str, type] = {
            "logs": LogsStage,
            "ingest": IngestStage,
            "shard": ShardStage,
            "etl": EtlStage,
            "analyze": AnalyzeStage,
            "train": TrainStage,
        }
        check_keys(data, ["run", *stages], f"{path}: ", what="section")
        if "logs" in data and "ingest" in data:
            raise ConfigError(
                f"{path}: give either [logs] (synthetic logs) or [ingest] (your event log), "
                "not both"
            )
        kwargs: dict[str, Any] = {}
        for name, typ in stages.items():
            if name == "ingest" and name not in data:
                continue
            kwargs[name] = build_section(typ, data.get(name, {}), name, source=str(path))
        run = data.get("run", {})
        if not isinstance(run, dict) or not isinstance(run.get("work_dir"), str):
            raise ConfigError(f"{path}: missing [run] work_dir (a directory path)")
        check_keys(run, ["work_dir"], f"{path}: [run] ")
        work_dir = Path(run["work_dir"])
        if not work_dir.is_absolute():
            work_dir = Path.cwd() / work_dir
        return cls(work_dir=work_dir, config_dir=path.parent.resolve(), **kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["work_dir"] = str(self.work_dir)
        out["config_dir"] = str(self.config_dir)
        return out


def run_pipeline(config: PipelineConfig, *, show_progress: bool = True) -> dict[str, Any]:
    """Run every stage; print a summary per stage; return (and save) the combined report."""
    from recd.etl.local import run_etl
    from recd.logs.generate import generate_logs
    from recd.logs.shard import compare_sharding
    from recd.schema import load_catalogue

    work = config.work_dir
    work.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"config": config.to_dict()}

    if config.ingest is not None:
        import shutil

        # the ETL appends to an existing table: another event log must not land on the last one's
        for name in ("table", "table_baseline"):
            shutil.rmtree(work / name, ignore_errors=True)
        report["ingest"] = ingest_stage(
            config.ingest,
            config.config_dir,
            work,
            show_progress,
            partition_by=config.etl.partition_by,
        )
    else:
        catalogue = load_catalogue(config.logs.profile)
        gen = generate_logs(
            catalogue,
            work / "raw",
            seed=config.logs.seed,
            num_sessions=config.logs.sessions,
            rows=config.logs.rows,
            show_progress=show_progress,
            overwrite=True,
        )
        report["generate"] = asdict(gen)
        print(
            f"[1/5 logs]    {gen.rows:,} rows in {gen.sessions:,} sessions, "
            f"{gen.raw_bytes / 1e6:.1f} MB raw, {gen.seconds:.1f} s"
        )

    if config.train.config:
        from recd.logs.rawlog import read_catalogue

        template, catalogue = config.config_dir / config.train.config, read_catalogue(work / "raw")
        check_train_template(template, catalogue)
        if config.train.log1p_dense:
            names = log1p_features(template, catalogue)
            report["log1p_dense"] = names
            print(
                f"[pipeline]    [train] log1p_dense: the training job takes log1p of "
                f"{', '.join(names) or 'no dense feature'} (the log's dense features that "
                f"no step of {template.name} transforms)"
            )

    shards = compare_sharding(
        work / "raw",
        work / "shards",
        num_shards=config.shard.num_shards,
        block_bytes=config.shard.block_bytes,
        zstd_level=config.shard.zstd_level,
        show_progress=show_progress,
    )
    report["shard"] = shards.to_dict()
    print(
        f"[2/5 shard]   {config.shard.num_shards} shards: session {shards.session.compressed_bytes / 1e6:.2f} MB "
        f"(compression {shards.session.compression_ratio:.2f}x), random "
        f"{shards.random.compressed_bytes / 1e6:.2f} MB ({shards.random.compression_ratio:.2f}x): "
        f"session sharding is {shards.ratio:.2f}x smaller"
    )

    budget = config.etl.memory_budget_mb
    etl_common: dict[str, Any] = {
        "row_group_rows": config.etl.row_group_rows,
        "zstd_level": config.etl.zstd_level,
        "memory_budget_bytes": None if budget is None else budget * 1024 * 1024,
        "show_progress": show_progress,
        "partition_by": config.etl.partition_by,
    }
    clustered = run_etl(
        EtlConfig(shard_dir=work / "shards" / "session", table_dir=work / "table", **etl_common)
    )
    baseline = run_etl(
        EtlConfig(
            shard_dir=work / "shards" / "random",
            table_dir=work / "table_baseline",
            baseline=True,
            **etl_common,
        )
    )
    ratio = baseline.bytes_out / clustered.bytes_out if clustered.bytes_out else 0.0
    report["etl"] = {
        "clustered": clustered.to_dict(),
        "baseline": baseline.to_dict(),
        "table_compression_ratio": ratio,
    }
    print(
        f"[3/5 etl]     rows in {clustered.rows_in:,} -> out {clustered.rows_out:,} "
        f"(quarantined {clustered.rows_quarantined}), {clustered.partitions} partitions; "
        f"clustered {clustered.bytes_out / 1e6:.2f} MB vs arrival-order {baseline.bytes_out / 1e6:.2f} MB: "
        f"{ratio:.2f}x smaller, {clustered.bytes_out / max(clustered.rows_out, 1):.0f} B/sample"
    )

    analysis, report["analyze"] = analysis_stage(config, work)

    if config.train.config:
        train_config = config.config_dir / config.train.config
        print(
            f"[5/5 train]   {train_config.name} on the clustered table with the proposed dedup groups"
        )
        job = write_train_job(config, work, dedup_sparse_features=analysis.dedup_sparse_features)
        if config.train.demo_resume:
            report["train"] = train_with_sigterm_and_resume(job, show_progress=show_progress)
        else:
            report["train"] = train_once(job, show_progress=show_progress)

    report_path = work / "report.json"
    report_path.write_text(json.dumps(report, indent=1, default=str))
    print(f"report: {report_path}")
    if "train" in report:
        print_outputs(work, report["train"])
    return report


def analysis_stage(config: PipelineConfig, work: Path) -> tuple[TableAnalysis, dict[str, Any]]:
    """Stage 4: the dedup analysis of ``work/table`` priced for the training job, exactly as
    ``recd analyze work/table --config work/train.toml`` runs it (the printed command): the
    job is written from the ``[train] config`` template first (:func:`write_train_job`, less
    the dedup groups the analysis proposes, which the training stage adds; the window and
    held-out range are unread by the analysis); without a template, the default training
    config. Returns the :class:`recd.analyze.TableAnalysis` and its report entry (the
    analysis, the command, the stage's wall seconds)."""
    import time

    from recd.analyze import analyze_command, analyze_for_job, format_report

    stage = config.analyze
    template = write_train_job(config, work) if config.train.config else None
    began = time.perf_counter()
    analysis = analyze_for_job(
        work / "table",
        config=template,
        pricing=stage.pricing,
        batch_size=stage.batch_size,
        threshold=stage.threshold,
    )
    seconds = time.perf_counter() - began
    command = analyze_command(
        work / "table",
        config=template,
        pricing=stage.pricing,
        batch_size=stage.batch_size,
        threshold=stage.threshold,
    )
    print(
        f"[4/5 analyze] per-feature dedup analysis of the clustered table "
        f"(B = {analysis.batch_size}, {seconds:.1f} s):"
    )
    print(format_report(analysis))
    print(f"[4/5 analyze] the same analysis again: {command}")
    return analysis, {**analysis.to_dict(), "command": command, "seconds": seconds}


def ingest_stage(
    stage: IngestStage,
    config_dir: Path,
    work: Path,
    show_progress: bool,
    *,
    partition_by: str = "hour",
) -> dict[str, Any]:
    """Stage 1 for your own data: ``recd logs ingest`` of ``stage.input`` into ``work/raw``
    (``partition_by``: the ETL's, so that no day-partition hint is given for a day table)."""
    from recd.logs.ingest import ingest_events

    source = config_dir / stage.input
    if not source.is_file():
        raise ConfigError(
            f"[ingest] input = {stage.input!r}: {source} does not exist (a path relative to the "
            "pipeline TOML)"
        )
    done = ingest_events(
        source,
        work / "raw",
        mapping=stage.resolve_mapping(config_dir),
        fmt=stage.format,
        on_bad_rows=stage.on_bad_rows,
        delimiter=stage.delimiter,
        memory_budget_bytes=stage.memory_budget_mb * 1024 * 1024,
        show_progress=show_progress,
        partition_by=partition_by,
    )
    print(
        f"[1/5 ingest]  {done.rows_in:,} events of {source.name} -> {done.rows_out:,} samples "
        f"in {done.sessions:,} sessions (distinct ids; {done.history_only:,} history-only, "
        f"{done.quarantined:,} quarantined), labels {', '.join(done.labels)}: "
        f"{done.positives:,} positive"
    )
    for warning in done.warnings:
        print(f"[1/5 ingest]  warning: {warning}")
    return done.to_dict()


def print_outputs(work: Path, train: dict[str, Any]) -> None:
    """Where the trained model, its metrics and the command to score with it are."""
    from recd.checkpoint import newest_valid_checkpoint

    run_dir = Path(train.get("run_dir") or work / "train")
    newest = newest_valid_checkpoint(run_dir)
    job = work / "train.toml"
    print(f"model:   {newest if newest is not None else run_dir} (newest checkpoint)")
    print(f"metrics: {run_dir / 'train.json'}, {run_dir / 'metrics.jsonl'}, {run_dir / 'loss.png'}")
    print(
        f"score:   recd predict --config {job} --checkpoint {run_dir} --eval-range "
        f"--out {work / 'predictions.parquet'}"
    )


# ----------------------------------------------------------------------------- training stage
def check_train_template(template: Path, catalogue: Catalogue) -> None:
    """ConfigError, in one line naming the template, the key and the name, when the training
    config ``template`` names a feature the log (``catalogue``) lacks in its ``[reader]``
    ``labels``, ``dense``, ``sparse`` or a ``preprocessing`` step: checked once the logs are
    written, not after the sharding and ETL. The names are the user's, so none is dropped;
    malformed values are left to the training config's own checks."""
    reader = _template_reader(template)
    what = {"labels": "label", "dense": "dense feature", "sparse": "sparse feature"}
    read = {
        "labels": list(catalogue.labels),
        "dense": catalogue.dense_names,
        "sparse": catalogue.sparse_names,
    }
    for key, names in list(read.items()):
        listed = reader.get(key)
        if _names(listed):
            for name in listed:
                if name not in names:
                    raise ConfigError(
                        _not_in_log(template, f"[reader] {key}", name, what[key], names)
                    )
            read[key] = listed
    specs = reader.get("preprocessing")
    for i, spec in enumerate(specs if isinstance(specs, list) else []):
        if not isinstance(spec, dict) or not _names(spec.get("features")):
            continue
        key = "sparse" if spec.get("kind") in SPARSE_PREPROCESS_KINDS else "dense"
        for name in spec["features"]:
            if name not in read[key]:
                where = f"[reader] preprocessing[{i}] ({spec.get('kind')})"
                raise ConfigError(_not_in_log(template, where, name, what[key], read[key]))


def _not_in_log(template: Path, key: str, name: str, what: str, names: list[str]) -> str:
    return (
        f"{template}: {key} names {name!r}, which is not a {what} of this log (its "
        f"{what}s: {', '.join(names) or 'none'}); remove it from the template, or have the "
        "log write it (an ingested log: [ingest.mapping])"
    )


def log1p_features(template: Path, catalogue: Catalogue) -> list[str]:
    """``[train] log1p_dense``'s features: the dense features the job of ``template`` reads
    (its ``[reader] dense``, else every dense feature of ``catalogue``), less those a dense
    step of its own ``[reader] preprocessing`` names (they are the user's to transform)."""
    reader = _template_reader(template)
    dense = reader.get("dense")
    read = list(dense) if _names(dense) else catalogue.dense_names
    specs = reader.get("preprocessing")
    claimed: set[str] = set()
    for spec in specs if isinstance(specs, list) else []:
        if isinstance(spec, dict) and spec.get("kind") not in SPARSE_PREPROCESS_KINDS:
            features = spec.get("features")
            claimed.update(features if _names(features) else [])
    return [name for name in read if name not in claimed]


def _template_reader(template: Path) -> dict[str, Any]:
    """The ``[reader]`` table of a training config ({} when it has none)."""
    data = load_toml(template, "training config")
    reader = data.get("reader", {})
    return reader if isinstance(reader, dict) else {}


def _names(value: object) -> TypeGuard[list[str]]:
    """Whether ``value`` is a list of names."""
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def write_train_job(
    config: PipelineConfig, work: Path, *, dedup_sparse_features: list[list[str]] | None = None
) -> Path:
    """``work/train.toml``, the training job as run: the ``[train] config`` template with this
    pipeline's table, run directory, steps, held-out hours, ``log1p_dense`` step (from the
    log's catalogue, ``work/raw``) and, once analysed, dedup groups
    (:func:`write_stage_train_config`)."""
    template = config.config_dir / str(config.train.config)
    log1p = None
    if config.train.log1p_dense:
        from recd.logs.rawlog import read_catalogue

        log1p = log1p_features(template, read_catalogue(work / "raw"))
    return write_stage_train_config(
        work,
        template,
        dedup_sparse_features=dedup_sparse_features,
        steps=config.train.steps,
        holdout_hours=config.train.holdout_hours,
        log1p=log1p,
    )


def write_stage_train_config(
    work_dir: Path,
    config_path: Path,
    *,
    dedup_sparse_features: list[list[str]] | None = None,
    steps: int | None = None,
    holdout_hours: int | None = None,
    log1p: list[str] | None = None,
) -> Path:
    """``work_dir/train.toml``: ``config_path`` with this job's table, run directory, dedup
    groups and step count (what ``train_from_pipeline`` overrides in-process); with
    ``holdout_hours``, the table's last N hours are the ``[eval]`` range and the rest train;
    with ``log1p``, a last ``[reader] preprocessing`` step takes log1p of those features."""
    data = load_toml(config_path, "training config")
    data.setdefault("reader", {})["table"] = str(Path(work_dir).resolve() / "table")
    if dedup_sparse_features is not None:
        data["reader"]["dedup_sparse_features"] = [list(g) for g in dedup_sparse_features]
    header = f"# Written by recd run from {config_path}\n"
    specs = data["reader"].get("preprocessing", [])
    if log1p and isinstance(specs, list):  # else the config's own checks name the value
        data["reader"]["preprocessing"] = [*specs, {"kind": "log1p", "features": list(log1p)}]
        header += "# [reader] preprocessing: the last step (log1p) is [train] log1p_dense's\n"
    data.setdefault("train", {})["run_dir"] = str(Path(work_dir).resolve() / "train")
    if steps is not None:
        data["train"]["steps"] = steps
    data.get("checkpoint", {}).pop("dir", None)  # the checkpoints follow the run directory
    if holdout_hours is not None:
        split = holdout_split(Path(work_dir) / "table", holdout_hours)
        data["reader"].pop("start", None)
        data["reader"]["end"] = split
        data.setdefault("eval", {})["start"] = split
        data["eval"].pop("end", None)
    path = Path(work_dir) / "train.toml"
    path.write_text(header + tomli_w.dumps(data))
    return path


def holdout_split(table: Path, hours: int) -> str:
    """The start of the table's last ``hours`` hours of partitions (``YYYY-MM-DDTHH:00``):
    the first of its last ``hours`` hourly partitions, or of its last ``hours / 24`` daily
    ones. ConfigError when that leaves no partition to train on, or when a day-partitioned
    table is asked for hours that are not whole days."""
    from recd.table.partitions import format_time_ms, iter_partition_dirs

    partitions = [p for p, _ in iter_partition_dirs(table)]
    unit = "hour" if not partitions else partitions[0].partition_by
    if unit == "day" and hours % 24:
        raise ConfigError(
            f"[train] holdout_hours = {hours}: the table {table} is partitioned by day; "
            "give a multiple of 24"
        )
    count = hours // 24 if unit == "day" else hours
    starts = sorted({p.start_ms for p in partitions})
    if len(starts) <= count:
        raise ConfigError(
            f"[train] holdout_hours = {hours}: the table {table} has {len(starts)} "
            f"{unit} partition(s); it needs more than {count} to leave some to train on"
        )
    return format_time_ms(starts[-count])


def train_once(job: Path, *, show_progress: bool = True) -> dict[str, Any]:
    """The training stage: ``recd train --config job`` as a child process, in a fresh run
    directory, from step 0 to the end. Returns its ``train.json`` result."""
    import subprocess
    import sys

    from recd.errors import RecdError

    config = _fresh_run(job)
    command = [sys.executable, "-m", "recd", "train", "--config", str(job)]
    code = subprocess.run(command, env=_train_env(show_progress), check=False).returncode
    if code != 0:
        raise RecdError(f"recd train --config {job} exited with code {code}")
    return dict(json.loads((config.train.run_dir / "train.json").read_text())["result"])


def _fresh_run(job: Path) -> Any:
    """The training config of ``job`` (a ``recd.train.config.TrainConfig``), its run and
    checkpoint directories deleted: a fresh run every time."""
    import shutil

    from recd.train.config import load_train_config

    config = load_train_config(job)
    shutil.rmtree(config.train.run_dir, ignore_errors=True)
    shutil.rmtree(config.checkpoint_dir, ignore_errors=True)
    return config


def _train_env(show_progress: bool) -> dict[str, str]:
    return {**os.environ, "RECD_PROGRESS": "1" if show_progress else "0"}


def train_with_sigterm_and_resume(job: Path, *, show_progress: bool = True) -> dict[str, Any]:
    """The ``make run`` training stage (``[train] demo_resume``), which also shows recovery
    from a checkpoint.

    ``recd train --config job`` runs as a child process; once it has written its first
    periodic checkpoint it gets SIGTERM (it finishes the step in flight, writes a checkpoint,
    exits 0), then ``recd train --resume`` continues from the newest checkpoint to the end.
    The loss history ``.loss.json`` must then hold exactly one entry per step. Returns the
    resumed run's ``train.json`` result plus what the demonstration saw.
    """
    import signal
    import subprocess
    import sys
    import time

    from recd.checkpoint import checkpoint_file, newest_valid_checkpoint, read_loss_history
    from recd.errors import RecdError

    config = _fresh_run(job)
    run_dir = config.checkpoint_dir
    command = [sys.executable, "-m", "recd", "train", "--config", str(job)]
    env = _train_env(show_progress)
    first_step = config.checkpoint.checkpoint_every
    # the first periodic checkpoint, full or delta (whichever the trainer writes at that step)
    first_checkpoint = run_dir / f"step_{first_step:06d}.bin"
    demo: dict[str, Any] = {"signal": "SIGTERM", "after": first_checkpoint.name}
    began = time.perf_counter()
    child = subprocess.Popen(command, env=env)
    while child.poll() is None and checkpoint_file(run_dir, first_step) is None:
        time.sleep(0.02)
    first_checkpoint = checkpoint_file(run_dir, first_step) or first_checkpoint
    demo["after"] = first_checkpoint.name
    interrupted = child.poll() is None  # else it ended before its first checkpoint was seen
    if interrupted:
        child.send_signal(signal.SIGTERM)
    code = child.wait()
    if code != 0:
        raise RecdError(f"recd train --config {job} exited with code {code}")
    newest = newest_valid_checkpoint(run_dir)
    demo |= {
        "interrupted": interrupted,
        "exit_code": code,
        "newest_checkpoint": None if newest is None else newest.name,
    }
    what = (
        f"SIGTERM once {first_checkpoint.name} was written"
        if interrupted
        else f"recd train ended before {first_checkpoint.name} was seen (no SIGTERM)"
    )
    print(
        f"[5/5 train]   {what}: exit code {code}, newest checkpoint "
        f"{newest.name if newest else None}; resuming with --resume"
    )
    code = subprocess.run([*command, "--resume"], env=env, check=False).returncode
    if code != 0:
        raise RecdError(f"recd train --config {job} --resume exited with code {code}")
    history = read_loss_history(run_dir)
    steps_done = history.steps.tolist()
    one_per_step = steps_done == list(range(1, len(steps_done) + 1))
    demo |= {
        "loss_entries": len(steps_done),
        "one_entry_per_step": one_per_step,
        "seconds": time.perf_counter() - began,
    }
    print(
        f"[5/5 train]   {run_dir / '.loss.json'}: {len(steps_done)} entries for steps "
        f"1..{steps_done[-1] if steps_done else 0}"
        + (", one per step across the restart" if one_per_step else ": NOT one per step")
    )
    result = json.loads((config.train.run_dir / "train.json").read_text())["result"]
    return {**result, "checkpoint_demo": demo}


@dataclass(slots=True)
class BuiltTables:
    """What :func:`build_tables` wrote: the reports of every stage."""

    generate: Any
    """recd.logs.generate.GenerateReport"""
    shards: Any
    """recd.logs.shard.ComparisonReport (session vs random)"""
    clustered: Any
    """recd.etl.config.EtlReport of ``work/table`` (from the session shards)"""
    baseline: Any
    """recd.etl.config.EtlReport of ``work/table_baseline`` (arrival order, random shards)"""
    dedup: Any = None
    """recd.etl.config.EtlReport of ``work/table_dedup`` (the clustered rows in the dedup
    layout), when asked for"""


def build_tables(
    work: Path,
    profile: str,
    *,
    seed: int,
    rows: int | None = None,
    num_sessions: int | None = None,
    num_shards: int,
    row_group_rows: int = etl_config.DEFAULT_ROW_GROUP_ROWS,
    keep_intermediate: bool = True,
    show_progress: bool = False,
    dedup: bool = False,
) -> BuiltTables:
    """Generate ``profile``'s logs, shard them both ways and ETL both tables into ``work``.

    ``work/table`` is clustered by session (from the session shards); ``work/table_baseline``
    keeps arrival order (from the random shards), the unclustered production table; with
    ``dedup``, ``work/table_dedup`` holds the clustered rows in the dedup layout.
    ``keep_intermediate=False`` deletes ``raw/`` and ``shards/`` afterwards.
    """
    import shutil

    from recd.etl.local import run_etl
    from recd.logs.generate import generate_logs
    from recd.logs.shard import compare_sharding
    from recd.schema import load_catalogue

    gen = generate_logs(
        load_catalogue(profile),
        work / "raw",
        seed=seed,
        rows=rows,
        num_sessions=num_sessions,
        show_progress=show_progress,
        overwrite=True,
    )
    shards = compare_sharding(
        work / "raw", work / "shards", num_shards=num_shards, show_progress=show_progress
    )
    common: dict[str, Any] = {"row_group_rows": row_group_rows, "show_progress": show_progress}
    clustered = run_etl(
        EtlConfig(shard_dir=work / "shards" / "session", table_dir=work / "table", **common)
    )
    baseline = run_etl(
        EtlConfig(
            shard_dir=work / "shards" / "random",
            table_dir=work / "table_baseline",
            baseline=True,
            **common,
        )
    )
    dedup_report = None
    if dedup:
        dedup_report = run_etl(
            EtlConfig(
                shard_dir=work / "shards" / "session",
                table_dir=work / "table_dedup",
                layout="dedup",
                **common,
            )
        )
    if not keep_intermediate:
        shutil.rmtree(work / "raw")
        shutil.rmtree(work / "shards")
    return BuiltTables(
        generate=gen, shards=shards, clustered=clustered, baseline=baseline, dedup=dedup_report
    )


def table_code_fingerprint() -> str:
    """Hash of the code that writes the tables (generator, sharding, ETL): a work directory's
    tables are reused only if they were written by the same code."""
    import hashlib

    import recd.etl.local
    import recd.logs.generate
    import recd.logs.shard
    import recd.table.layout

    h = hashlib.sha256()
    for module in (recd.logs.generate, recd.logs.shard, recd.etl.local, recd.table.layout):
        h.update(Path(str(module.__file__)).read_bytes())
    return h.hexdigest()[:16]


def reuse_or_build_tables(
    work: Path,
    profile: str,
    *,
    stamp: str,
    seed: int,
    rows: int,
    num_shards: int,
    row_group_rows: int,
    derived: tuple[str, ...] = (),
    dedup: bool = False,
) -> dict[str, Any]:
    """:func:`build_tables` into ``work`` (without the intermediates), unless ``work/stamp``
    says the same tables (profile, catalogue, code, rows, seed, shards, row groups) are there.

    Rebuilding first deletes the old data and ``derived`` (outputs made from the tables, e.g.
    cached batches). Returns the stamp: the request plus rows, sessions, partitions, bytes and
    files of both tables.
    """
    import hashlib
    import shutil

    from recd.schema import load_catalogue

    catalogue = load_catalogue(profile)
    wanted = {
        "profile": profile,
        "catalogue_sha256": hashlib.sha256(catalogue.to_json().encode()).hexdigest()[:16],
        "pipeline_sha256": table_code_fingerprint(),
        "rows_requested": rows,
        "seed": seed,
        "num_shards": num_shards,
        "row_group_rows": row_group_rows,
        "dedup_layout": dedup,
    }
    stamp_path = work / stamp
    if stamp_path.is_file():
        data: dict[str, Any] = json.loads(stamp_path.read_text())
        if {k: data.get(k) for k in wanted} == wanted:
            print(f"reusing the tables in {work}", flush=True)
            return data
    for name in ("raw", "shards", "table", "table_baseline", "table_dedup", *derived, stamp):
        path = work / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    print(f"generating {profile} (~{rows:,} rows), sharding, ETL (both tables) ...", flush=True)
    built = build_tables(
        work,
        profile,
        seed=seed,
        rows=rows,
        num_shards=num_shards,
        row_group_rows=row_group_rows,
        keep_intermediate=False,
        dedup=dedup,
    )
    gen, clustered, baseline = built.generate, built.clustered, built.baseline
    data = {
        **wanted,
        "rows": gen.rows,
        "sessions": gen.sessions,
        "partitions": clustered.partitions,
        "table_bytes_clustered": clustered.bytes_out,
        "table_bytes_unclustered": baseline.bytes_out,
        "files_clustered": clustered.files,
        "files_unclustered": baseline.files,
    }
    if built.dedup is not None:
        data["table_bytes_dedup"] = built.dedup.bytes_out
        data["files_dedup"] = built.dedup.files
        data["dedup_encoded_features"] = built.dedup.encoded_features
    stamp_path.write_text(json.dumps(data, indent=1) + "\n")
    return data
