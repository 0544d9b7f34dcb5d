"""2 ranks x 2 DataLoader worker processes read every row of the table exactly once per epoch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.reader import ReaderConfig, make_loader
from recd.schema import Catalogue, SparseFeature


def write_table(root: Path, *, partitions: int, files: int, rows_per_file: int) -> int:
    """A Hive table whose rows carry their global row number in ``row_id``; returns rows."""
    catalogue = Catalogue(
        name="workers",
        sparse=[SparseFeature(name="history"), SparseFeature(name="row_id")],
    )
    schema = catalogue.arrow_schema()
    row = 0
    for p in range(partitions):
        directory = root / "ds=2026-11-01" / f"hour={p:02d}"
        directory.mkdir(parents=True)
        for f in range(files):
            r = np.arange(row, row + rows_per_file)
            session = r // 5
            offsets = np.arange(rows_per_file + 1) * 2
            history = pa.ListArray.from_arrays(
                offsets, np.repeat(session, 2) + np.tile([0, 1], rows_per_file)
            )
            table = pa.table(
                {
                    "session_id": session,
                    "request_id": r,
                    "ts": r,
                    "label": np.zeros(rows_per_file, np.float32),
                    "history": history,
                    "row_id": pa.ListArray.from_arrays(np.arange(rows_per_file + 1), r),
                },
                schema=schema,
            )
            pq.write_table(
                table, directory / f"part-{f:04d}.parquet", row_group_size=13, compression="zstd"
            )
            row += rows_per_file
        (directory / "_SUCCESS").touch()
    uncommitted = root / "ds=2026-11-01" / f"hour={partitions:02d}"  # being written: ignored
    uncommitted.mkdir()
    pq.write_table(table, uncommitted / "part-0000.parquet")
    return row


@pytest.mark.parametrize("shuffle", ["file", "session"])
def test_two_ranks_two_workers_read_every_row_once_per_epoch(tmp_path: Path, shuffle: str) -> None:
    rows = write_table(tmp_path, partitions=2, files=2, rows_per_file=50)
    seen: dict[int, list[np.ndarray]] = {0: [], 1: []}
    for rank in range(2):
        cfg = ReaderConfig(
            table=str(tmp_path),
            batch_size=8,
            num_workers=2,
            rank=rank,
            world_size=2,
            num_epochs=2,
            shuffle=shuffle,
            seed=3,
            dedup_sparse_features=[["history"]],
        )
        loader = make_loader(cfg)
        per_epoch = [sum(loader.epoch_totals(e)) for e in range(2)]
        assert per_epoch == [loader.plan.rank_num_batches(e, rank) for e in range(2)]
        batches = list(loader)
        assert len(batches) == sum(per_epoch)
        for epoch, chunk in enumerate((batches[: per_epoch[0]], batches[per_epoch[0] :])):
            ids = [b.sparse.to_kjt()["row_id"].values().numpy() for b in chunk]
            seen[epoch].append(np.concatenate(ids))
    for epoch in range(2):
        both = np.concatenate(seen[epoch])
        assert np.array_equal(np.sort(both), np.arange(rows)), f"epoch {epoch}"
        assert len(np.intersect1d(seen[epoch][0], seen[epoch][1])) == 0  # ranks are disjoint
    # The shuffle changes the order between epochs.
    assert not np.array_equal(seen[0][0], seen[1][0])
