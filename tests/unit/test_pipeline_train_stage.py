"""The training stage's pipeline keys: the template checked against the log's catalogue (a
name the log lacks ends the run in one line), ``[train] log1p_dense`` (log1p of the log's
dense features, the user's own steps left alone), ``[train] demo_resume`` (on in ``small``
only); the shipped ``own_data`` template fits the smallest log a mapping describes."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import pytest

from recd.errors import ConfigError
from recd.logs import rawlog
from recd.logs.example_events import make_events
from recd.logs.ingest import ingest_events
from recd.logs.ingest_mapping import IngestMapping
from recd.pipeline import (
    PipelineConfig,
    TrainStage,
    check_train_template,
    log1p_features,
    write_stage_train_config,
)
from recd.pipelines import DIR, SHIPPED
from recd.schema import Catalogue

TEMPLATE = DIR / "train_own_data.toml"


def ingested(tmp_path: Path, rows: list[list[str]], mapping: IngestMapping) -> Catalogue:
    """The catalogue ``recd logs ingest`` writes for ``rows`` (header first)."""
    src = tmp_path / "events.csv"
    with src.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    ingest_events(src, tmp_path / "raw", mapping=mapping, show_progress=False)
    return rawlog.read_catalogue(tmp_path / "raw")


@pytest.fixture
def smallest_log(tmp_path: Path) -> Catalogue:
    """A log of session, time, item and event only, no history: the fewest features."""
    rows = [["session_id", "ts", "item_id", "event_type"]]
    rows += [
        [f"s{i % 3}", str(1_700_000_000_000 + i * 1000), str(i), ["view", "cart"][i % 2]]
        for i in range(9)
    ]
    return ingested(tmp_path, rows, IngestMapping(history=0))


@pytest.fixture
def example_log(tmp_path: Path) -> Catalogue:
    """The example shop clickstream with the shipped mapping: price, category, brand."""
    mapping = IngestMapping.from_toml(DIR / "own_data_mapping.toml")
    return ingested(tmp_path, make_events(300, hours=1.0), mapping)


def template(tmp_path: Path, reader: str) -> Path:
    path = tmp_path / "mine.toml"
    path.write_text(f'[reader]\ntable = "t"\n{reader}\n[model]\nkind = "rm1"\n')
    return path


def test_the_own_data_template_fits_any_log_its_mapping_describes(
    smallest_log: Catalogue, example_log: Catalogue
) -> None:
    assert smallest_log.dense_names == ["secs_since_prev_event"]  # no hist_len, no price
    for catalogue in (smallest_log, example_log):
        check_train_template(TEMPLATE, catalogue)
        assert log1p_features(TEMPLATE, catalogue) == catalogue.dense_names
    assert {"hist_len", "price"} <= set(example_log.dense_names)


@pytest.mark.parametrize(
    ("reader", "message"),
    [
        (
            'preprocessing = [{ kind = "log1p", features = ["secs_since_prev_event", "price"] }]',
            "[reader] preprocessing[0] (log1p) names 'price', which is not a dense feature of "
            "this log (its dense features: secs_since_prev_event)",
        ),
        (
            'dense = ["price"]',
            "[reader] dense names 'price', which is not a dense feature of this log",
        ),
        (
            'preprocessing = [{ kind = "hash_modulo", features = ["brand_id"], modulo = 9 }]',
            "[reader] preprocessing[0] (hash_modulo) names 'brand_id', which is not a sparse "
            "feature of this log (its sparse features: item_id)",
        ),
        (
            'sparse = ["item_id"]\npreprocessing = [{ kind = "truncate_last", '
            'features = ["hist_item_ids"], n = 5 }]',
            "(truncate_last) names 'hist_item_ids', which is not a sparse feature of this log "
            "(its sparse features: item_id)",
        ),
        ('labels = ["clicked"]', "[reader] labels names 'clicked', which is not a label"),
    ],
)
def test_a_name_the_log_lacks_ends_in_one_line_naming_template_key_and_name(
    tmp_path: Path, smallest_log: Catalogue, reader: str, message: str
) -> None:
    path = template(tmp_path, reader)
    with pytest.raises(ConfigError) as info:
        check_train_template(path, smallest_log)
    text = str(info.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text


def test_log1p_dense_leaves_the_users_own_steps_alone(
    tmp_path: Path, example_log: Catalogue
) -> None:
    mine = [
        {"kind": "normalize", "features": ["price"], "mean": 3.0, "std": 1.0},
        {"kind": "hash_modulo", "features": ["item_id"], "modulo": 100},  # sparse: no claim
    ]
    steps = ", ".join(
        "{ " + ", ".join(f"{k} = {v!r}".replace("'", '"') for k, v in s.items()) + " }"
        for s in mine
    )
    path = template(tmp_path, f"preprocessing = [{steps}]")
    check_train_template(path, example_log)
    features = log1p_features(path, example_log)
    assert features == [n for n in example_log.dense_names if n != "price"]
    (tmp_path / "w").mkdir()
    text = write_stage_train_config(tmp_path / "w", path, log1p=features).read_text()
    assert "[train] log1p_dense" in text.splitlines()[1]
    assert tomllib.loads(text)["reader"]["preprocessing"] == [
        *mine,
        {"kind": "log1p", "features": features},
    ]
    # Without the key, the user's steps as written.
    job = write_stage_train_config(tmp_path / "w", path)
    assert tomllib.loads(job.read_text())["reader"]["preprocessing"] == mine
    # A [reader] dense list: the features read are the listed ones.
    listed = template(tmp_path, 'dense = ["price", "hist_len"]')
    assert log1p_features(listed, example_log) == ["price", "hist_len"]


def test_demo_resume_only_in_small_and_the_keys_are_typed(tmp_path: Path) -> None:
    stage = TrainStage()
    assert (stage.demo_resume, stage.log1p_dense) == (False, False)
    for name, shipped in SHIPPED.items():
        train = PipelineConfig.from_toml(shipped.path).train
        assert train.demo_resume == (name == "small"), name
        assert train.log1p_dense == (name == "own_data"), name
    path = tmp_path / "p.toml"
    for key, value in (("demo_resume", '"yes"'), ("log1p_dense", "1")):
        path.write_text(f'[run]\nwork_dir = "w"\n[train]\n{key} = {value}\n')
        with pytest.raises(ConfigError, match=rf"\[train\] {key} = "):
            PipelineConfig.from_toml(path)
