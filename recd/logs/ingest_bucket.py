"""Pass 2 of ``recd logs ingest``: per bucket of whole sessions, parse the core columns with
the resolved modes, report each bad line once, and build the good rows' events and samples."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from recd.logs.ingest_features import FEATURE_KINDS
from recd.logs.ingest_mapping import IngestMapping
from recd.logs.ingest_merge import merge_files, write_sorted
from recd.logs.ingest_read import Modes
from recd.logs.ingest_requests import GoodRows, build_events, empty_events, key_conflicts
from recd.logs.ingest_samples import BucketEvents, BucketSamples, SampleStats, build_catalogue
from recd.logs.ingest_spill import Plan, Spill
from recd.logs.ingest_text import BadLine, roles
from recd.logs.ingest_values import (
    is_missing,
    parse_item,
    parse_request_keys,
    parse_session,
    parse_ts,
    quote,
)


@dataclass(slots=True)
class Done:
    """Pass 2 over every bucket: bad lines, good event types, statistics, samples."""

    bad: list[BadLine]
    event_names: set[str]
    stats: SampleStats
    batches: Callable[[], Iterator[pa.RecordBatch]]


def samples_per_bucket(
    spill: Spill,
    mapping: IngestMapping,
    modes: Modes,
    provisional: list[str],
    plan: Plan,
    spill_schema: pa.Schema | None,
    request_id_base: int,
) -> Done:
    """Pass 2: per bucket, parse, order the sessions, cut the histories; one bucket's samples
    stay in memory, several buckets' go to sorted files that are merged on output."""
    schema = _output_schema(mapping)
    event_id = {name: i + 1 for i, name in enumerate(provisional)}
    bad: list[BadLine] = []
    names: set[str] = set()
    stats = SampleStats()
    kept: BucketSamples | None = None
    sorted_paths: list[Path] = []
    for bucket in range(plan.buckets):
        table = spill.read(bucket, spill_schema)
        events, bucket_bad, bucket_names = _parse_bucket(
            table, mapping, modes, event_id, request_id_base
        )
        del table
        bad.extend(bucket_bad)
        names |= bucket_names
        samples = BucketSamples(events, mapping)
        stats.add(samples.stats(measure_zipf=bucket == 0))
        if plan.buckets == 1:
            kept = samples
        elif len(samples):
            target = spill.root / f"samples-{bucket:04d}.arrow"
            write_sorted(
                target,
                samples.batches(schema, batch_rows=plan.batch_rows),
                schema,
            )
            sorted_paths.append(target)

    def batches() -> Iterator[pa.RecordBatch]:
        if kept is not None:
            yield from kept.batches(schema, batch_rows=plan.batch_rows)
        else:
            yield from merge_files(
                sorted_paths, scratch=spill.root, batch_rows=plan.batch_rows, schema=schema
            )

    return Done(bad=bad, event_names=names, stats=stats, batches=batches)


def _output_schema(mapping: IngestMapping) -> pa.Schema:
    """The sample schema (no metadata) of this mapping: what the catalogue will describe."""
    stats = SampleStats()
    return build_catalogue(stats, mapping, event_types=0).arrow_schema().remove_metadata()


def _parse_bucket(
    table: pa.Table,
    mapping: IngestMapping,
    modes: Modes,
    event_id: dict[str, int],
    request_id_base: int,
) -> tuple[BucketEvents, list[BadLine], set[str]]:
    """Parse the core columns of a bucket with the resolved modes; report each bad line's first
    bad field (core fields first, then the mapped features pass 1 checked, then a request key
    shared by two sessions); build the good rows' events and samples."""
    n = table.num_rows
    if n == 0:
        return empty_events(mapping), [], set()
    col = {name: table.column(name).combine_chunks() for name in table.column_names}
    lines = np.asarray(col["line"].to_numpy(), dtype=np.int64)
    history_only = np.asarray(col["history_only"].to_numpy(zero_copy_only=False), dtype=bool)
    no_item = is_missing(col["item"])
    kept_itemless = history_only & no_item & mapping.keep_itemless
    session, _ = parse_session(col["session"], modes.session_ids)
    if mapping.ts_unit == "auto" and modes.ts_unit in ("ms", "s"):
        ts, _ = parse_ts(col["ts"], "number", number_unit=modes.ts_unit, mix=modes.ts_mix)
    else:
        ts, _ = parse_ts(col["ts"], modes.ts_unit)
    parsed = {"session": session, "ts": ts, "item": parse_item(col["item"])}
    # when a present value is required: items not on request rows of a per-request log (those
    # pass 1 checked), not on kept itemless rows
    required = {
        "session": np.ones(n, dtype=bool),
        "ts": np.ones(n, dtype=bool),
        "item": np.zeros(n, dtype=bool) if mapping.candidates else ~kept_itemless,
        "event": np.ones(n, dtype=bool),
    }
    names = roles(mapping)
    bad: list[BadLine] = []
    row_bad = np.asarray(col["flagged"].to_numpy(zero_copy_only=False), dtype=bool).copy()
    for role in [r for r in ("session", "ts", "item", "event") if r in names]:
        # report the first failing field of each line
        missing = is_missing(col[role])
        failed = parsed[role].failed & ~missing if role in parsed else np.zeros(n, dtype=bool)
        for mask, problem in (
            (missing & required[role], None),
            (failed, parsed[role].problem if role in parsed else None),
        ):
            for i in np.flatnonzero(mask & ~row_bad):
                raw = col[role][int(i)].as_py()
                message = "missing value" if problem is None else problem(raw)
                bad.append(BadLine(int(lines[i]), names[role], message))
            row_bad |= mask
    feature_bad = np.asarray(col["bad_field"].is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    fields, problems = col["bad_field"].to_pylist(), col["bad_problem"].to_pylist()
    for j in np.flatnonzero(feature_bad & ~row_bad).tolist():
        bad.append(BadLine(int(lines[j]), fields[j], problems[j]))
    row_bad |= feature_bad
    request_key = parse_request_keys(col["request"]) if mapping.request else None
    if request_key is not None and not mapping.candidates:
        keyed = np.flatnonzero(~row_bad & ~history_only)
        conflict = keyed[key_conflicts(session.values[keyed], request_key[keyed], lines[keyed])]
        for i in conflict.tolist():
            message = (
                f"request key {quote(col['request'][i].as_py())} is used by another session "
                "too: a request belongs to one session"
            )
            bad.append(BadLine(int(lines[i]), names["request"], message))
        row_bad[conflict] = True
    good = np.flatnonzero(~row_bad)
    take = pa.array(good)
    encoded = pc.dictionary_encode(pc.fill_null(col["event"].take(take), ""))
    dictionary = encoded.dictionary.to_pylist()
    ids = np.array([event_id.get(s, 0) for s in dictionary], dtype=np.int64)[_indices(encoded)]
    positive = None
    if not mapping.label_columns:
        flags = np.isin(np.array(dictionary, dtype=object), mapping.positives)
        positive = flags[_indices(encoded)].astype(np.float32)
    item = np.asarray(parsed["item"].values)[good]
    itemless = kept_itemless[good]
    rows = GoodRows(
        lines=lines[good],
        session=np.asarray(session.values)[good],
        ts=np.asarray(ts.values)[good],
        item=np.where(itemless, mapping.itemless_item_id, item),
        has_item=~no_item[good] | itemless,
        event_ids=ids,
        positive=positive,
        history_only=history_only[good],
        request_key=None if request_key is None else request_key[good],
        columns={
            name: column.take(take)
            for name, column in col.items()
            if name.split(":", 1)[0] in FEATURE_KINDS and ":" in name
        },
    )
    events = build_events(rows, mapping, request_id_base=request_id_base)
    return events, bad, {name for name in dictionary if name}


def _indices(encoded: pa.DictionaryArray) -> np.ndarray:
    return np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
