"""The JSON Lines reader of ``recd logs ingest``: a chunk of whole lines -> the mapped fields
as text, each line that does not parse a bad line of its own."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json

from recd.logs.ingest_text import BadLine, Lines, TextColumns, columns_as_text
from recd.logs.ingest_values import shorten

_ESCAPED = re.compile("[\udc80-\udcff]")  # bytes that were not UTF-8, after surrogateescape


def read_jsonl(
    path: Path, lines: Lines, names: dict[str, str], separator: str = "|"
) -> TextColumns:
    """Read the mapped fields as strings, keeping each row's line number.

    The whole chunk is parsed at once; if the reader rejects it (invalid JSON, a line that is not
    an object, a field whose JSON type changes), the line range is halved until each failing
    range is a single line, which is malformed. Valid ranges are parsed independently, so a
    field may be a number on some lines and a string on others.
    """
    content = np.flatnonzero(~lines.blank())
    longest = int((lines.ends - lines.starts).max()) if len(lines) else 0
    options = pa_json.ReadOptions(block_size=max(1 << 20, 2 * longest + 16))
    malformed: list[BadLine] = []
    parts: list[tuple[np.ndarray, dict[str, pa.Array], np.ndarray]] = []
    pending = [(0, len(content))] if content.size else []
    while pending:
        lo, hi = pending.pop()
        chunk = lines.data[lines.starts[content[lo]] : lines.ends[content[hi - 1]]]
        try:
            table = pa_json.read_json(io.BytesIO(chunk), read_options=options)
            ok = table.num_rows == hi - lo
            error = f"expected {hi - lo} rows, read {table.num_rows}"
        except pa.ArrowInvalid as exc:
            ok, error = False, str(exc)
        if ok:
            line_numbers = lines.numbers[content[lo:hi]]
            columns, bad, flagged = columns_as_text(table, names, line_numbers, separator)
            parts.append((line_numbers, columns, flagged))
            malformed.extend(bad)
        elif hi - lo == 1:
            index = int(content[lo])
            number = int(lines.numbers[index])
            malformed.append(BadLine(number, None, _json_problem(lines.text(index), error)))
        else:
            mid = (lo + hi) // 2
            pending.extend([(mid, hi), (lo, mid)])
    parts.sort(key=lambda part: int(part[0][0]) if part[0].size else 0)
    return TextColumns(
        lines=np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64),
        columns={
            role: pa.concat_arrays([p[1][role] for p in parts])
            if parts
            else pa.array([], pa.string())
            for role in names
        },
        malformed=malformed,
        rows_in=len(content),
        flagged=np.concatenate([p[2] for p in parts]) if parts else np.zeros(0, bool),
    )


def _json_problem(text: str, arrow_error: str) -> str:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return f"invalid JSON: {exc.msg} (column {exc.colno})"
    if not isinstance(value, dict):
        return f"not a JSON object (got {type(value).__name__})"
    return f"cannot read line: {arrow_error.removeprefix('JSON parse error: ')}"


def json_field_name(raw: bytes, position: int | None) -> str | None:
    """The key of JSON line ``raw`` whose value holds byte ``position`` (None: the biggest
    value), or None when the line is not a JSON object or the byte is not in a value."""
    try:
        value = json.loads(raw.decode("utf-8", "surrogateescape"))
    except ValueError:
        return None
    if not isinstance(value, dict) or not value:
        return None
    texts = {key: json.dumps(v, ensure_ascii=False) for key, v in value.items()}
    if position is None:
        key = max(texts, key=lambda k: len(texts[k]))
    else:
        holding = [k for k, text in texts.items() if _ESCAPED.search(text)]
        if not holding or _ESCAPED.search(holding[0]):
            return None
        key = holding[0]
    return shorten(key)
