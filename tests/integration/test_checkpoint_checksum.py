"""A flipped bit in a checkpoint is detected: every checkpoint the real trainer writes gets
its CRC-32 sidecar (``step_NNNNNN.bin.crc32``), and every reader that loads weights checks it.

The checkpoints are the never-stopped reference run's of test_checkpoint_resume (the real
trainer, a checkpoint after every step). One bit of the weights region is flipped in place, a
low mantissa bit: the value stays finite, the size and the header stay valid, so only the
checksum can tell. Then ``recd ckpt verify`` fails naming the file and the region, ``recd
predict``, ``recd ckpt export``, ``recd fork`` and ``recd pivot`` refuse it (exit 2, one line),
``recd train --resume`` falls back to the previous checkpoint and still ends bit-exact with the
never-stopped run. A checkpoint without a sidecar (as an older recd wrote it) still loads,
and verify reports its checksum absent; retention deletes a sidecar with its checkpoint and a
pivot archives it with its checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from recd.checkpoint import (
    LOSS_FILE,
    checkpoint_path,
    checksum_path,
    fork_run,
    list_checkpoints,
    newest_valid_checkpoint,
    parse_checkpoint_step,
    read_checkpoint,
    read_layout,
    remove_checkpoint,
    verify_checksum,
)
from recd.checkpoint.export import export_checkpoint
from recd.checkpoint.format import region_byte_offset
from recd.cli import main
from recd.train.config import load_train_config
from recd.train.inference import Scorer
from recd.train.run import run_training
from tests.integration.test_checkpoint_resume import (
    EVERY,
    N,
    Reference,
    assert_matches_reference,
    recd_train,
    reference,
    run_child,
    scenario_config,
    sha256,
    table,
    warning_lines,
)

__all__ = ["reference", "table"]  # module-scoped fixtures: the real table, the reference run


def flip_bit(path: Path, region: str = "weights", bit: int = 0) -> int:
    """Flip bit ``bit`` of the float in the middle of ``region``, in place; returns its index.
    Bit 0 is the lowest mantissa bit: the value stays finite."""
    layout = read_layout(path.parent)
    element = layout.n_params // 2
    offset = region_byte_offset(region, layout.n_params, element)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))
    return element


def copy_run(ref: Reference, tmp_path: Path, *, keep_up_to: int = N) -> tuple[Path, Path]:
    """The reference run directory (checkpoints 1..``keep_up_to``, with their checksums) and
    the EVERY-cadence config that resumes it."""
    config, run_dir = scenario_config(ref, tmp_path)
    shutil.copytree(ref.run_dir, run_dir)
    for path in list_checkpoints(run_dir):
        if (parse_checkpoint_step(path.name) or 0) > keep_up_to:
            remove_checkpoint(path)
    return config, run_dir


def test_the_trainer_writes_a_checksum_beside_every_checkpoint(reference: Reference) -> None:
    names = sorted(p.name for p in reference.run_dir.glob("step_*"))
    steps = [f"step_{k:06d}.bin" for k in range(1, N + 1)]
    assert names == sorted(steps + [s + ".crc32" for s in steps])
    for k in range(1, N + 1):
        path = checkpoint_path(reference.run_dir, k)
        assert verify_checksum(path) == "ok"
        sidecar = json.loads(checksum_path(path).read_text())
        assert sidecar["file"] == path.name and sidecar["step"] == k
        assert set(sidecar["crc32"]) == {"header", "weights", "adam_m", "adam_v"}


def test_ckpt_verify_fails_a_flipped_weight_bit_naming_the_file_and_the_region(
    reference: Reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, run_dir = copy_run(reference, tmp_path)
    bad, good = checkpoint_path(run_dir, N), checkpoint_path(run_dir, N - 1)
    element = flip_bit(bad)
    assert abs(float(read_checkpoint(bad).weights[element])) < float("inf")  # still finite
    assert main(["ckpt", "verify", str(bad), str(good)]) == 1
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith(f"FAIL  {bad}: checksum does not match (weights crc32 ")
    assert f"{bad.name}.crc32 says" in first
    assert "header" not in first and "adam_m" not in first and "adam_v" not in first
    assert second == f"ok    {good} (step {N - 1}, checksum ok)"
    assert main(["ckpt", "verify", str(bad), "--json"]) == 1
    (report,) = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["checksum"] == "mismatch"
    assert report["error"].startswith(f"{bad}: checksum does not match")


def test_predict_refuses_a_flipped_bit_and_a_run_directory_uses_the_previous_checkpoint(
    reference: Reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = copy_run(reference, tmp_path)
    bad = checkpoint_path(run_dir, N)
    flip_bit(bad)
    out = tmp_path / "predictions.parquet"
    argv = ["predict", "--config", str(config), "--checkpoint", str(bad), "--out", str(out)]
    assert main(argv) == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("recd")]
    assert error.startswith(f"recd predict: error: {bad}: checksum does not match (weights")
    assert not out.exists()
    scorer = Scorer.from_checkpoint(load_train_config(config), run_dir)  # newest *valid* one
    assert scorer.checkpoint == checkpoint_path(run_dir, N - 1) and scorer.step == N - 1


def test_resume_falls_back_past_a_flipped_bit_and_ends_bit_exact(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = copy_run(reference, tmp_path, keep_up_to=7)
    newest = checkpoint_path(run_dir, 7)
    flip_bit(newest)
    done = recd_train(config, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    (warning,) = warning_lines(done.stderr)
    assert f"skipping checkpoint {newest}: {newest}: checksum does not match (weights" in warning
    assert f"resumed from {checkpoint_path(run_dir, 6)} (step 6)" in done.stderr
    assert sha256(checkpoint_path(run_dir, 10)) == reference.sha[10]
    assert_matches_reference(reference, run_dir)  # final bytes, one loss record per step
    for step in (10, N):  # what the resumed run wrote carries its checksum
        assert verify_checksum(checkpoint_path(run_dir, step)) == "ok"


def test_a_checkpoint_without_a_checksum_still_loads_and_verify_says_absent(
    reference: Reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = copy_run(reference, tmp_path, keep_up_to=10)
    old = checkpoint_path(run_dir, 10)
    checksum_path(old).unlink()  # as a recd that stored no checksums wrote it
    assert main(["ckpt", "verify", str(run_dir)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"ok    {old} (step 10, checksum absent)"
    assert len(lines) == 10 and all(line.endswith(", checksum ok)") for line in lines[1:])
    assert verify_checksum(old) == "absent"
    assert newest_valid_checkpoint(run_dir) == old
    assert Scorer.from_checkpoint(load_train_config(config), old).step == 10
    exported = export_checkpoint(old, tmp_path / "model.pt", read_layout(run_dir))
    assert exported.step == 10
    assert run_child(config, resume=True) == 0  # resumes from it, bit-exact
    assert_matches_reference(reference, run_dir)
    assert verify_checksum(checkpoint_path(run_dir, N)) == "ok"
    assert not checksum_path(old).exists()  # an old checkpoint is left as it was


def test_export_fork_and_pivot_refuse_a_flipped_source(
    reference: Reference, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, run_dir = copy_run(reference, tmp_path)
    bad = checkpoint_path(run_dir, EVERY)
    flip_bit(bad, "weights", bit=3)
    history = (run_dir / LOSS_FILE).read_bytes()
    files = sorted(p.name for p in run_dir.glob("step_*"))
    exported = tmp_path / "model.pt"
    branch = tmp_path / "branch"
    commands = {
        "ckpt": ["ckpt", "export", str(bad), str(exported)],
        "fork": ["fork", str(bad), str(branch)],
        "pivot": ["pivot", str(run_dir), "--config", str(config), "--from", str(EVERY)],
    }
    for name, argv in commands.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        (line,) = [line for line in err.splitlines() if line.startswith("recd")]
        assert line.startswith(f"recd {name}: error: {bad}: checksum does not match"), line
    assert not exported.exists() and not branch.exists()
    assert not (run_dir / "archive").exists()  # the pivot moved nothing
    assert sorted(p.name for p in run_dir.glob("step_*")) == files
    assert (run_dir / LOSS_FILE).read_bytes() == history

    fork_run(checkpoint_path(run_dir, EVERY + 1), branch)  # a sound source forks, checksum too
    assert verify_checksum(checkpoint_path(branch, EVERY + 1)) == "ok"
    argv = ["pivot", str(run_dir), "--config", str(config), "--from", str(N - 2), "--no-train"]
    assert main(argv) == 0
    (archive,) = (run_dir / "archive").iterdir()
    assert sorted(p.name for p in archive.glob("step_*")) == [  # moved with their checksums
        f"step_{k:06d}.bin{suffix}" for k in (N - 1, N) for suffix in ("", ".crc32")
    ]
    assert verify_checksum(archive / f"step_{N:06d}.bin") == "ok"
    assert (
        max(parse_checkpoint_step(p.with_suffix("").name) or 0 for p in run_dir.glob("*.crc32"))
        == N - 2
    )


def test_retention_deletes_a_checksum_with_its_checkpoint(
    reference: Reference, tmp_path: Path
) -> None:
    config, run_dir = scenario_config(reference, tmp_path)
    text = config.read_text().replace("checkpoint_every = 5", "checkpoint_every = 2")
    config.write_text(text.replace("keep_last = 100", "keep_last = 2"))
    run_training(load_train_config(config), show_progress=False)
    assert sorted(p.name for p in run_dir.glob("step_*")) == [
        "step_000010.bin",
        "step_000010.bin.crc32",
        "step_000012.bin",
        "step_000012.bin.crc32",
    ]
    assert verify_checksum(checkpoint_path(run_dir, 10)) == "ok"
    assert verify_checksum(checkpoint_path(run_dir, 12)) == "ok"
