"""A warm spare of ``recd train --recovery survivor``: a process that waits, imported, to
replace a dead worker.

The launcher (:mod:`recd.train.agent`) starts one with the worker group. What a replacement
would spend seconds on before it can join the survivors is almost all imports (torch,
torchrec, recd's commands, pyiceberg's catalog and Arrow I/O: 2-5 s on a 2-core machine;
building the reader plan, the model and DMP together take ~0.1 s), so a spare does them
ahead of time, in a thread, while the workers do their own start-up: it is warm when
training starts and idle from then on, so it costs the job some start-up time once (measured
by ``benchmarks/train_recovery.py``: the survivor route's failure-free runs with and without
a spare), not step time. (Importing at idle priority instead was tried: on a machine whose
cores the workers keep busy, the spare was still importing at every kill of the benchmark.)

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

from recd.recovery.env import GENERATION_ENV, ROLE_ENV, SPARE_ENV

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


def is_spare() -> bool:
    """Whether this process was started by the launcher as a warm spare."""
    return os.environ.get(ROLE_ENV) == "spare"


def _warm_up(modules: Sequence[str], first_done: threading.Event) -> None:
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
    first_done = threading.Event()
    warming = threading.Thread(
        target=_warm_up, args=(modules, first_done), name="recd-spare-imports", daemon=True
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
            store.set(f"{key}/warm", str(time.time()))  # the launcher records it at the swap
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
