"""A warm spare of ``recd train --recovery survivor``: a process that waits, imported, to
replace a dead worker.

The launcher (:mod:`recd.recovery.agent`) starts one with the worker group. What a replacement
would spend seconds on before it can join the survivors is almost all imports (torch,
torchrec, recd's commands, pyiceberg's catalog and Arrow I/O: 2-5 s on a 2-core machine;
building the reader plan, the model and DMP together take ~0.1 s), so a spare does them
ahead of time, in a thread, while the workers do their own start-up: it is warm when
training starts and idle from then on, so it costs the job some start-up time once (measured
by ``benchmarks/train_recovery.py``: the survivor route's failure-free runs with and without
a spare), not step time. (Importing at idle priority instead was tried for it: on a machine
whose cores the workers keep busy, the spare was still importing at every kill of the
benchmark.)

Every later spare, started once a recovery is over (:mod:`recd.recovery.agent`), imports at
**idle** CPU priority (``RECD_SPARE_IDLE``): it is needed only at the next failure, and at
normal priority its seconds of imports slowed the survivors right after the recovery (on
the benchmark's 2-core machine a survivor recovery cost the job 2.12 s with the next spare
started at the swap, 1.09 s with it started afterwards at idle priority; its phases take
0.45 s). Only the importing thread is lowered (Linux: priority and scheduling policy are
per thread), and the process-wide thread pools an import starts (OpenBLAS's with numpy,
jemalloc's with pyarrow) are started first on the main thread, so they keep normal
priority; a spare that still finds a lowered thread once warm does not say it is warm, and
the launcher replaces it with a fresh process. An idle spare that is not warm by the next
failure is not used either (a half-imported process at idle priority would be slower than
a fresh one).

The main thread waits on the launcher's store for an assignment (and says in the store when
the imports are done: ``recd/spare/ID/warm``, which the launcher's swap event records); when
one comes, it waits for the imports, takes the assigned rank's environment and returns to the
``recd`` command line, which runs ``recd train`` as that rank's replacement with everything
already imported.

This module imports nothing outside the standard library at module level: the command line
calls :func:`wait_as_spare` before it builds its parser (which imports every command).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib
import json
import os
import threading
import time
from collections.abc import Sequence

from recd.recovery.env import GENERATION_ENV, ROLE_ENV, SPARE_ENV, SPARE_IDLE_ENV

__all__ = ["WARM_IMPORTS", "is_spare", "wait_as_spare"]

WARM_IMPORTS: tuple[str, ...] = (
    "torch.distributed",
    "torchrec",
    "recd.cli.train",
    "recd.train.run",
    "recd.train.loop",
    "recd.train.sharding",
    "recd.recovery.rejoin",
    "pyiceberg.catalog",
    "pyiceberg.catalog.sql",
    "pyiceberg.io.pyarrow",
)
"""What a spare imports before it is assigned (the first one before it opens the store)."""
POOL_IMPORTS: tuple[str, ...] = ("numpy", "pyarrow")
"""Imported on an idle spare's main thread first: they start process-wide thread pools, which
would otherwise take the importing thread's idle priority for good."""
IDLE_NICE = 19


def is_spare() -> bool:
    """Whether this process was started by the launcher as a warm spare."""
    return os.environ.get(ROLE_ENV) == "spare"


def lower_to_idle() -> None:
    """This thread (not the process) to niceness 19 and, where there is one, ``SCHED_IDLE``;
    best effort (an unprivileged thread can lower itself, never raise itself again)."""
    tid = threading.get_native_id()
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, tid, IDLE_NICE)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: this thread


def lowered_threads(exclude: Sequence[int] = ()) -> list[int]:
    """This process's threads (ids, but ``exclude``) at a lower CPU priority than the main
    thread's: another niceness or ``SCHED_IDLE`` (Linux; elsewhere an empty list)."""
    main = threading.main_thread().native_id or os.getpid()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
        reference = os.getpriority(os.PRIO_PROCESS, main)
    except (AttributeError, OSError):
        return []
    idle = getattr(os, "SCHED_IDLE", None)
    out = []
    for tid in tids:
        if tid in exclude or tid == main:
            continue
        try:
            lowered = os.getpriority(os.PRIO_PROCESS, tid) != reference
            lowered |= idle is not None and os.sched_getscheduler(tid) == idle
        except OSError:  # the thread has just exited
            continue
        if lowered:
            out.append(tid)
    return out


def _warm_up(
    modules: Sequence[str], first_done: threading.Event, *, idle: bool, tid: list[int]
) -> None:
    tid.append(threading.get_native_id())
    if idle:
        lower_to_idle()
    try:
        importlib.import_module(modules[0])
    finally:
        first_done.set()
    for name in modules[1:]:
        with contextlib.suppress(ImportError):  # an optional part missing: imported later
            importlib.import_module(name)


def wait_as_spare(modules: Sequence[str] = WARM_IMPORTS) -> None:
    """In a warm spare: import ``modules`` and wait for the launcher to assign a rank; afterwards this process's environment is that of the rank's replacement.
    Exits (status 0) when the launcher is gone."""
    idle = os.environ.get(SPARE_IDLE_ENV) == "1"
    if idle:
        for name in POOL_IMPORTS:
            importlib.import_module(name)
    first_done = threading.Event()
    warm_tid: list[int] = []
    warming = threading.Thread(
        target=_warm_up,
        args=(modules, first_done),
        kwargs={"idle": idle, "tid": warm_tid},
        name="recd-spare-imports",
        daemon=True,
    )
    warming.start()
    first_done.wait()  # torch.distributed, for the store
    import torch.distributed as dist

    spare_id = os.environ[SPARE_ENV]
    parent = os.getppid()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=300),
    )
    key = f"recd/spare/{spare_id}"
    announced = False
    while True:
        if not announced and not warming.is_alive():
            lowered = lowered_threads(exclude=warm_tid) if idle else []
            if lowered:  # cold for good: the launcher starts a fresh process instead
                store.set(f"{key}/lowered", json.dumps(lowered))
            else:
                store.set(f"{key}/warm", str(time.time()))  # recorded at the swap
            announced = True
        try:
            store.wait([key], datetime.timedelta(seconds=1 if not announced else 60))
            break
        except Exception:  # not assigned yet
            if os.getppid() != parent:
                raise SystemExit(0) from None  # the launcher is gone
    warming.join()
    assignment = json.loads(store.get(key))
    rank = str(assignment["rank"])
    os.environ.update(
        {
            "RANK": rank,
            "LOCAL_RANK": rank,
            "ROLE_RANK": rank,
            GENERATION_ENV: str(assignment["generation"]),
            "TORCHELASTIC_RESTART_COUNT": str(assignment["attempt"]),
            ROLE_ENV: "replacement",
        }
    )
    os.environ.pop(SPARE_ENV, None)
