"""``recd logs ingest``: real event logs (CSV / JSON Lines) -> raw logs of the sample schema."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from recd.errors import ConfigError
from recd.logs.ingest import (
    BAD_ROW_POLICIES,
    DEFAULT_POSITIVE_EVENTS,
    FORMATS,
    MAX_LINE_BYTES,
    QUOTE_CHARS,
    SESSION_ID_MODES,
    TS_UNITS,
    IngestReport,
    ingest_events,
    shorten,
)

VOCAB_SHOWN = 20  # event types listed in the summary; _ingest.json has them all

DESCRIPTION = f"""\
Turn an event log (CSV or JSON Lines, one event per line with a session or user id, a
timestamp, an item id and an event type) into a raw-log directory that `recd logs shard` and
`recd etl` read. This is how to try the pipeline on your own data.

One sample per event, written in timestamp order, with
  label                  1 if the event type is in --positive-events, else 0
  item_id                [the event's item id]
  hist_item_ids          item ids of the session's last N earlier events (N = --history)
  hist_event_types       their event types (synchronised group "history" with hist_item_ids)
  hist_len               number of earlier events in the history (<= N)
  secs_since_prev_event  seconds since the session's previous event (0 for its first)
  request_id             the event's line number in the input
The current event's type is not a feature (the label derives from it). Event types are
lower-cased and numbered 1..V by name; OUT/_ingest.json keeps the vocabulary (reuse it for the
next file with --event-vocab OUT/_ingest.json).

Timestamps: epoch ms, epoch s or ISO 8601 (no zone = UTC); --ts-unit auto picks per file.
Session ids: integers, or strings hashed to a stable 63-bit id (same on every run).
Item ids: integers >= 0.

Bad lines (wrong field count, an unmatched quote, invalid JSON, a missing or unparsable value,
bytes that are not UTF-8, a line longer than --max-line-bytes) are reported with file, line
number and field. --on-bad-rows fail (default) stops at the first one (exit 2); quarantine
writes each to OUT/_quarantine.jsonl and counts it (rows in = rows out + quarantined).
Messages quote at most {QUOTE_CHARS} characters of a value.

An input with no events (empty, only blank lines, only a CSV header, or only bad lines when
quarantining) is refused (exit 2) and OUT is left as it was; --allow-empty writes an empty OUT
instead.

The whole input is held in memory (a few times its size): split big logs, e.g. by day.
Default positive events: {",".join(DEFAULT_POSITIVE_EVENTS)}.
"""


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "ingest",
        help="turn CSV / JSON Lines event logs into raw logs (sessions, histories, labels)",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("events", type=Path, metavar="EVENTS", help="a .csv or .jsonl event log")
    parser.add_argument("--out", type=Path, required=True, help="output raw-log directory")
    parser.add_argument(
        "--format", choices=FORMATS, default=None, help="input format (default: from the suffix)"
    )
    parser.add_argument("--session-col", default="session_id", help="session / user id column")
    parser.add_argument("--ts-col", default="ts", help="timestamp column")
    parser.add_argument("--item-col", default="item_id", help="item id column")
    parser.add_argument("--event-col", default="event_type", help="event type column")
    parser.add_argument(
        "--ts-unit", choices=TS_UNITS, default="auto", help="timestamp format (default auto)"
    )
    parser.add_argument(
        "--history", type=int, default=20, help="N: events kept in the history features (20)"
    )
    parser.add_argument(
        "--positive-events",
        default=",".join(DEFAULT_POSITIVE_EVENTS),
        help="comma-separated event types whose label is 1",
    )
    parser.add_argument(
        "--on-bad-rows",
        choices=BAD_ROW_POLICIES,
        default="fail",
        help="fail at the first bad line (default) or quarantine bad lines and go on",
    )
    parser.add_argument(
        "--session-ids",
        choices=SESSION_ID_MODES,
        default="auto",
        help="int: ids must be integers; hash: hash every id as a string; auto: int if all are",
    )
    parser.add_argument(
        "--event-vocab",
        type=Path,
        default=None,
        help="JSON with event type ids to reuse (an earlier OUT/_ingest.json or a name->id map)",
    )
    parser.add_argument("--delimiter", default=",", help="CSV field delimiter (default ',')")
    parser.add_argument(
        "--max-line-bytes",
        type=int,
        default=MAX_LINE_BYTES,
        help=f"longest input line accepted, and so longest value ({MAX_LINE_BYTES:,} bytes); "
        "a longer line is a bad line",
    )
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="write an empty OUT for an input with no events instead of refusing it",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the report as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    positives = [p.strip() for p in args.positive_events.split(",") if p.strip()]
    report = ingest_events(
        args.events,
        args.out,
        fmt=args.format,
        session_col=args.session_col,
        ts_col=args.ts_col,
        item_col=args.item_col,
        event_col=args.event_col,
        ts_unit=args.ts_unit,
        history=args.history,
        positive_events=positives,
        on_bad_rows=args.on_bad_rows,
        session_ids=args.session_ids,
        event_vocabulary=_read_vocabulary(args.event_vocab) if args.event_vocab else None,
        delimiter=args.delimiter,
        max_line_bytes=args.max_line_bytes,
        allow_empty=args.allow_empty,
    )
    print(format_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_dict(), indent=1))
    return 0


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
    lines = [
        f"ingested {report.source} ({report.format}) -> {report.out_dir}",
        f"  rows in {report.rows_in:,}  out {report.rows_out:,}  quarantined {report.quarantined:,}",
        f"  sessions {report.sessions:,}  positives {report.positives:,}  "
        f"ts {report.ts_unit}  session ids {report.session_ids}  history {report.history}",
        f"  event types: {vocab}",
    ]
    if report.quarantine_path:
        lines.append(f"  bad lines: {report.quarantine_path}")
    return "\n".join(lines)
