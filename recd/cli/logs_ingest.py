"""``recd logs ingest``: real event logs (CSV / JSON Lines) -> raw logs of the sample schema."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from recd.cli.output import add_json_option, emit
from recd.errors import ConfigError, StorageError
from recd.logs.ingest import (
    BAD_ROW_POLICIES,
    DEFAULT_MEMORY_BUDGET_BYTES,
    FORMATS,
    MAX_LINE_BYTES,
    IngestReport,
    ingest_events,
    memory_bound_bytes,
)
from recd.logs.ingest_mapping import (
    DEFAULT_POSITIVE_EVENTS,
    SESSION_ID_MODES,
    TS_UNITS,
    IngestMapping,
)
from recd.logs.ingest_values import QUOTE_CHARS, shorten
from recd.writable import check_can_replace

VOCAB_SHOWN = 20  # event types listed in the summary; _ingest.json has them all

MIB = 1 << 20
DEFAULT_BUDGET_MB = DEFAULT_MEMORY_BUDGET_BYTES // MIB

DESCRIPTION = f"""\
Turn an event log (CSV, JSON Lines or Parquet, one event per line / row with a session or
user id, a timestamp, an item id and an event type) into a raw-log directory that `recd logs
shard` and `recd etl` read. This is how to try the pipeline on your own data.

Columns: name them with the --*-col flags, or with a mapping TOML (--mapping FILE; its keys:
session, ts, item, event, ts_unit, session_ids, positive_events, labels, dense, missing_dense,
sparse, sparse_lists, list_separator, history, keep_itemless, itemless_item_id, histories,
request, candidates, candidate_dense, candidate_sparse, candidate_labels, clicked, position;
see docs/own-data.md). Flags override the file. The event column is optional when the labels
come from label columns (event = "" in the mapping).

One sample per event that has an item, written in timestamp order, with
  label                  1 if the event type is in --positive-events, else 0
                         (or, with --label-cols, one float label per label column)
  item_id                [the event's item id]
  hist_item_ids          item ids of the session's last N earlier events (N = --history)
  hist_event_types       their event types (synchronised group "history" with hist_item_ids)
  hist_len               number of earlier events in the history (<= N)
  secs_since_prev_event  seconds since the session's previous event (0 for its first)
  <dense col>            --dense-cols: float32 (missing: a bad line, or --missing-dense)
  <sparse col>           --sparse-cols: [id]; --sparse-list-cols: the ids (3|17|42 in CSV)
  request_id             the event's line number in the input (Parquet: row number)
--history 0 leaves out hist_len and both history features. --keep-itemless keeps events with
no item (searches, filters) in the histories, as item --itemless-item-id (default 0), instead
of refusing them; they are no samples. The current event's type is not a feature (the label
derives from it). Event types are lower-cased and numbered 1..V by name; OUT/_ingest.json
keeps the vocabulary (reuse it for the next file with --event-vocab OUT/_ingest.json).
A label with one value on every sample is logged as a warning (check --positive-events).

Impression logs (one request scores several candidate items) come in two shapes:
  one row per request  --candidates-col: a row with a candidate list (3|17|42) is a request,
                       one sample per candidate in list order sharing the row's request_id
                       (its line, or --request-col), ts and request-level columns; parallel
                       lists (candidate_dense / candidate_sparse / candidate_labels in the
                       mapping) or --clicked-col give the candidates' features and labels
  one row per candidate --request-col: the rows of a session with one key are one request
                       (request_id = the key, ts = its first row's), in file order
Rows with no candidates (no request key) are interaction events: they feed the histories with
their items and event types (hist_item_ids is the session's last N events before the request)
but are no samples. A dense feature `position` holds each candidate's place in its list.
Declared history columns (mapping histories = {{group = [columns]}}) are catalogued as
histories of that group, pooled by the rm1 model's transformers.

Timestamps: epoch ms, epoch s or ISO 8601 (no zone = UTC); --ts-unit auto picks per file
(numbers: the unit most of them have; a file mixing seconds and milliseconds is refused).
Dates must fall in the years 1-9999; --ts-unit ms on epoch seconds (every date before 1990 as
ms, from 1990 on as s) is refused; a log dated before 1990 otherwise gets a warning.
Session ids: integers (any int64, negative too), or strings hashed to a stable 63-bit id
(same on every run). The summary's sessions are distinct session ids with a sample.
Item ids: integers >= 0.

Bad lines (wrong field count, an unmatched quote, invalid JSON, a missing or unparsable value,
bytes that are not UTF-8, a line longer than --max-line-bytes) are reported with file, line
number and field; impression logs also: parallel lists of another length than the candidate
list, a clicked item not in the list, an empty candidate list on a row with no item, a request
key used by two sessions. --on-bad-rows fail (default) stops at the first one (exit 2);
quarantine writes each to OUT/_quarantine.jsonl and counts it (rows in = sample rows +
history-only + quarantined). Messages quote at most {QUOTE_CHARS} characters of a value.

An input with no events (empty, only blank lines, only a CSV header, or only bad lines when
quarantining) is refused (exit 2) and OUT is left as it was; --allow-empty writes an empty OUT
instead.

Memory: the input is streamed. Pass 1 reads chunks of budget/16 bytes (at least 1 MiB) and
writes the parsed columns to B temporary bucket files beside OUT (B = sessions hashed so that
one bucket takes at most half the budget; B = 1 keeps them in memory); pass 2 sorts one
bucket at a time by (session, ts, line), cuts the histories and writes its samples; the
buckets are merged into timestamp order. Peak memory stays within --memory-budget-mb +
{memory_bound_bytes(0) // MIB} MiB whatever the file size, as long as one session's events are
small next to the budget; the temporary files take about 2x the input. Default budget
{DEFAULT_BUDGET_MB} MiB.
Default positive events: {",".join(DEFAULT_POSITIVE_EVENTS)}.
"""


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "ingest",
        help="turn CSV / JSON Lines / Parquet event logs into raw logs (histories, labels)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "events", type=Path, metavar="EVENTS", help="a .csv, .jsonl or .parquet event log"
    )
    parser.add_argument("--out", type=Path, required=True, help="output raw-log directory")
    parser.add_argument(
        "--format", choices=FORMATS, default=None, help="input format (default: from the suffix)"
    )
    parser.add_argument(
        "--mapping", type=Path, default=None, help="column mapping TOML (flags override it)"
    )
    columns = parser.add_argument_group("columns (default: the mapping's, else the shown name)")
    columns.add_argument("--session-col", help="session / user id column (session_id)")
    columns.add_argument("--ts-col", help="timestamp column (ts)")
    columns.add_argument("--item-col", help="item id column (item_id)")
    columns.add_argument("--event-col", help="event type column (event_type)")
    columns.add_argument(
        "--ts-unit",
        choices=TS_UNITS,
        help="timestamp format (auto: ISO or numbers, read per log in the unit most of its "
        "numbers have, ms for magnitudes >= 1e11, else s; a log mixing the two is refused, "
        "naming its first line of the other unit). A number whose date falls outside the years "
        "1-9999 is a bad line; ms on a log that would all fall before 1990 but from 1990 on "
        "read as s is refused (use s); any other log dated before 1990 gets a warning",
    )
    columns.add_argument(
        "--session-ids",
        choices=SESSION_ID_MODES,
        help="int: ids must be integers (any int64, negative ones too); hash: hash every id as "
        "a string; auto (default): int if all are",
    )
    columns.add_argument(
        "--history", type=int, help="N: events kept in the history features (20; 0: none)"
    )
    columns.add_argument(
        "--positive-events",
        help="comma-separated event types whose label is 1 (default: "
        f"{','.join(DEFAULT_POSITIVE_EVENTS)})",
    )
    columns.add_argument(
        "--label-cols", help="comma-separated label columns (numbers / true, false) instead"
    )
    columns.add_argument("--dense-cols", help="comma-separated numeric columns (dense features)")
    columns.add_argument(
        "--missing-dense", type=float, help="value of a missing dense value (default: bad line)"
    )
    columns.add_argument("--sparse-cols", help="comma-separated id columns (sparse features)")
    columns.add_argument(
        "--sparse-list-cols", help="comma-separated list columns (sparse features of many ids)"
    )
    columns.add_argument("--list-separator", help="separator of ids in a CSV list value (|)")
    columns.add_argument(
        "--keep-itemless",
        action="store_true",
        default=None,
        help="keep events with no item in the histories (not as samples) instead of refusing",
    )
    columns.add_argument(
        "--itemless-item-id", type=int, help="item id of such events in hist_item_ids (0)"
    )
    imp = parser.add_argument_group(
        "impression logs (one request scores several candidates; the mapping has the "
        "per-candidate lists and declared histories)"
    )
    imp.add_argument(
        "--candidates-col",
        help="candidate-list column: one row per request, one sample per candidate",
    )
    imp.add_argument(
        "--request-col",
        help="request-key column: one row per candidate (with --candidates-col: the request id)",
    )
    imp.add_argument(
        "--clicked-col", help="clicked-item column: label 1 on the candidate equal to it"
    )
    parser.add_argument(
        "--on-bad-rows",
        choices=BAD_ROW_POLICIES,
        default="fail",
        help="fail at the first bad line (default) or quarantine bad lines and go on",
    )
    parser.add_argument(
        "--event-vocab",
        type=Path,
        default=None,
        help="JSON with event type ids to reuse (an earlier OUT/_ingest.json or a name->id map)",
    )
    parser.add_argument(
        "--delimiter",
        default=",",
        help="CSV field delimiter: one character, or '\\t' or tab for a tab (default ',')",
    )
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        default=MAX_LINE_BYTES,
        help=f"longest input line accepted, and so longest value ({MAX_LINE_BYTES:,} bytes); "
        "a longer line is a bad line",
    )
    parser.add_argument(
        "--memory-budget-mb",
        type=int,
        default=DEFAULT_BUDGET_MB,
        help=f"memory the read is planned for, in MiB ({DEFAULT_BUDGET_MB}; at least 16); peak "
        f"memory stays within it + {memory_bound_bytes(0) // MIB} MiB",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="write an empty OUT for an input with no events instead of refusing it",
    )
    add_json_option(parser, "the report")
    parser.set_defaults(func=run)


def _split(text: str | None) -> list[str] | None:
    return None if text is None else [p.strip() for p in text.split(",") if p.strip()]


def mapping_from_args(args: argparse.Namespace) -> IngestMapping:
    """The mapping of ``--mapping`` (if given) with the column flags given on top."""
    flags: dict[str, Any] = {
        "session": args.session_col,
        "ts": args.ts_col,
        "item": args.item_col,
        "event": args.event_col,
        "ts_unit": args.ts_unit,
        "session_ids": args.session_ids,
        "history": args.history,
        "positive_events": _split(args.positive_events),
        "labels": _split(args.label_cols),
        "dense": _split(args.dense_cols),
        "missing_dense": args.missing_dense,
        "sparse": _split(args.sparse_cols),
        "sparse_lists": _split(args.sparse_list_cols),
        "list_separator": args.list_separator,
        "keep_itemless": args.keep_itemless,
        "itemless_item_id": args.itemless_item_id,
        "candidates": args.candidates_col,
        "request": args.request_col,
        "clicked": args.clicked_col,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if given.get("labels"):  # label columns replace the positive events of a mapping file
        given.setdefault("positive_events", None)
    if args.mapping is not None:
        return IngestMapping.from_toml(args.mapping, overrides=given)
    return IngestMapping.from_dict(given, section="flags")


def run(args: argparse.Namespace) -> int:
    _check_out(args.out)
    report = ingest_events(
        args.events,
        args.out,
        mapping=mapping_from_args(args),
        fmt=args.format,
        on_bad_rows=args.on_bad_rows,
        event_vocabulary=_read_vocabulary(args.event_vocab) if args.event_vocab else None,
        delimiter=args.delimiter,
        max_line_bytes=args.max_line_bytes,
        allow_empty=args.allow_empty,
        memory_budget_bytes=args.memory_budget_mb * MIB,
    )
    emit(args, report.to_dict(), lambda: print(format_report(report)))
    return 0


def _check_out(out: Path) -> None:
    """StorageError (one line naming OUT) unless the raw log can be written: OUT is built
    beside itself and renamed into place, so its directory must take new entries."""
    if out.exists() and not out.is_dir():
        raise StorageError(f"{out}: cannot write here: a file is in the way (not a directory)")
    check_can_replace(out, hint="write the raw log elsewhere (--out)")


def _read_vocabulary(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"--event-vocab {path}: cannot read JSON: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("event_vocabulary"), dict):
        data = data["event_vocabulary"]
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise ConfigError(f"--event-vocab {path}: expected a JSON object of name -> integer id")
    return {str(k): int(v) for k, v in data.items()}


def format_report(report: IngestReport) -> str:
    by_id = sorted(report.event_vocabulary.items(), key=lambda kv: kv[1])
    vocab = ", ".join(f"{shorten(k)}={v}" for k, v in by_id[:VOCAB_SHOWN])
    if len(by_id) > VOCAB_SHOWN:
        vocab += f", … ({len(by_id) - VOCAB_SHOWN:,} more in _ingest.json)"
    impressions = report.mapping.get("candidates") or report.mapping.get("request")
    requests = (
        f"  requests {report.requests:,} ({report.rows_out / report.requests:.1f} candidates each)"
        if impressions and report.requests
        else ""
    )
    lines = [
        f"ingested {report.source} ({report.format}) -> {report.out_dir}",
        f"  rows in {report.rows_in:,}  out {report.rows_out:,}{requests}  quarantined "
        f"{report.quarantined:,}"
        + (f"  history-only {report.history_only:,}" if report.history_only else ""),
        f"  sessions {report.sessions:,} (distinct ids)  positives {report.positives:,}  "
        f"ts {report.ts_unit}  session ids {report.session_ids}  history {report.history}",
    ]
    if report.mapping.get("event"):
        lines.append(f"  event types: {vocab}")
    if report.labels != ["label"]:
        lines.append(f"  labels: {', '.join(report.labels)}")
    if report.buckets > 1:
        lines.append(f"  streamed through {report.buckets} session buckets")
    if report.quarantine_path:
        lines.append(f"  bad lines: {report.quarantine_path}")
    lines += [f"  warning: {w}" for w in report.warnings]
    return "\n".join(lines)
