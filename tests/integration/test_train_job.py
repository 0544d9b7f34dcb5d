"""The training job end to end on a tiny table built by the real pipeline (generate -> shard ->
clustering ETL): ``recd train`` as a subprocess, determinism, resume from captured state,
hooks, config errors, the ``make run`` stage, and a 2-process torchrun run."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from recd.errors import ConfigError
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.schema import Catalogue
from recd.train.config import TrainConfig, load_train_config
from recd.train.loop import Trainer
from recd.train.results import TrainResult
from recd.train.run import run_training, train_from_pipeline
from tests.tables import build_table

REPO = Path(__file__).resolve().parents[2]
DENSE = ["user_age_days", "item_price"]

# Hours 00 (~2.7k rows) train, hours 01-03 (~3.3k rows) are held out.
CONFIG = """
[reader]
table = "{table}"
end = "2026-11-01T01:00"
batch_size = {batch_size}
shuffle = "session"
num_epochs = {num_epochs}
dedup_sparse_features = [["user_country"], ["user_history"], ["cart_item_ids", "cart_seller_ids"]]
preprocessing = [{{ kind = "log1p", features = ["user_age_days", "item_price"] }}]

[eval]
start = "2026-11-01T01:00"
batch_size = 512
max_batches = {eval_batches}

[model]
kind = "{kind}"
embedding_dim = 8
max_rows = 1000          # below item_id's 5000 ids: the trainer adds hash_modulo

[model.sequence]
num_heads = 2
ff_dim = 16

[optim]
lr = 0.01
embedding_lr = 0.01

[train]
steps = {steps}
log_every = 5
eval_every = {eval_every}
seed = {seed}
run_dir = "{run_dir}"
sharding = "{sharding}"
"""


def write_config(path: Path, table: Path, run_dir: Path, **overrides: Any) -> Path:
    values: dict[str, Any] = {
        "table": table,
        "run_dir": run_dir,
        "batch_size": 64,
        "num_epochs": 5,
        "eval_batches": 2,
        "kind": "rm1",
        "steps": 100,
        "eval_every": 50,
        "seed": 0,
        "sharding": "table_wise",
    }
    values.update(overrides)
    path.write_text(CONFIG.format(**values))
    return path


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory, tiny_catalogue: Catalogue) -> Path:
    """The tiny profile with 1000 sessions through the real generate -> shard -> ETL."""
    root = tmp_path_factory.mktemp("train-table")
    return build_table(root, tiny_catalogue, seed=3, num_sessions=1000, block_bytes=1 << 16)


@pytest.fixture(scope="module")
def dedup_table(table: Path, tiny_catalogue: Catalogue) -> Path:
    """The same rows in the dedup layout, every sparse feature encoded."""
    out = table.parent / "table_dedup"
    run_etl(
        EtlConfig(
            shard_dir=table.parent / "shards",
            table_dir=out,
            row_group_rows=256,
            layout="dedup",
            dedup_features=tiny_catalogue.sparse_names,
            show_progress=False,
        )
    )
    return out


def small_config(tmp_path: Path, table: Path, name: str, **overrides: Any) -> TrainConfig:
    """A fast in-process config: plain DLRM, batch 256, a few steps."""
    values: dict[str, Any] = {"kind": "dlrm", "batch_size": 256, "steps": 16, "eval_every": 8}
    values.update(overrides)
    path = write_config(tmp_path / f"{name}.toml", table, tmp_path / name, **values)
    return load_train_config(path)


def train(config: TrainConfig) -> TrainResult:
    return run_training(config, show_progress=False)


def recd_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    env["RECD_PROGRESS"] = "0"
    env["OMP_NUM_THREADS"] = "1"
    return env


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------- the command
@pytest.mark.slow
def test_recd_train_learns_and_writes_metrics_and_plot(tmp_path: Path, table: Path) -> None:
    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "train.toml", table, tmp_path / "unused")
    proc = subprocess.run(
        [sys.executable, "-m", "recd", "train", "--config", str(config), "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        env=recd_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "held-out" in proc.stdout and "samples/s" in proc.stdout
    assert "is_fx_tracing" not in proc.stderr  # torch.fx's warning about torchrec: filtered

    records = read_metrics(run_dir / "metrics.jsonl")
    train_lines = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train_lines] == list(range(5, 101, 5))
    assert [r["step"] for r in evals] == [50, 100]
    for r in train_lines:
        assert r["samples_per_s"] > 0 and r["peak_rss_bytes"] > 0
        assert r["samples_per_cpu_s"] > 0  # the reader runs in-process: its CPU counts too
    assert train_lines[-1]["loss"] < train_lines[0]["loss"]

    summary = json.loads((run_dir / "train.json").read_text())["result"]
    assert summary["steps"] == 100
    assert summary["loss_last10_mean"] < summary["loss_first10_mean"]
    final = evals[-1]
    assert math.isfinite(final["ne"]) and math.isfinite(final["loss"])
    assert final["rows"] == 1024  # eval.max_batches = 2 batches of 512
    assert 0.5 < final["auc"] <= 1.0, final

    png = (run_dir / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    import matplotlib.image

    assert matplotlib.image.imread(run_dir / "loss.png").shape[:2] == (400, 700)


def test_recd_train_reports_config_errors(tmp_path: Path, table: Path) -> None:
    from recd.cli.train import register  # the handler, without the CLI's command registry

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    config = write_config(tmp_path / "t.toml", table, tmp_path / "run")
    args = parser.parse_args(["train", "--config", str(config), "--steps", "0"])
    with pytest.raises(ConfigError, match="--steps: expected an integer >= 1, got 0"):
        args.func(args)


# ---------------------------------------------------------------------- determinism, state
def test_same_seed_gives_identical_losses(tmp_path: Path, table: Path) -> None:
    a = train(small_config(tmp_path, table, "a"))
    b = train(small_config(tmp_path, table, "b"))
    other = train(small_config(tmp_path, table, "c", seed=1))
    assert a.steps == b.steps == 16
    assert a.losses == b.losses  # bit-identical
    assert [e.to_dict() | {"seconds": 0} for e in a.evals] == [
        e.to_dict() | {"seconds": 0} for e in b.evals
    ]
    assert other.losses != a.losses
    assert all(math.isfinite(x) for x in a.losses)


def test_the_dedup_layout_trains_like_the_plain_one(
    tmp_path: Path, table: Path, dedup_table: Path
) -> None:
    # Same rows, same batches: the first step's loss is bit-identical. The dedup layout's
    # IKJTs keep repeats that are not adjacent as separate entries, so embedding gradients
    # are summed in another order afterwards: equal to float rounding.
    plain = train(small_config(tmp_path, table, "plain"))
    ours = train(small_config(tmp_path, dedup_table, "dedup"))
    assert ours.steps == plain.steps == 16
    assert ours.losses[0] == plain.losses[0]
    assert ours.losses == pytest.approx(plain.losses, rel=1e-4)


def test_resume_from_captured_state_is_bit_exact(tmp_path: Path, table: Path) -> None:
    # 11 batches of 256 per epoch: the resumed half crosses an epoch boundary.
    reference = Trainer(small_config(tmp_path, table, "straight", steps=16), show_progress=False)
    straight = reference.train()
    expected = reference.capture_state().params
    reference.close()

    first = Trainer(small_config(tmp_path, table, "first", steps=7), show_progress=False)
    head = first.train()
    state = first.capture_state()
    first.close()
    assert state.step == 7 and state.params.step == 7

    second = Trainer(small_config(tmp_path, table, "second", steps=16), show_progress=False)
    second.restore_state(state)
    tail = second.train()

    assert head.losses + tail.losses == straight.losses
    assert tail.first_step == 7 and tail.steps == 16
    final = second.capture_state().params
    assert final.step == expected.step == 16
    assert final.weights.tobytes() == expected.weights.tobytes()
    assert final.adam_m.tobytes() == expected.adam_m.tobytes()
    assert final.adam_v.tobytes() == expected.adam_v.tobytes()
    second.close()


class StopAt:
    def __init__(self, step: int) -> None:
        self.step = step
        self.seen: list[tuple[int, float]] = []

    def after_step(self, trainer: Trainer, step: int, loss: float) -> None:
        self.seen.append((step, loss))
        if step == self.step:
            trainer.request_stop(f"asked to stop at {step}")


def test_hooks_see_every_step_and_can_stop(tmp_path: Path, table: Path) -> None:
    hook = StopAt(3)
    result = run_training(small_config(tmp_path, table, "hook"), hooks=[hook], show_progress=False)
    assert result.steps == 3 and result.stop_reason == "asked to stop at 3"
    assert hook.seen == list(zip([1, 2, 3], result.losses, strict=True))


def test_training_in_table_order_is_warned_about(
    tmp_path: Path, table: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path / "job.toml", table, tmp_path / "run", kind="dlrm")
    for shuffle, warned in (("none", True), ("rows", False)):
        path.write_text(path.read_text().replace('shuffle = "session"', f'shuffle = "{shuffle}"'))
        caplog.clear()
        with caplog.at_level("WARNING", logger="recd.train.loop"):
            Trainer(load_train_config(path), show_progress=False).close()
        said = [
            r.getMessage() for r in caplog.records if "reader.shuffle = 'none'" in r.getMessage()
        ]
        assert bool(said) == warned, shuffle
        path.write_text(path.read_text().replace(f'shuffle = "{shuffle}"', 'shuffle = "session"'))


def test_training_stops_when_the_reader_runs_out(tmp_path: Path, table: Path) -> None:
    config = small_config(tmp_path, table, "short", steps=1000, num_epochs=1, eval_every=0)
    result = train(config)
    assert result.steps == 11  # ceil(~2.7k rows / 256)
    assert result.stop_reason is not None and "ran out of batches" in result.stop_reason
    assert result.final_eval is not None and result.final_eval.step == 11


def test_make_run_stage_trains_on_the_work_dir_table(tmp_path: Path, table: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "table").symlink_to(table, target_is_directory=True)
    config = write_config(tmp_path / "pipe.toml", Path("unused/table"), tmp_path / "unused")
    result = train_from_pipeline(
        work,
        config,
        dedup_sparse_features=[["user_history"], ["cart_item_ids", "cart_seller_ids"]],
        steps=4,
        show_progress=False,
    )
    assert result.steps == 4 and result.run_dir == work / "train"
    assert (work / "train" / "metrics.jsonl").is_file()
    assert (work / "train" / "loss.png").is_file()
    saved = json.loads((work / "train" / "train.json").read_text())["config"]["reader"]
    assert saved["dedup_sparse_features"] == [
        ["user_history"],
        ["cart_item_ids", "cart_seller_ids"],
    ]


# ---------------------------------------------------------------------- config checks
@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace('start = "2026-11-01T01:00"', 'start = "2026-11-01T00:00"'),
            "overlaps",
        ),
        (lambda t: t.replace("[optim]", "[optim]\nmomentum = 0.9"), "unknown key(s) momentum"),
        (
            lambda t: t.replace("embedding_dim = 8", "embedding_dim = 8\nbottom_mlp = [16, 4]"),
            "model.bottom_mlp: the last size 4 must equal model.embedding_dim = 8",
        ),
        (
            lambda t: t.replace('kind = "rm1"', 'kind = "rm2"'),
            "[model] kind = 'rm2': invalid enum value 'rm2'; expected one of 'dlrm', 'rm1'",
        ),
        (lambda t: t.replace("steps = 100", "steps = 0"), "train.steps: expected an integer >= 1"),
        (
            lambda t: t.replace('sharding = "table_wise"', 'sharding = "diagonal"'),
            "train.sharding: 'diagonal' is not one of",
        ),
        (lambda t: t.replace("[eval]", "[evaluation]"), "unknown table(s) evaluation"),
    ],
)
def test_config_errors_name_the_field(tmp_path: Path, table: Path, edit: Any, message: str) -> None:
    path = write_config(tmp_path / "bad.toml", table, tmp_path / "run")
    path.write_text(edit(path.read_text()))
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_train_config(path)


def test_hash_modulo_larger_than_the_table_is_rejected(tmp_path: Path, table: Path) -> None:
    config = small_config(tmp_path, table, "hash")
    config.reader.preprocessing.append(
        {"kind": "hash_modulo", "features": ["item_id"], "modulo": 4000}
    )
    with pytest.raises(ConfigError, match="hash_modulo of 'item_id' by 4000"):
        Trainer(config, show_progress=False)


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path, table: Path) -> None:
    (tmp_path / "conf").mkdir()
    rel_table = os.path.relpath(table, tmp_path / "conf")
    path = write_config(tmp_path / "conf" / "t.toml", Path(rel_table), Path("out/run"))
    config = load_train_config(path)
    assert Path(config.reader.table).resolve() == table.resolve()
    assert config.train.run_dir == (tmp_path / "conf" / "out" / "run").resolve()
    assert config.reader.seed == config.train.seed == 0


# ---------------------------------------------------------------------- two processes
@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(420)
def test_two_process_torchrun_smoke_run(tmp_path: Path, table: Path) -> None:
    run_dir = tmp_path / "dist"
    config = write_config(tmp_path / "dist.toml", table, run_dir, kind="rm1", steps=8, eval_every=4)
    proc = subprocess.run(
        [sys.executable, "-m", "recd", "train", "--config", str(config), "--nproc", "2"],
        capture_output=True,
        text=True,
        env=recd_env(),
        timeout=360,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    assert proc.stdout.count("held-out") == 1  # rank 0 prints the summary
    result = json.loads((run_dir / "train.json").read_text())["result"]
    assert result["world_size"] == 2 and result["steps"] == 8
    assert result["samples"] == 8 * 2 * 64  # every step: 64 rows on each rank
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "train"] == [5, 8]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [4, 8]
    assert all(math.isfinite(r["ne"]) and 0.0 <= r["auc"] <= 1.0 for r in evals)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_two_nodes_on_localhost_train_like_two_processes_on_one(
    tmp_path: Path, table: Path
) -> None:
    """``--nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT`` on two "machines" (two
    launchers on localhost, one process each) gives the same checkpoint, byte for byte, as
    ``--nproc 2`` on one."""
    from tests.distributed.spawn import free_port

    def train(run_dir: Path, *extra: str) -> subprocess.Popen[str]:
        config = write_config(tmp_path / f"{run_dir.name}.toml", table, run_dir, steps=6)
        command = [sys.executable, "-m", "recd", "train", "--config", str(config), *extra]
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=recd_env()
        )

    endpoint = f"127.0.0.1:{free_port()}"
    multi = ["--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", endpoint]
    nodes = [train(tmp_path / "nodes", *multi, "--node-rank", str(rank)) for rank in (0, 1)]
    for rank, proc in enumerate(nodes):
        out, err = proc.communicate(timeout=420)
        assert proc.returncode == 0, (rank, out[-2000:], err[-4000:])
    single = train(tmp_path / "single", "--nproc", "2")
    out, err = single.communicate(timeout=420)
    assert single.returncode == 0, (out[-2000:], err[-4000:])
    a = (tmp_path / "nodes" / "step_000006.bin").read_bytes()
    b = (tmp_path / "single" / "step_000006.bin").read_bytes()
    assert a == b
    summary = json.loads((tmp_path / "nodes" / "train.json").read_text())["result"]
    assert summary["world_size"] == 2


def _no_constant(name: str) -> None:
    raise ValueError(f"not strict JSON: {name}")


def test_a_resumed_run_writes_outputs_for_the_whole_run(tmp_path: Path, table: Path) -> None:
    """``train.json`` and ``loss.png`` after ``--resume`` cover steps 1..N, not the last
    segment; every file is strict JSON; resuming a finished run trains nothing and rewrites
    nothing."""
    from recd.train.results import format_summary

    run_dir = tmp_path / "run"
    config = write_config(tmp_path / "t.toml", table, run_dir, steps=30, eval_every=10)
    first_cfg = load_train_config(config)
    first_cfg.checkpoint.checkpoint_every = 10
    first = run_training(first_cfg, show_progress=False)
    assert first.steps == 30
    cfg = load_train_config(config)
    cfg.checkpoint.checkpoint_every = 10
    cfg.train.steps = 50
    second = run_training(cfg, show_progress=False, resume=True)
    assert (second.first_step, second.steps) == (30, 50)

    doc = json.loads((run_dir / "train.json").read_text(), parse_constant=_no_constant)
    run, segment = doc["run"], doc["result"]
    assert (segment["first_step"], segment["steps"]) == (30, 50)
    assert run["losses_from"] == ".loss.json"
    assert (run["steps_recorded"], run["first_step"], run["last_step"]) == (50, 1, 50)
    assert run["loss_first10_mean"] == pytest.approx(sum(first.losses[:10]) / 10)
    assert run["loss_last10_mean"] == pytest.approx(sum(second.losses[-10:]) / 10)
    assert [e["step"] for e in run["evals"]] == [10, 20, 30, 40, 50]
    assert run["final_eval"] == run["evals"][-1] == second.evals[-1].to_dict()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=_no_constant)
    assert (run_dir / "loss.png").read_bytes().startswith(b"\x89PNG")

    before = {name: (run_dir / name).read_bytes() for name in ("train.json", "loss.png")}
    again = run_training(cfg, show_progress=False, resume=True)
    assert again.already_done and again.steps == 50 and not again.losses
    assert "already at step 50: nothing to train" in format_summary(again)
    assert {name: (run_dir / name).read_bytes() for name in before} == before
