"""The tensor stage: rows of a table -> torchrec tensors.

- ``jagged``: jagged-tensor helpers (lengths, offsets, index_select on jagged rows);
- ``ikjt``: the InverseKeyedJaggedTensor (distinct rows + inverse indices of a dedup group);
- ``convert``: Arrow record batches -> KJT / IKJTs (hashing rows to find duplicates, or
  straight from the dedup table layout);
- ``preprocess``: TorchScript preprocessing modules that run on distinct values;
- ``batch``: the ``Batch`` a reader yields (dense, labels, sparse features).

The readers (``recd.reader``) build these; the models (``recd.models``) consume them.
"""
