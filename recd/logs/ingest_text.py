"""What the input readers of ``recd logs ingest`` share: the input columns a mapping reads
(roles), the lines of a byte buffer, the text columns a reader hands to pass 1, bad lines.

Every reader (``ingest_csv``, ``ingest_jsonl``, ``ingest_parquet``) turns a chunk of input into
``TextColumns``: one string column per role with each row's 1-based line number, plus the lines
it could not read. Values are parsed later (``ingest_values``), so that every format gets the
same checks and messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.errors import SchemaError
from recd.logs.ingest_mapping import IngestMapping

CORE = ("session", "ts", "item", "event", "request")  # text roles; the last three optional
LIST_KINDS = ("list", "hist", "cand", "cdense", "csparse", "clabel")  # list-valued roles
MIB = 1 << 20
MIN_CHUNK_BYTES = 1 * MIB  # the smallest chunk of whole lines read at a time
LINE_CAP_LINES = 64  # a "line" of 64 line limits with no line break: not a text file
_UTF8_BOM = b"\xef\xbb\xbf"


def roles(mapping: IngestMapping) -> dict[str, str]:
    """Role -> input column: the core roles (session, ts, and those mapped of item, event,
    request), then the mapped features' ``KIND:COLUMN`` roles (kinds:
    ``ingest_features.FEATURE_KINDS``)."""
    names = {"session": mapping.session, "ts": mapping.ts}
    names.update({role: getattr(mapping, role) for role in CORE[2:] if getattr(mapping, role)})
    for prefix, columns in (
        ("label", mapping.labels),
        ("dense", mapping.dense),
        ("sparse", mapping.sparse),
        ("list", mapping.sparse_lists),
        ("hist", mapping.history_columns),
        ("cand", [mapping.candidates] if mapping.candidates else []),
        ("cdense", mapping.candidate_dense),
        ("csparse", mapping.candidate_sparse),
        ("clabel", mapping.candidate_labels),
        ("clicked", [mapping.clicked] if mapping.clicked else []),
    ):
        names.update({f"{prefix}:{c}": c for c in columns})
    return names


@dataclass(slots=True)
class BadLine:
    """One bad input line: its 1-based number, the field (None: the line) and the problem."""

    line: int
    field: str | None
    problem: str


@dataclass(slots=True)
class TextColumns:
    """The mapped columns (by role) as text, for the data lines that parsed, plus the lines
    that didn't."""

    lines: np.ndarray  # (N,) int64 1-based line numbers
    columns: dict[str, pa.Array]  # role -> (N,) string
    malformed: list[BadLine]  # bad lines, whether or not they are among the rows
    rows_in: int
    flagged: np.ndarray | None = None  # (N,) bool: rows already in ``malformed``


def no_text() -> TextColumns:
    """The text columns of a chunk with no rows (only blank lines)."""
    return TextColumns(
        lines=np.zeros(0, np.int64),
        columns={role: pa.array([], pa.string()) for role in CORE[:2]},
        malformed=[],
        rows_in=0,
    )


class Lines:
    """Line boundaries of a byte buffer (lines end with \\n; a trailing \\r is not content).

    ``numbers`` (L,) holds each line's 1-based number in the input file: ``1..L`` unless the
    buffer is what ``without`` left of a bigger one.
    """

    def __init__(self, data: bytes, numbers: np.ndarray | None = None) -> None:
        self.data = data
        self.buf = np.frombuffer(data, dtype=np.uint8)
        newlines = np.flatnonzero(self.buf == ord("\n"))
        self.starts = np.concatenate([[0], newlines + 1]).astype(np.int64)
        self.ends = np.concatenate([newlines, [len(self.buf)]]).astype(np.int64)
        if self.starts[-1] == len(self.buf):  # the file ends with a newline
            self.starts, self.ends = self.starts[:-1], self.ends[:-1]
        has_cr = (self.ends > self.starts) & (self.buf[np.maximum(self.ends - 1, 0)] == ord("\r"))
        self.content_ends = self.ends - has_cr
        self.numbers = np.arange(1, len(self.starts) + 1) if numbers is None else numbers
        self._blank: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def sizes(self) -> np.ndarray:
        """(L,) int64: bytes of each line, without its line break."""
        return self.content_ends - self.starts

    def without(self, drop: np.ndarray) -> Lines:
        """The lines other than ``drop`` (0-based indices), keeping their line numbers.

        Copies the kept bytes once; only called when some lines are rejected before parsing.
        """
        keep = np.ones(len(self), dtype=bool)
        keep[drop] = False
        sizes_with_break = np.diff(np.append(self.starts, len(self.buf)))
        kept = self.buf[np.repeat(keep, sizes_with_break)].tobytes()
        return Lines(kept, self.numbers[keep])

    def empty(self) -> np.ndarray:
        """(L,) bool: the line has no characters (as a CSV reader skips)."""
        return self.content_ends == self.starts

    def blank(self) -> np.ndarray:
        """(L,) bool: the line has only whitespace (as a JSON reader skips)."""
        if self._blank is None:
            is_content = np.ones(256, dtype=bool)
            is_content[list(b" \t\r\n")] = False
            # any content byte from a line's start up to the next line's start
            self._blank = (
                ~np.logical_or.reduceat(is_content[self.buf], self.starts)
                if len(self)
                else np.zeros(0, dtype=bool)
            )
        return self._blank

    def raw(self, index: int) -> bytes:
        """The bytes of line ``index`` (0-based), without its line break."""
        return self.data[self.starts[index] : self.content_ends[index]]

    def text(self, index: int, max_bytes: int | None = None) -> str:
        """The text of line ``index`` (0-based), without its line break; bytes that are not
        UTF-8 become U+FFFD. With ``max_bytes``, a longer line is cut there and ends in "…"."""
        start, end = int(self.starts[index]), int(self.content_ends[index])
        if max_bytes is not None and end - start > max_bytes:
            return self.data[start : start + max_bytes].decode("utf-8", "replace") + "…"
        return self.data[start:end].decode("utf-8", "replace")


def iter_line_chunks(
    path: Path, chunk_bytes: int, max_line_bytes: int
) -> Iterator[tuple[bytes, int, int]]:
    """(bytes of whole lines, lines before them, input bytes they cover) of ``path``, about
    ``chunk_bytes`` at a time; a leading UTF-8 BOM is dropped. A line with no line break
    within ``LINE_CAP_LINES`` line limits (and the chunk size) is refused: the input is not
    line-oriented text."""
    cap = max(chunk_bytes, LINE_CAP_LINES * max_line_bytes)
    pending = b""
    before = 0
    first = True
    with path.open("rb") as f:
        while True:
            block = f.read(chunk_bytes)
            size = len(block)
            if first:
                first = False
                if block.startswith(_UTF8_BOM):
                    block = block[len(_UTF8_BOM) :]
            if not block:
                if pending:
                    yield pending, before, 0
                return
            data = pending + block if pending else block
            cut = data.rfind(b"\n")
            if cut < 0:
                if len(data) > cap:
                    raise SchemaError(
                        f"{path}: line {before + 1}: no line break in {len(data):,} bytes (over "
                        f"{LINE_CAP_LINES} x --max-line-bytes): not a line-oriented text file?"
                    )
                pending = data
                continue
            chunk, pending = data[: cut + 1], data[cut + 1 :]
            yield chunk, before, size
            before += chunk.count(b"\n")


def columns_as_text(
    table: pa.Table, names: dict[str, str], line_numbers: np.ndarray, separator: str = "|"
) -> tuple[dict[str, pa.Array], list[BadLine], np.ndarray]:
    """Each wanted field of a decoded ``table`` (JSON Lines, Parquet) as strings (numbers,
    booleans, timestamps formatted); a list field of a list role (``LIST_KINDS``: sparse
    lists, histories, candidates and their parallel lists) as its items joined by
    ``separator``.

    A field holding a JSON object or array (other than such a list) makes its line bad (first
    such field per line); returns the columns, those bad lines and the (N,) mask of rows they
    flag.
    """
    out: dict[str, pa.Array] = {}
    bad: list[BadLine] = []
    flagged = np.zeros(table.num_rows, dtype=bool)
    for role, col in names.items():
        if col not in table.column_names:
            out[role] = pa.nulls(table.num_rows, pa.string())
            continue
        column = table.column(col).combine_chunks()
        typ = column.type
        if role.split(":", 1)[0] in LIST_KINDS and _is_flat_list(typ):
            items = pc.cast(column, pa.list_(pa.string()))
            out[role] = pc.binary_join(items, separator)
        elif pa.types.is_nested(typ):
            kind = "an array" if pa.types.is_list(typ) else "an object"
            present = np.asarray(column.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
            for i in np.flatnonzero(present & ~flagged):
                bad.append(
                    BadLine(int(line_numbers[i]), col, f"expected a string or number, got {kind}")
                )
            flagged |= present
            out[role] = pa.nulls(table.num_rows, pa.string())
        elif pa.types.is_null(typ):
            out[role] = pa.nulls(table.num_rows, pa.string())
        else:
            out[role] = pc.cast(column, pa.string())
    return out, bad, flagged


def _is_flat_list(typ: pa.DataType) -> bool:
    return (pa.types.is_list(typ) or pa.types.is_large_list(typ)) and not pa.types.is_nested(
        typ.value_type
    )
