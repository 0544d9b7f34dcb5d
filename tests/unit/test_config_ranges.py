"""Every ranged config key and flag: a value just outside its range (or not among its
choices) ends in one line naming the key (or flag) and the value. The cases are read from
the dataclasses' annotations, so a new ranged field is covered without touching this file."""

from __future__ import annotations

import argparse
import dataclasses
import math
import typing
from pathlib import Path
from typing import Annotated, Any

import msgspec
import pytest
import tomli_w

from recd.cli import build_parser, main
from recd.config_reference import PIPELINE_SECTIONS, TRAIN_SECTIONS
from recd.config_types import check_keys, field_default, field_hints, load_toml, value_type
from recd.errors import ConfigError
from recd.etl.config import EtlConfig
from recd.pipeline import EtlStage, PipelineConfig
from recd.train.config import load_train_config


def outside(hint: Any) -> list[Any]:
    """Values just outside the range of a field's annotation (one per bound), or one not
    among its choices."""
    if value_type(hint)[1]:
        return ["bogus"]
    args = typing.get_args(hint)
    if type(None) in args:  # X | None
        rest = [a for a in args if a is not type(None)]
        if len(rest) > 1:
            return []
        hint = rest[0]
    if typing.get_origin(hint) is list:
        return [[value] for value in outside(typing.get_args(hint)[0])]
    if typing.get_origin(hint) is not Annotated:
        return []
    base, *extras = typing.get_args(hint)
    meta = next((e for e in extras if isinstance(e, msgspec.Meta)), None)
    if meta is None:
        return []
    step_down = (lambda x: x - 1) if base is int else (lambda x: math.nextafter(x, -math.inf))
    step_up = (lambda x: x + 1) if base is int else (lambda x: math.nextafter(x, math.inf))
    out = []
    if meta.ge is not None:
        out.append(step_down(meta.ge))
    if meta.gt is not None:
        out.append(meta.gt)
    if meta.le is not None:
        out.append(step_up(meta.le))
    if meta.lt is not None:
        out.append(meta.lt)
    return out


def cases(kind: str, sections: list[tuple[str, type]]) -> list[Any]:
    return [
        pytest.param(kind, section, name, bad, id=f"{kind}:{section}.{name}={bad!r}")
        for section, cls in sections
        for name, hint in field_hints(cls).items()
        for bad in outside(hint)
    ]


TOML_CASES = cases("train", TRAIN_SECTIONS) + cases("pipeline", PIPELINE_SECTIONS)


def test_the_cases_cover_every_file_kind() -> None:
    sections = {p.values[1] for p in TOML_CASES}
    assert {"reader", "eval", "model", "model.sequence", "optim", "train", "checkpoint"} <= sections
    assert {"logs", "ingest", "shard", "etl", "analyze"} <= sections
    assert len(TOML_CASES) > 40


def _train_toml(section: str, name: str, bad: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "reader": {"table": "/nonexistent/table", "end": "2026-11-01T00:00"},
        "eval": {"start": "2026-11-01T01:00"},
    }
    table = data
    for part in section.split("."):
        table = table.setdefault(part, {})
    table[name] = bad
    return data


def _pipeline_toml(section: str, name: str, bad: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"run": {"work_dir": "work"}}
    if section == "ingest":
        data["ingest"] = {"input": "events.csv"}
    data.setdefault(section, {})[name] = bad
    return data


@pytest.mark.parametrize(("kind", "section", "name", "bad"), TOML_CASES)
def test_a_value_out_of_range_names_the_key_and_the_value(
    tmp_path: Path, kind: str, section: str, name: str, bad: Any
) -> None:
    path = tmp_path / "job.toml"
    build = _train_toml if kind == "train" else _pipeline_toml
    path.write_text(tomli_w.dumps(build(section, name, bad)))
    load = load_train_config if kind == "train" else PipelineConfig.from_toml
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    value = bad[0] if isinstance(bad, list) else bad
    assert "\n" not in message and message.startswith(str(path))
    assert f"{section}.{name}" in message or f"[{section}] {name}" in message, message
    if bad == "bogus":
        assert "'bogus'" in message and " one of " in message, message
    else:
        assert f"got {value!r}" in message, message


@pytest.mark.parametrize(
    ("name", "bad"),
    [(name, bad) for name, hint in field_hints(EtlConfig).items() for bad in outside(hint)],
)
def test_etl_config_out_of_range(tmp_path: Path, name: str, bad: Any) -> None:
    with pytest.raises(ConfigError) as info:
        EtlConfig(shard_dir=tmp_path / "s", table_dir=tmp_path / "t", **{name: bad})
    assert str(info.value).startswith(f"{name} must be ") and str(info.value).endswith(
        f", got {bad!r}"
    )


def test_pipeline_stages_take_the_etl_defaults() -> None:
    for name in ("row_group_rows", "zstd_level"):
        assert field_default(EtlStage, name) == field_default(EtlConfig, name)
        assert field_hints(EtlStage)[name] == field_hints(EtlConfig)[name]


def _subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a.choices, dict))
    parser = sub.choices[name]
    assert isinstance(parser, argparse.ArgumentParser)
    return parser


def test_etl_flags_take_type_default_and_help_from_the_fields() -> None:
    actions = {a.dest: a for a in _subparser("etl")._actions}
    same = {"row_group_rows", "zstd_level", "layout", "dictionary", "on_bad_rows", "engine"}
    for name in same | {"table_format", "partition_by", "catalog", "start", "baseline"}:
        assert actions[name].default == field_default(EtlConfig, name), name
    assert actions["row_group_rows"].type is int
    assert actions["table"].dest == "table" and actions["table"].required
    assert actions["layout"].choices == ("plain", "dedup")
    assert "Rows per Parquet row group" in (actions["row_group_rows"].help or "")


def _train_job(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text('[reader]\ntable = "/nonexistent/table"\n')
    return path


@pytest.mark.parametrize(
    ("argv", "flag", "value"),
    [
        (["etl", "SHARDS", "--table", "T", "--row-group-rows", "0"], "--row-group-rows", "0"),
        (["etl", "SHARDS", "--table", "T", "--zstd-level", "23"], "--zstd-level", "23"),
        (["train", "--config", "JOB", "--steps", "0"], "--steps", "0"),
        (["train", "--config", "JOB", "--seed", "-1"], "--seed", "-1"),
        (["train", "--config", "JOB", "--nproc", "0"], "--nproc", "0"),
        (["pivot", "RUN", "--config", "JOB", "--steps", "0"], "--steps", "0"),
        (
            ["predict", "--config", "JOB", "--checkpoint", "C", "--out", "O", "--batch-size", "0"],
            "--batch-size",
            "0",
        ),
    ],
)
def test_a_flag_out_of_range_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, value: str
) -> None:
    job = _train_job(tmp_path)
    argv = [str(job) if a == "JOB" else str(tmp_path / a) if a.isupper() else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{flag}: expected an integer" in err and f"got {value}" in err, err
    assert not list((tmp_path).glob("[A-Z]*")), "nothing written"


def test_one_key_check_and_one_loader(tmp_path: Path) -> None:
    @dataclasses.dataclass
    class Section:
        need: int
        have: int = 0

    with pytest.raises(ConfigError, match=r"^f: \[s\] unknown key\(s\) x; expected need, have$"):
        check_keys({"need": 1, "x": 2}, Section, "f: [s] ")
    with pytest.raises(ConfigError, match=r"^f: \[s\] missing key 'need'$"):
        check_keys({"have": 1}, Section, "f: [s] ")
    with pytest.raises(ConfigError, match=r"widget config .* does not exist"):
        load_toml(tmp_path / "nope.toml", "widget config")
    (tmp_path / "bad.toml").write_text("a = [")
    with pytest.raises(ConfigError, match=r"bad\.toml: invalid TOML"):
        load_toml(tmp_path / "bad.toml", "widget config")
