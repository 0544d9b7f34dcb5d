"""The CLI's manners with pipes and versions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from recd import __version__
from recd.checkpoint.atomic import write_checkpoint, write_layout
from recd.checkpoint.format import ParamLayout, ParamSpec


def test_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "recd", "--version"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout.strip() == f"recd {__version__}"


def test_the_command_line_starts_without_torch() -> None:
    """Every command's parser (what ``--help``, ``--version`` and a bad option need) loads
    without torch or torchrec: a command imports them when it runs, not when it registers."""
    code = (
        "import sys\n"
        "from recd.cli import build_parser\n"
        "build_parser()\n"
        "print(sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_reader_that_goes_away_is_not_an_error(tmp_path: Path) -> None:
    """``recd ckpt inspect FILE | head -1``: the report (hundreds of KB: one line per tensor)
    meets a closed pipe; exit 0 and no traceback."""
    layout = ParamLayout(tuple(ParamSpec(f"block{i}.weight", (2, 3)) for i in range(4000)))
    write_layout(tmp_path, layout)
    zeros = np.zeros(layout.n_params, dtype=np.float32)
    path = tmp_path / "step_000001.bin"
    write_checkpoint(path, 1, zeros, zeros, zeros)
    proc = subprocess.Popen(
        [sys.executable, "-m", "recd", "ckpt", "inspect", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()  # what `head -1` reads ...
    proc.stdout.close()  # ... before it exits
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "BrokenPipeError" not in err
