"""The run directory's lock (``RUN_DIR/.lock``): one owner, named when another process asks,
re-entrant in a process, never inherited by a forked child, lent by a launcher to its workers.
Every holder here is a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from recd.checkpoint import RUN_LOCK_FILE, RunDirectoryBusyError, lock_run_directory
from recd.checkpoint.lock import OWNER_ENV

REPO = Path(__file__).resolve().parents[2]
HOLD = """
import sys
from recd.checkpoint import lock_run_directory
lock = lock_run_directory(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()  # hold it until the test closes our stdin
"""


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """Another process that owns ``tmp_path / "run"`` until the test ends."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def test_a_second_process_is_refused_with_the_owners_pid(
    tmp_path: Path, holder: subprocess.Popen[str]
) -> None:
    run = tmp_path / "run"
    record = json.loads((run / RUN_LOCK_FILE).read_text())
    assert record["pid"] == holder.pid
    with pytest.raises(RunDirectoryBusyError) as caught:
        lock_run_directory(run)
    message = str(caught.value)
    assert str(run) in message and f"pid {holder.pid}" in message
    assert f"kill -TERM {holder.pid}" in message and "\n" not in message


def test_the_lock_is_re_entrant_in_a_process_and_released_by_the_last_holder(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    outer = lock_run_directory(run)
    inner = lock_run_directory(run)
    assert inner is outer and outer.held and not outer.borrowed
    inner.release()
    assert outer.held  # still ours: another process is refused
    probe = subprocess.run(
        [sys.executable, "-c", HOLD, str(run)],
        input="",
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert probe.returncode == 1 and f"pid {os.getpid()}" in probe.stderr
    outer.release()
    outer.release()  # idempotent
    with lock_run_directory(run) as again:  # free again
        assert again.held


def test_a_forked_child_does_not_keep_the_lock_of_its_parent(tmp_path: Path) -> None:
    """What a DataLoader worker (forked while the trainer holds the lock) must not do: keep
    the lock alive after the trainer gave it back (or died)."""
    run = tmp_path / "run"
    lock = lock_run_directory(run)
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: owns nothing, and lives on after the parent releases
        code = 1
        try:
            try:
                lock_run_directory(run)
            except RunDirectoryBusyError:
                code = 0  # the parent still owns it; the child does not
            os.write(ready_w, b"x")
            os.read(go_r, 1)
        finally:
            os._exit(code)
    try:
        assert os.read(ready_r, 1) == b"x"
        lock.release()
        with lock_run_directory(run) as mine:  # taken while the child still lives
            assert mine.held
    finally:
        os.write(go_w, b"x")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_workers_of_the_owning_launcher_proceed_and_nobody_else_does(
    tmp_path: Path, holder: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "run"
    owner = json.loads((run / RUN_LOCK_FILE).read_text())["owner"]
    assert owner.startswith(f"{holder.pid}@")
    monkeypatch.setenv(OWNER_ENV, f"{holder.pid + 1}@elsewhere")
    with pytest.raises(RunDirectoryBusyError):
        lock_run_directory(run)
    monkeypatch.setenv(OWNER_ENV, owner)  # what `recd train --nproc` gives its workers
    with lock_run_directory(run) as lent:
        assert lent.borrowed and lent.held
