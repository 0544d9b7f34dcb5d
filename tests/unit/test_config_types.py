"""Every config value of the wrong type ends in one line naming the key and the value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from recd.errors import ConfigError
from recd.reader.config import Shuffle
from recd.train.config import TrainConfig

BASE: dict[str, dict[str, Any]] = {"reader": {"table": "/nonexistent/table"}}


def with_value(section: str, key: str, value: Any) -> dict[str, dict[str, Any]]:
    data = {name: dict(body) for name, body in BASE.items()}
    data.setdefault(section, {})[key] = value
    return data


@pytest.mark.parametrize(
    ("section", "key", "value", "expected"),
    [
        ("optim", "lr", "fast", "expected `float`, got `str`"),
        ("reader", "end", 2026, "expected `str | null`, got `int`"),
        ("reader", "drop_last", "no", "expected `bool`, got `str`"),
        ("reader", "batch_size", 1.5, "expected `int`, got `float`"),
        ("reader", "batch_size", True, "expected `int`, got `bool`"),
        ("reader", "shuffle", "row", "invalid enum value 'row'"),
        ("reader", "dedup_sparse_features", [["a"], [1]], "expected `str`, got `int`"),
        ("train", "plot", "no", "expected `bool`, got `str`"),
        ("train", "steps", "100", "expected `int`, got `str`"),
        ("train", "run_dir", 5, "expected `str`, got `int`"),
        ("model", "embedding_dim", [16], "expected `int`, got `array`"),
        ("checkpoint", "keep_last", "3", "expected `int`, got `str`"),
    ],
)
def test_a_wrong_type_names_the_key_and_the_value(
    section: str, key: str, value: Any, expected: str
) -> None:
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(with_value(section, key, value), source="job.toml")
    message = str(info.value)
    assert message.startswith("job.toml") and "\n" not in message
    assert f"[{section}] {key} = {value!r}" in message and expected in message


def test_values_of_the_right_type_are_converted() -> None:
    data = with_value("optim", "lr", 1)  # an integer for a float
    data["reader"]["shuffle"] = "session"
    config = TrainConfig.from_dict(data)
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
    assert config.reader.shuffle is Shuffle.SESSION


def test_recd_train_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[reader]\ntable = "/nonexistent"\n[optim]\nlr = "fast"\n')
    proc = subprocess.run(
        [sys.executable, "-m", "recd", "train", "--config", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "[optim] lr = 'fast': expected `float`, got `str`" in lines[0]


def test_a_training_config_loads_without_torch() -> None:
    """``recd train --config`` validates the whole config (reader, model, optimizer sections)
    before it imports torch: a typo costs well under a second, not torch's import."""
    config = Path(__file__).resolve().parents[2] / "pipelines" / "train_small.toml"
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from recd.train.config import load_train_config\n"
        f"load_train_config(Path({str(config)!r}))\n"
        "print(sorted(m for m in ('torch', 'torchrec', 'fbgemm_gpu') if m in sys.modules))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert proc.stdout.strip() == "[]", proc.stdout
