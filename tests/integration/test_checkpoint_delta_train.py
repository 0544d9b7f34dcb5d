"""Delta checkpoints written by the real trainer: every step restores bit-exactly from its
chain, a chain materialises to the full checkpoint's bytes, and a run killed between deltas
resumes from its chain (or, past a torn delta, from the chain's sound prefix) to the
uninterrupted run's final checkpoint."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import checkpoint_path, write_checkpoint
from recd.checkpoint.chain import chain_paths, read_any
from recd.checkpoint.delta import delta_filename, read_delta
from tests.integration.test_checkpoint_resume import make_config, run_child, sha256
from tests.integration.test_train_job import table

__all__ = ["table"]

N = 12
FULL_EVERY = 4


def _with_full_every(config: Path, full_every: int, *, background: bool = True) -> Path:
    extra = f"full_every = {full_every}\n" + ("" if background else "background = false\n")
    config.write_text(config.read_text().replace("[checkpoint]\n", "[checkpoint]\n" + extra))
    return config


@pytest.fixture(scope="module")
def runs(table: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The reference (a full checkpoint every step) and the same run with deltas."""
    root = tmp_path_factory.mktemp("delta_runs")
    ref = make_config(root / "ref.toml", table, root / "ref", every=1)
    assert run_child(ref) == 0
    deltas = _with_full_every(
        make_config(root / "delta.toml", table, root / "delta", every=1), FULL_EVERY
    )
    assert run_child(deltas) == 0
    return root / "ref", root / "delta"


def _file_of(run_dir: Path, step: int) -> Path:
    full = checkpoint_path(run_dir, step)
    return full if full.exists() else run_dir / delta_filename(step)


def test_every_step_restores_bit_exactly_from_its_chain(
    runs: tuple[Path, Path], tmp_path: Path
) -> None:
    ref, deltas = runs
    kinds = []
    for step in range(1, N + 1):
        path = _file_of(deltas, step)
        kinds.append("d" if path.suffix == ".delta" else "f")
        ckpt = read_any(path)
        made = write_checkpoint(
            tmp_path / f"step_{step:06d}.bin", step, ckpt.weights, ckpt.adam_m, ckpt.adam_v
        )
        assert sha256(made) == sha256(checkpoint_path(ref, step)), step
    # the first checkpoint and every FULL_EVERY-th after it are full; the last one too
    assert "".join(kinds) == "fdddfdddfddf"


def test_a_delta_holds_only_the_rows_its_steps_touched(runs: tuple[Path, Path]) -> None:
    ref, deltas = runs
    delta = read_delta(deltas / delta_filename(2))
    full = read_any(checkpoint_path(ref, 2))
    before = read_any(checkpoint_path(ref, 1))
    changed = np.flatnonzero(full.weights != before.weights)
    covered = np.concatenate([b.element_index() for b in delta.blocks])
    assert np.isin(changed, covered).all()  # nothing that changed is missing
    assert delta.path.stat().st_size < checkpoint_path(ref, 2).stat().st_size
    assert [p.name for p in chain_paths(deltas / delta_filename(4))] == [
        "step_000001.bin",
        "step_000002.delta",
        "step_000003.delta",
        "step_000004.delta",
    ]


@pytest.mark.parametrize("torn", [False, True])
def test_a_run_killed_between_deltas_resumes_to_the_same_bytes(
    runs: tuple[Path, Path], table: Path, tmp_path: Path, torn: bool
) -> None:
    ref, _ = runs
    config = make_config(tmp_path / "c.toml", table, tmp_path / "run", every=1)
    config = _with_full_every(config, FULL_EVERY, background=False)  # step 6 is on disk at 7
    assert run_child(config, signal_at=(7, signal.SIGKILL)) == -signal.SIGKILL
    newest = tmp_path / "run" / delta_filename(6)
    assert newest.exists()
    if torn:  # a delta cut short: the chain's sound prefix (step 5) is resumed from
        newest.write_bytes(newest.read_bytes()[:-5])
    assert run_child(config, resume=True) == 0
    result = json.loads((tmp_path / "run" / "train.json").read_text())["result"]
    resumed = 5 if torn else 6
    assert result["first_step"] == resumed  # from the chain, or its sound prefix
    assert checkpoint_path(tmp_path / "run", resumed + 1).exists()  # a full one after a resume
    assert sha256(checkpoint_path(tmp_path / "run", N)) == sha256(checkpoint_path(ref, N))
