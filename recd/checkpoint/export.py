"""A checkpoint's tensors in the formats other tools load: a torch ``state_dict`` file
(``torch.save``) or a safetensors file.

The flat ``step_NNNNNN.bin`` holds the logical model's weights, Adam m and Adam v in one
parameter order; its :class:`recd.checkpoint.format.ParamLayout` (``_layout.json`` beside it)
names and shapes each tensor. The export is the weights under those names, which are the
unsharded model's parameter names, so ``model.load_state_dict(torch.load(path))`` works on a
model built from the same config. With ``with_optimizer`` the Adam moments come along as
``adam_m.<name>`` / ``adam_v.<name>`` (safetensors: flat keys; torch: a dict with ``model``,
``adam_m``, ``adam_v`` and ``step``). The step is in the safetensors metadata.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from recd.checkpoint.chain import is_delta, read_any
from recd.checkpoint.checksum import verify_checksum
from recd.checkpoint.format import ParamLayout
from recd.durable import replacing
from recd.errors import ConfigError

__all__ = ["EXPORT_FORMATS", "ExportReport", "export_checkpoint"]

ExportFormat = Literal["state_dict", "safetensors"]
EXPORT_FORMATS: tuple[ExportFormat, ...] = ("state_dict", "safetensors")


@dataclass(kw_only=True, slots=True)
class ExportReport:
    out: Path
    step: int
    tensors: int
    bytes: int


def _named(region: np.ndarray, layout: ParamLayout) -> dict[str, torch.Tensor]:
    out = {}
    for spec, offset in zip(layout.specs, layout.offsets, strict=True):
        values = np.array(region[offset : offset + spec.numel], dtype=np.float32)  # owns memory
        out[spec.name] = torch.from_numpy(values.reshape(spec.shape))
    return out


def export_checkpoint(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    layout: ParamLayout,
    *,
    fmt: ExportFormat = "state_dict",
    with_optimizer: bool = False,
    overwrite: bool = False,
) -> ExportReport:
    """Write ``path``'s tensors (named by ``layout``) to ``out`` in ``fmt``, atomically.

    The checkpoint's bytes are checked against its checksum first (``CheckpointChecksumError``
    when they differ; a checkpoint without one, from an older recd, is exported unverified).
    A delta (``step_NNNNNN.delta``) exports the state its chain restores, every link checked
    (each delta's CRC, the base's sidecar; ``CheckpointCorruptError`` naming a torn, missing
    or damaged one).
    """
    if fmt not in EXPORT_FORMATS:
        raise ConfigError(f"export format {fmt!r}: expected one of {', '.join(EXPORT_FORMATS)}")
    out = Path(out)
    if out.exists() and not overwrite:
        raise ConfigError(f"{out}: already exists; pass --overwrite to replace it")
    ckpt = read_any(path, layout, verify=True)  # checks n_params against the layout
    if not is_delta(path):
        verify_checksum(path)  # a chain's links were checked by read_any
    weights = _named(ckpt.weights, layout)
    moments = (
        {"adam_m": _named(ckpt.adam_m, layout), "adam_v": _named(ckpt.adam_v, layout)}
        if with_optimizer
        else {}
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as tmp:
        if fmt == "safetensors":
            from safetensors.torch import save_file

            flat = dict(weights)
            for region, named in moments.items():
                flat.update({f"{region}.{name}": t for name, t in named.items()})
            # safetensors creates its file with mode 0600; give it the mode any new file gets
            # (0666 less the umask, as torch.save's .pt has): create the temp file first
            tmp.unlink(missing_ok=True)
            tmp.touch()
            mode = stat.S_IMODE(tmp.stat().st_mode)
            save_file(flat, str(tmp), metadata={"step": str(ckpt.step), "source": "recd"})
            os.chmod(tmp, mode)
        elif with_optimizer:
            torch.save({"model": weights, **moments, "step": ckpt.step}, tmp)
        else:
            torch.save(weights, tmp)
    tensors = len(weights) * (3 if with_optimizer else 1)
    return ExportReport(out=out, step=ckpt.step, tensors=tensors, bytes=out.stat().st_size)
