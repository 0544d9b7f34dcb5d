"""Peer copies of the embedding shards: a dead rank's tables come back bit-exact.

Survivor recovery (:mod:`recd.recovery.rejoin`) gets the dense layers from a survivor, but a
sharded table's rows live on one rank only: without a copy elsewhere, the dead rank's shard
comes back from the newest checkpoint and the rows updated since lose those updates (the
audit trail names them). ``recd train --recovery survivor --peer-copy`` keeps a copy instead:

- **Ring.** Rank ``r`` holds the sharded tables (weights, Adam m and v) of its *ward*, rank
  ``r - 1`` (mod N), and sends its own to its *keeper*, rank ``r + 1``. The copy starts as the
  ward's whole shards (:meth:`PeerCopy.seed`, when training starts and after every recovery).
- **Every step.** After its update, a rank sends its keeper the rows the update touched, as
  they are after it (ids, weights, m, v: what the lazy row-sparse Adam computed anyway,
  :class:`recd.optim.RowsStep`), and receives its ward's (:meth:`PeerCopy.exchange`: gloo
  send/recv around the ring, before the step's loss all-reduce). The received rows are written
  into the copy only once the step has completed on every rank (:meth:`PeerCopy.commit`, after
  the loss all-reduce), so a keeper that completed step ``k`` holds its ward's shards exactly
  as they were after step ``k``, and rows of a step that never completed are dropped
  (:meth:`PeerCopy.drop_pending`). Survivors agree on the last step every one of them
  completed (the agreed step), so the keeper's copy is at that step, with no undo.
- **Recovery.** The keeper of the dead rank sends the copy to the replacement
  (:meth:`PeerCopy.send_ward` / :meth:`PeerCopy.receive_own`), which loads it as its own
  shards: with the dense state from a survivor, the state of every rank is that of the agreed
  step, bit for bit. Then the ring is seeded again (the replacement has no copy of its ward).

Cost (documented in docs/recovery.md, measured by ``benchmarks/undo_overhead.py``): memory, a
second copy of every sharded table's weights, m and v (12 bytes per element, spread over the
ring); per step, sending the touched rows' ids and 12 bytes per element of them to one peer;
per recovery, one transfer of the dead shard and a re-seed of every copy (the whole sharded
state, once). Not covered: fused (GPU) tables, whose update runs inside the backward, and two
neighbours dying together (the keeper is gone too: the checkpoint route, audited).

Why by hand: torchrec and torch.distributed checkpointing replicate to storage, not to a peer's
memory; torchft replicates data-parallel replicas, not a model-parallel shard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from recd.optim.sharded_adam import ShardedAdam

__all__ = ["PeerCopy", "RowsAfter"]


@dataclass(kw_only=True, slots=True)
class RowsAfter:
    """The rows one update touched in one local table, after it (what a keeper needs)."""

    table: int
    """Index of the table in the rank's copied tables (:attr:`PeerCopy.own`)."""
    rows: torch.Tensor
    """(R,) int64 local rows."""
    weight: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    """(R x E) each."""


class PeerCopy:
    """The copy of the ward's sharded tables this rank keeps, and the ring traffic that keeps
    it current (see the module docstring).

    Args:
        optimizer: this rank's :class:`recd.optim.sharded_adam.ShardedAdam` (its process group).
    """

    def __init__(self, optimizer: ShardedAdam) -> None:
        self.optimizer = optimizer
        self.rank = optimizer.rank
        self.world_size = optimizer.world_size
        self.keeper = (self.rank + 1) % self.world_size
        self.ward = (self.rank - 1) % self.world_size
        self.own = [i for i, t in enumerate(optimizer.tables) if not (t.fused or t.replicated)]
        """Indices (in ``optimizer.tables``) of the tables this rank's copy at its keeper
        holds: the sharded, non-fused ones."""
        self.copy: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        """The ward's tables: (weights, m, v) each (rows x E), in the ward's ``own`` order."""
        self.step: int | None = None
        """The step the copy is at (None: not seeded)."""
        self._pending: list[RowsAfter] | None = None

    def rebind(self, optimizer: ShardedAdam) -> None:
        """Use the optimizer rebuilt in a new process group (same plan, same shards)."""
        self.optimizer = optimizer
        optimizer.keep_rows_after = True

    # ------------------------------------------------------------------ whole shards
    def _own_tensors(self) -> list[torch.Tensor]:
        opt = self.optimizer
        out = []
        for i in self.own:
            m, v = opt._table_moments(i)
            out += [opt.tables[i].weight, m, v]
        return out

    def _own_shapes(self) -> torch.Tensor:
        shapes = [list(self.optimizer.tables[i].weight.shape) for i in self.own]
        return torch.tensor([len(shapes)] + [x for s in shapes for x in s], dtype=torch.int64)

    def seed(self, step: int) -> None:
        """Every rank sends its keeper its whole shards and receives its ward's (a
        collective over the ring: every rank calls it at the same point)."""
        mine = self._own_shapes()
        size = torch.tensor([mine.numel()], dtype=torch.int64)
        theirs_size = torch.empty(1, dtype=torch.int64)
        _ring(size, theirs_size, self.keeper, self.ward)
        theirs = torch.empty(int(theirs_size), dtype=torch.int64)
        _ring(mine, theirs, self.keeper, self.ward)
        n = int(theirs[0])
        shapes = [(int(theirs[1 + 2 * k]), int(theirs[2 + 2 * k])) for k in range(n)]
        flat_out = _flat(self._own_tensors())
        flat_in = torch.empty(sum(3 * r * c for r, c in shapes), dtype=torch.float32)
        _ring(flat_out, flat_in, self.keeper, self.ward)
        self.copy, at = [], 0
        for r, c in shapes:
            parts = []
            for _ in range(3):
                parts.append(flat_in[at : at + r * c].view(r, c).clone())
                at += r * c
            self.copy.append((parts[0], parts[1], parts[2]))
        self.step = step
        self._pending = None

    # ------------------------------------------------------------------ every step
    def exchange(self, updates: list[RowsAfter]) -> None:
        """Send this step's touched rows (after the update) to the keeper; receive the ward's
        and hold them until :meth:`commit`. Raises what a failed send/recv raises (a peer
        died: the caller's survivor recovery takes over)."""
        if self.step is None:
            raise RuntimeError("PeerCopy.exchange before seed()")
        counts = torch.zeros(len(self.own), dtype=torch.int64)
        for u in updates:
            counts[u.table] += u.rows.numel()
        their_counts = torch.empty(len(self.copy), dtype=torch.int64)
        _ring(counts, their_counts, self.keeper, self.ward)
        rows_out = _cat([u.rows for u in updates], torch.int64)
        values_out = _flat([t for u in updates for t in (u.weight, u.exp_avg, u.exp_avg_sq)])
        total = int(their_counts.sum())
        widths = [w.shape[1] for w, _, _ in self.copy]
        rows_in = torch.empty(total, dtype=torch.int64)
        values_in = torch.empty(
            sum(3 * int(n) * e for n, e in zip(their_counts.tolist(), widths, strict=True)),
            dtype=torch.float32,
        )
        _ring(rows_out, rows_in, self.keeper, self.ward)
        _ring(values_out, values_in, self.keeper, self.ward)
        pending, r_at, v_at = [], 0, 0
        for table, (n, e) in enumerate(zip(their_counts.tolist(), widths, strict=True)):
            if not n:
                continue
            parts = []
            for _ in range(3):
                parts.append(values_in[v_at : v_at + n * e].view(n, e))
                v_at += n * e
            pending.append(
                RowsAfter(
                    table=table,
                    rows=rows_in[r_at : r_at + n],
                    weight=parts[0],
                    exp_avg=parts[1],
                    exp_avg_sq=parts[2],
                )
            )
            r_at += n
        self._pending = pending

    def send_step(self) -> None:
        """:meth:`exchange` of the optimizer's last step (its ``rows_after``, consumed)."""
        index = {i: k for k, i in enumerate(self.own)}
        updates = [
            RowsAfter(
                table=index[i],
                rows=rows,
                weight=done.weight_after,
                exp_avg=done.exp_avg_after,
                exp_avg_sq=done.exp_avg_sq_after,
            )
            for i, rows, done in self.optimizer.rows_after
        ]
        self.optimizer.rows_after = []
        self.exchange(updates)

    def commit(self) -> None:
        """The step completed on every rank: write the ward's rows into the copy."""
        if self._pending is None:
            return
        with torch.no_grad():
            for u in self._pending:
                w, m, v = self.copy[u.table]
                w.index_copy_(0, u.rows, u.weight)
                m.index_copy_(0, u.rows, u.exp_avg)
                v.index_copy_(0, u.rows, u.exp_avg_sq)
        self._pending = None
        assert self.step is not None
        self.step += 1

    def drop_pending(self) -> None:
        """Forget rows of a step that did not complete (a peer died during it)."""
        self._pending = None

    # ------------------------------------------------------------------ recovery
    def send_ward(self, dst: int) -> None:
        """Send the copy (the ward's tables at :attr:`step`) to its replacement ``dst``."""
        dist.send(_flat([t for parts in self.copy for t in parts]), dst)

    def receive_own(self, src: int) -> None:
        """Receive this rank's tables from its keeper ``src`` and load them as the live
        weights and moments (a replacement, before it trains)."""
        own = self._own_tensors()
        flat = torch.empty(sum(t.numel() for t in own), dtype=torch.float32)
        dist.recv(flat, src)
        at = 0
        with torch.no_grad():
            for t in own:
                t.copy_(flat[at : at + t.numel()].view(t.shape).to(t.device))
                at += t.numel()

    @property
    def nbytes(self) -> int:
        """Bytes the copy holds."""
        return sum(t.numel() * t.element_size() for parts in self.copy for t in parts)


def _flat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return _cat([t.detach().reshape(-1) for t in tensors], torch.float32)


def _cat(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    if not tensors:
        return torch.empty(0, dtype=dtype)
    return torch.cat([t.to("cpu", dtype) for t in tensors])


def _ring(out: torch.Tensor, into: torch.Tensor, keeper: int, ward: int) -> None:
    """Send ``out`` to the keeper while receiving ``into`` from the ward (both complete)."""
    works = [dist.isend(out, keeper)] if out.numel() else []
    if into.numel():
        works.append(dist.irecv(into, ward))
    for work in works:
        if work is not None:
            work.wait()
