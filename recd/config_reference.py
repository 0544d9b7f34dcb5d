"""The configuration reference (docs/config.md), generated from the config dataclasses.

Every config section is a dataclass whose fields carry a docstring (the string right under
the field). This module reads those from the source with ``ast`` (Python keeps no field
docstrings at run time) and writes one Markdown table per TOML section: key, type, default,
meaning. ``python -m recd.config_reference > docs/config.md`` regenerates the page; a test
checks that the committed page is current.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import itertools
import textwrap
import types
import typing
from pathlib import Path
from typing import Any

from recd.config_types import OneOf, field_hints, range_text
from recd.etl.config import EtlConfig
from recd.pipeline import (
    AnalyzeStage,
    EtlStage,
    IngestStage,
    LogsStage,
    ShardStage,
    TrainStage,
)
from recd.reader.config import ReaderConfig
from recd.train.config import (
    CheckpointSection,
    EvalConfig,
    ModelSection,
    OptimSection,
    RunSection,
    SequenceSection,
)

# (TOML section, dataclass) per file kind, in the order of the page.
TRAIN_SECTIONS: list[tuple[str, type]] = [
    ("reader", ReaderConfig),
    ("eval", EvalConfig),
    ("model", ModelSection),
    ("model.sequence", SequenceSection),
    ("optim", OptimSection),
    ("train", RunSection),
    ("checkpoint", CheckpointSection),
]
PIPELINE_SECTIONS: list[tuple[str, type]] = [
    ("logs", LogsStage),
    ("ingest", IngestStage),
    ("shard", ShardStage),
    ("etl", EtlStage),
    ("analyze", AnalyzeStage),
    ("train", TrainStage),
]
# Fields set by the program, not by a TOML file.
_INTERNAL = {(ReaderConfig, "rank"), (ReaderConfig, "world_size")}


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring under it in ``cls``'s source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = _markdown(after.value.value)
    return docs


def _markdown(text: str) -> str:
    """A docstring as one Markdown line (reST ``code`` becomes `code`)."""
    return " ".join(text.split()).replace("``", "`")


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        choices = [v for e in extras if isinstance(e, OneOf) for v in e.values]
        if choices:
            return " \\| ".join(f'"{c}"' for c in choices)
        bounds = range_text(hint)
        return f"{_type_name(base)} {bounds}" if bounds else _type_name(base)
    if hint is type(None):
        return "none"
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " \\| ".join(f'"{m.value}"' for m in hint)
    if isinstance(hint, type):
        return {"str": "string", "Path": "path", "bool": "bool", "int": "int"}.get(
            hint.__name__, hint.__name__
        )
    args = typing.get_args(hint)
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return "table"
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' for a in args)
    return str(hint).replace("typing.", "")


def _default(f: dataclasses.Field[Any]) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return f'`"{value.value}"`'
    if dataclasses.is_dataclass(value):
        return "(section)"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str | Path):
        return f'`"{value}"`'
    return f"`{value!r}`"


def section_table(section: str, cls: type, *, title: str | None = None) -> str:
    """The Markdown of one TOML section (``title`` replaces the ``[section]`` heading)."""
    docs = field_docs(cls)
    hints = field_hints(cls)
    doc = _markdown(inspect.getdoc(cls) or "")
    lines = [
        title or f"### `[{section}]`",
        "",
        doc,
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for f in dataclasses.fields(cls):
        if (cls, f.name) in _INTERNAL or dataclasses.is_dataclass(hints.get(f.name)):
            continue
        meaning = docs.get(f.name, "").replace("|", "\\|")
        lines.append(f"| `{f.name}` | {_type_name(hints[f.name])} | {_default(f)} | {meaning} |")
    return "\n".join(lines) + "\n"


def etl_table() -> str:
    """``recd etl``'s options as a table (the keys of :class:`EtlConfig`)."""
    return section_table("etl", EtlConfig, title="### `EtlConfig`")


def render() -> str:
    parts = [
        "# Configuration reference",
        "",
        "Generated from the config dataclasses by `python -m recd.config_reference` (do not",
        "edit by hand; a test checks that this page is current). Every key is type-checked: a",
        "wrong type, an unknown key or a bad value ends in one line naming the section, the key",
        "and the value, and `recd` exits 2.",
        "",
        "## Training job (`recd train --config JOB.toml`)",
        "",
        "Relative paths (`reader.table`, `eval.table`, `train.run_dir`, `checkpoint.dir`) are",
        "resolved against the TOML file's directory.",
        "",
    ]
    parts += [section_table(name, cls) for name, cls in TRAIN_SECTIONS]
    parts += [
        "## Pipeline (`recd run --config PIPELINE.toml`)",
        "",
        "`[run] work_dir` (required) holds every stage's output; the sections below are",
        "optional and default as shown. `[logs]` (synthetic logs) and `[ingest]` (your event",
        "log, see docs/own-data.md for `[ingest.mapping]`) exclude each other. `work_dir` is",
        "relative to the directory recd runs in, the other paths to the pipeline TOML's",
        "directory. A pipeline shipped with recd runs by name (`recd run --config small`;",
        "`recd init --list` lists them, `recd init NAME DIR` copies one to edit): its training",
        "template comes from the installed package, its `work_dir` and `[ingest] input` are",
        "relative to the directory recd runs in.",
        "",
    ]
    parts += [section_table(name, cls) for name, cls in PIPELINE_SECTIONS]
    parts += [
        "## ETL options (`recd etl`, Python `recd.etl.config.EtlConfig`)",
        "",
        "The command-line flags of `recd etl` set these fields (`--row-group-rows` is",
        "`row_group_rows`, and so on).",
        "",
        etl_table(),
    ]
    return "\n".join(parts)


if __name__ == "__main__":
    print(render(), end="")
