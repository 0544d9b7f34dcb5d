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


class CheckpointError(RecdError):
    """A checkpoint or run directory cannot be used as asked (see the subclasses)."""


class CheckpointCorruptError(CheckpointError):
    """A ``step_NNNNNN.bin`` file is not a valid checkpoint: wrong size, truncated, extended,
    impossible header, foreign file, or a header that disagrees with the model's layout."""


class CheckpointNonFiniteError(CheckpointCorruptError):
    """A checkpoint's weights or Adam state hold NaN or infinity (a diverged run's state):
    names the file, the region, the tensor and the first bad element."""


class CheckpointChecksumError(CheckpointCorruptError):
    """A checkpoint's bytes do not match the checksum recorded beside it when it was written
    (``step_NNNNNN.bin.crc32``): names the file, the damaged part and both CRCs."""


class RunDirectoryBusyError(CheckpointError):
    """Another live process owns the run directory (holds its ``.lock``)."""


class TrainingDivergedError(RecdError):
    """Training produced non-finite values (a NaN / infinite loss or held-out predictions):
    names the step, the run directory and what to do."""


class CheckpointTooLargeError(CheckpointError):
    """The model has more parameters (or the step is larger) than the int32 header can hold."""


class SidecarError(RecdError):
    """A run-directory sidecar (``.loss.json``, ``.samples.json``, ``.state.json``) is unusable,
    or a resumed run disagrees with the history it recorded (bit-exact resume broken)."""


class TensorFormatError(RecdError, ValueError):
    """A KJT / IKJT / batch container is internally inconsistent (names the part and the value)."""


class NoEventsError(SchemaError):
    """An event log holds no event to write: it is empty, has only blank lines or only a CSV
    header, or (quarantine mode) every data line is bad. ``allow_empty`` writes an empty output
    instead."""


class BadLineError(BadRowError):
    """A line of a text input (CSV, JSON Lines) is bad: names the file, the 1-based line as an
    editor shows it (a CSV header is line 1) and the field (None: the whole line is malformed)."""

    def __init__(self, path: str, line: int, field: str | None, problem: str) -> None:
        super().__init__(path, line, field or "", problem)
        self.line = line
        where = f"field {field!r}: " if field else ""
        self.args = (f"{path}: line {line}: {where}{problem}",)


class UndoError(RecdError):
    """An optimizer step cannot be captured or undone as asked: an optimizer or option with no
    inverse (e.g. AMSGrad), or a record whose post-update state no longer matches the live
    tensors (already undone, or another step ran since). Names the parameter and the reason."""


class RecoveryError(RecdError):
    """Failure recovery could not proceed: a worker died and the survivors could not agree on
    a step, the dense state or the checkpoint a replacement needs is missing, or the job did
    not come back within its deadline. Names the run directory, rank and generation."""


class StorageError(RecdError):
    """recd cannot write where it was asked to: a regular file stands where a directory must
    be, the file system is read-only, permission is denied, or the disk (or quota) is full.
    Names the path and the reason; what was on disk before is left as it was."""
