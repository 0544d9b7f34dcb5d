"""``recd analyze`` priced for a training job: the trainer's side of a group's saving, the
split in the report, and ``recd run`` reaching the same proposal as ``recd analyze``."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pytest

import recd.analyze.costs as costs
import recd.analyze.table as analyze_table_module
from recd.analyze import (
    PAY_MARGIN,
    Cost,
    JobTimer,
    TrainerStep,
    analyze_for_job,
    analyze_table,
    format_report,
)
from recd.cli import analyze as analyze_cli
from recd.errors import ConfigError
from recd.pipeline import (
    AnalyzeStage,
    PipelineConfig,
    TrainStage,
    analysis_stage,
    write_stage_train_config,
)
from recd.schema import Catalogue, DenseFeature, SparseFeature, SparseKind
from recd.tensors.batch import SparseFeatures
from recd.tensors.convert import FeatureSpec, convert_sparse

from .test_analyze import write

IMPRESSIONS = Catalogue(
    name="impressionstest",
    dense=[DenseFeature(name="price")],
    sparse=[
        SparseFeature(
            name="history",
            kind=SparseKind.HISTORY,
            mean_length=48,
            cardinality=1000,
            max_length=48,
        ),
        SparseFeature(name="user", kind=SparseKind.STATIC, cardinality=1000),
        SparseFeature(name="item", cardinality=1000),
    ],
)
CANDIDATES = 24
"""Rows per request: every candidate row repeats its request's history (and session's user)."""


def impression_table(*, requests: int = 96) -> pa.Table:
    """``requests`` requests of 24 candidate rows, 2 requests per session: each request's rows
    share a 48-id history, each session's rows the user id; the item (and price) differ."""
    rng = np.random.default_rng(0)
    rows = []
    users = rng.integers(1000, size=requests)
    for r in range(requests):
        history = rng.integers(1000, size=48).tolist()
        user = int(users[r // 2])
        for c in range(CANDIDATES):
            rows.append(
                {
                    "session_id": 1 + r // 2,
                    "request_id": r,
                    "ts": 1000 * r,
                    "label": float(c == 0),
                    "price": float(c),
                    "history": history,
                    "user": [user],
                    "item": [int(rng.integers(1000))],
                }
            )
    return pa.Table.from_pylist(rows, schema=IMPRESSIONS.arrow_schema())


def impressions(root: Path, *, requests: int = 96) -> Path:
    return write(root, impression_table(requests=requests), row_group_rows=512)


# ---------------------------------------------------------------------- the decision
def parts_timer(plain: Cost, savings: dict[str, Cost]) -> Callable[[list[list[str]]], Cost]:
    """Seconds per sample of a job: ``plain`` minus the saving of each deduplicated group
    (keyed by its first feature), reader and trainer parts apart."""

    def timer(groups: list[list[str]]) -> Cost:
        cost = plain
        for g in groups:
            cost = cost - savings[g[0]]
        return cost

    return timer


MS = 1e-6
"""Seconds per sample that make 1 ms per 1k samples."""


def test_a_group_the_trainer_pays_for_is_proposed_only_when_the_trainer_is_priced(
    tmp_path: Path,
) -> None:
    root = impressions(tmp_path / "t")
    # Plain job: reader 1, trainer 9 ms per 1k samples; the margin is 2% of the job (0.2), or
    # of the reader alone (0.02). The history group costs the reader 0.1 and saves the
    # trainer 2; the one-id user group saves the reader 0.3.
    timer = parts_timer(
        Cost(1 * MS, 9 * MS), {"history": Cost(-0.1 * MS, 2 * MS), "user": Cost(0.3 * MS, 0.0)}
    )
    job = analyze_table(root, batch_size=256, pricing="job", timer=timer)
    assert job.dedup_sparse_features == [["history"], ["user"]] and job.rejected == []
    history = {tuple(g.features): g for g in job.groups}[("history",)]
    assert history.expected_saving_ms_per_1k == pytest.approx(1.9)
    assert history.reader_saving_ms_per_1k == pytest.approx(-0.1)
    assert history.trainer_saving_ms_per_1k == pytest.approx(2.0)
    assert job.reader_ms_per_1k == pytest.approx({"plain": 1.0, "proposed": 0.8})
    assert job.trainer_ms_per_1k == pytest.approx({"plain": 9.0, "proposed": 7.0})
    data = json.loads(json.dumps(job.to_dict()))
    assert data["pricing"] == "job"
    (entry,) = [g for g in data["groups"] if g["features"] == ["history"]]
    assert entry["expected_saving_ms_per_1k"] == pytest.approx(1.9)
    assert entry["reader_saving_ms_per_1k"] == pytest.approx(-0.1)
    assert entry["trainer_saving_ms_per_1k"] == pytest.approx(2.0)
    text = format_report(job)
    assert "priced by: reader + trainer of the job" in text
    (line,) = [x for x in text.splitlines() if x.startswith("group ['history'] (single)")]
    assert line.endswith("saves 1.900 ms per 1k samples (reader -0.100, trainer 2.000)")
    assert "trainer (the job's training step), ms per 1k samples: plain 9.000, with the " in text

    # The same timings priced for the reader alone: the history group costs the reader, and
    # the one-id user group is refused before any timing.
    reader = analyze_table(root, batch_size=256, pricing="reader", timer=timer)
    assert reader.dedup_sparse_features == []
    reasons = {tuple(r.features): r for r in reader.rejected}
    assert "at most one id per row" in reasons[("user",)].reason
    rejected = reasons[("history",)]
    assert "leaving it out costs the reader -0.100 ms per 1k samples" in rejected.reason
    assert "not more than 0.020 (2% of the plain job)" in rejected.reason
    assert rejected.reader_saving_ms_per_1k == pytest.approx(-0.1)
    assert rejected.trainer_saving_ms_per_1k is None and reader.trainer_ms_per_1k == {}
    assert "priced by: reader only" in format_report(reader)
    assert PAY_MARGIN == 0.02
    # The paper's rule proposes both, timing nothing.
    factor = analyze_table(root, batch_size=256)
    assert factor.pricing == "factor" and factor.dedup_sparse_features == [["history"], ["user"]]
    assert "priced by: factor only" in format_report(factor)


def test_paired_job_differences_keep_the_split_of_the_median_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each pass is (reader, trainer) seconds, in call order: the two warm-ups, then the pairs
    # a b, b a, a b. The verdict is the pair of median total, its parts that pair's parts.
    passes = [(0.0, 0.0), (0.0, 0.0)]  # warm-ups of a, then b
    passes += [(3.0, 10.0), (2.0, 4.0)]  # a - b = (1, 6): total 7
    passes += [(5.0, 2.0), (3.0, 10.0)]  # b then a: a - b = (-2, 8): total 6, the median
    passes += [(3.0, 10.0), (2.5, 6.0)]  # a - b = (0.5, 4): total 4.5
    trainer_s: list[float] = []
    fed: list[int] = []

    def fake_run(
        rows: list[pa.Table], spec: FeatureSpec, module: object, out: list[Any] | None = None
    ) -> float:
        assert out is not None  # the trainer is fed what this pass converted
        out.extend(convert_sparse(b, spec, source="test") for b in rows)
        reader, trainer = passes.pop(0)
        trainer_s.append(trainer)
        return reader

    class Trainer:
        def seconds(self, batches: list[SparseFeatures]) -> float:
            fed.append(len(batches))
            return trainer_s.pop(0)

    monkeypatch.setattr(costs, "_run", fake_run)
    batches = [impression_table(requests=4)]  # one batch of 96 rows
    timer = JobTimer(batches, IMPRESSIONS.sparse_names, preprocessing=[], reps=3, trainer=Trainer())
    saving = timer.difference([], [["history"]])
    assert isinstance(saving, Cost)
    assert (saving.reader_s, saving.trainer_s) == (-2.0 / 96, 8.0 / 96)
    assert passes == [] and fed == [1] * 8


def test_job_pricing_proposes_a_history_repeated_on_every_candidate_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Real timings, real model: the default job (rm1: the history pooled by a transformer)
    # runs the transformer once per request instead of once per candidate row with the history
    # deduplicated: far more than the margin. The reader alone gains little from it.
    root = impressions(tmp_path / "t", requests=64)
    fed: list[tuple[int, list[list[str]]]] = []
    seconds = TrainerStep.seconds

    def spy(self: TrainerStep, batches: list[SparseFeatures]) -> float:
        fed.extend((f.batch_size, [i.keys() for i in f.ikjts]) for f in batches)
        return seconds(self, batches)

    monkeypatch.setattr(TrainerStep, "seconds", spy)
    a = analyze_for_job(root, batch_size=256)
    assert a.pricing == "job" and ["history"] in a.dedup_sparse_features
    assert a.job is not None and a.job.startswith(
        "the default training config (model rm1, embedding_dim 16, max_rows 100000, dedup full, "
        "1 thread"
    )
    history = {tuple(g.features): g for g in a.groups}[("history",)]
    assert history.trainer_saving_ms_per_1k is not None
    assert history.reader_saving_ms_per_1k is not None
    assert history.expected_saving_ms_per_1k == pytest.approx(
        history.reader_saving_ms_per_1k + history.trainer_saving_ms_per_1k
    )
    assert set(a.trainer_ms_per_1k) == {"plain", "proposed"}
    # The trainer was fed full batches of the reader's own configurations: plain, and with
    # the history group as an IKJT.
    assert {b for b, _ in fed} == {256}
    assert [] in [g for _, g in fed] and [["history"]] in [g for _, g in fed]
    text = format_report(a)
    assert "priced by: reader + trainer of the default training config (model rm1" in text


# ---------------------------------------------------------------------- recd run == recd analyze
class CountingTimer:
    """Stands in for :class:`JobTimer`: prices a configuration by counting the ids the reader
    copies (plain rows, distinct rows, a probe per row and group) and the ids and rows the
    trainer looks up, and records what it was asked to price."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(
        self,
        batches: list[pa.Table] | Callable[[], list[pa.Table]],
        sparse: list[str],
        *,
        preprocessing: list[dict[str, Any]],
        stacked: Any = (),
        reps: int,
        trainer: TrainerStep | None = None,
    ) -> None:
        self.batches = batches
        self.sparse = sparse
        self.inputs: dict[str, Any] = {
            "sparse": list(sparse),
            "preprocessing": preprocessing,
            "stacked": list(stacked),
            "reps": reps,
            "trainer": None
            if trainer is None
            else (trainer.describe(), trainer.model_config, trainer.preprocessing),
        }
        CountingTimer.made.append(self.inputs)

    def __call__(self, groups: list[list[str]]) -> Cost:
        if callable(self.batches):
            self.batches = self.batches()
            self.inputs["batch_rows"] = [b.num_rows for b in self.batches]
        spec = FeatureSpec(sparse=self.sparse, labels=[], dedup_sparse_features=groups)
        reader = trainer = 0
        for rows in self.batches:
            sparse = convert_sparse(rows, spec, source="counting")
            parts = ([] if sparse.kjt is None else [sparse.kjt]) + [
                i.distinct_kjt() for i in sparse.ikjts
            ]
            ids = sum(int(k.values().numel()) for k in parts)
            looked_up = sum(k.stride() * len(k.keys()) for k in parts)  # rows x keys
            reader += ids + rows.num_rows * len(groups)
            trainer += 4 * ids + 8 * looked_up
        n = sum(b.num_rows for b in self.batches)
        return Cost(reader / n, trainer / n)


TEMPLATE = """
[reader]
table = "../elsewhere/table"        # replaced
batch_size = 128
preprocessing = [
    { kind = "truncate_last", features = ["history"], n = 32 },
    { kind = "log1p", features = ["price"] },
]
dedup_sparse_features = [["item"]]   # replaced by the proposal

[eval]                              # overlaps: the pipeline's holdout_hours would split
start = "2026-11-01T00:00"

[model]
kind = "rm1"
embedding_dim = 8
max_rows = 500                      # the trainer hashes the 1000-id features into 500 rows

[train]
steps = 5
num_threads = 1
"""


@pytest.mark.parametrize("template", [True, False], ids=["train-config", "default-job"])
def test_recd_run_and_recd_analyze_propose_the_same_groups_for_the_same_job(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    template: bool,
) -> None:
    monkeypatch.setattr(analyze_table_module, "JobTimer", CountingTimer)
    monkeypatch.setattr(CountingTimer, "made", [])
    work = tmp_path / "work"
    impressions(work / "table")
    (tmp_path / "train_job.toml").write_text(TEMPLATE)
    config = PipelineConfig(
        work_dir=work,
        analyze=AnalyzeStage(batch_size=None if template else 192),
        train=TrainStage(config="train_job.toml" if template else None),
        config_dir=tmp_path,
    )
    analysis, entry = analysis_stage(config, work)
    printed = capsys.readouterr().out
    command = entry["command"]
    assert f"[4/5 analyze] the same analysis again: {command}" in printed
    assert entry["dedup_sparse_features"] == analysis.dedup_sparse_features
    if template:  # what run_pipeline's training stage writes next, from the template
        write_stage_train_config(work, tmp_path / "train_job.toml", dedup_sparse_features=[])
        assert command == f"recd analyze {work / 'table'} --config {work / 'train.toml'}"
    else:
        assert command == f"recd analyze {work / 'table'} --batch-size 192"

    parser = argparse.ArgumentParser(prog="recd")
    analyze_cli.register(parser.add_subparsers(dest="command", required=True))
    out = tmp_path / "a.json"
    args = parser.parse_args([*shlex.split(command)[1:], "--json", str(out)])
    assert args.func(args) == 0
    data = json.loads(out.read_text())

    run_inputs, cli_inputs = CountingTimer.made
    assert run_inputs == cli_inputs  # the same job, preprocessing, features and batches
    rows = 128 if template else 192  # the template's [reader] batch_size, or [analyze]'s
    assert set(run_inputs["batch_rows"]) == {rows} and analysis.batch_size == rows
    describe, _, preprocessing = run_inputs["trainer"]
    if template:
        assert describe.startswith("model rm1, embedding_dim 8, max_rows 500")
        assert {"kind": "truncate_last", "features": ["history"], "n": 32} in preprocessing
        assert {"kind": "hash_modulo", "features": IMPRESSIONS.sparse_names, "modulo": 500} in (
            preprocessing
        )
    else:
        assert describe.startswith("model rm1, embedding_dim 16, max_rows 100000")
    assert analysis.pricing == data["pricing"] == "job"
    # The trainer's side decides: the one-id user group costs the reader a probe per row but
    # saves the trainer its lookups.
    assert analysis.dedup_sparse_features == [["history"], ["user"]]
    assert data["dedup_sparse_features"] == analysis.dedup_sparse_features
    for kept, priced in zip(data["groups"], analysis.groups, strict=True):
        assert kept["trainer_saving_ms_per_1k"] == pytest.approx(priced.trainer_saving_ms_per_1k)
        assert kept["trainer_saving_ms_per_1k"] > 0


# ---------------------------------------------------------------------- options
def test_cli_batch_size_rules_and_exclusive_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(analyze_table_module, "JobTimer", CountingTimer)
    monkeypatch.setattr(CountingTimer, "made", [])
    root = impressions(tmp_path / "t")
    job = tmp_path / "job.toml"
    job.write_text(TEMPLATE)
    parser = argparse.ArgumentParser(prog="recd")
    analyze_cli.register(parser.add_subparsers(dest="command", required=True))

    def run(*argv: str) -> dict[str, Any]:
        out = tmp_path / "a.json"
        args = parser.parse_args(["analyze", str(root), *argv, "--json", str(out)])
        assert args.func(args) == 0
        return dict(json.loads(out.read_text()))

    assert run("--factor-only", "--config", str(job))["batch_size"] == 128  # the job's
    assert run("--factor-only")["batch_size"] == 512  # the default
    factor = run("--factor-only", "--config", str(job), "--batch-size", "64")
    assert factor["batch_size"] == 64 and factor["pricing"] == "factor"
    assert CountingTimer.made == []  # the factor alone: nothing timed
    # --reader-only with the job: its reader's preprocessing (the trainer's hash included),
    # the reader's features only, no trainer; the one-id user group refused untimed.
    reader = run("--reader-only", "--config", str(job))
    (inputs,) = CountingTimer.made
    assert inputs["trainer"] is None and reader["pricing"] == "reader"
    assert {"kind": "hash_modulo", "features": ["history", "user", "item"], "modulo": 500} in (
        inputs["preprocessing"]
    )
    assert "at most one id per row" in next(
        r["reason"] for r in reader["rejected"] if r["features"] == ["user"]
    )
    assert "priced by: reader only (the reader of the job" in capsys.readouterr().out
    # --preprocessed: the default job's reader hashes every id into its tables (max_rows rows)
    assert run("--preprocessed")["pricing"] == "job"
    hashed = {"kind": "hash_modulo", "features": IMPRESSIONS.sparse_names, "modulo": 100_000}
    assert CountingTimer.made[-1]["preprocessing"] == [hashed]
    assert CountingTimer.made[-1]["trainer"][2] == [hashed]
    # --preprocessed describes the default job's reader: not with a config
    with pytest.raises(SystemExit):
        parser.parse_args(["analyze", str(root), "--preprocessed", "--config", str(job)])
    with pytest.raises(ConfigError, match=r"training config .* names its own"):
        analyze_for_job(root, config=job, preprocessed=True)
    with pytest.raises(SystemExit):
        parser.parse_args(["analyze", str(root), "--reader-only", "--factor-only"])
    with pytest.raises(ConfigError, match="--factor-only times nothing"):
        run("--preprocessed", "--factor-only")
    with pytest.raises(ConfigError, match="pricing = 'fast'"):
        analyze_for_job(root, pricing="fast")  # type: ignore[arg-type]


def test_analyze_stage_keys(tmp_path: Path) -> None:
    def load(section: str) -> PipelineConfig:
        path = tmp_path / "p.toml"
        path.write_text(f'[run]\nwork_dir = "w"\n[analyze]\n{section}\n')
        return PipelineConfig.from_toml(path)

    stage = load("threshold = 2.0").analyze
    assert (stage.batch_size, stage.threshold, stage.pricing) == (None, 2.0, "job")
    assert load('pricing = "reader"').analyze.pricing == "reader"
    with pytest.raises(ConfigError, match=r"\[analyze\] pricing = 'fast'"):
        load('pricing = "fast"')
    with pytest.raises(ConfigError, match=r"\[analyze\] batch_size must be >= 1, got 0"):
        load("batch_size = 0")
