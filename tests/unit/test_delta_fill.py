"""A delta checkpoint's copy made on the writer thread (:class:`recd.train.snapshot.DeltaFill`):
the training thread only swaps the row logs at the boundary; steps that race the writer's
gather hand their old rows over, so the delta still holds exactly the state of its step."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest
import torch
from torch import nn

from recd.checkpoint.format import ParamLayout
from recd.optim.model_adam import AdamConfig, ModelAdam
from recd.train import snapshot
from recd.train.snapshot import DeltaFill


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.items = nn.Embedding(400, 8, sparse=True)
        self.users = nn.Embedding(50, 4, sparse=True)
        self.head = nn.Linear(12, 1)

    def forward(self, items: torch.Tensor, users: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.items(items), self.users(users)], dim=1)).sum()


def make(seed: int = 0) -> tuple[Tiny, ModelAdam, ParamLayout, torch.Generator]:
    torch.manual_seed(seed)
    model = Tiny()
    optimizer = ModelAdam.for_model(model, AdamConfig(lr=0.01))
    layout = ParamLayout.from_named_arrays(
        (n, p.detach().numpy()) for n, p in model.named_parameters()
    )
    optimizer.log_rows()
    return model, optimizer, layout, torch.Generator().manual_seed(seed)


def train_step(
    model: Tiny, optimizer: ModelAdam, gen: torch.Generator, touched: dict[str, set[int]]
) -> None:
    """One step on random ids; ``touched`` collects the rows each table had updated."""
    items = torch.randint(0, 400, (32,), generator=gen)
    users = torch.randint(0, 50, (32,), generator=gen)
    optimizer.zero_grad()
    model(items, users).backward()
    optimizer.step()
    touched["items.weight"].update(items.tolist())
    touched["users.weight"].update(users.tolist())


def state(optimizer: ModelAdam) -> dict[str, list[torch.Tensor]]:
    m, v = optimizer.moments("adam_m"), optimizer.moments("adam_v")
    return {
        n: [optimizer.params[n].detach().clone(), m[n].clone(), v[n].clone()]
        for n in optimizer.names
    }


def check_parts(
    parts: list, layout: ParamLayout, expected: dict, touched: dict[str, set[int]]
) -> None:
    """Every dense tensor whole, each table's touched rows, values of the boundary's state."""
    by_start = {block.start: (block, values) for block, values in parts}
    assert len(by_start) == len(parts)
    for name, tensors in expected.items():
        start = layout.offset_of(name)
        if name in touched:
            rows = sorted(touched[name])
            if not rows:
                assert start not in by_start
                continue
            block, values = by_start[start]
            assert block.rows.tolist() == rows
            for got, want in zip(values, tensors, strict=True):
                np.testing.assert_array_equal(got, want[rows].reshape(-1).numpy())
        else:
            block, values = by_start[start]
            assert block.width == block.row_stride == tensors[0].numel()
            for got, want in zip(values, tensors, strict=True):
                np.testing.assert_array_equal(got, want.reshape(-1).numpy())


@pytest.mark.parametrize("race", [False, True])
def test_a_delta_holds_the_state_of_its_step_while_steps_race_the_gather(
    monkeypatch: pytest.MonkeyPatch, race: bool
) -> None:
    """``race``: steps run before and while the writer gathers (the worst case: every row
    they update may be read mid-update); without, the copy runs alone. Either way the delta
    is the boundary's state bit for bit, and the next delta holds the rows updated after."""
    monkeypatch.setattr(snapshot, "FILL_PIECE_ELEMENTS", 3)  # dense pieces both threads share
    model, optimizer, layout, gen = make()
    for _ in range(2):
        touched: dict[str, set[int]] = {"items.weight": set(), "users.weight": set()}
        for _ in range(5):
            train_step(model, optimizer, gen, touched)
        expected = state(optimizer)
        fill = DeltaFill.plan(optimizer, layout)
        after: dict[str, set[int]] = {"items.weight": set(), "users.weight": set()}
        if race:
            optimizer.step = functools.partial(fill.guard_step, optimizer.step)  # type: ignore[method-assign]
            for _ in range(3):  # before the writer starts
                train_step(model, optimizer, gen, after)
            writer = threading.Thread(target=fill.run)
            writer.start()
            while not fill.patches.closed:
                train_step(model, optimizer, gen, after)
            writer.join()
            del optimizer.step
            assert fill.patches.rows_saved > 0
        else:
            fill.run()
        check_parts(fill.parts(), layout, expected, touched)
        if race:  # the rows updated during the copy went to the fresh log
            logged = optimizer.take_logged_rows()
            assert {n: set(r.tolist()) for n, r in logged.items()} == after


def test_a_table_not_updated_since_the_last_delta_is_left_out() -> None:
    model, optimizer, layout, gen = make(1)
    train_step(model, optimizer, gen, {"items.weight": set(), "users.weight": set()})
    DeltaFill.plan(optimizer, layout).run()  # takes the logs
    expected = state(optimizer)
    fill = DeltaFill.plan(optimizer, layout)
    fill.run()
    check_parts(fill.parts(), layout, expected, {"items.weight": set(), "users.weight": set()})


def test_the_fill_gives_what_the_training_thread_gather_gives() -> None:
    """The writer-thread copy and ``ModelAdam.delta_blocks`` (the gather on the training
    thread, used with several processes) agree block for block."""
    runs = []
    for gather in ("fill", "delta_blocks"):
        model, optimizer, layout, gen = make(2)
        for _ in range(4):
            train_step(model, optimizer, gen, {"items.weight": set(), "users.weight": set()})
        if gather == "fill":
            fill = DeltaFill.plan(optimizer, layout)
            fill.run()
            runs.append(fill.parts())
        else:
            runs.append(optimizer.delta_blocks(layout))
    assert len(runs[0]) == len(runs[1])
    for (block_a, values_a), (block_b, values_b) in zip(*runs, strict=True):
        assert (block_a.start, block_a.row_stride, block_a.width) == (
            block_b.start,
            block_b.row_stride,
            block_b.width,
        )
        np.testing.assert_array_equal(block_a.rows, block_b.rows)
        for a, b in zip(values_a, values_b, strict=True):
            np.testing.assert_array_equal(a, b)
