"""Checkpoint chains: a full ``step_NNNNNN.bin`` and the deltas written after it.

A delta names its parent (the checkpoint it applies onto) and its base (the full checkpoint
the chain starts at), so ``step_000300.delta`` resolves to ``step_000100.bin``,
``step_000200.delta``, ``step_000300.delta``. Every reader of checkpoints goes through
:func:`validate_any` and :func:`read_any`, which take a full file or a delta alike: a chain
with a missing, torn or damaged link is invalid as a whole, so a resume falls back to the
newest checkpoint whose whole chain is sound.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from recd.checkpoint.checksum import verify_checksum
from recd.checkpoint.delta import (
    Delta,
    delta_filename,
    parse_delta_step,
    read_delta,
    read_delta_header,
)
from recd.checkpoint.format import (
    Checkpoint,
    CheckpointHeader,
    ParamLayout,
    check_checkpoint_finite,
    check_finite,
    checkpoint_filename,
    parse_checkpoint_step,
    read_checkpoint,
    validate_checkpoint,
)
from recd.errors import CheckpointCorruptError


def is_delta(path: str | os.PathLike[str]) -> bool:
    return parse_delta_step(Path(path).name) is not None


def step_of_name(name: str) -> int | None:
    """The step of a ``step_NNNNNN.bin`` or ``step_NNNNNN.delta`` name, else None."""
    step = parse_checkpoint_step(name)
    return step if step is not None else parse_delta_step(name)


def chain_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The files a checkpoint needs, base first: ``[path]`` for a full file, else the base
    and every delta up to ``path``, from the headers (missing links raise
    CheckpointCorruptError naming them)."""
    path = Path(path)
    if not is_delta(path):
        return [path]
    links = [path]
    header = read_delta_header(path)
    base = header.base
    while True:
        parent = header.parent
        if parent == base:
            full = path.parent / checkpoint_filename(base)
            if not full.exists():
                raise CheckpointCorruptError(f"{path}: its base {full.name} is missing")
            return [full, *reversed(links)]
        link = path.parent / delta_filename(parent)
        if not link.exists():
            raise CheckpointCorruptError(f"{path}: link {link.name} of its chain is missing")
        header = read_delta_header(link)
        if header.base != base:
            raise CheckpointCorruptError(
                f"{path}: chain link {link.name} starts at step {header.base}, not {base}"
            )
        links.append(link)


def _deltas(chain: list[Path], *, verify: bool, payload: bool = True) -> list[Delta]:
    deltas = [read_delta(p, verify=verify, payload=payload) for p in chain[1:]]
    base = validate_checkpoint(chain[0])
    previous = base.step
    for delta in deltas:
        if delta.parent != previous:
            raise CheckpointCorruptError(
                f"{delta.path}: applies onto step {delta.parent}, the chain is at {previous}"
            )
        if delta.n_params != base.n_params:
            raise CheckpointCorruptError(
                f"{delta.path}: n_params {delta.n_params:,}, its base has {base.n_params:,}"
            )
        previous = delta.step
    return deltas


def validate_any(
    path: str | os.PathLike[str], layout: ParamLayout | None = None, *, verify: bool = False
) -> CheckpointHeader:
    """``validate_checkpoint`` for a full file or a whole chain. A chain's deltas always
    have their size, headers and links checked, and their CRC-32 with ``verify``, which also
    checks the base's checksum sidecar (a full file's sidecar is checked by the caller, as
    ``newest_valid_checkpoint`` does)."""
    chain = chain_paths(path)
    header = validate_checkpoint(chain[0], layout)
    if len(chain) == 1:
        return header
    if verify:
        verify_checksum(chain[0])
    deltas = _deltas(chain, verify=verify, payload=verify)  # links only, unless verifying
    size = sum(p.stat().st_size for p in chain)
    return CheckpointHeader(
        path=Path(path), step=deltas[-1].step, n_params=header.n_params, size_bytes=size
    )


def read_any(
    path: str | os.PathLike[str], layout: ParamLayout | None = None, *, verify: bool = True
) -> Checkpoint:
    """``read_checkpoint`` for a full file (memmapped) or a chain (the base copied into
    memory and every delta applied in order, CRCs checked with ``verify``)."""
    chain = chain_paths(path)
    base = read_checkpoint(chain[0], layout)
    if len(chain) == 1:
        return base
    if verify:
        verify_checksum(chain[0])
    regions = [np.array(base.region(r)) for r in ("weights", "adam_m", "adam_v")]
    deltas = _deltas(chain, verify=verify)
    for delta in deltas:
        delta.apply(regions)
    return Checkpoint(
        path=Path(path),
        step=deltas[-1].step,
        n_params=base.n_params,
        weights=regions[0],
        adam_m=regions[1],
        adam_v=regions[2],
        layout=layout,
    )


def check_finite_any(
    path: str | os.PathLike[str], layout: ParamLayout | None = None
) -> CheckpointHeader:
    """``check_checkpoint_finite`` for a full file or a chain (the state the chain restores)."""
    if not is_delta(path):
        return check_checkpoint_finite(path, layout)
    ckpt = read_any(path, layout)
    check_finite(ckpt.path, (ckpt.weights, ckpt.adam_m, ckpt.adam_v), layout=layout)
    return validate_any(path, layout)
