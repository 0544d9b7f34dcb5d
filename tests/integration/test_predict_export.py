"""Using a trained checkpoint: ``recd predict`` scores a table range exactly as the trainer's
evaluation does; ``recd ckpt export`` writes weights that load into a model of the config."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from recd.cli import main
from recd.models import DLRM
from recd.schema import Catalogue
from recd.train.build import build_model_config
from recd.train.checkpointing import Checkpointer
from recd.train.config import TrainConfig, load_train_config
from recd.train.inference import Scorer, predict_table
from recd.train.loop import Trainer
from tests.tables import build_table

CONFIG = """
[reader]
table = "{table}"
end = "2026-11-01T01:00"
batch_size = 64
shuffle = "session"
num_epochs = 5
dedup_sparse_features = [["user_history"]]
preprocessing = [{{ kind = "log1p", features = ["user_age_days", "item_price"] }}]

[eval]
start = "2026-11-01T01:00"
batch_size = 96

[model]
kind = "rm1"
embedding_dim = 8
max_rows = 1000

[model.sequence]
num_heads = 2
ff_dim = 16

[optim]
lr = 0.01

[train]
steps = 12
log_every = 4
eval_every = 0
seed = 0
run_dir = "{run_dir}"
plot = false

[checkpoint]
checkpoint_every = 6
"""


@pytest.fixture(scope="module")
def trained(
    tmp_path_factory: pytest.TempPathFactory, tiny_catalogue: Catalogue
) -> tuple[Path, TrainConfig, Any]:
    """A table, a 12-step run with checkpoints, and the trainer's own held-out evaluation of
    the final weights (every held-out row)."""
    root = tmp_path_factory.mktemp("predict")
    table = build_table(root, tiny_catalogue, seed=5, num_sessions=600)
    path = root / "train.toml"
    path.write_text(CONFIG.format(table=table, run_dir=root / "run"))
    config = load_train_config(path)
    trainer = Trainer(config, show_progress=False)
    checkpointer = Checkpointer(config)
    checkpointer.attach(trainer)
    trainer.hooks.append(checkpointer)
    try:
        trainer.train()
        checkpointer.close()
        evaluation = trainer.evaluate()
    finally:
        trainer.close()
    return path, config, evaluation


def test_predict_equals_the_trainers_evaluation_on_the_same_rows(
    trained: tuple[Path, TrainConfig, Any], tmp_path: Path
) -> None:
    _, config, evaluation = trained
    out = tmp_path / "preds.parquet"
    report = predict_table(
        config,
        config.train.run_dir,  # a run directory: its newest checkpoint
        out,
        start=config.eval.start if config.eval else None,
        batch_size=37,  # batching does not change a row's prediction
        show_progress=False,
    )
    assert report.step == 12 and report.checkpoint.name == "step_000012.bin"
    assert report.rows == evaluation.rows
    assert report.loss == pytest.approx(evaluation.loss, rel=1e-6)
    table = pq.read_table(out)
    assert table.num_rows == report.rows
    assert table.column_names == [
        "session_id",
        "request_id",
        "ts",
        "label",
        "logit_label",
        "prediction_label",
    ]
    logits = table.column("logit_label").to_numpy().astype(np.float64)
    probs = table.column("prediction_label").to_numpy()
    assert np.allclose(probs, 1 / (1 + np.exp(-logits)), atol=1e-6)
    assert table.column("label").to_numpy().mean() == pytest.approx(evaluation.base_rate)
    ts = table.column("ts").to_numpy()
    assert ts.min() >= 1_793_494_800_000  # 2026-11-01T01:00 UTC: the held-out range only


def test_predict_cli_writes_once_and_refuses_to_overwrite(
    trained: tuple[Path, TrainConfig, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, config, evaluation = trained
    out = tmp_path / "cli.parquet"
    argv = ["predict", "--config", str(path), "--checkpoint", str(config.train.run_dir)]
    argv += ["--out", str(out), "--eval-range"]
    assert main(argv) == 0
    assert f"predicted {evaluation.rows:,} rows" in capsys.readouterr().out
    before = out.read_bytes()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "already exists; pass --overwrite" in err and len(err.strip().splitlines()) == 1
    assert out.read_bytes() == before
    assert main([*argv, "--overwrite"]) == 0


@pytest.mark.parametrize("fmt", ["state_dict", "safetensors"])
def test_exported_weights_load_into_the_model_and_predict_the_same(
    trained: tuple[Path, TrainConfig, Any], tmp_path: Path, fmt: str
) -> None:
    _, config, _ = trained
    ckpt = config.train.run_dir / "step_000012.bin"
    out = tmp_path / f"model.{fmt}"
    assert main(["ckpt", "export", str(ckpt), str(out), "--format", fmt]) == 0
    scorer = Scorer.from_checkpoint(config, ckpt)
    if fmt == "safetensors":
        from safetensors.torch import load_file

        state = load_file(str(out))
    else:
        state = torch.load(out, weights_only=True)
    model = DLRM(build_model_config(config, scorer.catalogue), device=torch.device("cpu"))
    model.load_state_dict(state, strict=True)
    model.eval()
    reader = scorer.range_reader(start=None, end=None, batch_size=50)
    from recd.reader import ResumableLoader

    batch = next(iter(ResumableLoader(reader)))
    with torch.no_grad():
        assert torch.equal(model(batch.dense, batch.sparse), scorer.logits(batch))


def test_export_with_the_optimizer_state(
    trained: tuple[Path, TrainConfig, Any], tmp_path: Path
) -> None:
    from recd.checkpoint.format import read_checkpoint

    _, config, _ = trained
    ckpt = config.train.run_dir / "step_000012.bin"
    out = tmp_path / "full.pt"
    assert main(["ckpt", "export", str(ckpt), str(out), "--with-optimizer"]) == 0
    doc = torch.load(out, weights_only=True)
    assert doc["step"] == 12 and set(doc) == {"model", "adam_m", "adam_v", "step"}
    flat = read_checkpoint(ckpt)
    m = torch.cat([t.reshape(-1) for t in doc["adam_m"].values()]).numpy()
    assert np.array_equal(m, flat.adam_m) and math.isfinite(float(m.sum()))
