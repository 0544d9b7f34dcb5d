"""``recd logs``: generate synthetic logs, ingest real event logs, shard logs (O1)."""

from __future__ import annotations

import argparse
import importlib

# Modules defining register(logs_subparsers), one per ``recd logs`` verb.
LOGS_COMMAND_MODULES = ("logs_generate", "logs_ingest", "logs_shard")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("logs", help="raw inference logs: generate, ingest, shard (O1)")
    verbs = parser.add_subparsers(dest="logs_command", metavar="VERB", required=True)
    for name in LOGS_COMMAND_MODULES:
        importlib.import_module(f"recd.cli.{name}").register(verbs)
