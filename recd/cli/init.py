"""``recd init``: copy a shipped pipeline, with the files it uses, into a directory to edit."""

from __future__ import annotations

import argparse
from pathlib import Path

from recd.config_types import load_toml
from recd.errors import ConfigError
from recd.pipelines import DIR, SHIPPED, ShippedPipeline, shipped_names, shipped_pipeline


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "init",
        help="copy a shipped pipeline and its training template into DIR to edit (--list: "
        "the shipped pipelines)",
        description=(
            "Copy the shipped pipeline NAME and the files it uses (training template, column "
            "mapping) into DIR (created if missing), to edit and run with `recd run --config "
            "DIR/NAME.toml`. [run] work_dir stays relative to the directory recd runs in, the "
            "other paths to DIR. A file that exists in DIR is never replaced without --force "
            "(nothing is written then). `recd run --config NAME` runs a shipped pipeline "
            f"without a copy. Shipped: {shipped_names()}."
        ),
    )
    parser.add_argument("name", nargs="?", metavar="NAME", help="the shipped pipeline to copy")
    parser.add_argument(
        "dir", nargs="?", type=Path, metavar="DIR", help="directory to copy it into"
    )
    parser.add_argument(
        "--list", action="store_true", help="list the shipped pipelines, one line each"
    )
    parser.add_argument(
        "--example-events",
        action="store_true",
        help="also write the example shop clickstream (20,000 events) as the pipeline's "
        "[ingest] input, DIR/events.csv (own_data)",
    )
    parser.add_argument("--force", action="store_true", help="replace files that exist in DIR")
    parser.set_defaults(func=run_init)


def run_init(args: argparse.Namespace) -> int:
    if args.list:
        if args.name is not None or args.dir is not None:
            raise ConfigError("--list takes no NAME or DIR")
        width = max(len(name) for name in SHIPPED)
        for shipped in SHIPPED.values():
            print(f"{shipped.name:<{width}}  {shipped.description}")
        return 0
    if args.name is None or args.dir is None:
        raise ConfigError(
            "give the shipped pipeline NAME and a directory DIR (recd init own_data myproj), "
            f"or --list; shipped: {shipped_names()}"
        )
    shipped = shipped_pipeline(args.name)
    if args.example_events and shipped.example_events is None:
        raise ConfigError(
            f"--example-events: {shipped.name} reads no event log (its logs are synthetic); "
            "recd init own_data DIR --example-events writes one"
        )
    written = copy_pipeline(shipped, args.dir, example_events=args.example_events, force=args.force)
    print(f"copied {shipped.name} to {args.dir}: {', '.join(p.name for p in written)}")
    _print_next_steps(shipped, args.dir, example_events=args.example_events)
    return 0


def copy_pipeline(
    shipped: ShippedPipeline, target: Path, *, example_events: bool = False, force: bool = False
) -> list[Path]:
    """Copy ``shipped``'s files (and with ``example_events`` its example event log) into
    ``target``; returns the files written. Nothing is written if one of them exists and
    ``force`` is false, or if one exists and is no regular file."""
    from recd.durable import replacing, write_bytes_atomic
    from recd.logs.example_events import write_example_events

    if target.exists() and not target.is_dir():
        raise ConfigError(f"{target}: exists and is not a directory")
    outputs = [target / name for name in shipped.files]
    if example_events:
        assert shipped.example_events is not None
        outputs.append(target / shipped.example_events)
    in_the_way = [p for p in outputs if (p.exists() or p.is_symlink()) and not p.is_file()]
    if in_the_way:
        raise ConfigError(f"{in_the_way[0]}: exists and is not a file; not replaced")
    existing = [p for p in outputs if p.exists()]
    if existing and not force:
        verb = "exists" if len(existing) == 1 else "exist"
        raise ConfigError(
            f"{', '.join(str(p) for p in existing)} {verb} already; nothing written (--force "
            "replaces them)"
        )
    target.mkdir(parents=True, exist_ok=True)
    for name in shipped.files:
        write_bytes_atomic(target / name, (DIR / name).read_bytes())
    if example_events:
        with replacing(outputs[-1], suffix=".csv") as tmp:
            write_example_events(tmp)
    return outputs


def _print_next_steps(shipped: ShippedPipeline, target: Path, *, example_events: bool) -> None:
    config = target / shipped.files[0]
    work_dir = load_toml(config, "pipeline config").get("run", {}).get("work_dir", "?")
    if shipped.example_events is not None and not example_events:
        events = target / shipped.example_events
        print(
            f"next: put your event log at {events} (or set [ingest] input in {config}) and "
            "name its columns in [ingest.mapping] (docs/own-data.md)"
        )
    print(
        f"run:  recd run --config {config}    "
        f"(writes {work_dir}/ under the directory you run it in)"
    )
