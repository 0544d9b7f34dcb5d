"""Dedup analysis of a table (``recd analyze``).

RecD's analytic model per feature (S, d(f), l(f), DedupeLen, DedupeFactor), the factor measured
at the reader's own batch boundaries, and a ``dedup_sparse_features`` proposal that keeps only
groups whose dedup makes the reader faster on this machine, timed on the table's own batches
(:mod:`.costs`).

The names below load their submodule on first use (PEP 562): the cost model needs torch and
torchrec, and ``recd --help`` or ``from recd.analyze.defaults import ...`` should not pay for
them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recd.lazy import lazy_exports

_HOME = {
    "defaults": (
        "DEFAULT_BATCH_SIZE",
        "DEFAULT_SYNC_THRESHOLD",
        "DEFAULT_THRESHOLD",
        "PAY_MARGIN",
    ),
    "costs": (
        "Choice",
        "ConfigTimer",
        "JobTimer",
        "choose_groups",
        "hash_all_preprocessing",
        "sample_batches",
    ),
    "table": (
        "DedupCounts",
        "FeatureAnalysis",
        "GroupProposal",
        "RejectedGroup",
        "SyncPair",
        "TableAnalysis",
        "adjacent_unchanged",
        "analyze_rows",
        "analyze_table",
        "dedupe_factor",
        "dedupe_len",
        "format_report",
        "is_clustered",
        "propose_groups",
        "reader_dedup_counts",
        "session_breaks",
        "table_sparse_features",
        "write_json",
    ),
}
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

if TYPE_CHECKING:
    from recd.analyze.costs import (
        Choice,
        ConfigTimer,
        JobTimer,
        choose_groups,
        hash_all_preprocessing,
        sample_batches,
    )
    from recd.analyze.defaults import (
        DEFAULT_BATCH_SIZE,
        DEFAULT_SYNC_THRESHOLD,
        DEFAULT_THRESHOLD,
        PAY_MARGIN,
    )
    from recd.analyze.table import (
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


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
