"""Exceptions that users of recd can hit, one class per kind of mistake.

Every message says where (file, row, column or field) and what was expected. The CLI maps
``RecdError`` subclasses to exit code 2 and prints the message without a traceback.
"""

from __future__ import annotations


class RecdError(Exception):
    """Base class of every error recd raises on bad input or bad configuration."""


class ConfigError(RecdError):
    """A TOML config or command-line option is missing, of the wrong type or out of range."""


class SchemaError(RecdError):
    """A table, file or record batch does not match the feature catalogue."""


class BadRowError(RecdError):
    """An input row is malformed: names the file, the row/line and the field."""

    def __init__(self, path: str, row: int, field: str, problem: str) -> None:
        self.path = path
        self.row = row
        self.field = field
        self.problem = problem
        super().__init__(f"{path}: row {row}: field {field!r}: {problem}")


class CommitError(RecdError):
    """A table partition could not be committed atomically."""
