"""Delta checkpoints and chains: exact restore at every step, byte-identical materialisation,
torn and missing links refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint.atomic import checkpoint_path, write_checkpoint
from recd.checkpoint.chain import chain_paths, read_any, validate_any
from recd.checkpoint.delta import (
    HEADER_BYTES,
    Block,
    blocks_for,
    delta_filename,
    delta_size_bytes,
    read_delta,
    write_delta,
)
from recd.checkpoint.format import ParamLayout
from recd.errors import CheckpointCorruptError

LAYOUT = ParamLayout.from_named_arrays(
    [
        ("tables.a", np.zeros((50, 4), np.float32)),
        ("dense.w", np.zeros((3, 5), np.float32)),
        ("tables.b", np.zeros((20, 8), np.float32)),
        ("dense.b", np.zeros(5, np.float32)),
    ]
)
TABLES = {"tables.a": 50, "tables.b": 20}
DENSE = ("dense.w", "dense.b")


def _lazy_steps(seed: int, steps: int) -> list[tuple[list[np.ndarray], dict[str, np.ndarray]]]:
    """A run's state after each step and the rows each step touched (lazy Adam: only looked-up
    rows and the dense tensors change)."""
    rng = np.random.default_rng(seed)
    regions = [rng.standard_normal(LAYOUT.n_params).astype(np.float32) for _ in range(3)]
    history = [([r.copy() for r in regions], {})]
    for _ in range(steps):
        touched = {}
        for name, n_rows in TABLES.items():
            rows = rng.integers(0, n_rows, size=rng.integers(0, 6))
            touched[name] = rows
            offset = LAYOUT.offset_of(name)
            width = LAYOUT.spec(name).numel // n_rows
            for row in rows:
                for r in regions:
                    r[offset + row * width : offset + (row + 1) * width] += 1.0
        for name in DENSE:
            for r in regions:
                r[LAYOUT.slice_of(name)] *= 0.5
        history.append(([r.copy() for r in regions], touched))
    return history


def _write_chain(run_dir: Path, history: list, *, base: int = 0) -> None:
    write_checkpoint(checkpoint_path(run_dir, base), base, *history[base][0], layout=LAYOUT)
    since: dict[str, list[np.ndarray]] = {}
    for step in range(base + 1, len(history)):
        regions, touched = history[step]
        since = touched  # each delta holds the rows touched since its parent
        write_delta(
            run_dir / delta_filename(step),
            step=step,
            parent=step - 1,
            base=base,
            n_params=LAYOUT.n_params,
            blocks=blocks_for(LAYOUT, since, DENSE),
            regions=dict(zip(("weights", "adam_m", "adam_v"), regions, strict=True)),
        )


def test_chain_restores_every_step_exactly(tmp_path: Path) -> None:
    history = _lazy_steps(0, 8)
    _write_chain(tmp_path, history)
    for step in range(1, 9):
        path = tmp_path / delta_filename(step)
        assert validate_any(path, LAYOUT, verify=True).step == step
        ckpt = read_any(path, LAYOUT)
        assert ckpt.step == step
        for got, want in zip(
            (ckpt.weights, ckpt.adam_m, ckpt.adam_v), history[step][0], strict=True
        ):
            assert np.array_equal(got, want)
        assert len(chain_paths(path)) == step + 1


def test_materialised_chain_equals_the_full_checkpoint_byte_for_byte(tmp_path: Path) -> None:
    history = _lazy_steps(1, 5)
    _write_chain(tmp_path / "run", history)
    ckpt = read_any(tmp_path / "run" / delta_filename(5), LAYOUT)
    made = write_checkpoint(
        tmp_path / "made" / "step_000005.bin", 5, ckpt.weights, ckpt.adam_m, ckpt.adam_v
    )
    direct = write_checkpoint(tmp_path / "direct" / "step_000005.bin", 5, *history[5][0])
    assert made.read_bytes() == direct.read_bytes()


def test_delta_holds_only_touched_rows(tmp_path: Path) -> None:
    blocks = blocks_for(LAYOUT, {"tables.a": np.array([7, 3, 7]), "tables.b": np.array([])}, DENSE)
    assert [len(b.rows) for b in blocks] == [2, 1, 1]  # a's two rows, dense.w, dense.b
    regions = {r: np.zeros(LAYOUT.n_params, np.float32) for r in ("weights", "adam_m", "adam_v")}
    path = write_delta(
        tmp_path / delta_filename(3), step=3, parent=2, base=0, n_params=LAYOUT.n_params,
        blocks=blocks, regions=regions,
    )  # fmt: skip
    elems = 2 * 4 + 15 + 5
    assert (
        path.stat().st_size
        == delta_size_bytes(blocks)
        == HEADER_BYTES + 24 * 3 + 4 * 4 + 12 * elems
    )
    assert read_delta(path).blocks[0].rows.tolist() == [3, 7]


def test_rows_outside_the_table_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        blocks_for(LAYOUT, {"tables.a": np.array([50])}, DENSE)
    with pytest.raises(ValueError, match="not in the checkpoint layout"):
        blocks_for(LAYOUT, {"tables.c": np.array([0])}, DENSE)


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing_link", "missing_base", "extend"])
def test_a_damaged_chain_is_refused(tmp_path: Path, damage: str) -> None:
    history = _lazy_steps(2, 4)
    _write_chain(tmp_path, history)
    link = tmp_path / delta_filename(2)
    data = link.read_bytes()
    if damage == "truncate":
        link.write_bytes(data[:-3])
    elif damage == "flip":
        link.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif damage == "extend":
        link.write_bytes(data + b"\0\0\0\0")
    elif damage == "missing_link":
        link.unlink()
    else:
        checkpoint_path(tmp_path, 0).unlink()
    newest = tmp_path / delta_filename(4)
    with pytest.raises(CheckpointCorruptError):
        validate_any(newest, LAYOUT, verify=True)
    with pytest.raises(CheckpointCorruptError):
        read_any(newest, LAYOUT)
    if damage not in ("missing_link", "missing_base"):
        assert validate_any(tmp_path / delta_filename(1), LAYOUT, verify=True).step == 1


@pytest.mark.parametrize(
    "damage", ["truncate", "extend", "header_rows", "row_order", "missing_link", "none"]
)
def test_checking_links_without_their_payload_finds_what_a_full_read_finds(
    tmp_path: Path, damage: str
) -> None:
    """``validate_any`` without ``verify`` (what retention runs after every checkpoint) reads
    each link's header, block table and rows, not its weights: it refuses a wrong size, a
    broken row list or a missing link as a full read does (the CRC is ``verify``'s)."""
    history = _lazy_steps(4, 3)
    _write_chain(tmp_path, history)
    link = tmp_path / delta_filename(2)
    data = bytearray(link.read_bytes())
    table = HEADER_BYTES  # the first block: tables.a, its n_rows at offset 16 of the entry
    if damage == "truncate":
        data = data[:-3]
    elif damage == "extend":
        data += b"\0" * 12
    elif damage == "header_rows":
        data[table + 16] += 1  # one more row than the file holds
    elif damage == "row_order":
        rows_at = HEADER_BYTES + 24 * read_delta(link).blocks.__len__()
        data[rows_at : rows_at + 8] = np.array([5, 5], np.int32).tobytes()
    elif damage == "missing_link":
        link.unlink()
    if damage != "missing_link":
        link.write_bytes(bytes(data))
    newest = tmp_path / delta_filename(3)
    full = light = None
    try:
        read_delta(link, verify=False)
    except (CheckpointCorruptError, FileNotFoundError) as exc:
        full = exc
    try:
        read_delta(link, verify=False, payload=False)
    except (CheckpointCorruptError, FileNotFoundError) as exc:
        light = exc
    assert (full is None) == (light is None) == (damage == "none"), (full, light)
    if damage == "none":
        a, b = read_delta(link), read_delta(link, verify=False, payload=False)
        assert [blk.rows.tolist() for blk in a.blocks] == [blk.rows.tolist() for blk in b.blocks]
        assert b.payload.shape == (3, 0)
        assert validate_any(newest, LAYOUT).step == 3
    else:
        with pytest.raises(CheckpointCorruptError):
            validate_any(newest, LAYOUT)
    with pytest.raises(ValueError, match="payload"):
        read_delta(tmp_path / delta_filename(1), verify=True, payload=False)


def test_a_chain_of_another_model_is_refused(tmp_path: Path) -> None:
    history = _lazy_steps(3, 2)
    _write_chain(tmp_path, history)
    other = ParamLayout.from_named_arrays([("x", np.zeros(7, np.float32))])
    with pytest.raises(CheckpointCorruptError, match="n_params"):
        validate_any(tmp_path / delta_filename(2), other)


def test_column_shards_are_blocks_narrower_than_their_rows(tmp_path: Path) -> None:
    """Two ranks holding the left and right halves of tables.b's rows write one block each."""
    history = _lazy_steps(4, 1)
    write_checkpoint(checkpoint_path(tmp_path, 0), 0, *history[0][0], layout=LAYOUT)
    offset = LAYOUT.offset_of("tables.b")
    rows = np.unique(history[1][1]["tables.b"]).astype(np.int32)
    halves = [Block(offset + col, 8, 4, rows) for col in (0, 4)]
    others = [b for b in blocks_for(LAYOUT, {"tables.a": history[1][1]["tables.a"]}, DENSE)]
    regions = dict(zip(("weights", "adam_m", "adam_v"), history[1][0], strict=True))
    path = write_delta(
        tmp_path / delta_filename(1), step=1, parent=0, base=0, n_params=LAYOUT.n_params,
        blocks=others + halves, regions=regions,
    )  # fmt: skip
    ckpt = read_any(path, LAYOUT)
    assert np.array_equal(ckpt.adam_v, history[1][0][2])
    half = write_delta(
        tmp_path / "half" / delta_filename(1), step=1, parent=0, base=0,
        n_params=LAYOUT.n_params, blocks=others + halves[:1], regions=regions,
    )  # fmt: skip
    (tmp_path / "half" / "step_000000.bin").write_bytes(checkpoint_path(tmp_path, 0).read_bytes())
    assert rows.size > 0  # the seed touches tables.b, so a missing half is seen
    assert not np.array_equal(read_any(half, LAYOUT).weights, history[1][0][0])
