"""The CSV reader of ``recd logs ingest``: a chunk of whole lines -> the mapped columns as text.

Arrow's CSV reader does the parsing; the code around it keeps each row's line number (which
the reader cannot report), and turns what the reader skips (a line with the wrong number of
fields, the lines an unmatched quote swallows) into bad lines.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

from recd.errors import SchemaError
from recd.logs.ingest_text import BadLine, Lines, TextColumns
from recd.logs.ingest_values import shorten


def csv_header(path: Path, lines: Lines, index: int, delimiter: str) -> list[str]:
    """The field names of the header, line ``index`` (0-based) of ``lines``."""
    try:
        return next(csv.reader([lines.text(index)], delimiter=delimiter))
    except csv.Error as exc:
        raise SchemaError(
            f"{path}: line {lines.numbers[index]}: cannot read the CSV header: {exc}"
        ) from exc


def read_csv(path: Path, lines: Lines, names: dict[str, str], delimiter: str) -> TextColumns:
    """Read the mapped columns as strings, keeping each row's line number.

    The reader cannot say which line a row came from, so every non-empty line gets its
    zero-padded line number prepended as an extra first field (``_prefix_line_numbers``);
    malformed lines then carry their number into the invalid-row handler too.
    """
    content = np.flatnonzero(~lines.empty())
    if content.size == 0:
        raise SchemaError(f"{path}: empty file: no CSV header line")
    header_index, data_index = int(content[0]), content[1:]
    header = csv_header(path, lines, header_index, delimiter)
    missing = [(role, col) for role, col in names.items() if col not in header]
    if missing:
        wanted = ", ".join(f"{col!r}" for _, col in missing)
        raise SchemaError(
            f"{path}: line {lines.numbers[header_index]}: no column {wanted} in the header "
            f"(columns: {', '.join(shorten(h) for h in header[:50])}); "
            "set the column names with --*-col"
        )
    width = max(9, len(str(int(lines.numbers[-1]))))
    line_col = "recd_line".ljust(width, "_")
    if line_col in header:
        raise SchemaError(f"{path}: the column name {line_col!r} is reserved")
    prefixed = _prefix_line_numbers(lines, content, line_col, delimiter)

    malformed: list[BadLine] = []

    def on_invalid(row: pa_csv.InvalidRow) -> str:
        number = int(row.text[:width]) if row.text[:width].isdigit() else -1
        malformed.append(
            BadLine(
                number,
                None,
                f"malformed line: expected {row.expected_columns - 1} fields, "
                f"found {row.actual_columns - 1}",
            )
        )
        return "skip"

    columns = [line_col, *dict.fromkeys(names.values())]
    longest = int(lines.sizes().max()) + width + 3  # a line with its prefix and line break
    try:
        table = pa_csv.read_csv(
            pa.BufferReader(prefixed),
            # a row must fit in one block, or the whole read fails
            read_options=pa_csv.ReadOptions(block_size=max(1 << 20, 2 * longest)),
            parse_options=pa_csv.ParseOptions(delimiter=delimiter, invalid_row_handler=on_invalid),
            convert_options=pa_csv.ConvertOptions(
                column_types={line_col: pa.int64(), **{c: pa.string() for c in columns[1:]}},
                include_columns=columns,
                strings_can_be_null=False,
            ),
        )
    except pa.ArrowInvalid as exc:
        raise SchemaError(f"{path}: cannot read as CSV: {exc}") from exc
    table = table.combine_chunks()
    numbers = table.column(line_col).to_numpy()
    text = (
        {role: table.column(col).chunk(0) for role, col in names.items()}
        if table.num_rows
        else {role: pa.array([], pa.string()) for role in names}
    )
    return TextColumns(
        lines=numbers,
        columns=text,
        malformed=malformed,
        rows_in=len(data_index),
        flagged=_unclosed_quotes(lines, data_index, numbers, text, names, malformed),
    )


def _unclosed_quotes(
    lines: Lines,
    data_index: np.ndarray,
    numbers: np.ndarray,
    columns: dict[str, pa.Array],
    names: dict[str, str],
    malformed: list[BadLine],
) -> np.ndarray | None:
    """Add the lines an unclosed quote spoiled to ``malformed``; returns the (N,) mask of the
    rows among them, or None when there are none.

    A ``"`` that does not close on its line makes the reader go on to the next ``"`` (or the
    end of its block), so the lines in between are no rows: they are the data lines
    (``data_index``) that neither a row (``numbers``) nor a malformed line carries. The row
    where the value began is bad when the value is one of the wanted ``columns``.
    """
    seen = np.concatenate([numbers, [b.line for b in malformed]]).astype(np.int64)
    if len(seen) == len(data_index):
        return None
    unmatched = (
        'an unmatched " on this line: a quoted value runs across lines '
        "(CSV values must not hold line breaks)"
    )
    inside = (
        'not read: inside a quoted value that runs across lines from an unmatched " before it '
        "(CSV values must not hold line breaks)"
    )
    for index in data_index[~np.isin(lines.numbers[data_index], seen)].tolist():
        problem = unmatched if lines.raw(index).count(b'"') % 2 else inside
        malformed.append(BadLine(int(lines.numbers[index]), None, problem))
    flagged = np.zeros(len(numbers), dtype=bool)
    for role, column in columns.items():
        has_break = pc.fill_null(pc.match_substring(column, "\n"), False)
        rows = np.asarray(has_break.to_numpy(zero_copy_only=False), dtype=bool) & ~flagged
        for i in np.flatnonzero(rows).tolist():
            malformed.append(BadLine(int(numbers[i]), names[role], unmatched))
        flagged |= rows
    return flagged


def _prefix_line_numbers(
    lines: Lines, content: np.ndarray, line_col: str, delimiter: str
) -> pa.Buffer:
    """The CSV text from the header on, each line prefixed with a field holding its number.

    The header gets ``line_col``; the data lines their zero-padded 1-based line number, all
    ``len(line_col)`` characters wide. One element-wise binary join (C++) builds the result.
    """
    width = len(line_col)
    numbers = lines.numbers[content[1:]]
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = ((numbers[:, None] // powers) % 10 + ord("0")).astype(np.uint8)
    header = np.frombuffer(line_col.encode(), dtype=np.uint8)[None, :]
    prefix = np.concatenate(
        [np.concatenate([header, digits]), np.full((len(content), 1), ord(delimiter), np.uint8)],
        axis=1,
    )
    # (M,) prefixes of width + 1 bytes, and (M,) segments: from a line to the next non-empty one
    prefixes = _binary_array(prefix.reshape(-1), np.arange(len(content) + 1) * (width + 1))
    bounds = np.append(lines.starts[content], len(lines.buf))
    segments = _binary_array(lines.buf, bounds)
    joined = pc.binary_join_element_wise(prefixes, segments, pa.scalar(b"", pa.large_binary()))
    total = prefix.size + len(lines.buf) - int(bounds[0])
    values = joined.buffers()[2]
    return values.slice(0, total) if values is not None else pa.py_buffer(b"")


def _binary_array(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """A large_binary array whose entry i is ``data[offsets[i]:offsets[i + 1]]`` (no copy)."""
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(offsets) - 1,
        [None, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(data)],
    )


def csv_field_name(
    raw: bytes, position: int | None, header: list[str], delimiter: str
) -> str | None:
    """The header name of the field of CSV line ``raw`` that holds byte ``position`` (None: the
    longest field). Fields are split at delimiters outside double quotes."""
    if position is not None and b'"' not in raw[:position]:
        index = raw.count(delimiter.encode(), 0, position)
    else:
        buf = np.frombuffer(raw, dtype=np.uint8)
        quoted = (np.cumsum(buf == ord('"'), dtype=np.uint8) & 1) == 1  # wraps, keeps parity
        cuts = np.flatnonzero((buf == ord(delimiter)) & ~quoted)
        if position is None:
            index = int(np.argmax(np.diff(np.concatenate([[-1], cuts, [len(buf)]]))))
        else:
            index = int(np.searchsorted(cuts, position))
    return shorten(header[index]) if index < len(header) else None
