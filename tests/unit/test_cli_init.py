"""The shipped pipelines (recd/pipelines, package data): ``recd init`` copies one to edit,
``recd run --config NAME`` finds one by name, an unknown name ends in one line naming them."""

from __future__ import annotations

import csv
import tomllib
from pathlib import Path

import pytest

from recd.cli import main
from recd.logs import example_events
from recd.pipeline import PipelineConfig
from recd.pipelines import DIR, SHIPPED, resolve_pipeline_config

ROOT = Path(__file__).resolve().parents[2]


def test_every_shipped_file_is_package_data_and_every_reference_is_shipped() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "pipelines/*.toml" in pyproject["tool"]["setuptools"]["package-data"]["recd"]
    shipped_files = {name for p in SHIPPED.values() for name in p.files}
    assert shipped_files == {p.name for p in DIR.glob("*.toml")}, "a TOML no pipeline ships"
    for shipped in SHIPPED.values():
        assert shipped.files[0] == f"{shipped.name}.toml"
        config = PipelineConfig.from_toml(shipped.path)
        assert config.config_dir == DIR
        assert config.train.config in shipped.files
        if config.ingest is None:
            assert shipped.example_events is None
        else:
            assert config.ingest.input == shipped.example_events
            assert not isinstance(config.ingest.mapping, str) or (
                config.ingest.mapping in shipped.files
            )
        # work_dir: relative to the directory recd runs in, never the package's
        assert not config.work_dir.is_relative_to(DIR)


def test_init_list_names_every_shipped_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == list(SHIPPED)
    for line, shipped in zip(lines, SHIPPED.values(), strict=True):
        assert line.endswith(shipped.description)


def test_init_copies_the_files_and_never_overwrites_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "a" / "proj"
    assert main(["init", "small", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"recd run --config {target / 'small.toml'}" in out
    assert sorted(p.name for p in target.iterdir()) == ["small.toml", "train_small.toml"]
    for name in SHIPPED["small"].files:
        assert (target / name).read_bytes() == (DIR / name).read_bytes()
    copy = PipelineConfig.from_toml(target / "small.toml")
    assert copy.config_dir == target.resolve()
    assert (copy.config_dir / str(copy.train.config)).is_file()

    edited = "# mine\n"
    (target / "train_small.toml").write_text(edited)
    assert main(["init", "small", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--force" in err and "small.toml" in err, err
    assert (target / "train_small.toml").read_text() == edited  # untouched
    assert sorted(p.name for p in target.iterdir()) == ["small.toml", "train_small.toml"]

    assert main(["init", "small", str(target), "--force"]) == 0
    assert (target / "train_small.toml").read_bytes() == (DIR / "train_small.toml").read_bytes()


def test_init_own_data_with_example_events_runs_as_copied(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "proj"
    assert main(["init", "own_data", str(target), "--example-events"]) == 0
    assert sorted(p.name for p in target.iterdir()) == [
        "events.csv",
        "own_data.toml",
        "own_data_mapping.toml",
        "train_own_data.toml",
    ]
    with (target / "events.csv").open() as f:
        rows = list(csv.reader(f))
    assert rows[0][:2] == ["event_time", "event_type"] and len(rows) == 1 + 20_000
    config = PipelineConfig.from_toml(target / "own_data.toml")
    assert config.ingest is not None
    assert (config.config_dir / config.ingest.input).samefile(target / "events.csv")
    assert not list(tmp_path.glob("proj/.*")), "a temp file was left behind"
    capsys.readouterr()
    # the events count as a target too: nothing is written over them
    (target / "events.csv").write_text("mine\n")
    (target / "own_data.toml").unlink()
    assert main(["init", "own_data", str(target), "--example-events"]) == 2
    assert "events.csv" in capsys.readouterr().err
    assert not (target / "own_data.toml").exists()
    assert (target / "events.csv").read_text() == "mine\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["init"], "give the shipped pipeline NAME and a directory DIR"),
        (["init", "small"], "give the shipped pipeline NAME and a directory DIR"),
        (
            ["init", "nope", "x"],
            "no shipped pipeline 'nope'; shipped: impressions, own_data, small",
        ),
        (["init", "small", "x", "--example-events"], "--example-events: small reads no event"),
        (["init", "small", "--list"], "--list takes no NAME or DIR"),
        (["init", "small", "afile"], "afile: exists and is not a directory"),
    ],
)
def test_init_bad_input_exits_2_with_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("recd init: error: ") and expected in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


def test_run_config_resolves_files_first_then_shipped_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_pipeline_config("small") == (DIR / "small.toml", SHIPPED["small"])
    (tmp_path / "small").write_text('[run]\nwork_dir = "w"\n')
    assert resolve_pipeline_config("small") == (Path("small"), None)


@pytest.mark.parametrize("name", ["nope", "small.toml", "pipelines/small.toml"])
def test_run_unknown_name_exits_2_with_one_line_naming_the_shipped_ones(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--config", name]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"recd run: error: pipeline config {name} does not exist, and it is no shipped "
        "pipeline name (impressions, own_data, small; recd init --list describes them)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_run_shipped_own_data_reads_its_events_from_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--config", "own_data"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{tmp_path / 'events.csv'} does not exist" in err
    assert "current directory" in err
    assert list(tmp_path.iterdir()) == [], "nothing is written before the input is found"


def test_example_events_module_writes_the_rows_it_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "d" / "e.csv"
    assert example_events.main(["--out", str(out), "--events", "300", "--seed", "3"]) == 0
    assert capsys.readouterr().out == f"wrote 300 events to {out}\n"
    first = out.read_bytes()
    assert len(first.splitlines()) == 301
    assert example_events.main(["--out", str(out), "--events", "300", "--seed", "3"]) == 0
    assert out.read_bytes() == first  # the same seed writes the same file
    assert example_events.main(["--out", str(out), "--events", "0"]) == 2
    assert "--events: expected an integer >= 1, got 0" in capsys.readouterr().err
