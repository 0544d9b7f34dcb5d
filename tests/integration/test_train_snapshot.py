"""A training run reads one Iceberg snapshot of its table, and a resume reads it again.

The table is a private copy of the tiny training table (the real generate -> shard -> ETL).
Run A trains 6 of 12 steps and stops; then an ETL run of another log lands in the same table
(it rewrites the training hour and the held-out hours); run A resumes to step 12. Its final
checkpoint must equal, byte for byte, that of a run that trained 12 steps uninterrupted
before the new data landed, and ``train.json`` names the snapshot both read.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from recd.checkpoint import checkpoint_path
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.logs.generate import generate_logs
from recd.logs.shard import shard_logs
from recd.schema import Catalogue
from recd.table.snapshot import committed_files
from recd.train.config import load_train_config
from recd.train.run import run_training
from tests.integration.test_checkpoint_resume import make_config
from tests.tables import build_table

STEPS = 12


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow
def test_resume_after_new_data_landed_reads_the_same_snapshot(
    tmp_path: Path, tiny_catalogue: Catalogue
) -> None:
    table = build_table(tmp_path / "data", tiny_catalogue, seed=3, num_sessions=600)
    snapshot = committed_files(table).snapshot_id
    assert snapshot is not None

    reference = make_config(tmp_path / "ref.toml", table, tmp_path / "ref", every=5)
    ref = run_training(load_train_config(reference), show_progress=False)
    assert ref.steps == STEPS and ref.table_snapshot == snapshot

    first = make_config(tmp_path / "a.toml", table, tmp_path / "run", every=5, steps=6)
    part = run_training(load_train_config(first), show_progress=False)
    assert part.steps == 6

    # New data lands: another log's rows replace the hours this job trains and evaluates on.
    generate_logs(tiny_catalogue, tmp_path / "raw2", seed=99, num_sessions=600, show_progress=False)
    shard_logs(
        tmp_path / "raw2", tmp_path / "shards2", key="session", num_shards=2, show_progress=False
    )
    run_etl(
        EtlConfig(
            shard_dir=tmp_path / "shards2", table_dir=table, row_group_rows=256, show_progress=False
        )
    )
    assert committed_files(table).snapshot_id != snapshot

    rest = make_config(tmp_path / "b.toml", table, tmp_path / "run", every=5)
    resumed = run_training(load_train_config(rest), show_progress=False, resume=True)
    assert resumed.first_step == 6 and resumed.steps == STEPS
    assert resumed.table_snapshot == snapshot
    final = checkpoint_path(tmp_path / "run", STEPS)
    assert sha256(final) == sha256(checkpoint_path(tmp_path / "ref", STEPS))
    assert resumed.final_eval is not None and ref.final_eval is not None
    assert resumed.final_eval.ne == ref.final_eval.ne  # held-out hours of the old snapshot
    summary = json.loads((tmp_path / "run" / "train.json").read_text())
    assert summary["result"]["table_snapshot"] == snapshot

    # A fresh run on the same table reads the new snapshot.
    fresh = make_config(tmp_path / "c.toml", table, tmp_path / "fresh", every=5, steps=1)
    assert run_training(load_train_config(fresh), show_progress=False).table_snapshot != snapshot
