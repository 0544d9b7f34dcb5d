"""``recd ckpt export``: both formats are written with the mode any new file gets."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import ParamLayout, ParamSpec, checkpoint_path, write_checkpoint, write_layout
from recd.cli import main

LAYOUT = ParamLayout(specs=(ParamSpec("emb.t0", (6, 4)), ParamSpec("mlp.b", (3,))))


@pytest.fixture
def umask() -> Iterator[int]:
    """A umask of 022 for the test (restored after): new files get mode 0644."""
    old = os.umask(0o022)
    try:
        yield 0o022
    finally:
        os.umask(old)


@pytest.mark.parametrize("with_optimizer", [False, True])
def test_safetensors_and_state_dict_exports_get_the_same_mode(
    tmp_path: Path, umask: int, with_optimizer: bool
) -> None:
    run = tmp_path / "run"
    write_layout(run, LAYOUT)
    regions = [np.full(LAYOUT.n_params, x, dtype=np.float32) for x in (0.5, 0.01, 1e-4)]
    ckpt = write_checkpoint(checkpoint_path(run, 7), 7, *regions, layout=LAYOUT)
    extra = ["--with-optimizer"] if with_optimizer else []
    modes = {}
    for fmt, name in (("state_dict", "model.pt"), ("safetensors", "model.safetensors")):
        out = tmp_path / name
        assert main(["ckpt", "export", str(ckpt), str(out), "--format", fmt, *extra]) == 0
        modes[fmt] = stat.S_IMODE(out.stat().st_mode)
    assert modes == {"state_dict": 0o666 & ~umask, "safetensors": 0o666 & ~umask}
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no temp file left beside the exports
