"""The ``recd`` command line: one subcommand per pipeline stage.

Each stage lives in its own module under ``recd.cli`` that defines ``register(subparsers)``.
Errors a user can fix (``RecdError``) print one clear line and exit 2; nothing else calls
``sys.exit``. So does a full disk or quota and a read-only file system met anywhere (an
``OSError`` no command turned into a ``StorageError`` naming its path): the machine's doing,
never a bug to show a traceback for.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from recd import __version__
from recd.errors import RecdError
from recd.writable import ENVIRONMENT_ERRNOS, os_error_reason, storage_error

# Modules under recd.cli, each adding its subcommand(s); listed in pipeline order (init: a
# shipped pipeline to edit, first).
COMMAND_MODULES = (
    "init",
    "logs",
    "etl",
    "table",
    "analyze",
    "train",
    "predict",
    "run",
    "ckpt",
    "recover",
    "pivot",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recd",
        description="RecD-style pipeline: logs -> table -> tensors -> model -> disk.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--version", action="version", version=f"recd {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"recd.cli.{name}")
        module.register(sub)
    _show_defaults(parser)
    return parser


class _DefaultsMixin(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help unless the help already speaks of its
    default or there is none worth showing (None, False, an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and "default" not in text.lower()
            and default is not None
            and default is not False
            and default != []
            and default != argparse.SUPPRESS
            and not isinstance(action, argparse._VersionAction | argparse._HelpAction)
        ):
            text += " (default: %(default)s)"
        return text


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)parser a help formatter that shows defaults, keeping its own layout."""
    stack = [parser]
    while stack:
        current = stack.pop()
        base = current.formatter_class
        if isinstance(base, type) and not issubclass(base, _DefaultsMixin):
            shown = type(f"Defaults{base.__name__}", (_DefaultsMixin, base), {})
            current.formatter_class = shown  # type: ignore[assignment]
        for action in current._actions:
            if isinstance(action.choices, dict):
                stack.extend(p for p in action.choices.values() if hasattr(p, "_actions"))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``recd`` console script; returns the exit code."""
    try:
        return _run(argv)
    except BrokenPipeError:
        # The reader of our output went away (`recd ckpt diff A B | head`): not an error of
        # ours. Point stdout at /dev/null so that the interpreter's final flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 0


def _run(argv: list[str] | None) -> int:
    from recd.recovery.spare import is_spare, wait_as_spare

    if is_spare():  # before the parser imports every command (the spare imports them itself)
        wait_as_spare()  # returns as the replacement of the rank it was assigned
    parser = build_parser()
    args = parser.parse_args(argv)
    # Libraries (fbgemm logs every .so it loads at INFO on the root logger) stay at WARNING;
    # force: importing torchrec installs a root handler of its own.
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    # torchrec calls torch.fx's is_fx_tracing, which warns on every run about an API choice
    # that is torchrec's to make, not the user's.
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    level = logging.DEBUG if args.verbose else logging.INFO
    if os.environ.get("RANK", "0") != "0" and "LOCAL_RANK" in os.environ:
        level = max(level, logging.WARNING)  # a torchrun worker other than rank 0: warnings only
    logging.getLogger("recd").setLevel(level)
    from tqdm.contrib.logging import logging_redirect_tqdm

    try:
        with logging_redirect_tqdm():  # log lines above the progress bars, not through them
            return int(args.func(args) or 0)
    except RecdError as exc:
        print(f"recd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            raise
        print(f"recd {args.command}: error: {_environment_error(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"recd {args.command}: interrupted", file=sys.stderr)
        return 130


def _environment_error(exc: OSError) -> str:
    """One line for a full disk or a read-only file system: the path when the error names
    one (pyarrow's writers name none)."""
    if exc.filename is not None:
        return str(storage_error(exc.filename, exc))
    detail = " ".join(str(exc).split())  # one line
    return f"cannot write: {os_error_reason(exc)} ({detail})"
