"""DLRM variants built from torchrec modules, consuming IKJT batches natively.

- :mod:`models.dlrm`: :class:`DLRM` (EmbeddingBagCollection + torchrec's Dense/Interaction/Over
  arches), :class:`ModelConfig`, :class:`DedupMode`, :func:`bce_loss`;
- :mod:`models.sequence`: transformer pooling of sequence groups (EmbeddingCollection);
- :mod:`models.rm1`: configs from a catalogue (plain DLRM and the RM1-like variant);
- :mod:`models.packing`: the batch container -> one KJT whose groups hold distinct rows.
"""

from recd.models.dlrm import DLRM, DedupMode, ModelConfig, PooledSparseArch, bce_loss
from recd.models.packing import PackedFeatures, as_sparse_features, pack_features
from recd.models.rm1 import build_rm1, dedup_groups, dlrm_config, rm1_config, table_sizes
from recd.models.sequence import SequenceArch, SequenceConfig, SequenceEncoder

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
