"""DLRM variants built from torchrec modules, consuming IKJT batches natively.

- :mod:`models.dlrm`: :class:`DLRM` (EmbeddingBagCollection + torchrec's Dense/Interaction/Over
  arches), :class:`ModelConfig`, :func:`bce_loss`;
- :mod:`models.options`: :class:`DedupMode` and :class:`SequenceConfig`, torch-free (configs);
- :mod:`models.sequence`: transformer pooling of sequence groups (EmbeddingCollection);
- :mod:`models.rm1`: configs from a catalogue (plain DLRM and the RM1-like variant);
- :mod:`models.packing`: the batch container -> one KJT whose groups hold distinct rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recd.lazy import lazy_exports

# Names load their submodule on first use (recd.lazy): the light ones (configs) without torch.
_HOME = {
    "dlrm": (
        "DLRM",
        "ModelConfig",
        "PooledSparseArch",
        "bce_loss",
    ),
    "options": (
        "DedupMode",
        "SequenceConfig",
    ),
    "packing": (
        "PackedFeatures",
        "as_sparse_features",
        "pack_features",
    ),
    "rm1": (
        "build_rm1",
        "dedup_groups",
        "dlrm_config",
        "rm1_config",
        "table_sizes",
    ),
    "sequence": (
        "SequenceArch",
        "SequenceEncoder",
    ),
}
__all__ = [
    "DLRM",
    "DedupMode",
    "ModelConfig",
    "PackedFeatures",
    "PooledSparseArch",
    "SequenceArch",
    "SequenceConfig",
    "SequenceEncoder",
    "as_sparse_features",
    "bce_loss",
    "build_rm1",
    "dedup_groups",
    "dlrm_config",
    "pack_features",
    "rm1_config",
    "table_sizes",
]

if TYPE_CHECKING:
    from recd.models.dlrm import DLRM, ModelConfig, PooledSparseArch, bce_loss
    from recd.models.options import DedupMode, SequenceConfig
    from recd.models.packing import PackedFeatures, as_sparse_features, pack_features
    from recd.models.rm1 import build_rm1, dedup_groups, dlrm_config, rm1_config, table_sizes
    from recd.models.sequence import SequenceArch, SequenceEncoder

__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
