"""``--json [FILE]``, the same in every command.

``--json FILE`` writes the command's report as JSON to FILE (strict JSON: a non-finite number
is ``null``) and still prints the human-readable text; ``--json`` alone (or ``--json -``)
prints the JSON on stdout instead of the text, for scripts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recd.durable import write_bytes_atomic
from recd.train.history import json_safe

STDOUT = "-"


def add_json_option(parser: argparse.ArgumentParser, what: str = "the report") -> None:
    parser.add_argument(
        "--json",
        nargs="?",
        const=STDOUT,
        default=None,
        metavar="FILE",
        help=f"write {what} as JSON to FILE (the text is still printed); --json alone or "
        "--json -: print the JSON instead of the text",
    )


def emit(args: argparse.Namespace, body: Any, show: Callable[[], None]) -> None:
    """Print the text (``show``) and/or the JSON ``body`` as ``--json`` asks."""
    text = json.dumps(json_safe(body), indent=1, allow_nan=False, default=str) + "\n"
    if args.json == STDOUT:
        print(text, end="")
        return
    show()
    if args.json is not None:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, text.encode())
