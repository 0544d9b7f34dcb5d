"""The snapshot copy shared by the writer thread and a waiting training thread."""

from __future__ import annotations

import threading

import pytest
import torch

from recd.errors import CheckpointError
from recd.train.checkpointing import FillPieces


def pieces_of(sources: list[torch.Tensor], target: torch.Tensor, size: int) -> FillPieces:
    out, position = [], 0
    for source in sources:
        flat = source.reshape(-1)
        for start in range(0, flat.numel(), size):
            piece = flat[start : start + size]
            out.append((target[position : position + piece.numel()], piece))
            position += piece.numel()
    return FillPieces(out)


def test_two_threads_copy_every_piece_exactly_once() -> None:
    torch.manual_seed(0)
    sources = [torch.randn(n) for n in (1000, 37, 4096, 1)]
    total = sum(s.numel() for s in sources)
    for size in (1, 7, 64, 10_000):
        target = torch.full((total,), float("nan"))
        pieces = pieces_of(sources, target, size)
        writer = threading.Thread(target=pieces.work, kwargs={"from_back": False})
        writer.start()
        pieces.work(from_back=True)
        pieces.finish()
        writer.join()
        assert pieces.complete.is_set()
        assert torch.equal(target, torch.cat(sources))


def test_no_pieces_is_complete_at_once() -> None:
    pieces = FillPieces([])
    pieces.finish()
    pieces.work(from_back=True)


def test_a_failed_copy_is_reported_and_stops_the_other_thread() -> None:
    target = torch.zeros(4)
    bad = torch.zeros(3)  # wrong shape: copy_ raises
    pieces = FillPieces([(target[:2], torch.ones(2)), (target[2:], bad)])
    with pytest.raises(RuntimeError):
        pieces.work(from_back=True)
    pieces.work(from_back=False)  # nothing left to claim once a copy failed
    with pytest.raises(CheckpointError, match="snapshot copy failed"):
        pieces.finish()
