"""Finite values in checkpoints: ``check_finite`` names the file, region, tensor and first bad
index; a resume's fallback (``newest_valid_checkpoint(check=...)``) skips such a file like a
truncated one, with one warning line; ``recd ckpt verify`` reports it (exit 1)."""

from __future__ import annotations

import argparse
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import (
    CheckpointCorruptError,
    CheckpointNonFiniteError,
    ParamLayout,
    ParamSpec,
    check_checkpoint_finite,
    check_finite,
    checkpoint_path,
    checksum_of_file,
    newest_valid_checkpoint,
    write_checkpoint,
    write_checksum,
    write_layout,
)
from recd.checkpoint.format import region_byte_offset
from recd.cli import ckpt as ckpt_cli

LAYOUT = ParamLayout(
    specs=(ParamSpec("emb.t0", (6, 4)), ParamSpec("mlp.w", (4, 3)), ParamSpec("mlp.b", (3,)))
)


def _regions(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = LAYOUT.n_params
    w = rng.standard_normal(n).astype(np.float32)
    m = (rng.standard_normal(n) * 0.01).astype(np.float32)
    v = np.abs(rng.standard_normal(n) * 1e-4).astype(np.float32)
    return w, m, v


def _write(run: Path, step: int) -> Path:
    write_layout(run, LAYOUT)
    return write_checkpoint(checkpoint_path(run, step), step, *_regions(step), layout=LAYOUT)


def _poke(path: Path, region: str, element: int, value: float) -> None:
    """Overwrite one float of ``region`` in place and record the new bytes' checksum, as a
    trainer that wrote that value would have: size, header and checksum stay valid, so only
    the finite check can tell."""
    with open(path, "r+b") as f:
        f.seek(region_byte_offset(region, LAYOUT.n_params, element))
        f.write(np.array([value], dtype="<f4").tobytes())
    write_checksum(path, checksum_of_file(path))


def test_finite_regions_pass_and_the_first_bad_value_is_named() -> None:
    w, m, v = _regions()
    check_finite("x.bin", (w, m, v), layout=LAYOUT)
    v[LAYOUT.offset_of("mlp.w") + 5] = np.nan  # mlp.w[1, 2]
    v[LAYOUT.offset_of("mlp.b") + 1] = np.inf
    m[3] = -np.inf  # emb.t0[0, 3]: adam_m comes before adam_v in the file
    with pytest.raises(CheckpointNonFiniteError) as caught:
        check_finite("x.bin", (w, m, v), layout=LAYOUT)
    assert str(caught.value) == (
        "x.bin: non-finite value -inf in adam_m of tensor 'emb.t0' (shape (6, 4)) at index "
        "(0, 3) (element 3 of adam_m); non-finite values: weights 0, adam_m 1, adam_v 2"
    )
    m[3] = 0.0
    with pytest.raises(
        CheckpointNonFiniteError, match=re.escape("'mlp.w' (shape (4, 3)) at index (1, 2)")
    ):
        check_finite("x.bin", (w, m, v), layout=LAYOUT)
    with pytest.raises(CheckpointNonFiniteError, match="nan in element 29 of adam_v"):
        check_finite("x.bin", (w, m, v))  # no layout: the flat index only


def test_a_nan_checkpoint_is_skipped_like_a_truncated_one_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (100, 200, 300):
        _write(tmp_path, step)
    newest = checkpoint_path(tmp_path, 300)
    _poke(newest, "weights", LAYOUT.offset_of("mlp.b"), np.nan)
    assert newest_valid_checkpoint(tmp_path, LAYOUT) == newest  # sizes alone: valid
    with caplog.at_level(logging.INFO, logger="recd.checkpoint"):
        chosen = newest_valid_checkpoint(
            tmp_path, LAYOUT, check=lambda p: check_checkpoint_finite(p, LAYOUT)
        )
    assert chosen == checkpoint_path(tmp_path, 200)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert "step_000300.bin" in warnings[0] and "weights of tensor 'mlp.b'" in warnings[0]
    assert "falling back to the previous one" in warnings[0]

    for step in (100, 200):
        _poke(checkpoint_path(tmp_path, step), "adam_v", 0, np.inf)
    with pytest.raises(CheckpointCorruptError, match="none of 3 checkpoints is valid"):
        newest_valid_checkpoint(tmp_path, LAYOUT, check=lambda p: check_checkpoint_finite(p))


def _verify(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="recd")
    ckpt_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["ckpt", "verify", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_ckpt_verify_reports_nonfinite_values(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good, bad = _write(tmp_path, 1), _write(tmp_path, 2)
    assert _verify([str(good)], capsys) == (0, f"ok    {good} (step 1, checksum ok)\n")
    _poke(bad, "adam_m", LAYOUT.offset_of("emb.t0", row=5), np.nan)
    code, out = _verify([str(tmp_path)], capsys)  # a run directory: newest first
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith(f"FAIL  {bad}: non-finite value nan in adam_m of tensor 'emb.t0'")
    assert "at index (5, 0)" in lines[0] and lines[1] == f"ok    {good} (step 1, checksum ok)"
    code, out = _verify([str(bad), "--json"], capsys)
    (report,) = json.loads(out)
    assert code == 1 and report["ok"] is False and "adam_m" in report["error"]
