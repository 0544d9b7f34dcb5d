"""Where recd writes: the operating system's refusals as one line naming the path.

A run directory, a table, or an output may sit where recd cannot write: a regular file where
a directory must be, a read-only file system, a directory without write permission, a full
disk or quota. The user fixes these, so they end in a :class:`recd.errors.StorageError`
(exit 2 in the CLI) naming the path and the reason: before anything is written where that
can be checked (:func:`check_writable_dir`, :func:`check_can_replace`), else where the write
fails (:func:`storage_error`), with what was on disk before left as it was.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from recd.errors import StorageError

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The disk (or the user's quota) is full."""
NOT_WRITABLE_ERRNOS = frozenset(
    {errno.EROFS, errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR, errno.EISDIR}
)
"""The place cannot take the write: read-only, no permission, a file or directory in the way."""
ENVIRONMENT_ERRNOS = DISK_FULL_ERRNOS | {errno.EROFS}
"""Refusals that only the machine causes (never a wrong path or a bug): a full disk or quota,
a read-only file system."""

_REASONS = {
    errno.ENOSPC: "the disk is full (no space left on device)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EEXIST: "a file is in the way (not a directory)",
    errno.ENOTDIR: "a file is in the way (not a directory)",
    errno.EISDIR: "it is a directory",
}


def os_error_reason(exc: OSError) -> str:
    """What ``exc`` means for a write, in a few words (its strerror for other errors)."""
    if exc.errno in _REASONS:
        return _REASONS[exc.errno]
    return exc.strerror or str(exc)


def storage_error(path: str | os.PathLike[str], exc: OSError, *, hint: str = "") -> StorageError:
    """``PATH: cannot write here: REASON (the failing path, when another one); HINT``."""
    reason = os_error_reason(exc)
    failed = exc.filename
    if failed is not None and os.fspath(failed) != os.fspath(path):
        reason += f" ({os.fsdecode(failed)})"
    return StorageError(f"{os.fspath(path)}: cannot write here: {reason}" + _hint(hint))


def check_writable_dir(path: str | os.PathLike[str], *, hint: str = "") -> None:
    """StorageError unless entries can be created in directory ``path``, or ``path`` can be
    created: the path or its nearest existing ancestor must be a directory this process may
    write (not on a read-only file system). Creates and writes nothing."""
    _check(Path(path), Path(path), hint)


def check_can_replace(path: str | os.PathLike[str], *, hint: str = "") -> None:
    """StorageError unless ``path`` (a file or directory written beside itself and renamed
    into place) can be created or replaced: as :func:`check_writable_dir` for its parent, the
    message naming ``path``. Creates and writes nothing."""
    _check(Path(path), Path(path).parent, hint)


def _check(named: Path, directory: Path, hint: str) -> None:
    probe = directory
    while not os.path.lexists(probe) and probe != probe.parent:
        probe = probe.parent
    where = "" if probe == named else f" ({probe})"
    if not probe.is_dir():
        raise StorageError(
            f"{named}: cannot write here: a file is in the way (not a directory){where}"
            + _hint(hint)
        )
    if not _may_write(probe):
        reason = "read-only file system" if _read_only(probe) else "permission denied"
        raise StorageError(f"{named}: cannot write here: {reason}{where}" + _hint(hint))


def _may_write(directory: Path) -> bool:
    mode = os.W_OK | os.X_OK
    if os.access in os.supports_effective_ids:
        return os.access(directory, mode, effective_ids=True)
    return os.access(directory, mode)


def _read_only(directory: Path) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _hint(hint: str) -> str:
    return f"; {hint}" if hint else ""
