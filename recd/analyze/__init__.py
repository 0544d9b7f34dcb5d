"""Dedup analysis of a table (``recd analyze``).

RecD's analytic model per feature (S, d(f), l(f), DedupeLen, DedupeFactor), the factor measured
at the reader's own batch boundaries, and a ``dedup_sparse_features`` proposal that keeps only
groups whose dedup makes the reader faster on this machine, timed on the table's own batches
(:mod:`.costs`).
"""

from recd.analyze.costs import (
    PAY_MARGIN,
    Choice,
    ConfigTimer,
    JobTimer,
    choose_groups,
    hash_all_preprocessing,
    sample_batches,
)
from recd.analyze.table import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_SYNC_THRESHOLD,
    DEFAULT_THRESHOLD,
    DedupCounts,
    FeatureAnalysis,
    GroupProposal,
    RejectedGroup,
    SyncPair,
    TableAnalysis,
    adjacent_unchanged,
    analyze_rows,
    analyze_table,
    dedupe_factor,
    dedupe_len,
    format_report,
    is_clustered,
    propose_groups,
    reader_dedup_counts,
    session_breaks,
    table_sparse_features,
    write_json,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_SYNC_THRESHOLD",
    "DEFAULT_THRESHOLD",
    "PAY_MARGIN",
    "Choice",
    "ConfigTimer",
    "DedupCounts",
    "FeatureAnalysis",
    "GroupProposal",
    "JobTimer",
    "RejectedGroup",
    "SyncPair",
    "TableAnalysis",
    "adjacent_unchanged",
    "analyze_rows",
    "analyze_table",
    "choose_groups",
    "dedupe_factor",
    "dedupe_len",
    "format_report",
    "hash_all_preprocessing",
    "is_clustered",
    "propose_groups",
    "reader_dedup_counts",
    "sample_batches",
    "session_breaks",
    "table_sparse_features",
    "write_json",
]
