"""One trainer per run directory: an exclusive lock taken before anything in it is touched.

A run directory has exactly one owner, the ``recd train`` (or ``recd pivot``) process that
holds ``RUN_DIR/.lock``::

    with lock_run_directory(run_dir):     # RunDirectoryBusyError if another process owns it
        clean_stray_temp_files(run_dir)   # safe now: no live writer can own a temp file
        ...                               # resume, train, checkpoint

The lock is an exclusive ``flock`` on ``.lock``, held for the whole run and released by the
kernel when the process dies (no stale lock after a SIGKILL or a power cut). The holder writes
its pid and host into the file, so a second process names the live one in its error. The
file itself is never removed (removing a lock file races with the next locker).

Who takes it:

- one process: the trainer, first thing (before the stray temp files of killed writers are
  removed: a newcomer must never delete the temp file a live writer is filling);
- ``recd train --nproc N``: the launcher, before any worker exists, for the whole job; it
  names itself in ``RECD_RUN_DIR_OWNER`` (``pid@host``), and its workers' rank 0 finds the lock
  held by that owner and proceeds (the other ranks take no lock; they touch the directory
  only after rank 0's set-up barrier);
- a torchrun started by hand: rank 0, before the barrier that releases the other ranks.

Re-entrant within a process (a reference count per directory), and a forked child (e.g. a
DataLoader worker) drops its inherited copy at once, so the lock never outlives the process
that took it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType

from recd.errors import RunDirectoryBusyError
from recd.writable import check_writable_dir, storage_error

__all__ = [
    "OWNER_ENV",
    "RUN_LOCK_FILE",
    "RunDirectoryBusyError",
    "RunDirectoryLock",
    "lock_run_directory",
    "owner_token",
]

RUN_LOCK_FILE = ".lock"
"""The lock file of a run directory."""
OWNER_ENV = "RECD_RUN_DIR_OWNER"
"""Set by a launcher that holds the lock for its workers: ``pid@host`` of the launcher."""
OWNER_WAIT_S = 2.0
"""How long a refused process waits for the holder to write its pid (it writes it right after
taking the lock)."""


def owner_token(pid: int | None = None) -> str:
    """``pid@host`` of this process (or of ``pid`` on this host)."""
    return f"{os.getpid() if pid is None else pid}@{socket.gethostname()}"


# ----------------------------------------------------------------------------- the registry

_registry_lock = threading.Lock()
_held: dict[Path, RunDirectoryLock] = {}
"""Locks this process holds, by resolved directory (re-entrant acquisition)."""


def _forget_in_child() -> None:
    """After fork: the child owns nothing (its copy of the descriptor is closed, so the lock
    is released when the parent ends even if the child lives on)."""
    global _registry_lock
    _registry_lock = threading.Lock()
    for held in _held.values():
        if held._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(held._fd)
            held._fd = -1
        held._count = 0
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# ----------------------------------------------------------------------------- the lock


class RunDirectoryLock:
    """The exclusive lock of one run directory (see the module docstring).

    Use :func:`lock_run_directory`; ``release`` (or leaving the ``with`` block) gives it back.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / RUN_LOCK_FILE
        self.borrowed = False
        """Held by this process's launcher (``RECD_RUN_DIR_OWNER``), not by this process."""
        self._fd = -1
        self._count = 0

    def _acquire(self) -> None:
        # A file in the way, a read-only file system, no permission: one line naming the run
        # directory (StorageError), nothing written.
        hint = "choose another run directory (--run-dir)"
        check_writable_dir(self.directory, hint=hint)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_error(self.directory, exc, hint=hint) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = self._read_holder()
            if holder is not None and holder.get("owner") == os.environ.get(OWNER_ENV):
                self.borrowed = True  # our launcher holds it for the whole job
                return
            raise RunDirectoryBusyError(self._busy_message(holder)) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        record = {"owner": owner_token(), "pid": os.getpid(), "host": socket.gethostname()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)

    def _read_holder(self) -> dict[str, object] | None:
        """The holder's record; waits up to ``OWNER_WAIT_S`` for a holder that has just taken
        the lock to write it."""
        deadline = time.monotonic() + OWNER_WAIT_S
        while True:
            try:
                record = json.loads(self.path.read_text())
                if isinstance(record, dict):
                    return record
            except (OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def _busy_message(self, holder: dict[str, object] | None) -> str:
        if holder is None:
            who, stop = "another process (pid unknown)", "stop it"
        else:
            pid, host = holder.get("pid"), holder.get("host")
            local = host == socket.gethostname()
            who = f"another trainer, pid {pid}" + ("" if local else f" on {host}")
            stop = f"stop it (kill -TERM {pid})"
        return (
            f"{self.directory} is in use by {who}: one trainer per run directory; wait for it "
            f"to finish, {stop}, or choose another run directory (--run-dir)"
        )

    @property
    def held(self) -> bool:
        return self._count > 0

    def release(self) -> None:
        """Give back one acquisition; the last one unlocks (idempotent once released)."""
        with _registry_lock:
            if self._count == 0:
                return
            self._count -= 1
            if self._count:
                return
            _held.pop(self.directory, None)
            if self._fd >= 0:
                os.close(self._fd)  # closing the only descriptor releases the flock
                self._fd = -1

    def __enter__(self) -> RunDirectoryLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def lock_run_directory(directory: str | os.PathLike[str]) -> RunDirectoryLock:
    """Own ``directory`` (created if missing) until ``release``; ``RunDirectoryBusyError``
    naming the live owner's pid when another process owns it. Re-entrant in one process."""
    path = Path(directory).resolve()
    with _registry_lock:
        held = _held.get(path)
        if held is None:
            held = RunDirectoryLock(path)
            held._acquire()
            _held[path] = held
        held._count += 1
        return held
