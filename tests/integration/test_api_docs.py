"""The examples of docs/api.md run as written, against a real table and a real run."""

from __future__ import annotations

import doctest
from pathlib import Path

import pytest

from recd.schema import Catalogue
from tests.tables import build_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"

CONFIG = """
[reader]
table = "{table}"
end = "2026-11-01T01:00"
batch_size = 64
shuffle = "session"
num_epochs = 5
dedup_sparse_features = [["user_history"]]

[eval]
start = "2026-11-01T01:00"
batch_size = 96

[model]
kind = "rm1"
embedding_dim = 8
max_rows = 1000

[model.sequence]
num_heads = 2
ff_dim = 16

[train]
steps = 12
log_every = 4
eval_every = 0
run_dir = "{run_dir}"
plot = false

[checkpoint]
checkpoint_every = 6
"""


@pytest.mark.slow
def test_the_api_examples_run(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    table = build_table(tmp_path, tiny_catalogue, seed=7, num_sessions=500)
    config = tmp_path / "train.toml"
    config.write_text(CONFIG.format(table=table, run_dir=tmp_path / "run"))
    (tmp_path / "out").mkdir()
    globs = {
        "TABLE": str(table),
        "CONFIG": config,
        "RUN_DIR": tmp_path / "run",
        "OUT_DIR": tmp_path / "out",
    }
    test = doctest.DocTestParser().get_doctest(DOC.read_text(), globs, str(DOC), str(DOC), 0)
    assert len(test.examples) >= 20, "the API page lost its examples"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0 and result.attempted == len(test.examples)
