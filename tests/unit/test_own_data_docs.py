"""The impression-log example of docs/own-data.md runs as written: its files, its command,
and the samples its table shows."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pytest

from recd.cli import main
from recd.logs import rawlog

DOC = Path(__file__).resolve().parents[2] / "docs" / "own-data.md"


def _blocks(text: str) -> dict[str, str]:
    """Each ``<!-- example: NAME -->`` marker's next fenced block (or table) by NAME."""
    out = {}
    for match in re.finditer(r"<!-- example: (\S+) -->\n", text):
        rest = text[match.end() :]
        if rest.startswith("```"):
            body = rest.split("\n", 1)[1]
            out[match.group(1)] = body[: body.index("```")]
        else:  # a Markdown table: up to the first blank line
            out[match.group(1)] = rest[: rest.index("\n\n")]
    return out


def _table(text: str) -> list[dict[str, object]]:
    lines = [line.strip().strip("|").split("|") for line in text.strip().splitlines()]
    header = [h.strip() for h in lines[0]]
    return [
        {name: json.loads(cell.strip()) for name, cell in zip(header, row, strict=True)}
        for row in lines[2:]
    ]


def test_the_impression_example_runs_as_documented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = _blocks(DOC.read_text())
    assert {"impressions.csv", "impressions_mapping.toml", "command", "samples"} <= set(blocks)
    for name in ("impressions.csv", "impressions_mapping.toml"):
        (tmp_path / name).write_text(blocks[name])
    command = shlex.split(blocks["command"].strip())
    assert command[:3] == ["recd", "logs", "ingest"]
    monkeypatch.chdir(tmp_path)
    assert main(command[1:]) == 0
    assert "requests 3" in capsys.readouterr().out
    batches = [b for _, _, b in rawlog.iter_raw_log(tmp_path / "raw")]
    rows = pa.Table.from_batches(batches).to_pylist()
    documented = _table(blocks["samples"])
    assert len(rows) == len(documented) == 7
    for row, want in zip(rows, documented, strict=True):
        assert {name: row[name] for name in want} == want
    catalogue = rawlog.read_catalogue(tmp_path / "raw")
    kinds = {f.name: (f.kind.value, f.group) for f in catalogue.sparse}
    assert kinds["hist_item_ids"] == kinds["hist_event_types"] == ("history", "history")
    assert kinds["platform"] == ("static", None)
    dense = {f.name: f.kind.value for f in catalogue.dense}
    assert dense["prices"] == "candidate" and dense["position"] == "position"
