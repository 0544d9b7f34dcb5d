"""``--json [FILE]`` means the same in every command: FILE gets the JSON and the text is still
printed; ``--json`` alone (or ``-``) prints only the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recd.cli import build_parser, main
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.schema import Catalogue

from .etl_shards import make_rows, write_shards


def test_every_json_option_takes_an_optional_file() -> None:
    parser = build_parser()
    seen = 0
    stack = [parser]
    while stack:
        current = stack.pop()
        for action in current._actions:
            if action.option_strings == ["--json"]:
                seen += 1
                assert action.nargs == "?" and action.const == "-", current.prog
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):  # a subcommand's parsers
                stack.extend(sub for sub in choices.values() if hasattr(sub, "_actions"))
    assert seen >= 10


def test_json_file_keeps_the_text_and_json_alone_prints_only_json(
    tmp_path: Path, tiny_catalogue: Catalogue, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = make_rows(tiny_catalogue, num_sessions=10, seed=1)
    write_shards(tmp_path / "shards", tiny_catalogue, rows)
    run_etl(EtlConfig(shard_dir=tmp_path / "shards", table_dir=tmp_path / "t", show_progress=False))
    capsys.readouterr()
    assert main(["table", "info", str(tmp_path / "t"), "--json", str(tmp_path / "o.json")]) == 0
    text = capsys.readouterr().out
    body = json.loads((tmp_path / "o.json").read_text())
    assert text.startswith("table ") and f"{body['rows']}" in text
    assert main(["table", "info", str(tmp_path / "t"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == body
    assert main(["table", "info", str(tmp_path / "t"), "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == body
