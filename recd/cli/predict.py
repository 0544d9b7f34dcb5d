"""``recd predict``: score a table range with a trained checkpoint, predictions to Parquet."""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.cli.fields import add_field_option, check_field_options
from recd.cli.output import add_json_option, emit
from recd.reader.config import ReaderConfig


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "predict",
        help="score a table's rows with a checkpoint; write ids, labels, logits, predictions",
        description=(
            "Build the model of the train TOML, load the checkpoint's weights (a "
            "step_NNNNNN.bin, or a run directory: its newest valid checkpoint) and score every "
            "row of the config's table in [--start, --end) in table order, with the reader the "
            "trainer uses (same preprocessing). OUT (Parquet, zstd) holds one row per table "
            "row: session_id, request_id, ts, the labels, and per label logit_<label> and "
            "prediction_<label> (the probability). Prints the rows and the mean BCE."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--config", type=Path, required=True, help="the train TOML of the run")
    parser.add_argument(
        "--checkpoint", type=Path, required=True, help="step_NNNNNN.bin or a run directory"
    )
    parser.add_argument("--out", type=Path, required=True, help="Parquet file to write")
    parser.add_argument(
        "--start", help="first partition hour, e.g. 2026-11-01T01:00 (default: the table's first)"
    )
    parser.add_argument("--end", help="end hour, exclusive (default: after the table's last)")
    parser.add_argument(
        "--eval-range",
        action="store_true",
        help="score the config's [eval] range (its start / end) instead of --start / --end",
    )
    parser.add_argument(
        "--table",
        help="score this table (the training table's columns) instead of [reader] table",
    )
    add_field_option(
        parser, "--batch-size", ReaderConfig, "batch_size", override="[reader] batch_size"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    add_json_option(parser, "the report")
    parser.set_defaults(func=run_predict)


def run_predict(args: argparse.Namespace) -> int:
    from recd.errors import ConfigError
    from recd.progress import progress_enabled
    from recd.train.config import load_train_config

    check_field_options(args)
    config = load_train_config(args.config)
    start, end, table = args.start, args.end, args.table
    if args.eval_range:
        if config.eval is None:
            raise ConfigError(f"--eval-range: {args.config} has no [eval] section")
        if start is not None or end is not None:
            raise ConfigError("--eval-range: give either it or --start / --end, not both")
        if table is not None:
            raise ConfigError("--eval-range: give either it or --table, not both")
        eval_reader = config.eval_reader()
        start, end = eval_reader.start, eval_reader.end
        table = config.eval.table
    _check_out(args.out)  # before torch is imported and the model built
    from recd.train.inference import predict_table

    report = predict_table(
        config,
        args.checkpoint,
        args.out,
        start=start,
        end=end,
        batch_size=args.batch_size,
        overwrite=args.overwrite,
        show_progress=progress_enabled(),
        table=table,
    )
    loss = "n/a" if report.loss is None else f"{report.loss:.4f}"
    doc = {
        "out": str(report.out),
        "checkpoint": str(report.checkpoint),
        "step": report.step,
        "rows": report.rows,
        "labels": report.labels,
        "loss": report.loss,
    }
    emit(
        args,
        doc,
        lambda: print(
            f"predicted {report.rows:,} rows with {report.checkpoint} (step {report.step}): "
            f"mean BCE {loss} -> {report.out}"
        ),
    )
    return 0


def _check_out(out: Path) -> None:
    """StorageError (one line naming OUT) unless OUT can be written: it is written beside
    itself and renamed over, so its directory must take new files."""
    from recd.errors import StorageError
    from recd.writable import check_can_replace

    if out.is_dir():
        raise StorageError(f"{out}: cannot write here: it is a directory (--out names a file)")
    check_can_replace(out, hint="write the predictions elsewhere (--out)")
