"""recd: a RecD-style data pipeline and trainer for deep learning recommendation models.

The package follows the pipeline: ``logs`` (generate, ingest, shard: O1) -> ``etl`` (cluster
by session into zstd Parquet: O2) -> readers and IKJTs (O3, O4) -> trainer (O5-O7) ->
checkpoints and recovery.
"""

__version__ = "0.1.0"
