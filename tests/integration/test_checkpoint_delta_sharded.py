"""Delta checkpoints of a sharded run (``recd train --nproc 2``, tables row-wise): each rank
writes the rows of its own blocks, rank 0 the rest, and every chain restores the reference
run's state; survivor recovery with peer copies and deltas ends in the reference's bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import checkpoint_path, read_checkpoint
from recd.checkpoint.chain import read_any
from recd.checkpoint.delta import delta_filename
from tests.integration.test_train_job import table
from tests.integration.test_train_survivor import STEPS, _config, _records, _train, reference

__all__ = ["reference", "table"]

FULL_EVERY = 3


def _with_deltas(config: Path) -> Path:
    text = config.read_text().replace(
        "[checkpoint]\n", f"[checkpoint]\nfull_every = {FULL_EVERY}\n"
    )
    config.write_text(text)
    return config


def _file_of(run_dir: Path, step: int) -> Path:
    full = checkpoint_path(run_dir, step)
    return full if full.exists() else run_dir / delta_filename(step)


def _assert_same_state(path: Path, reference: Path, step: int) -> None:
    got, want = read_any(path), read_checkpoint(checkpoint_path(reference, step))
    assert got.step == want.step == step
    for region in ("weights", "adam_m", "adam_v"):
        assert np.array_equal(got.region(region), want.region(region)), (step, region)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_chain_of_a_sharded_run_restores_the_reference(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    config = _with_deltas(_config(tmp_path, table, "run", every=1))
    proc = _train(config, "--recovery", "survivor")
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = ""
    for step in range(1, STEPS + 1):
        path = _file_of(tmp_path / "run", step)
        kinds += "d" if path.suffix == ".delta" else "f"
        _assert_same_state(path, reference, step)
    assert kinds == "fddfddfddfddfddf"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_peer_copy_recovery_with_deltas_ends_in_the_reference_bytes(
    tmp_path: Path, table: Path, reference: Path
) -> None:
    config = _with_deltas(_config(tmp_path, table, "run", every=1))
    kills = "0:1:4:forward,0:0:9:optimizer"
    proc = _train(config, "--recovery", "survivor", "--peer-copy", kills=kills)
    run_dir = tmp_path / "run"
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert [r["bit_exact"] for r in _records(run_dir)] == [True, True]
    for step in range(1, STEPS + 1):  # every chain, across both recoveries
        _assert_same_state(_file_of(run_dir, step), reference, step)
    final = f"step_{STEPS:06d}.bin"
    assert (run_dir / final).read_bytes() == (reference / final).read_bytes()
