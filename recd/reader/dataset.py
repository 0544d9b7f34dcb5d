"""The reader as torch sees it: an IterableDataset of batches and a resumable loader around it.

Each reading process (a DataLoader worker, or the main process when ``num_workers == 0``)
reads its share of the rank's streams (``ReaderConfig.worker_streams``) with
``recd.reader.stream.iter_stream_batches``, converts each batch to tensors
(``recd.reader.transform``) and yields it tagged with ``(epoch, stream, seq)``, ``seq``
counting that stream's batches in the epoch; a process reading several streams yields their
batches in the rank's order.

Order. ``ResumableLoader`` hands batches out in one order per epoch, the rank's order of
``recd.reader.order``: by ``(seq, stream)``, i.e. round-robin over the streams (skipping
streams that have run out). It depends on the seed and ``streams``, not on ``num_workers`` or
the engine: worker ``w`` of ``W`` reads streams ``w, w + W, ...``, so torch's DataLoader,
which takes one batch from each worker in turn, delivers them in that order, and a small
reorder buffer absorbs the rest (streams of different lengths, Ray chunks, a resumed run's
first round). ``iter_batches`` (single process, for tools and benchmarks) yields the same
sequence.

Resume. The position is ``(epoch, batches handed out)``, from which the batches taken from
each stream follow; a batch counts as consumed when the loader hands it to the caller
(prefetched batches do not). ``load_state_dict`` (with any worker count) makes the next
``__iter__`` start every stream at its own next batch: the stream maps that batch's first row
to (unit, offset), or to its shuffle window, with the Parquet footer row counts and reads
nothing before it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from recd.errors import ConfigError, RecdError
from recd.reader.config import ReaderConfig
from recd.reader.memory import worker_init
from recd.reader.order import canonical_counts, next_stream
from recd.reader.plan import ReadPlan, build_plan
from recd.reader.stats import ReaderStats
from recd.reader.tagged import TaggedBatch, WorkerFailure, iter_tagged_batches
from recd.reader.transform import BatchTransform
from recd.tensors.batch import Batch

STATE_VERSION = 2


def iter_streams(
    plan: ReadPlan,
    transform: BatchTransform,
    *,
    epoch: int,
    streams: list[int],
    start_batches: list[int],
) -> Iterator[TaggedBatch]:
    """The batches of ``streams`` (of this rank) in ``epoch`` in the rank's order, stream ``s``
    from batch ``start_batches[s]`` on (``start_batches`` has one entry per stream of the
    rank)."""
    totals = [plan.stream_num_batches(epoch, s) for s in range(plan.config.streams)]
    counts = list(start_batches)
    its = {
        s: iter_tagged_batches(plan, transform, epoch=epoch, stream=s, start_batch=counts[s])
        for s in streams
    }
    while (s := next_stream(totals, counts, streams)) is not None:
        counts[s] += 1
        yield next(its[s])


class ReaderDataset(IterableDataset):
    """Batches of one epoch of one rank; each DataLoader worker reads its own streams.

    ``start_batches[s]`` is the first batch stream ``s`` yields (resume position).
    ``transform`` (built once, in the main process: compiling TorchScript takes seconds) is
    inherited by forked workers or re-created from its serialised modules otherwise.
    """

    def __init__(
        self,
        plan: ReadPlan,
        *,
        epoch: int,
        start_batches: list[int] | None = None,
        transform: BatchTransform | None = None,
    ):
        super().__init__()
        self.plan = plan
        self.transform = transform if transform is not None else BatchTransform(plan)
        self.epoch = epoch
        n = plan.config.streams
        self.start_batches = list(start_batches) if start_batches is not None else [0] * n
        if len(self.start_batches) != n:
            raise ConfigError(f"reader: {len(self.start_batches)} start positions for {n} streams")

    def __iter__(self) -> Iterator[TaggedBatch | WorkerFailure]:
        info = get_worker_info()
        worker = 0 if info is None else info.id
        expected = self.plan.config.num_workers
        if info is not None and info.num_workers != expected:
            raise ConfigError(
                f"reader.num_workers is {expected} but the DataLoader has {info.num_workers} "
                "workers: build the loader with make_loader()"
            )
        try:
            yield from iter_streams(
                self.plan,
                self.transform,
                epoch=self.epoch,
                streams=self.plan.config.worker_streams(worker),
                start_batches=self.start_batches,
            )
        except RecdError as exc:
            if info is None:
                raise
            yield WorkerFailure.capture(worker, exc)


class ResumableLoader:
    """Iterates the batches of every remaining epoch of one rank, resumable exactly.

    ``for batch in loader`` yields ``Batch`` objects (a finished loader starts over, see
    ``__iter__``); ``state_dict()`` at any point records
    the position after the last batch handed out, and a new loader given that state via
    ``load_state_dict()`` continues with exactly the next batch (same tensors).
    """

    def __init__(self, config: ReaderConfig, *, plan: ReadPlan | None = None) -> None:
        self.config = config
        self.plan = plan if plan is not None else build_plan(config)
        self.transform = BatchTransform(self.plan)
        """Conversion + compiled preprocessing, shared by every epoch's workers."""
        self.stats = ReaderStats()
        """Timings and bytes of the batches handed out by this loader."""
        self.epoch = 0
        """Current epoch (``num_epochs`` once everything has been read)."""
        self._counts = [0] * config.streams
        """Batches handed out from each stream in the current epoch."""
        self._ray_stream: Iterator[TaggedBatch | WorkerFailure] | None = None

    def epoch_totals(self, epoch: int) -> list[int]:
        """Batches each stream of this rank yields in ``epoch``."""
        return [self.plan.stream_num_batches(epoch, s) for s in range(self.config.streams)]

    @property
    def batches_left(self) -> int:
        """Batches left to hand out before the last epoch ends (0 once finished)."""
        if self.epoch >= self.config.num_epochs:
            return 0
        left = sum(self.epoch_totals(self.epoch)) - sum(self._counts)
        return left + sum(
            sum(self.epoch_totals(e)) for e in range(self.epoch + 1, self.config.num_epochs)
        )

    @property
    def position(self) -> int:
        """Batches handed out since the start of epoch 0 (every epoch counted)."""
        done = sum(
            sum(self.epoch_totals(e)) for e in range(min(self.epoch, self.config.num_epochs))
        )
        return done + (sum(self._counts) if self.epoch < self.config.num_epochs else 0)

    def seek(self, position: int) -> None:
        """Move to :attr:`position` ``position`` without reading anything: the next batch is
        the one a loader that handed out ``position`` batches would hand out next (a rank
        rejoining a job at another rank's step; no iterator may be open)."""
        if position < 0:
            raise ConfigError(f"reader: position {position} is negative")
        epoch, left = 0, position
        while epoch < self.config.num_epochs and left >= (total := sum(self.epoch_totals(epoch))):
            if left == total and epoch == self.config.num_epochs - 1:
                break
            left -= total
            epoch += 1
        if epoch >= self.config.num_epochs and left:
            raise ConfigError(f"reader: position {position} is past the last epoch")
        self.epoch = epoch
        self._counts = canonical_counts(self.epoch_totals(epoch), left)

    def __len__(self) -> int:
        """Batches the next ``for`` yields: :attr:`batches_left`, or every epoch's once the
        loader has finished (it starts over)."""
        if self.epoch >= self.config.num_epochs:
            return sum(sum(self.epoch_totals(e)) for e in range(self.config.num_epochs))
        return self.batches_left

    def __iter__(self) -> Iterator[Batch]:
        """The batches from the current position to the end of the last epoch. A loader that
        has handed out everything starts again at epoch 0 (so ``for`` works on it again, like
        a DataLoader); one stopped midway (``break``) continues where it stopped."""
        if self.epoch >= self.config.num_epochs:
            self.epoch = 0
            self._counts = [0] * self.config.streams
        self._ray_stream = None  # engine "ray": started from this position when first needed
        try:
            while self.epoch < self.config.num_epochs:
                yield from self._iter_epoch()
                self.epoch += 1
                self._counts = [0] * self.config.streams
        finally:  # finished, or closed / dropped midway: stop the Ray execution now
            stream, self._ray_stream = self._ray_stream, None
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    def _iter_epoch(self) -> Iterator[Batch]:
        totals = self.epoch_totals(self.epoch)
        if next_stream(totals, self._counts) is None:
            return
        dataset = ReaderDataset(
            self.plan, epoch=self.epoch, start_batches=self._counts, transform=self.transform
        )
        buffer: dict[tuple[int, int], TaggedBatch] = {}
        for item in self._source(dataset):
            if isinstance(item, WorkerFailure):
                raise item.rebuild()
            buffer[(item.stream, item.seq)] = item
            while (s := next_stream(totals, self._counts)) is not None:
                ready = buffer.pop((s, self._counts[s]), None)
                if ready is None:
                    break
                self._counts[s] += 1
                self.stats.add(ready.timing)
                yield ready.batch

    def _source(self, dataset: ReaderDataset) -> Iterator[TaggedBatch | WorkerFailure]:
        cfg = self.config
        if cfg.engine == "ray":
            if self._ray_stream is None:  # one Ray Data execution for every epoch left
                from recd.reader.ray_tier import iter_ray_batches

                epochs = [(dataset.epoch, self.epoch_totals(dataset.epoch), dataset.start_batches)]
                epochs += [
                    (e, self.epoch_totals(e), [0] * cfg.streams)
                    for e in range(dataset.epoch + 1, cfg.num_epochs)
                ]
                self._ray_stream = iter_ray_batches(self.plan, epochs)
            left = sum(self.epoch_totals(dataset.epoch)) - sum(dataset.start_batches)
            return itertools.islice(self._ray_stream, left)
        if cfg.num_workers == 0:
            return iter(dataset)
        loader = DataLoader(
            dataset,
            batch_size=None,
            num_workers=cfg.num_workers,
            prefetch_factor=cfg.prefetch_factor,
            collate_fn=_identity,
            pin_memory=cfg.pin_memory,
            persistent_workers=False,
            worker_init_fn=worker_init,  # reader processes keep freed memory (memory.py)
        )
        return iter(loader)

    def state_dict(self) -> dict[str, Any]:
        """The exact position: epoch and batches handed out (per stream too), plus
        fingerprints. It holds nothing of the reading processes: any worker count resumes it."""
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "batches_per_stream": list(self._counts),
            "batches_in_epoch": sum(self._counts),
            "config_fingerprint": self.config.fingerprint(),
            "plan_fingerprint": self.plan.fingerprint(),
            "position_fields": self.config.position_fields(),
            "snapshot": self.plan.config.snapshot,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict()`` of a loader with the same config).

        Raises ConfigError naming the differing config field, or saying that the table's
        units changed, when the state was recorded for another reader.
        """
        if state.get("version") == 1:
            raise ConfigError(
                "reader state: saved by an older recd whose batch order depended on "
                "reader.num_workers; this version cannot continue it exactly (resume with the "
                "recd that wrote it, or start the run again)"
            )
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"reader state: version {state.get('version')!r} is not supported")
        if state["config_fingerprint"] != self.config.fingerprint():
            saved = state.get("position_fields", {})
            now = self.config.position_fields()
            diff = [k for k in now if saved.get(k) != now[k]]
            detail = ", ".join(f"reader.{k}: saved {saved.get(k)!r}, now {now[k]!r}" for k in diff)
            raise ConfigError(f"reader state was saved with another config ({detail})")
        saved_snapshot = state.get("snapshot")
        if saved_snapshot is not None and saved_snapshot != self.plan.config.snapshot:
            raise ConfigError(
                f"reader state: saved while reading snapshot {saved_snapshot} of "
                f"{self.config.table}, but this reader reads snapshot "
                f"{self.plan.config.snapshot} (set reader.snapshot = {saved_snapshot})"
            )
        if state["plan_fingerprint"] != self.plan.fingerprint():
            raise ConfigError(
                f"reader state: the units of {self.config.table} changed since the state was "
                "saved (partitions or files added, removed or rewritten)"
            )
        epoch = int(state["epoch"])
        counts = [int(c) for c in state["batches_per_stream"]]
        if epoch < self.config.num_epochs:
            expected = canonical_counts(self.epoch_totals(epoch), sum(counts))
            if counts != expected:
                raise ConfigError(
                    f"reader state: batches per stream {counts} is not a position of the "
                    f"rank's order (expected {expected} after {sum(counts)} batches)"
                )
        self.epoch = epoch
        self._counts = counts


def _identity(item: Any) -> Any:
    return item


def make_loader(config: ReaderConfig) -> ResumableLoader:
    """The resumable loader of ``config`` (builds and validates the read plan)."""
    return ResumableLoader(config)


def iter_batches(config: ReaderConfig, *, stats: ReaderStats | None = None) -> Iterator[Batch]:
    """All batches of ``config`` read in this process, in the loader's order.

    For tools and benchmarks; ``stats`` (if given) accumulates the per-batch timings.
    """
    plan = build_plan(config)
    transform = BatchTransform(plan)
    streams = list(range(config.streams))
    for epoch in range(config.num_epochs):
        for item in iter_streams(
            plan, transform, epoch=epoch, streams=streams, start_batches=[0] * len(streams)
        ):
            if stats is not None:
                stats.add(item.timing)
            yield item.batch
