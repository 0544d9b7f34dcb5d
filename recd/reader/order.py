"""The order of an epoch: which rows each batch holds, decided by the seed and never by the
number of reading processes or the engine that runs them.

An epoch of one rank is built in four steps, each a function of ``(seed, epoch)`` and the
table's units only:

1. **Units.** ``order_units``: table order (``none``), files permuted (``file``), or every
   (file, row group) unit permuted (``row_group``, ``session``, ``rows``).
2. **Streams.** The epoch's units are dealt round-robin over the job's ``world_size x
   streams`` streams: global stream ``g = rank * streams + s`` reads units ``g, g + G, ...``
   (``G = world_size * streams``). A stream's rows are its units' rows, concatenated.
3. **Windows** (``rows`` and ``session`` only). A stream's rows are cut into windows of
   ``window_rows`` rows (``shuffle_window`` rounded up to whole batches), and the rows of each
   window are permuted (``window_order``): one by one for ``rows``, as whole sessions (runs
   of equal ids in ``session_column``) for ``session``. The generator is seeded by ``(seed, epoch,
   global stream, window)``. A window spans several row groups, drawn at random from the
   whole table by step 1, so a batch mixes rows of different hours and partitions.
4. **Batches.** Each stream's rows (permuted windows, or units as they are) are cut into
   batches of ``batch_size`` rows; a window holds whole batches, so no batch spans two
   windows. The rank's sequence takes one batch from each stream in turn (stream 0, 1, ...,
   skipping streams that ran out): the ``(seq, stream)`` order of ``next_stream``.

Reading processes only decide who builds which batch: local worker ``w`` of ``W`` builds the
batches of streams ``w, w + W, ...`` (so ``W`` divides ``streams``), the Ray engine builds
windows or chunks of them in tasks. Every batch is the same either way, and a position (the
number of batches handed out) is valid for any worker count.

Memory: a stream holds one window at a time (its rows, plus the rest of the row group the
window ends in, kept for the next window), so a process reading ``k`` streams holds at most
``k x (window_rows + rows of one row group)`` rows; ``none``, ``file`` and ``row_group`` hold
one row group per stream.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import numpy as np

from recd.errors import ConfigError
from recd.reader.config import Shuffle


class _Unit(Protocol):
    @property
    def path(self) -> str: ...


U = TypeVar("U", bound=_Unit)


def order_units(units: list[U], shuffle: Shuffle, *, seed: int, epoch: int) -> list[U]:
    """Units in the reading order of ``epoch``: table order, or permuted per ``shuffle``."""
    if shuffle == Shuffle.NONE or len(units) < 2:
        return list(units)
    rng = np.random.default_rng([seed, epoch])
    if shuffle == Shuffle.FILE:
        files: dict[str, list[U]] = {}
        for u in units:
            files.setdefault(u.path, []).append(u)
        groups = list(files.values())
        return [u for i in rng.permutation(len(groups)) for u in groups[i]]
    return [units[i] for i in rng.permutation(len(units))]


def window_order(
    shuffle: Shuffle,
    num_rows: int,
    session_ids: np.ndarray | None,
    *,
    seed: int,
    epoch: int,
    stream: int,
    window: int,
) -> np.ndarray:
    """Row indices (int64, a permutation of ``range(num_rows)``) of one window of global
    stream ``stream``: rows permuted one by one (``rows``) or as whole sessions
    (``session``, the runs of equal ``session_ids``)."""
    rng = np.random.default_rng([seed, epoch, stream, window])
    if shuffle == Shuffle.ROWS:
        return rng.permutation(num_rows).astype(np.int64)
    if shuffle == Shuffle.SESSION:
        if session_ids is None or len(session_ids) != num_rows:
            raise ValueError("the session shuffle needs one session id per row")
        return session_order(session_ids, rng)
    raise ValueError(f"shuffle {shuffle.value!r} does not permute rows")


def session_order(session_ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row indices that permute whole sessions (shape (N,), int64).

    Sessions are the runs of equal ``session_ids`` (contiguous in a clustered table); the runs
    are permuted and each keeps its rows in order, so a session's duplicate rows stay adjacent.
    """
    n = len(session_ids)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, session_ids[1:] != session_ids[:-1]])
    lengths = np.diff(np.r_[starts, n])
    perm = rng.permutation(len(starts))
    new_lengths = lengths[perm]
    # Row j of permuted run r comes from starts[perm[r]] + j.
    run_of_row = np.repeat(np.arange(len(perm)), new_lengths)
    new_starts = np.cumsum(new_lengths) - new_lengths
    within = np.arange(n) - new_starts[run_of_row]
    return (starts[perm][run_of_row] + within).astype(np.int64)


def next_stream(totals: list[int], counts: list[int], among: list[int] | None = None) -> int | None:
    """The stream whose batch comes next in the ``(seq, stream)`` order, given each stream's
    batch count ``totals`` and batches taken ``counts`` (None: the epoch is finished).
    ``among``: only these streams (a worker's share), in the same order."""
    best: tuple[int, int] | None = None
    for s in range(len(totals)) if among is None else among:
        if counts[s] < totals[s] and (best is None or counts[s] < best[0]):
            best = (counts[s], s)
    return None if best is None else best[1]


def canonical_counts(totals: list[int], consumed: int) -> list[int]:
    """Batches taken from each stream after the first ``consumed`` batches of the
    ``(seq, stream)`` order, given each stream's batch count ``totals``."""
    if consumed > sum(totals):
        raise ConfigError(
            f"reader: position {consumed} is past the end of the epoch ({sum(totals)})"
        )
    lo, hi = 0, max(totals, default=0)  # r: the number of complete rounds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(t, mid) for t in totals) <= consumed:
            lo = mid
        else:
            hi = mid - 1
    counts = [min(t, lo) for t in totals]
    left = consumed - sum(counts)
    for s, t in enumerate(totals):  # a partial round goes to the lowest stream ids
        if left and t > lo:
            counts[s] += 1
            left -= 1
    return counts
