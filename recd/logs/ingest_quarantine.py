"""The quarantine of ``recd logs ingest`` (``on_bad_rows="quarantine"``): every bad line,
with its line number, field, reason and text, one JSON object per line."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from recd.logs.ingest_text import MIN_CHUNK_BYTES, BadLine, Lines, iter_line_chunks


def bad_line_texts(path: Path, fmt: str, bad: list[BadLine], max_line_bytes: int) -> dict[int, str]:
    """The text of each bad line (cut at ``max_line_bytes``, ending in "…"), read again from
    the input in chunks; none for Parquet, whose rows are no lines."""
    wanted = np.unique(np.array([b.line for b in bad if b.line >= 1], dtype=np.int64))
    texts: dict[int, str] = {}
    if fmt == "parquet" or wanted.size == 0:
        return texts
    for data, before, _ in iter_line_chunks(path, MIN_CHUNK_BYTES, max_line_bytes):
        lines = Lines(data)
        lo, hi = np.searchsorted(wanted, [before + 1, before + len(lines) + 1])
        for number in wanted[lo:hi].tolist():
            texts[number] = lines.text(number - before - 1, max_line_bytes)
        if hi == wanted.size:
            break
    return texts


def write_quarantine(
    target: Path, source: Path, bad: Iterable[BadLine], texts: dict[int, str]
) -> None:
    """One JSON object per bad line, in line order: file, line, field, reason and the line's
    text from ``texts`` (``bad_line_texts``; bytes that are not UTF-8 as U+FFFD)."""
    with target.open("w") as f:
        for b in sorted(bad, key=lambda b: b.line):
            record = {
                "file": str(source),
                "line": b.line,
                "field": b.field,
                "reason": b.problem,
                "text": texts.get(b.line),
            }
            f.write(json.dumps(record) + "\n")
