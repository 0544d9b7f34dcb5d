"""Checkpoint signals: SIGTERM = finish the step, write, exit 0; SIGUSR1 = finish, write, go on.

The handlers only set flags; :class:`recd.train.checkpointing.Checkpointer` reads them at the
next step boundary (:meth:`SignalFlags.take`), so a signal never interrupts a step, an
optimizer update or a checkpoint write. In a distributed job the ranks agree before acting
(:meth:`SignalFlags.take_agreed`: all-reduce MAX of the signal counts at the step boundary),
so when any rank was signalled every rank checkpoints at the same step, once per signal. SIGINT (Ctrl-C) keeps Python's default
(``KeyboardInterrupt``, exit 130, no checkpoint).

Data-loader worker processes must not die from the signal before the checkpoint is written
(a ``kill -TERM -PGID``, systemd, docker or a batch scheduler signals the whole process
group; torch's worker loop would die from a SIGTERM not sent by its parent, and the trainer
would then fail on the lost worker). While the handlers are installed, an at-fork hook runs
:func:`ignore_stop_signals` in every forked child, i.e. in every DataLoader worker before its
loop starts: SIGTERM and SIGUSR1 ignored and blocked. The handlers themselves also do nothing
in any process but the one that installed them. For workers started with
``spawn``/``forkserver`` pass ``worker_init_fn=ignore_stop_signals`` to the DataLoader.

Signalling a job
----------------
One process (``recd train``)::

    kill -TERM <pid>        # checkpoint at the end of the step in flight, exit 0
    kill -USR1 <pid>        # checkpoint at the end of the step in flight, keep training

``recd train --nproc N`` (the launcher runs ``python -m torch.distributed.run`` whose agent
runs N workers ``python -u -m recd train ...``): signal the **launcher**, the process you
started. It forwards SIGTERM and SIGUSR1 to the N worker processes
(:func:`forward_signals_to_workers`); the workers agree on the step, write one checkpoint,
and exit 0 (SIGTERM) or continue (SIGUSR1); the agent then exits 0 and so does the launcher.

A torchrun job started by hand: torchrun's agent (torch 2.13, ``--signals-to-handle``,
default ``SIGTERM,SIGINT,SIGHUP,SIGQUIT``) treats every signal it handles as a death signal:
it sends it to the workers, waits ``--shutdown-timeout`` (``TORCH_ELASTIC_SHUTDOWN_TIMEOUT``,
default 30 s; ``recd train --nproc`` raises it to 600 s) and then SIGKILLs them. So
``kill -TERM <agent pid>`` works (the workers checkpoint within the timeout; the agent's own
exit code is non-zero). SIGUSR1 is not in its list, and the agent has no handler for it:
SIGUSR1 to the agent *kills the agent* (default action), and adding SIGUSR1 to
``--signals-to-handle`` makes the agent shut the job down after forwarding it. Send SIGUSR1
to the workers instead, never to the agent::

    pkill -USR1 -f -- '-u -m recd train'                          # the workers' command line
    pkill -USR1 -P "$(pgrep -f 'torch.distributed.run.*recd train')"  # the agent's children

(``pkill -USR1 -f 'recd train'`` would also match the agent and the launcher and kill them.)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

import torch

__all__ = [
    "STOP_SIGNALS",
    "SignalFlags",
    "StepSignals",
    "agree",
    "forward_signals_to_workers",
    "ignore_stop_signals",
]

log = logging.getLogger(__name__)

STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1)
"""SIGTERM: write and exit; SIGUSR1: write and continue."""


@dataclass(frozen=True, slots=True)
class StepSignals:
    """What the signals received since the last step boundary ask for."""

    save: bool = False
    """Write a checkpoint at this boundary (SIGUSR1, or SIGTERM)."""
    stop: bool = False
    """Stop training after writing it (SIGTERM)."""

    @property
    def any(self) -> bool:
        return self.save or self.stop


class SignalFlags:
    """SIGTERM / SIGUSR1 handlers that only count signals; read them at step boundaries.

    Use as a context manager in the main thread (``signal.signal`` works nowhere else); the
    previous handlers are restored on exit. A handler invoked in another process (a forked
    DataLoader worker inherits it) does nothing: the worker ignores the signal.
    """

    def __init__(self) -> None:
        self._owner_pid = os.getpid()
        self._term = 0
        self._usr1 = 0
        self._term_seen = 0
        self._usr1_seen = 0
        self._previous: dict[signal.Signals, Any] = {}

    def install(self) -> SignalFlags:
        """Install the handlers (main thread only; ValueError elsewhere).

        While installed, every process forked from this one (DataLoader workers) starts with
        SIGTERM and SIGUSR1 ignored (:func:`ignore_stop_signals`, run by an at-fork hook).
        """
        global _ACTIVE
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("SignalFlags.install: signal handlers need the main thread")
        self._owner_pid = os.getpid()
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        _register_fork_hook()
        _ACTIVE = self
        return self

    def uninstall(self) -> None:
        """Restore the handlers that were there before :meth:`install`."""
        global _ACTIVE
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        if _ACTIVE is self:
            _ACTIVE = None

    def __enter__(self) -> SignalFlags:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner_pid:
            return  # a forked DataLoader worker: leave the signal to the trainer
        if signum == signal.SIGTERM:
            self._term += 1
        else:
            self._usr1 += 1

    def raise_signal(self, sig: signal.Signals) -> None:
        """Count ``sig`` as if it had been received (tests, the pivot command)."""
        self._handle(int(sig), None)

    def take(self) -> StepSignals:
        """The requests since the previous call (each signal is acted on once).

        Counters, not booleans: a signal arriving while this runs is never lost, it is seen
        at the next boundary.
        """
        term, usr1 = self._term, self._usr1
        stop = term > self._term_seen
        save = stop or usr1 > self._usr1_seen
        self._term_seen, self._usr1_seen = term, usr1
        return StepSignals(save=save, stop=stop)

    def take_agreed(self, *, device: torch.device, group: Any = None) -> StepSignals:
        """:meth:`take` for a job of several ranks: every rank calls it at the same step
        boundary and gets the same answer.

        The ranks agree on the largest signal *counts* any of them has received (all-reduce
        MAX), and act when the agreed counts exceed those acted on last time. One signal
        forwarded to every rank is one checkpoint even when it reaches the ranks at different
        steps: the rank it reaches late only catches up with a count already acted on (with
        flags, that rank's late flag made a second checkpoint one step later).
        """
        import torch.distributed as dist

        counts = torch.tensor([self._term, self._usr1], dtype=torch.int64, device=device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX, group=group)
        term, usr1 = (int(x) for x in counts.tolist())
        stop = term > self._term_seen
        save = stop or usr1 > self._usr1_seen
        self._term_seen, self._usr1_seen = max(term, self._term_seen), max(usr1, self._usr1_seen)
        return StepSignals(save=save, stop=stop)

    @property
    def stop_requested(self) -> bool:
        """Whether a SIGTERM has ever been received (without consuming it)."""
        return self._term > 0


def agree(
    signals: StepSignals,
    *,
    device: torch.device,
    group: Any = None,
) -> StepSignals:
    """The union over all ranks of ``signals`` (all-reduce MAX): every rank must call it at
    the same step boundary; afterwards every rank holds the same answer."""
    import torch.distributed as dist

    flags = torch.tensor([int(signals.save), int(signals.stop)], dtype=torch.int32, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group)
    save, stop = (bool(x) for x in flags.tolist())
    return StepSignals(save=save or stop, stop=stop)


def ignore_stop_signals(worker_id: int | None = None) -> None:
    """Make this process immune to SIGTERM and SIGUSR1: a DataLoader ``worker_init_fn``.

    ``SIG_IGN`` for both, and both blocked: torch's worker loop installs its own C handler for
    SIGTERM (it exits quietly when the parent sends it, and dies otherwise), which would undo
    ``SIG_IGN`` alone; a blocked signal is never delivered whatever the handler. The trainer
    shuts its workers down itself (end-of-data sentinel), after the checkpoint is written; a
    worker whose trainer died exits by torch's parent watchdog.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, set(STOP_SIGNALS))


_ACTIVE: SignalFlags | None = None
"""The installed flags of this process (the at-fork hook protects its children)."""
_FORK_HOOK_REGISTERED = False


def _after_fork_in_child() -> None:
    if _ACTIVE is not None:  # inherited from a trainer: this child is one of its workers
        ignore_stop_signals()


def _register_fork_hook() -> None:
    global _FORK_HOOK_REGISTERED
    if not _FORK_HOOK_REGISTERED:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _FORK_HOOK_REGISTERED = True


def _worker_processes() -> list[Any]:
    """The torchrun workers under this launcher: the children of its children (the agent)."""
    import psutil

    me = psutil.Process()
    workers = []
    for agent in me.children():
        with contextlib.suppress(psutil.Error):
            workers.extend(agent.children())
    return workers


@contextlib.contextmanager
def forward_signals_to_workers() -> Iterator[None]:
    """In the ``recd train --nproc N`` launcher: send SIGTERM and SIGUSR1 to the workers.

    The launcher's child is torchrun's agent, whose children are the trainer workers; the
    signal goes to those (not to the agent, which would shut the job down or, for SIGUSR1,
    die). Before the workers exist, SIGTERM goes to the agent (nothing to checkpoint yet) and
    SIGUSR1 is dropped with a warning. Main thread only; the old handlers come back on exit.
    """
    import psutil

    def forward(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        workers = _worker_processes()
        targets = workers
        if not workers:
            if sig != signal.SIGTERM:
                log.warning("%s received before the workers started: ignored", sig.name)
                return
            targets = psutil.Process().children()
        for proc in targets:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        log.info("forwarded %s to %d worker process(es)", sig.name, len(targets))

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
