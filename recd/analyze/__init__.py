"""Dedup analysis of a table (``recd analyze``).

RecD's analytic model per feature (S, d(f), l(f), DedupeLen, DedupeFactor), the factor measured
at the reader's own batch boundaries (:mod:`.table`), and a ``dedup_sparse_features`` proposal
that keeps only groups whose dedup makes the training job faster on this machine: the reader's
conversion and preprocessing plus the trainer step of the job's own model, timed on the
table's own batches (:mod:`.costs`, :mod:`.trainer_cost`). :func:`analyze_for_job`
(:mod:`.job`) is what ``recd analyze`` and ``recd run`` call: a training config (or the
default one) in, the proposal priced for that job out.

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
        "PRICINGS",
        "Pricing",
    ),
    "costs": (
        "Choice",
        "ConfigTimer",
        "Cost",
        "JobTimer",
        "choose_groups",
        "hash_all_preprocessing",
        "sample_batches",
    ),
    "job": (
        "analyze_command",
        "analyze_for_job",
        "default_train_config",
        "job_for_table",
    ),
    "trainer_cost": ("TrainerStep",),
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
        "pricing_rule",
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
    "PRICINGS",
    "Choice",
    "ConfigTimer",
    "Cost",
    "DedupCounts",
    "FeatureAnalysis",
    "GroupProposal",
    "JobTimer",
    "Pricing",
    "RejectedGroup",
    "SyncPair",
    "TableAnalysis",
    "TrainerStep",
    "adjacent_unchanged",
    "analyze_command",
    "analyze_for_job",
    "analyze_rows",
    "analyze_table",
    "choose_groups",
    "dedupe_factor",
    "dedupe_len",
    "default_train_config",
    "format_report",
    "hash_all_preprocessing",
    "is_clustered",
    "job_for_table",
    "pricing_rule",
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
        Cost,
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
        PRICINGS,
        Pricing,
    )
    from recd.analyze.job import (
        analyze_command,
        analyze_for_job,
        default_train_config,
        job_for_table,
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
        pricing_rule,
        propose_groups,
        reader_dedup_counts,
        session_breaks,
        table_sparse_features,
        write_json,
    )
    from recd.analyze.trainer_cost import TrainerStep


__getattr__, __dir__ = lazy_exports(__name__, _HOME, globals())
