"""The read plan: which (file, row group) units a reader reads, in which order, on which worker.

Built once in the main process (``build_plan``) from the Parquet footers of the committed
partitions, validated against the config, then pickled to the DataLoader workers.

* **Units.** One unit per non-empty (file, row group), listed in table order: partitions by
  (ds, hour), files by name, row groups by index. Only committed files count: those of one
  Iceberg snapshot (``config.snapshot``, or the current one, which the plan's config records),
  or of a Hive-layout table's partitions holding ``_SUCCESS`` (recd.table.snapshot).
* **Order per epoch.** ``recd.reader.order``: the units are ordered per ``shuffle`` with a
  generator seeded by ``(seed, epoch)``, dealt round-robin over the job's ``world_size x
  streams`` streams, and (``rows``, ``session``) permuted inside windows of rows. Every unit,
  hence every row, is read exactly once per epoch. Streams may get a different number of rows
  (at most one unit apart per round).
* **Batches.** A stream's rows are cut into batches of ``batch_size`` rows (batches span
  row-group boundaries); its last partial batch is kept unless ``drop_last``. Batch k of a
  stream therefore starts at row ``k * batch_size`` of its stream, which ``locate`` maps back
  to (unit, offset) from the footer row counts: resuming skips to a position (to its window,
  for the windowed shuffles) without reading the data before it.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from recd.errors import ConfigError, SchemaError
from recd.reader.config import SPARSE_PREPROCESS_KINDS, ReaderConfig, Shuffle
from recd.reader.infer import infer_catalogue, with_history_features
from recd.reader.order import order_units
from recd.schema import (
    CATALOGUE_METADATA_KEY,
    Catalogue,
    catalogue_from_schema,
    nullable_type,
)
from recd.table.layout import PLAIN, Layout, layout_of
from recd.table.snapshot import committed_files
from recd.tensors.stacked import STACKED_COLUMNS


@dataclass(frozen=True, slots=True)
class WorkUnit:
    """One row group of one Parquet file: the indivisible unit of work of a reader."""

    index: int
    """Position in table order."""
    path: str
    """Parquet file."""
    row_group: int
    """Row-group index inside the file."""
    num_rows: int
    """Rows in the row group (from the footer)."""
    first_row: int
    """Row number, inside the file, of the row group's first row (for error messages)."""
    read_bytes: int
    """Compressed bytes of the projected column chunks: what reading the unit costs."""
    encoded: tuple[str, ...] = ()
    """Sparse features read that the file stores in the dedup layout (``recd.table.layout``)."""
    groups: tuple[tuple[str, ...], ...] = ()
    """The file's groups (whole) holding some of ``encoded`` (``recd.table.layout.Layout.groups``)."""

    @property
    def layout(self) -> Layout:
        """The unit's layout, for the features read."""
        return Layout("dedup", self.encoded, self.groups) if self.encoded else PLAIN


@dataclass(frozen=True, slots=True)
class Position:
    """Where a worker's stream starts: unit ``unit`` of its list, row ``offset`` inside it."""

    unit: int
    offset: int


@dataclass(kw_only=True, slots=True)
class ReadPlan:
    """Validated units and resolved columns of one reader config."""

    config: ReaderConfig
    """The config the plan was built from, with ``snapshot`` set to the Iceberg snapshot read
    (None for a Hive-layout table)."""
    catalogue: Catalogue | None
    """The table's catalogue (from the Parquet schema metadata), or, for a table without one,
    the catalogue of the listed features measured on its files (``recd.reader.infer``)."""
    catalogue_inferred: bool = False
    """Whether ``catalogue`` was measured rather than read from the table."""
    labels: list[str]
    """Label columns, in batch order."""
    dense: list[str]
    """Dense feature columns, in batch order."""
    sparse: list[str]
    """Sparse feature columns, in batch order."""
    columns: list[str]
    """Columns read from each row group (projection)."""
    column_types: dict[str, pa.DataType]
    """Arrow type of every projected column (identical in every file)."""
    units: list[WorkUnit]
    """All units, in table order."""
    encoded: list[str] = dataclasses.field(default_factory=list)
    """Sparse features some file stores in the dedup layout: every unit, plain units
    included, reads them stacked (``recd.tensors.stacked``), preprocessed on their stored ids;
    batches carry the members of hash-free groups stacked (``stacked``), the rest plain."""

    @property
    def stacked(self) -> list[str]:
        """The encoded features batches carry stacked: the members of the dedup groups whose
        features are all encoded (their IKJTs come from the positions, without hashing). The
        other encoded features are gathered to plain rows once per unit
        (``recd.tensors.stacked.expand_stacked``)."""
        encoded = set(self.encoded)
        members = {f for g in self.config.dedup_sparse_features if encoded.issuperset(g) for f in g}
        return [f for f in self.encoded if f in members]

    @property
    def session_column(self) -> str | None:
        """The column of the session ids the ``session`` shuffle reads (``reader.
        session_column``); None for the other shuffles."""
        return self.config.session_column if self.config.shuffle == Shuffle.SESSION else None

    @property
    def batch_columns(self) -> list[str]:
        """The columns of a batch's rows: the features (``columns`` less a session column read
        for the shuffle alone) less the stacked ones, then the stacked columns holding those."""
        features = {*self.labels, *self.dense, *self.sparse}
        stacked = set(self.stacked)
        out = [c for c in self.columns if c in features and c not in stacked]
        return out + list(STACKED_COLUMNS) if stacked else out

    @property
    def num_rows(self) -> int:
        """Rows of one epoch over all ranks."""
        return sum(u.num_rows for u in self.units)

    def fingerprint(self) -> str:
        """Hash of the units (file, row group, rows): a saved position is only valid for it."""
        root = Path(self.config.table)
        h = hashlib.sha256()
        for u in self.units:
            rel = Path(u.path).relative_to(root) if Path(u.path).is_relative_to(root) else u.path
            h.update(f"{rel}:{u.row_group}:{u.num_rows};".encode())
        return h.hexdigest()[:16]

    def epoch_units(self, epoch: int) -> list[WorkUnit]:
        """All units of ``epoch`` in reading order (the shuffle for ``(seed, epoch)``)."""
        return order_units(self.units, self.config.shuffle, seed=self.config.seed, epoch=epoch)

    def stream_units(self, epoch: int, stream: int) -> list[WorkUnit]:
        """Units of this rank's stream ``stream`` in ``epoch`` (round-robin split)."""
        g = self.config.global_stream_id(stream)
        return self.epoch_units(epoch)[g :: self.config.num_global_streams]

    def stream_num_batches(self, epoch: int, stream: int) -> int:
        """Batches this rank's stream ``stream`` yields in ``epoch``."""
        return self._global_stream_batches(epoch, self.config.global_stream_id(stream))

    def rank_num_batches(self, epoch: int, rank: int) -> int:
        """Batches rank ``rank`` (any rank, not only this one) yields in ``epoch``.

        Computed from the footers, without communication: a DDP trainer can stop every rank
        after ``min(rank_num_batches(e, r) for r in range(world_size))`` steps.
        """
        n = self.config.streams
        return sum(self._global_stream_batches(epoch, rank * n + s) for s in range(n))

    def _global_stream_batches(self, epoch: int, g: int) -> int:
        units = self.epoch_units(epoch)[g :: self.config.num_global_streams]
        rows = sum(u.num_rows for u in units)
        return num_batches(rows, self.config.batch_size, drop_last=self.config.drop_last)


def num_batches(rows: int, batch_size: int, *, drop_last: bool) -> int:
    """Batches cut from ``rows`` consecutive rows."""
    return rows // batch_size if drop_last else -(-rows // batch_size)


def locate(units: list[WorkUnit], row: int) -> Position:
    """The (unit, offset) of row ``row`` of the stream formed by ``units``; past the end it is
    ``Position(len(units), 0)``."""
    ends = np.cumsum([u.num_rows for u in units], dtype=np.int64)
    unit = int(np.searchsorted(ends, row, side="right"))
    if unit >= len(units):
        return Position(len(units), 0)
    start = int(ends[unit - 1]) if unit > 0 else 0
    return Position(unit, row - start)


def build_plan(config: ReaderConfig) -> ReadPlan:
    """List and validate the units of ``config``'s table (reads every file's footer once).

    Raises SchemaError naming the file and column when a needed column is missing or has an
    unusable type, or when a column's type differs between two files (naming both).
    """
    table = Path(config.table)
    if not table.is_dir():
        raise ConfigError(f"reader.table: {table} is not a directory")
    committed = committed_files(
        table, snapshot_id=config.snapshot, start_ms=config.start_ms, end_ms=config.end_ms
    )
    files = committed.files
    if not files:
        window = f"[{config.start or '-inf'}, {config.end or '+inf'})"
        raise ConfigError(
            f"reader.table: {table} has no committed partition with data files in {window}"
        )
    metas = [_read_footer(path) for path in files]
    first_schema = metas[0].schema.to_arrow_schema()
    catalogue = _catalogue_or_none(first_schema, source=str(files[0]))
    labels, dense, sparse = _resolve_features(config, catalogue, source=str(files[0]))
    inferred = catalogue is None
    columns = [*labels, *dense, *sparse]
    session = config.session_column if config.shuffle == Shuffle.SESSION else None
    if session is not None and session not in columns:
        columns.append(session)  # read for the shuffle alone (a feature too: read once)
    _check_preprocessing(config, dense=dense, sparse=sparse)
    layouts = [
        layout_of(meta.schema.to_arrow_schema(), source=str(path))
        for path, meta in zip(files, metas, strict=True)
    ]
    column_types = _check_schemas(
        files, metas, layouts, columns, features={*labels, *dense, *sparse}, sparse=sparse,
        session=session,
    )  # fmt: skip
    if catalogue is not None:
        catalogue = with_history_features(catalogue, config.history_features, sparse)
    else:
        catalogue = infer_catalogue(
            files,
            metas,
            labels=labels,
            dense=dense,
            sparse=sparse,
            history=config.history_features,
        )
    units: list[WorkUnit] = []
    for path, meta, layout in zip(files, metas, layouts, strict=True):
        read = layout.restricted(sparse)
        physical = set(layout.physical_columns(columns))
        first_row = 0
        for rg in range(meta.num_row_groups):
            group = meta.row_group(rg)
            if group.num_rows > 0:
                units.append(
                    WorkUnit(
                        index=len(units),
                        path=str(path),
                        row_group=rg,
                        num_rows=group.num_rows,
                        first_row=first_row,
                        read_bytes=_projected_bytes(group, physical),
                        encoded=read.encoded,
                        groups=read.groups,
                    )
                )
            first_row += group.num_rows
    return ReadPlan(
        config=dataclasses.replace(config, snapshot=committed.snapshot_id),
        catalogue=catalogue,
        catalogue_inferred=inferred,
        labels=labels,
        dense=dense,
        sparse=sparse,
        columns=columns,
        column_types=column_types,
        units=units,
        encoded=[f for f in sparse if any(f in u.encoded for u in units)],
    )


def _read_footer(path: Path) -> pq.FileMetaData:
    try:
        return pq.read_metadata(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise SchemaError(f"{path}: not a readable Parquet file: {exc}") from exc


def _catalogue_or_none(schema: pa.Schema, *, source: str) -> Catalogue | None:
    if not schema.metadata or CATALOGUE_METADATA_KEY not in schema.metadata:
        return None
    return catalogue_from_schema(schema, source=source)


def _resolve_features(
    config: ReaderConfig, catalogue: Catalogue | None, *, source: str
) -> tuple[list[str], list[str], list[str]]:
    missing = [n for n in ("labels", "dense", "sparse") if getattr(config, n) is None]
    if catalogue is None and missing:
        raise SchemaError(
            f"{source}: no recd catalogue in the schema metadata; list reader."
            f"{', reader.'.join(missing)} explicitly"
        )
    labels = config.labels if config.labels is not None else list(catalogue.labels)  # type: ignore[union-attr]
    dense = config.dense if config.dense is not None else catalogue.dense_names  # type: ignore[union-attr]
    sparse = config.sparse if config.sparse is not None else catalogue.sparse_names  # type: ignore[union-attr]
    for i, group in enumerate(config.dedup_sparse_features):
        for name in group:
            if name not in sparse:
                raise SchemaError(
                    f"{source}: reader.dedup_sparse_features[{i}] names {name!r}, which is not "
                    f"a sparse feature of the table ({', '.join(sparse)})"
                )
    overlap = (set(labels) & set(dense)) | (set(labels) | set(dense)) & set(sparse)
    if overlap:
        raise ConfigError(f"reader: column(s) {sorted(overlap)} listed in two feature lists")
    return list(labels), list(dense), list(sparse)


def _check_preprocessing(config: ReaderConfig, *, dense: list[str], sparse: list[str]) -> None:
    for i, spec in enumerate(config.preprocessing):
        allowed = sparse if spec["kind"] in SPARSE_PREPROCESS_KINDS else dense
        what = "sparse" if spec["kind"] in SPARSE_PREPROCESS_KINDS else "dense"
        for name in spec["features"]:
            if name not in allowed:
                raise ConfigError(
                    f"reader.preprocessing[{i}] ({spec['kind']}): {name!r} is not one of the "
                    f"{what} features read ({', '.join(allowed) or 'none'})"
                )


def _check_schemas(
    files: list[Path],
    metas: list[pq.FileMetaData],
    layouts: list[Layout],
    columns: list[str],
    *,
    features: set[str],
    sparse: list[str],
    session: str | None,
) -> dict[str, pa.DataType]:
    """Types of ``columns``; SchemaError if one is missing, unusable, or changes across files.
    ``session``: the column of the session shuffle's ids (integers or strings).

    A feature a file stores in the dedup layout has the type of its ``__new_ids`` column
    (or of its group's ``__group_ids`` column; the other columns were checked by
    ``layout_of``)."""
    sparse_set = set(sparse)
    types: dict[str, pa.DataType] = {}
    origin: dict[str, Path] = {}
    for path, meta, layout in zip(files, metas, layouts, strict=True):
        schema = meta.schema.to_arrow_schema()
        for name in columns:
            stored = layout.stored_column(name)
            idx = schema.get_field_index(stored)
            if idx < 0:
                seen = f" (present in {origin[name]})" if name in origin else ""
                raise SchemaError(f"{path}: missing column {name!r}{seen}")
            typ = nullable_type(schema.field(idx).type)  # ETL tables: no nullable item
            if name not in types:
                _check_column_type(
                    path,
                    name,
                    typ,
                    sparse=name in sparse_set,
                    feature=name in features,
                    session=name == session,
                )
                types[name] = typ
                origin[name] = path
            elif not typ.equals(types[name]):
                raise SchemaError(
                    f"schema changed between files: column {name!r} is {types[name]} in "
                    f"{origin[name]} but {typ} in {path}"
                )
    return types


def _check_column_type(
    path: Path, name: str, typ: pa.DataType, *, sparse: bool, feature: bool, session: bool
) -> None:
    if session and not is_session_id_type(typ):
        raise SchemaError(
            f"{path}: column {name!r} (reader.session_column, the session ids of shuffle = "
            f"'session') has type {typ}, expected integers or strings"
        )
    if not feature:
        return
    if sparse:
        ok = pa.types.is_integer(typ) or (
            (pa.types.is_list(typ) or pa.types.is_large_list(typ))
            and pa.types.is_integer(typ.value_type)
        )
        if not ok:
            raise SchemaError(
                f"{path}: column {name!r} has type {typ}, expected list<int64> or an integer "
                "(sparse ids)"
            )
    elif not (pa.types.is_floating(typ) or pa.types.is_integer(typ)):
        raise SchemaError(f"{path}: column {name!r} has type {typ}, expected float32")


def is_session_id_type(typ: pa.DataType) -> bool:
    """Whether a column of ``typ`` can hold session ids: integers, or strings (or bytes),
    dictionary-encoded or not."""
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    return pa.types.is_integer(typ) or any(
        check(typ)
        for check in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_string_view,
            pa.types.is_binary,
            pa.types.is_large_binary,
            pa.types.is_binary_view,
        )
    )


def _projected_bytes(group: pq.RowGroupMetaData, columns: set[str]) -> int:
    total = 0
    for j in range(group.num_columns):
        chunk = group.column(j)
        if chunk.path_in_schema.split(".")[0] in columns:
            total += chunk.total_compressed_size
    return total
