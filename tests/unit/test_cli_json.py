"""Options mean the same in every command: ``--json [FILE]`` (FILE gets the JSON and the text
is still printed; ``--json`` alone or ``-`` prints only the JSON), and every ``--help`` shows
the defaults."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from recd.cli import build_parser, main
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.schema import Catalogue

from .etl_shards import make_rows, write_shards


def all_parsers() -> list[argparse.ArgumentParser]:
    out, stack = [], [build_parser()]
    while stack:
        current = stack.pop()
        out.append(current)
        for action in current._actions:
            choices = getattr(action, "choices", None)
            if isinstance(choices, dict):  # a subcommand's parsers
                stack.extend(sub for sub in choices.values() if hasattr(sub, "_actions"))
    return out


def test_every_help_shows_the_defaults() -> None:
    parsers = all_parsers()
    assert len(parsers) > 20
    for parser in parsers:
        text = parser.format_help()
        for action in parser._actions:
            default = action.default
            if action.option_strings and isinstance(default, int | float | str):
                if isinstance(default, bool) or default == argparse.SUPPRESS:
                    continue
                assert "default" in (action.help or "").lower() or (
                    f"(default: {default})" in " ".join(text.split())
                ), f"{parser.prog} {action.option_strings[0]}"
    etl = next(p for p in parsers if p.prog.endswith(" etl"))
    assert "(default: 8192)" in " ".join(etl.format_help().split())


def test_every_json_option_takes_an_optional_file() -> None:
    seen = 0
    for current in all_parsers():
        for action in current._actions:
            if action.option_strings == ["--json"]:
                seen += 1
                assert action.nargs == "?" and action.const == "-", current.prog
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
