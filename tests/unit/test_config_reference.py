"""docs/config.md is generated from the config dataclasses and must be current."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from recd.config_reference import PIPELINE_SECTIONS, TRAIN_SECTIONS, field_docs, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_is_current() -> None:
    assert DOC.read_text() == render(), "run: python -m recd.config_reference > docs/config.md"


def test_every_key_has_a_meaning() -> None:
    for section, cls in TRAIN_SECTIONS + PIPELINE_SECTIONS:
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            if f.name in ("rank", "world_size"):
                continue
            assert docs.get(f.name), f"[{section}] {f.name} has no docstring"
