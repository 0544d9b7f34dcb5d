"""The reader tier on Ray Data, on a real local Ray cluster (2 CPUs): the batches equal the
local reader's (KJT and IKJT configs), resume is exact mid-epoch (also across engines), a
Ray worker process killed mid-epoch costs nothing (its chunk is read again), a bad row is
raised as in the local reader, and `recd train` with `engine = "ray"` trains exactly as with
the local reader and checkpoints; and benchmarks/reader_tier.py at toy size."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ray = pytest.importorskip("ray")

from benchmarks.reader_tier import main as bench_main  # noqa: E402
from recd.errors import BadRowError, ConfigError  # noqa: E402
from recd.reader import ReaderConfig  # noqa: E402
from recd.reader.dataset import ResumableLoader  # noqa: E402
from recd.reader.plan import build_plan  # noqa: E402
from recd.reader.ray_tier import KILL_DIR_ENV, chunk_list, ray_dataset  # noqa: E402
from recd.schema import load_catalogue  # noqa: E402
from tests.tables import build_table  # noqa: E402
from tests.unit.test_reader_dataset import assert_same_batch  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.fixture(scope="module")
def kill_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-kills")


@pytest.fixture(scope="module")
def cluster(kill_dir: Path) -> Iterator[None]:
    """One local Ray cluster for the module; its workers inherit the kill hook's directory."""
    saved = os.environ.get(KILL_DIR_ENV)
    os.environ[KILL_DIR_ENV] = str(kill_dir)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
    if saved is None:
        os.environ.pop(KILL_DIR_ENV, None)
    else:
        os.environ[KILL_DIR_ENV] = saved


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ray-table")
    return build_table(root, load_catalogue("tiny"), seed=3, num_sessions=300)


def configs(table: Path) -> dict[str, ReaderConfig]:
    common = {"table": str(table), "batch_size": 64, "num_workers": 2, "num_epochs": 2}
    return {
        "kjt": ReaderConfig(**common, shuffle="row_group"),  # type: ignore[arg-type]
        "ikjt": ReaderConfig(
            **common,  # type: ignore[arg-type]
            shuffle="session",
            shuffle_window=192,  # 3 batches: a window is one Ray task's chunk
            dedup_sparse_features=[["user_history"]],
            preprocessing=[{"kind": "hash_modulo", "features": ["user_history"], "modulo": 97}],
            ray_chunk_batches=3,
        ),
    }


def on_ray(config: ReaderConfig) -> ReaderConfig:
    return dataclasses.replace(config, engine="ray")


def assert_same_batches(a: list, b: list) -> None:  # type: ignore[type-arg]
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert_same_batch(x, y)


@pytest.mark.parametrize("kind", ["kjt", "ikjt"])
def test_batches_equal_the_local_readers(cluster: None, table: Path, kind: str) -> None:
    config = configs(table)[kind]
    local = list(ResumableLoader(dataclasses.replace(config, num_workers=0)))  # main process
    remote = ResumableLoader(on_ray(config))
    assert_same_batches(local, list(remote))
    assert_same_batches(local, list(remote))  # a finished loader starts over, on Ray too
    if kind == "ikjt":
        assert all(b.sparse.ikjts for b in local)


def test_resume_mid_epoch_is_exact_on_ray_and_across_engines(cluster: None, table: Path) -> None:
    config = configs(table)["ikjt"]
    local = list(ResumableLoader(config))
    first = ResumableLoader(on_ray(config))
    taken = []
    for batch in first:
        taken.append(batch)
        if len(taken) == 7:  # mid-epoch 0, mid-chunk (chunks of 3 batches)
            break
    state = first.state_dict()
    resumed = ResumableLoader(on_ray(config))
    resumed.load_state_dict(state)
    assert_same_batches(local, taken + list(resumed))
    # A position saved by the local reader continues on Ray (engine is not part of it).
    local_loader = ResumableLoader(config)
    head = [b for _, b in zip(range(len(local) // 2 + 1), local_loader, strict=False)]
    on_ray_loader = ResumableLoader(on_ray(config))
    on_ray_loader.load_state_dict(local_loader.state_dict())
    assert_same_batches(local, head + list(on_ray_loader))


def test_a_killed_reader_worker_loses_and_duplicates_nothing(
    cluster: None, table: Path, kill_dir: Path
) -> None:
    config = configs(table)["ikjt"]
    local = list(ResumableLoader(config))
    totals = ResumableLoader(config).epoch_totals(0)
    chunks = chunk_list(totals, [0] * config.streams, config.window_rows // config.batch_size)
    assert len(chunks) >= 4
    victims = [f"e0-s{chunks[3][0]}-b{chunks[3][1]}", f"e1-s0-b{config.ray_chunk_batches}"]
    for name in victims:
        (kill_dir / f"{name}.kill").touch()
    remote = list(ResumableLoader(on_ray(config)))
    assert sorted(p.name for p in kill_dir.iterdir()) == sorted(f"{v}.killed" for v in victims)
    assert_same_batches(local, remote)


def test_a_bad_row_is_raised_with_its_file_row_and_column(cluster: None, tmp_path: Path) -> None:
    rows = pa.table({"label": [0.0, 1.0, 0.0], "item": pa.array([1, None, 3], pa.int64())})
    (tmp_path / "t").mkdir()
    pq.write_table(rows, tmp_path / "t" / "part-0.parquet")
    config = ReaderConfig(
        table=str(tmp_path / "t"), labels=["label"], dense=[], sparse=["item"], engine="ray"
    )
    with pytest.raises(BadRowError, match=r"part-0.parquet: row 1: field 'item': null id"):
        list(ResumableLoader(config))


def test_the_dataset_is_ordered_and_capped_without_touching_the_process_settings(
    cluster: None, table: Path
) -> None:
    from ray.data import DataContext

    config = dataclasses.replace(on_ray(configs(table)["kjt"]), ray_memory_mb=64)
    before = DataContext.get_current().execution_options
    before_order, before_limits = before.preserve_order, before.resource_limits
    plan = build_plan(config)
    totals = ResumableLoader(config).epoch_totals(0)
    dataset = ray_dataset(plan, [(0, totals, [0] * config.streams)])
    options = dataset.context.execution_options
    assert options.preserve_order  # chunks come back in list order
    assert options.resource_limits.object_store_memory == 64 * 2**20  # Ray's backpressure cap
    now = DataContext.get_current().execution_options
    assert now.preserve_order == before_order and now.resource_limits == before_limits
    assert ray_dataset(plan, [(0, totals, totals)]) is None  # nothing left: no execution


def test_each_rank_gets_its_own_split_equal_to_the_local_readers(
    cluster: None, table: Path
) -> None:
    """Two ranks sharing this cluster (``ray_address`` set: the process already joined it):
    each rank's batches are the local reader's batches of that rank."""
    config = dataclasses.replace(configs(table)["ikjt"], num_epochs=1)
    for rank in range(2):
        local = dataclasses.replace(config, world_size=2, rank=rank)
        remote = dataclasses.replace(local, engine="ray", ray_address="auto")
        assert_same_batches(list(ResumableLoader(local)), list(ResumableLoader(remote)))


def test_several_ranks_need_one_shared_cluster(table: Path) -> None:
    with pytest.raises(ConfigError, match=r"needs reader\.ray_address"):
        dataclasses.replace(on_ray(configs(table)["kjt"]), world_size=2)


def test_recd_train_on_ray_trains_like_the_local_reader_and_checkpoints(
    table: Path, tmp_path: Path
) -> None:
    """Two real `recd train` runs, local reader and Ray reader (a local cluster started for
    the job): the same loss at every step, and a checkpoint."""
    losses = {}
    for engine in ("local", "ray"):
        run = tmp_path / engine
        run.mkdir()
        (run / "train.toml").write_text(
            f"""
[reader]
table = "{table}"
batch_size = 64
shuffle = "session"
num_workers = 2
num_epochs = 2
engine = "{engine}"
dedup_sparse_features = [["user_history"]]

[model]
kind = "rm1"
embedding_dim = 8

[train]
steps = 12
run_dir = "run"

[checkpoint]
checkpoint_every = 6
"""
        )
        done = subprocess.run(
            [sys.executable, "-m", "recd", "train", "--config", "train.toml"],
            cwd=run, capture_output=True, text=True, timeout=300,
            env={**os.environ, "RECD_PROGRESS": "0"},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert (run / "run" / "step_000012.bin").is_file()
        lines = (run / "run" / ".loss.json").read_text().splitlines()
        losses[engine] = [json.loads(line) for line in lines]
        assert [e["step"] for e in losses[engine]] == list(range(1, 13))
    assert losses["ray"] == losses["local"]
    shutil.rmtree(tmp_path / "ray" / "run")


def test_reader_tier_benchmark_quick_run_writes_consistent_results(
    cluster: None, tmp_path: Path
) -> None:
    """benchmarks/reader_tier.py at toy size (``--quick``) on this module's cluster: every
    reported number measured and consistent with the others (no timing assertions)."""
    out = tmp_path / "reader_tier.json"
    argv = ["--quick", "--work-dir", str(tmp_path / "work"), "--out", str(out)]
    assert bench_main(argv) == 0
    result = json.loads(out.read_text())
    protocol = result["protocol"]
    assert protocol["reps"] == 1 and len(protocol["orders"]) == 1
    assert (
        sorted(protocol["orders"][0])
        == sorted(result["tiers"])
        == [
            "dataloader_w1",
            "inline",
            "ray_w1",
        ]
    )
    assert protocol["step_calibrated"] and protocol["step_ms"] > 0
    assert not protocol["ray_started_here"]
    for name, tier in result["tiers"].items():
        assert tier["rows"] == protocol["table_rows"] > 0, name  # the whole table, every tier
        assert tier["passes"] == 1 and tier["failed_passes"] == 0
        for key in ("samples_per_s", "stall_fraction", "wall_s"):
            s = tier[key]
            assert s["min"] <= s["median"] <= s["max"], (name, key)
        assert 0.0 <= tier["stall_fraction"]["median"] <= 1.0
        assert tier["samples_per_s"]["median"] == pytest.approx(
            tier["rows"] / tier["wall_s"]["median"]
        )
    wire = result["wire"]
    assert wire["wire_ratio_kjt_over_ikjt"] == pytest.approx(
        wire["kjt"]["pickled_bytes_per_batch"] / wire["ikjt"]["pickled_bytes_per_batch"]
    )
    assert out.with_suffix(".md").read_text().count("\n| ") == 4  # header + 3 tiers
    assert out.with_suffix(".png").stat().st_size > 0
