"""The warm spare of ``recd train --recovery survivor`` (``recd.recovery.spare``), as a real process
waiting on a real store: an idle spare imports at idle priority on one thread only, and says
it is warm with every thread of its own back at normal priority."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from recd.recovery.env import ROLE_ENV, SPARE_ENV, SPARE_IDLE_ENV
from recd.recovery.spare import IDLE_NICE, lower_to_idle, lowered_threads

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir() or not hasattr(os, "SCHED_IDLE"),
    reason="per-thread priorities are read from Linux's /proc",
)


def _thread_priority(pid: int, tid: int) -> tuple[int, int]:
    """(niceness, scheduling policy) of thread ``tid`` of process ``pid``, from /proc."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[16]), int(fields[38])  # stat fields 19 (nice) and 41 (policy)


def test_lower_to_idle_lowers_only_the_calling_thread() -> None:
    seen: dict[str, int] = {}
    lowered, release = threading.Event(), threading.Event()

    def worker() -> None:
        lower_to_idle()
        seen["tid"] = threading.get_native_id()
        lowered.set()
        release.wait(30)

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert lowered.wait(30)
        tid = seen["tid"]
        assert _thread_priority(os.getpid(), tid) == (IDLE_NICE, os.SCHED_IDLE)
        main = threading.main_thread().native_id
        assert _thread_priority(os.getpid(), main) == (os.getpriority(os.PRIO_PROCESS, 0), 0)
        assert tid in lowered_threads()
        assert tid not in lowered_threads(exclude=[tid])
    finally:
        release.set()
        thread.join()


@pytest.mark.timeout(240)
def test_an_idle_spare_is_warm_with_no_thread_left_at_idle_priority(tmp_path: Path) -> None:
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False,
        timeout=datetime.timedelta(seconds=200),
    )  # fmt: skip
    env = dict(os.environ)
    env.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            ROLE_ENV: "spare",
            SPARE_ENV: "7",
            SPARE_IDLE_ENV: "1",
        }
    )
    modules = ("torch.distributed", "pyarrow.parquet", "recd.recovery.rejoin")
    code = f"from recd.recovery.spare import wait_as_spare; wait_as_spare({modules!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env)
    try:
        deadline = time.monotonic() + 200
        said = []
        while not said and time.monotonic() < deadline and proc.poll() is None:
            said = [k for k in ("warm", "lowered") if store.check([f"recd/spare/7/{k}"])]
            time.sleep(0.1)
        assert said == ["warm"], f"the idle spare said {said} (exit code {proc.poll()})"
        main = _thread_priority(proc.pid, proc.pid)
        assert main[1] != os.SCHED_IDLE
        # the importing thread has returned; it may take a moment to leave /proc
        deadline = time.monotonic() + 20
        while True:
            tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
            lowered = [t for t in tids if _thread_priority(proc.pid, t) != main]
            if not lowered or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert lowered == [], "threads of the warm spare left at idle priority"
        assert len(tids) > 1  # the main thread and the pools started by its imports
        assert proc.poll() is None  # still waiting for an assignment
    finally:
        proc.kill()
        proc.wait()
