"""Dedup analysis of a table (``recd analyze``).

RecD's analytic model per feature (S, d(f), l(f), DedupeLen, DedupeFactor), the factor measured
at the reader's own batch boundaries, and a ``dedup_sparse_features`` proposal that keeps only
groups whose dedup is expected to make the reader faster on this machine (:mod:`.costs`).
"""

from recd.analyze.costs import (
    PAY_MARGIN,
    CostModel,
    GroupCost,
    GroupShape,
    calibrate,
    machine_cost_model,
)
from recd.analyze.table import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SYNC_THRESHOLD,
    DEFAULT_THRESHOLD,
    FeatureAnalysis,
    GroupProposal,
    RejectedGroup,
    SyncPair,
    TableAnalysis,
    adjacent_unchanged,
    analyze_rows,
    analyze_table,
    dedup_group_values,
    dedup_values,
    dedupe_factor,
    dedupe_len,
    format_report,
    is_clustered,
    propose_groups,
    reader_dedup_counts,
    session_breaks,
    write_json,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_SYNC_THRESHOLD",
    "DEFAULT_THRESHOLD",
    "PAY_MARGIN",
    "CostModel",
    "FeatureAnalysis",
    "GroupCost",
    "GroupProposal",
    "GroupShape",
    "RejectedGroup",
    "SyncPair",
    "TableAnalysis",
    "adjacent_unchanged",
    "analyze_rows",
    "analyze_table",
    "calibrate",
    "dedup_group_values",
    "dedup_values",
    "dedupe_factor",
    "dedupe_len",
    "format_report",
    "is_clustered",
    "machine_cost_model",
    "propose_groups",
    "reader_dedup_counts",
    "session_breaks",
    "write_json",
]
