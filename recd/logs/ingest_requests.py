"""Events and samples of one ingest bucket, by the shape of the log.

``recd.logs.ingest_bucket`` parses a bucket's good rows (:class:`GoodRows`); :func:`build_events`
turns them into the events and samples of :class:`recd.logs.ingest_samples.BucketEvents`:

* an **event log** (no ``candidates``, no ``request``): every row is an event; a row with an
  item is one sample (its own ``request_id``: the line number); a kept itemless row is an
  event for histories only;
* **one row per request** (``candidates``): a row with candidates is a request event with one
  sample per candidate, in list order; the request-level columns (``dense``, ``sparse``,
  ``sparse_lists``, ``histories``) stay with the event, the parallel lists, the labels and
  the ``clicked`` label go to the samples; a row without candidates is an interaction event.
  A request row with an item (e.g. the clicked one) also enters later histories;
* **one row per candidate** (``request``): the rows of a session with one request key form
  one request event (the ``ts`` and line of its first row in the file), its rows its samples
  in file order, every mapped column per sample; a row with no key is an interaction event.

Interaction events keep their items (they are what histories are made of); only a kept
itemless event stands in with ``itemless_item_id``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.logs.ingest_mapping import LABEL, IngestMapping
from recd.logs.ingest_samples import BucketEvents, SampleColumns

__all__ = ["GoodRows", "build_events", "empty_events", "key_conflicts"]


@dataclass(slots=True)
class GoodRows:
    """The good rows of one bucket (R rows, input order), parsed."""

    lines: np.ndarray  # (R,) int64 1-based input line (row) numbers
    session: np.ndarray  # (R,) int64
    ts: np.ndarray  # (R,) int64 epoch ms
    item: np.ndarray  # (R,) int64 the row's item (a kept itemless row: the stand-in id)
    has_item: np.ndarray  # (R,) bool: an item, or a kept itemless row (enters histories)
    event_ids: np.ndarray  # (R,) int64 provisional event type ids (0: no event column)
    positive: np.ndarray | None  # (R,) float32 label from the event type; None: label columns
    history_only: np.ndarray  # (R,) bool: an event for histories only (no sample)
    request_key: np.ndarray | None  # (R,) int64 the request column's key (None: unmapped)
    columns: dict[str, pa.Array]  # "KIND:COLUMN" role -> (R,) parsed feature column


def build_events(rows: GoodRows, mapping: IngestMapping, *, request_id_base: int) -> BucketEvents:
    """The events and samples of ``rows`` (see the module docstring for the three shapes)."""
    if mapping.candidates:
        return _request_rows(rows, mapping, request_id_base)
    if mapping.request:
        return _candidate_rows(rows, mapping, request_id_base)
    return _event_rows(rows, mapping, request_id_base)


def empty_events(mapping: IngestMapping) -> BucketEvents:
    """The events of a bucket with no good row."""
    empty = np.zeros(0, dtype=np.int64)
    columns = {
        role: pa.array([], _ROLE_TYPES[role.split(":", 1)[0]]) for role in _feature_roles(mapping)
    }
    rows = GoodRows(
        lines=empty,
        session=empty,
        ts=empty,
        item=empty,
        has_item=np.zeros(0, dtype=bool),
        event_ids=empty,
        positive=None if mapping.label_columns else np.zeros(0, np.float32),
        history_only=np.zeros(0, dtype=bool),
        request_key=empty if mapping.request else None,
        columns=columns,
    )
    return build_events(rows, mapping, request_id_base=0)


def key_conflicts(session: np.ndarray, key: np.ndarray, lines: np.ndarray) -> np.ndarray:
    """(R,) bool: the rows whose request key the file used first (lowest line) in another
    session: a request belongs to one session."""
    order = np.lexsort((lines, key))
    first = np.ones(len(order), dtype=bool)
    first[1:] = key[order][1:] != key[order][:-1]
    owner = session[order][np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))]
    conflict = np.zeros(len(order), dtype=bool)
    conflict[order] = session[order] != owner
    return conflict


_ROLE_TYPES = {
    "label": pa.float32(),
    "dense": pa.float32(),
    "sparse": pa.list_(pa.int64()),
    "list": pa.list_(pa.int64()),
    "hist": pa.list_(pa.int64()),
    "cand": pa.list_(pa.int64()),
    "csparse": pa.list_(pa.int64()),
    "cdense": pa.list_(pa.float32()),
    "clabel": pa.list_(pa.float32()),
    "clicked": pa.int64(),
}


def _feature_roles(mapping: IngestMapping) -> list[str]:
    roles = [f"label:{c}" for c in mapping.labels] + [f"dense:{c}" for c in mapping.dense]
    roles += [f"sparse:{c}" for c in mapping.sparse] + [f"list:{c}" for c in mapping.sparse_lists]
    roles += [f"hist:{c}" for c in mapping.history_columns]
    if mapping.candidates:
        roles.append(f"cand:{mapping.candidates}")
    roles += [f"cdense:{c}" for c in mapping.candidate_dense]
    roles += [f"csparse:{c}" for c in mapping.candidate_sparse]
    roles += [f"clabel:{c}" for c in mapping.candidate_labels]
    if mapping.clicked:
        roles.append(f"clicked:{mapping.clicked}")
    return roles


def _event_values(
    rows: GoodRows, mapping: IngestMapping
) -> tuple[dict[str, np.ndarray], dict[str, pa.Array]]:
    """The mapped dense and sparse columns (``dense``; ``sparse``, ``sparse_lists``,
    ``histories``) of every row: name -> (R,) column."""
    dense = {c: _floats(rows.columns[f"dense:{c}"]) for c in mapping.dense}
    sparse = {
        c: rows.columns[f"{kind}:{c}"]
        for kind, columns in (
            ("sparse", mapping.sparse),
            ("list", mapping.sparse_lists),
            ("hist", mapping.history_columns),
        )
        for c in columns
    }
    return dense, sparse


def _labels(rows: GoodRows, mapping: IngestMapping, take: np.ndarray) -> dict[str, np.ndarray]:
    """Labels of the rows ``take`` from label columns, or ``label`` from the event types."""
    if rows.positive is None:
        return {c: _floats(rows.columns[f"label:{c}"])[take] for c in mapping.labels}
    return {LABEL: rows.positive[take]}


def _event_rows(rows: GoodRows, mapping: IngestMapping, base: int) -> BucketEvents:
    samples = np.flatnonzero(~rows.history_only)
    dense, sparse = _event_values(rows, mapping)
    return BucketEvents(
        lines=rows.lines,
        session=rows.session,
        ts=rows.ts,
        request_id=rows.lines + base,
        item=rows.item,
        event_ids=rows.event_ids,
        is_entry=rows.has_item,
        counts=(~rows.history_only).astype(np.int64),
        samples=SampleColumns(item=rows.item[samples], labels=_labels(rows, mapping, samples)),
        dense=dense,
        sparse=sparse,
        sample_lines=len(samples),
    )


def _request_rows(rows: GoodRows, mapping: IngestMapping, base: int) -> BucketEvents:
    candidates = rows.columns[f"cand:{mapping.candidates}"]
    counts = np.where(rows.history_only, 0, _list_lengths(candidates))
    requests = pa.array(np.flatnonzero(counts))

    def flat(role: str) -> np.ndarray:
        return np.asarray(pc.list_flatten(rows.columns[role].take(requests)).to_numpy())

    items = flat(f"cand:{mapping.candidates}").astype(np.int64)
    m = len(items)
    if mapping.clicked:
        clicked = np.asarray(rows.columns[f"clicked:{mapping.clicked}"].to_numpy())
        by_sample = np.repeat(clicked[counts > 0], counts[counts > 0])
        labels = {LABEL: (items == by_sample).astype(np.float32)}
    else:
        labels = {c: flat(f"clabel:{c}").astype(np.float32) for c in mapping.candidate_labels}
    one = pa.array(np.arange(m + 1, dtype=np.int32))
    samples = SampleColumns(
        item=items,
        labels=labels,
        dense={c: flat(f"cdense:{c}").astype(np.float32) for c in mapping.candidate_dense},
        sparse={
            c: pa.ListArray.from_arrays(one, pa.array(flat(f"csparse:{c}"), pa.int64()))
            for c in mapping.candidate_sparse
        },
    )
    dense, sparse = _event_values(rows, mapping)
    request_id = rows.request_key if rows.request_key is not None else rows.lines + base
    return BucketEvents(
        lines=rows.lines,
        session=rows.session,
        ts=rows.ts,
        request_id=request_id,
        item=rows.item,
        event_ids=rows.event_ids,
        is_entry=rows.has_item,
        counts=counts.astype(np.int64),
        samples=samples,
        dense=dense,
        sparse=sparse,
        sample_lines=len(requests),
    )


def _candidate_rows(rows: GoodRows, mapping: IngestMapping, base: int) -> BucketEvents:
    assert rows.request_key is not None
    cand = np.flatnonzero(~rows.history_only)
    inter = np.flatnonzero(rows.history_only)
    # candidates grouped by request (session, key), in file order inside a request
    order = cand[np.lexsort((rows.lines[cand], rows.request_key[cand], rows.session[cand]))]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (rows.session[order][1:] != rows.session[order][:-1]) | (
        rows.request_key[order][1:] != rows.request_key[order][:-1]
    )
    heads = order[first]  # each request's first row
    sizes = np.diff(np.append(np.flatnonzero(first), len(order)))
    dense, sparse = _event_values(rows, mapping)
    take = pa.array(order)
    samples = SampleColumns(
        item=rows.item[order],
        labels=_labels(rows, mapping, order),
        dense={name: values[order] for name, values in dense.items()},
        sparse={name: lists.take(take) for name, lists in sparse.items()},
    )
    g = len(heads)
    return BucketEvents(
        lines=np.concatenate([rows.lines[heads], rows.lines[inter]]),
        session=np.concatenate([rows.session[heads], rows.session[inter]]),
        ts=np.concatenate([rows.ts[heads], rows.ts[inter]]),
        request_id=np.concatenate([rows.request_key[heads], rows.lines[inter] + base]),
        item=np.concatenate([np.zeros(g, np.int64), rows.item[inter]]),
        event_ids=np.concatenate([np.zeros(g, np.int64), rows.event_ids[inter]]),
        is_entry=np.concatenate([np.zeros(g, bool), rows.has_item[inter]]),
        counts=np.concatenate([sizes, np.zeros(len(inter), np.int64)]).astype(np.int64),
        samples=samples,
        sample_lines=len(order),
    )


def _list_lengths(lists: pa.Array) -> np.ndarray:
    return np.asarray(pc.list_value_length(lists).to_numpy(zero_copy_only=False), dtype=np.int64)


def _floats(values: pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=np.float32)
