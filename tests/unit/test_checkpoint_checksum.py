"""Checkpoint checksums (``step_NNNNNN.bin.crc32``): every writer records the CRC-32 of the
bytes it wrote, a flipped bit is named by region and skipped like a truncated file, a damaged
sidecar cannot vouch for anything, and a sidecar lives and dies with its checkpoint. (The
trainer's own writer, resume, predict, export, fork and pivot: the integration tests in
tests/integration/test_checkpoint_checksum.py.)"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import (
    CheckpointChecksumError,
    ParamLayout,
    ParamSpec,
    RetentionPolicy,
    apply_retention,
    checkpoint_path,
    checksum_of_file,
    checksum_path,
    clean_stray_temp_files,
    commit,
    copy_checkpoint,
    newest_valid_checkpoint,
    preallocate,
    read_checksum,
    verify_checksum,
    write_checkpoint,
    write_region_range,
)
from recd.checkpoint import atomic as atomic_module
from recd.checkpoint.format import region_byte_offset
from recd.durable import temp_path_for
from recd.train.checkpointing import read_checkpoint_flat

LAYOUT = ParamLayout(
    specs=(ParamSpec("emb.t0", (6, 4)), ParamSpec("mlp.w", (4, 3)), ParamSpec("mlp.b", (3,)))
)


def _regions(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = LAYOUT.n_params
    w = rng.standard_normal(n).astype(np.float32)
    return w, (w * 0.01).astype(np.float32), np.abs(w * 1e-4).astype(np.float32)


def _write(run: Path, step: int) -> Path:
    return write_checkpoint(checkpoint_path(run, step), step, *_regions(step), layout=LAYOUT)


def _flip(path: Path, region: str, element: int = 7, bit: int = 0) -> None:
    offset = region_byte_offset(region, LAYOUT.n_params, element)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << bit)]))


def test_every_writer_records_the_checksum_of_the_bytes_it_wrote(tmp_path: Path) -> None:
    w, m, v = _regions(4)
    one_shot = _write(tmp_path / "one", 4)
    streamed = write_checkpoint(  # one tensor after the other, as the layout iterates them
        checkpoint_path(tmp_path / "streamed", 4),
        4,
        *(LAYOUT.iter_flat(LAYOUT.unflatten(region)) for region in (w, m, v)),
        layout=LAYOUT,
    )
    ranged = checkpoint_path(tmp_path / "ranks", 4)  # a distributed save: ranged pwrites
    ranged.parent.mkdir()
    tmp = preallocate(temp_path_for(ranged, "job1"), 4, LAYOUT.n_params)
    for region, values in zip(("weights", "adam_m", "adam_v"), (w, m, v), strict=True):
        for lo, hi in ((20, LAYOUT.n_params), (0, 20)):
            write_region_range(tmp, region, lo, values[lo:hi])
    commit(tmp, ranged)  # no checksum given: computed from the temp file
    copied = checkpoint_path(tmp_path / "copy", 4)
    checksum, sha = copy_checkpoint(one_shot, copied)

    sidecar = checksum_path(one_shot).read_bytes()
    for path in (streamed, ranged, copied):
        assert path.read_bytes() == one_shot.read_bytes()
        assert checksum_path(path).read_bytes() == sidecar
        assert verify_checksum(path) == "ok"
    assert checksum == checksum_of_file(one_shot) == read_checksum(one_shot)
    assert len(sha) == 64
    doc = json.loads(sidecar)
    assert doc["file"] == "step_000004.bin" and doc["algorithm"] == "crc32"
    assert doc["step"] == 4 and doc["n_params"] == LAYOUT.n_params
    assert doc["size_bytes"] == one_shot.stat().st_size


@pytest.mark.parametrize("region", ["weights", "adam_m", "adam_v"])
def test_a_flipped_bit_is_named_by_region_and_skipped_with_one_warning(
    region: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    older, newest = _write(tmp_path, 100), _write(tmp_path, 200)
    _flip(newest, region)
    with pytest.raises(CheckpointChecksumError) as caught:
        verify_checksum(newest)
    message = str(caught.value)
    assert message.startswith(f"{newest}: checksum does not match ({region} crc32 ")
    assert "step_000200.bin.crc32 says" in message and message.count(" crc32 ") == 1
    with pytest.raises(CheckpointChecksumError, match="checksum does not match"):
        read_checkpoint_flat(newest, LAYOUT)  # the bytes it read into memory
    assert read_checkpoint_flat(newest, LAYOUT, verify=False).step == 200
    with caplog.at_level(logging.WARNING, logger="recd.checkpoint"):
        assert newest_valid_checkpoint(tmp_path, LAYOUT) == older
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith(f"skipping checkpoint {newest}: {newest}: checksum does not match")
    assert newest_valid_checkpoint(tmp_path, LAYOUT, verify=False) == newest  # sizes alone
    _flip(newest, region)  # flipped back: the bytes are as written again
    assert verify_checksum(newest) == "ok"


def test_a_checkpoint_without_a_sidecar_is_absent_not_failed(tmp_path: Path) -> None:
    path = _write(tmp_path, 100)
    checksum_path(path).unlink()
    assert read_checksum(path) is None and verify_checksum(path) == "absent"
    assert newest_valid_checkpoint(tmp_path, LAYOUT) == path
    assert read_checkpoint_flat(path, LAYOUT).step == 100


def test_a_damaged_or_foreign_sidecar_cannot_vouch_for_its_checkpoint(tmp_path: Path) -> None:
    first, second = _write(tmp_path, 100), _write(tmp_path, 200)
    shutil.copyfile(checksum_path(first), checksum_path(second))  # another write's checksum
    with pytest.raises(CheckpointChecksumError, match="was written for step 100"):
        verify_checksum(second)
    checksum_path(second).write_text('{"format": "recd-checkpoint-checksum", "crc32": 7}')
    with pytest.raises(CheckpointChecksumError, match="not a valid checkpoint checksum file"):
        verify_checksum(second)
    checksum_path(second).write_bytes(b"\x00\xff not json")
    with pytest.raises(CheckpointChecksumError, match="delete it to load the checkpoint"):
        verify_checksum(second)
    assert newest_valid_checkpoint(tmp_path, LAYOUT) == first  # skipped like a corrupt file


def test_retention_deletes_checksums_with_their_checkpoints(tmp_path: Path) -> None:
    for step in range(1, 7):
        _write(tmp_path, step)
    policy = RetentionPolicy(keep_last=2, keep_every=2, checkpoint_every=1)
    deleted = apply_retention(tmp_path, policy, layout=LAYOUT)
    assert [p.name for p in deleted] == ["step_000001.bin", "step_000003.bin"]
    assert sorted(p.name for p in tmp_path.glob("step_*")) == [
        f"step_{k:06d}.bin{suffix}" for k in (2, 4, 5, 6) for suffix in ("", ".crc32")
    ]


def test_the_sidecar_is_committed_before_its_checkpoint_and_an_orphan_is_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kept = _write(tmp_path, 100)

    def killed(tmp: object, final: object) -> None:
        raise OSError("killed before the checkpoint's rename")

    monkeypatch.setattr(atomic_module, "replace_durably", killed)
    with pytest.raises(OSError, match="killed"):
        _write(tmp_path, 200)
    monkeypatch.undo()
    orphan = checksum_path(checkpoint_path(tmp_path, 200))
    assert orphan.exists() and not checkpoint_path(tmp_path, 200).exists()
    assert newest_valid_checkpoint(tmp_path, LAYOUT) == kept  # an orphan is ignored
    assert clean_stray_temp_files(tmp_path) == [orphan]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_000100.bin",
        "step_000100.bin.crc32",
    ]


def test_a_copy_that_lands_damaged_is_caught_by_its_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``copy_checkpoint`` (fork) reads the copy back after committing it: bytes damaged on
    the way to the disk fail its checksum even though the source was sound."""
    source = _write(tmp_path / "src", 3)
    real_commit = atomic_module.commit

    def damaging_commit(tmp: Path, final: Path, **kwargs: object) -> Path:
        _flip(Path(tmp), "adam_m")
        return real_commit(tmp, final, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(atomic_module, "commit", damaging_commit)
    with pytest.raises(CheckpointChecksumError):
        copy_checkpoint(source, checkpoint_path(tmp_path / "copy", 3))
