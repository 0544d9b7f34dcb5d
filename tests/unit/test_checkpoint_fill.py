"""The snapshot copy shared by the writer thread and the training thread: dense pieces two
threads share, and the embedding tables' copy-on-write by rows."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from recd.errors import CheckpointError
from recd.optim.lazy_adam import lazy_adam_update_rows
from recd.train import snapshot
from recd.train.snapshot import FillPieces, RowPatches, SnapshotFill, cut_pieces


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
    assert pieces.complete.is_set()
    pieces.work(from_back=True)  # nothing to claim: returns at once
    pieces.finish()
    assert pieces.complete.is_set()


def test_a_failed_copy_is_reported_and_stops_the_other_thread() -> None:
    target = torch.zeros(4)
    bad = torch.zeros(3)  # wrong shape: copy_ raises
    pieces = FillPieces([(target[:2], torch.ones(2)), (target[2:], bad)])
    with pytest.raises(RuntimeError):
        pieces.work(from_back=True)
    pieces.work(from_back=False)  # nothing left to claim once a copy failed
    with pytest.raises(CheckpointError, match="snapshot copy failed"):
        pieces.finish()


# ---------------------------------------------------------------------- copy-on-write by rows
HYPER = {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0}


def table_fill(
    monkeypatch: pytest.MonkeyPatch, tables: list[tuple[torch.Tensor, ...]]
) -> tuple[SnapshotFill, torch.Tensor]:
    """A SnapshotFill of ``tables`` ((w, m, v) each) into one image, in small pieces."""
    monkeypatch.setattr(snapshot, "FILL_PIECE_ELEMENTS", 64)
    total = sum(w.numel() for w, _, _ in tables)
    image = torch.full((3, total), float("nan"))
    pieces, views, offset = [], {}, 0
    for table in tables:
        n = table[0].numel()
        targets = [image[r, offset : offset + n] for r in range(3)]
        for target, source in zip(targets, table, strict=True):
            pieces += cut_pieces(target, source.reshape(-1))
        views[id(table[0])] = tuple(t.view(table[0].shape) for t in targets)
        offset += n
    fill = SnapshotFill(dense=FillPieces([]), tables=FillPieces(pieces), patches=RowPatches(views))
    return fill, image


def one_step(tables: list[tuple[torch.Tensor, ...]], t: int, gen: torch.Generator) -> Any:
    """A lazy Adam step on random rows of every table (what ModelAdam.step does)."""

    def step(*, update_rows: Any = lazy_adam_update_rows) -> None:
        for w, m, v in tables:
            rows = torch.unique(torch.randint(0, w.shape[0], (40,), generator=gen))
            grad = torch.randn(len(rows), w.shape[1], generator=gen)
            update_rows(w, m, v, rows, grad, step=t, **HYPER)

    return step


@pytest.mark.parametrize("inner", ["default", "other"])
def test_steps_during_the_table_copy_leave_the_image_at_the_snapshot_step(
    monkeypatch: pytest.MonkeyPatch, inner: str
) -> None:
    """Steps before the bulk copy starts (the worst case: the copy reads only updated
    rows) and steps racing it: the image still holds every table as it was at the
    snapshot, bit for bit. ``other``: an update function that does not return the old rows
    (the recovery's recording update), so the patches gather them."""
    gen = torch.Generator().manual_seed(0)
    tables = [
        (torch.randn(300, 8, generator=gen), torch.randn(300, 8, generator=gen), torch.rand(300, 8))
        for _ in range(2)
    ]
    expected = torch.cat([torch.stack([t.reshape(-1) for t in table]) for table in tables], dim=1)
    fill, image = table_fill(monkeypatch, tables)

    def recording(*args: Any, **kwargs: Any) -> None:
        lazy_adam_update_rows(*args, **kwargs)  # returns nothing to the caller

    kwargs = {} if inner == "default" else {"update_rows": recording}
    for t in range(1, 4):  # the bulk copy has not started
        fill.guard_step(one_step(tables, t, gen), **kwargs)
    writer = threading.Thread(target=fill.run)
    writer.start()
    t = 4
    while not fill.patches.closed:  # steps racing the copy
        fill.guard_step(one_step(tables, t, gen), **kwargs)
        t += 1
    writer.join()
    assert fill.patches.rows_saved > 0
    assert torch.equal(image, expected)
    # after the copy, steps are not recorded and do not touch the image
    fill.guard_step(one_step(tables, t, gen), **kwargs)
    assert torch.equal(image, expected)


def test_a_table_missing_from_the_image_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    table = (torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2))
    fill, _ = table_fill(monkeypatch, [table])
    stranger = (torch.zeros(4, 2), torch.zeros(4, 2), torch.zeros(4, 2))
    with pytest.raises(CheckpointError, match="not in the checkpoint image"):
        fill.guard_step(one_step([stranger], 1, torch.Generator().manual_seed(0)))
    fill.run()  # the failed step closed its recording; the copy completes
