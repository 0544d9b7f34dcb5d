"""Per-batch reader timings, split as in the paper's Figure 10: fill, convert, process."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(slots=True)
class BatchTiming:
    """Where one batch's reader time went (wall seconds inside the reading process)."""

    rows: int
    """Rows in the batch."""
    fill_s: float
    """Read + decompress + decode + check the rows (Arrow), including the row-group reads
    that happened while this batch was being filled."""
    convert_s: float
    """Arrow rows -> tensors (dense, labels, KJT, IKJTs: hashing for the dedup)."""
    process_s: float
    """Preprocessing modules (over IKJT distinct values only), and the preprocessing of the
    dedup layout's stored ids in the row groups opened while this batch was being filled."""
    read_bytes: int
    """Compressed bytes of the row groups opened while filling this batch."""
    buffer_rows: int = 0
    """Rows its stream held in memory while filling it (the shuffle window and the row group
    kept for the next one, or the row groups the batch spans)."""


@dataclass(slots=True)
class ReaderStats:
    """Totals over the batches a reader handed out; read by benchmarks and progress logs."""

    batches: int = 0
    rows: int = 0
    fill_s: float = 0.0
    convert_s: float = 0.0
    process_s: float = 0.0
    read_bytes: int = 0
    peak_buffer_rows: int = 0
    """The most rows one stream held in memory for a batch."""

    def add(self, timing: BatchTiming) -> None:
        self.batches += 1
        self.rows += timing.rows
        self.fill_s += timing.fill_s
        self.convert_s += timing.convert_s
        self.process_s += timing.process_s
        self.read_bytes += timing.read_bytes
        self.peak_buffer_rows = max(self.peak_buffer_rows, timing.buffer_rows)

    @property
    def total_s(self) -> float:
        return self.fill_s + self.convert_s + self.process_s

    def to_dict(self) -> dict[str, Any]:
        """Totals, plus per-sample bytes and the fill/convert/process shares of the time."""
        out: dict[str, Any] = asdict(self)
        total = self.total_s
        out["total_s"] = total
        out["read_bytes_per_sample"] = self.read_bytes / self.rows if self.rows else 0.0
        for part in ("fill", "convert", "process"):
            out[f"{part}_share"] = getattr(self, f"{part}_s") / total if total else 0.0
        return out
