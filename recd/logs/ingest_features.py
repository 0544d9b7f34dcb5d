"""The mapped feature columns of one chunk of ``recd logs ingest`` (labels, dense, sparse,
lists, per-candidate lists, the clicked item), parsed and checked in pass 1."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.logs.ingest_mapping import IngestMapping
from recd.logs.ingest_text import LIST_KINDS
from recd.logs.ingest_values import (
    is_missing,
    parse_ids,
    parse_number,
    parse_number_lists,
    shorten,
)

FEATURE_KINDS = ("label", "dense", "sparse", *LIST_KINDS, "clicked")


@dataclass(slots=True)
class Features:
    """The mapped feature columns of one chunk (N rows), parsed, and its rows' first bad
    feature (None where all are good)."""

    columns: dict[str, pa.Array]  # role -> (N,) typed column (see parse_features)
    history_only: np.ndarray  # (N,) bool: the row is an event for histories only, no sample
    bad_field: list[str | None]
    bad_problem: list[str | None]

    def fail(self, rows: np.ndarray, column: str, problem: Callable[[int], str]) -> None:
        """Record ``problem(row)`` for ``column`` on each of ``rows`` (indices) that has no
        bad feature yet."""
        for i in rows.tolist():
            if self.bad_field[i] is None:
                self.bad_field[i] = shorten(column)
                self.bad_problem[i] = problem(i)


def parse_features(
    columns: dict[str, pa.Array],
    trimmed: dict[str, pa.Array],
    names: dict[str, str],
    mapping: IngestMapping,
) -> Features:
    """Parse the mapped features of one chunk (N rows) and tell samples from history-only
    rows.

    Typed columns by role: ``label:`` / ``dense:`` float32; ``sparse:`` / ``list:`` /
    ``hist:`` / ``cand:`` / ``csparse:`` list<int64>; ``cdense:`` / ``clabel:`` list<float32>;
    ``clicked:`` int64 (-1: no click). History-only rows (an event log's kept itemless events;
    an impression log's interaction events: no candidates, or no request key) are no samples:
    their features are not checked. A request's parallel lists must have one value per
    candidate and its clicked item must be one of them.
    """
    n = len(trimmed["session"])
    out = Features(
        columns={},
        history_only=np.zeros(n, dtype=bool),
        bad_field=[None] * n,
        bad_problem=[None] * n,
    )
    no_item = is_missing(trimmed["item"])
    lengths = np.zeros(n, dtype=np.int64)  # candidates of each row (request form)
    cand_role = f"cand:{mapping.candidates}"
    if mapping.candidates:
        cand_text = pc.utf8_trim_whitespace(columns[cand_role])
        cand = parse_ids(cand_text, True, mapping.list_separator)
        out.columns[cand_role] = cand.values
        lengths = np.asarray(pc.list_value_length(cand.values).to_numpy(zero_copy_only=False))
        if mapping.item:  # a row without candidates is an interaction event
            out.history_only = lengths == 0
        else:  # every row must be a request
            out.fail(
                np.flatnonzero(lengths == 0),
                mapping.candidates,
                lambda i: "empty candidate list (with no mapping.item every row is a request)",
            )
    elif mapping.request:
        out.history_only = is_missing(trimmed["request"])
    elif mapping.keep_itemless:
        out.history_only = no_item
    if mapping.candidates and mapping.item and not mapping.keep_itemless:
        out.fail(
            np.flatnonzero((lengths == 0) & no_item),
            mapping.candidates,
            lambda i: (
                f"empty candidate list and no {mapping.item}: neither a request nor an "
                "interaction event"
            ),
        )
    row_bad = out.history_only | np.array([f is not None for f in out.bad_field], dtype=bool)
    if mapping.candidates:
        out.fail(
            np.flatnonzero(cand.failed & ~row_bad),
            mapping.candidates,
            lambda i: cand.problem(cand_text[i].as_py()),
        )
        row_bad |= cand.failed
    clicked: np.ndarray | None = None
    for role, col in names.items():
        kind = role.split(":", 1)[0]
        if kind not in FEATURE_KINDS or role == cand_role:
            continue
        values = pc.utf8_trim_whitespace(columns[role])
        if kind in ("label", "dense"):
            parsed = parse_number(values, kind, mapping.missing_dense if kind == "dense" else None)
            out.columns[role] = pa.array(parsed.values, pa.float32())
        elif kind in ("cdense", "clabel"):
            number_kind = "label" if kind == "clabel" else "dense"
            parsed = parse_number_lists(values, number_kind, mapping.list_separator)
            out.columns[role] = parsed.values
        elif kind == "clicked":
            parsed = parse_ids(values, False, mapping.list_separator)
            got = np.asarray(pc.list_value_length(parsed.values).to_numpy(zero_copy_only=False))
            flat = np.asarray(pc.list_flatten(parsed.values).to_numpy(zero_copy_only=False))
            clicked = np.full(n, -1, dtype=np.int64)
            clicked[got > 0] = flat
            out.columns[role] = pa.array(clicked)
            parsed.failed &= ~is_missing(values)  # no click is no error
        else:
            parsed = parse_ids(values, kind not in ("sparse",), mapping.list_separator)
            out.columns[role] = parsed.values
        for i in np.flatnonzero(parsed.failed & ~row_bad).tolist():
            raw = values[i].as_py()
            out.bad_field[i] = shorten(col)
            out.bad_problem[i] = "missing value" if raw in (None, "") else parsed.problem(raw)
        row_bad |= parsed.failed
        if kind in ("cdense", "csparse", "clabel"):
            got = np.asarray(pc.list_value_length(out.columns[role]).to_numpy(zero_copy_only=False))
            wrong = np.flatnonzero((got != lengths) & ~row_bad)
            out.fail(wrong, col, _parallel_problem(got, lengths, mapping.candidates))
            row_bad[wrong] = True
    if clicked is not None:
        cand_values = out.columns[f"cand:{mapping.candidates}"]
        hits = _clicked_hits(cand_values, clicked)
        missed = np.flatnonzero((clicked >= 0) & (hits == 0) & ~row_bad)
        out.fail(
            missed,
            mapping.clicked,
            lambda i: (
                f"clicked item {clicked[i]} is not among the row's {lengths[i]} "
                f"candidates ({mapping.candidates})"
            ),
        )
    return out


def _parallel_problem(got: np.ndarray, want: np.ndarray, candidates: str) -> Callable[[int], str]:
    """The problem of row i of a parallel list with ``got[i]`` values for ``want[i]``
    candidates."""

    def problem(i: int) -> str:
        return (
            f"{got[i]} values for {want[i]} candidates: a list parallel to {candidates} has one "
            "value per candidate"
        )

    return problem


def _clicked_hits(candidates: pa.Array, clicked: np.ndarray) -> np.ndarray:
    """(N,) int64: how many of each row's candidates equal its clicked item (-1: none)."""
    lengths = np.asarray(pc.list_value_length(candidates).to_numpy(zero_copy_only=False))
    flat = np.asarray(pc.list_flatten(candidates).to_numpy(zero_copy_only=False))
    row = np.repeat(np.arange(len(clicked)), lengths)
    return np.bincount(row[flat == clicked[row]], minlength=len(clicked))
