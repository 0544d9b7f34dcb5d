"""``shuffle = "session"`` on a plain Parquet table from another tool: the session ids in a
column named by ``[reader] session_column``, string ids hashed as ``recd logs ingest`` hashes
them, integer ids as they are; every row read once and each session one run of rows; a null
id, an unusable type and a missing column named with their file."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.errors import BadRowError, ConfigError, SchemaError
from recd.logs.ingest_values import parse_session
from recd.reader.config import ReaderConfig
from recd.reader.dataset import ResumableLoader
from recd.reader.plan import build_plan
from recd.reader.stream import SESSION_KEY, UnitReader, iter_rank_batches, iter_stream_batches


def visits(num_sessions: int, seed: int) -> tuple[list[str], np.ndarray]:
    """String session ids as a web log has them, and each session's number of rows (1..7)."""
    rng = np.random.default_rng(seed)
    ids = [f"visit-{rng.integers(1 << 40):x}-{s}" for s in range(num_sessions)]
    return ids, rng.integers(1, 8, num_sessions)


def write_sessions(root: Path, ids: list, lengths: np.ndarray, *, column: str) -> list:
    """Two files of whole sessions, several sessions per row group (never split by one), in
    the order given; row r has item [r]. Returns each row's session id."""
    root.mkdir(parents=True)
    per_row = [sid for sid, n in zip(ids, lengths, strict=True) for _ in range(n)]
    rng = np.random.default_rng(0)
    row, half = 0, len(ids) // 2
    for part, sessions in enumerate((range(half), range(half, len(ids)))):
        with pq.ParquetWriter(root / f"part-{part}.parquet", _schema(column, ids)) as writer:
            cuts = rng.choice(sessions[1:], min(5, len(sessions) - 1), replace=False)
            bounds = [sessions.start, *sorted(cuts), sessions.stop]
            for lo, hi in itertools.pairwise(bounds):  # one row group each
                n = int(lengths[lo:hi].sum())
                writer.write_table(_rows(per_row[row : row + n], row, column, ids))
                row += n
    return per_row


def _schema(column: str, ids: list) -> pa.Schema:
    typ = pa.string() if isinstance(ids[0], str) else pa.int64()
    return pa.schema([(column, typ), ("clicked", pa.int64()), ("price", pa.float64()),
                      ("item", pa.int64())])  # fmt: skip


def _rows(session: list, first: int, column: str, ids: list) -> pa.Table:
    r = np.arange(first, first + len(session))
    data = {column: session, "clicked": r % 2, "price": r * 0.5, "item": r}
    return pa.table(data, schema=_schema(column, ids))


def reader(table: Path, **kwargs: object) -> ReaderConfig:
    options: dict[str, object] = {
        "labels": ["clicked"],
        "dense": ["price"],
        "sparse": ["item"],
        "batch_size": 16,
        "shuffle": "session",
        "shuffle_window": 1 << 20,  # one window per stream: a session is one run in it
        "streams": 2,
        "seed": 3,
        **kwargs,
    }
    return ReaderConfig(table=str(table), **options)  # type: ignore[arg-type]


def read_order(config: ReaderConfig, epoch: int = 0) -> list[int]:
    """The table rows (item ids) in the order the rank reads them."""
    plan = build_plan(config)
    return [v[0] for b in iter_rank_batches(plan, epoch=epoch) for v in b.rows["item"].to_pylist()]


def runs(sessions: list) -> int:
    """The number of runs of equal values."""
    return 1 + sum(a != b for a, b in itertools.pairwise(sessions))


def stream_orders(config: ReaderConfig) -> list[list[int]]:
    """Each stream's rows (item ids) in its window order."""
    plan = build_plan(config)
    return [
        [v[0] for b in iter_stream_batches(plan, epoch=0, stream=s) for v in b.rows["item"].to_pylist()]
        for s in range(config.streams)
    ]  # fmt: skip


@pytest.mark.parametrize("kind", ["string", "integer"])
def test_session_shuffle_on_a_plain_table_keeps_each_session_in_one_run(
    tmp_path: Path, kind: str
) -> None:
    ids, lengths = visits(60, seed=1)
    if kind == "integer":  # user ids as another tool writes them: not under session_id
        ids = list(np.random.default_rng(2).permutation(10_000)[:60] * 1_000_003)
    per_row = write_sessions(tmp_path / "t", ids, lengths, column="visit")
    config = reader(tmp_path / "t", session_column="visit")
    for stream in stream_orders(config):
        sessions = [per_row[r] for r in stream]
        assert runs(sessions) == len(set(sessions))  # every session one contiguous run
    order = read_order(config)
    assert sorted(order) == list(range(len(per_row)))  # every row once
    assert order != sorted(order)  # and permuted
    assert read_order(config, epoch=1) != order  # another epoch, another order
    loaded = list(ResumableLoader(config))
    assert sum(b.batch_size for b in loaded) == len(per_row)
    items = np.concatenate([b.sparse.kjt["item"].values().numpy() for b in loaded])
    assert sorted(items.tolist()) == list(range(len(per_row)))


def test_string_ids_are_hashed_as_ingest_hashes_them(tmp_path: Path) -> None:
    ids, lengths = visits(20, seed=4)
    per_row = write_sessions(tmp_path / "t", ids, lengths, column="visit")
    plan = build_plan(reader(tmp_path / "t", session_column="visit"))
    reader_ = UnitReader(plan)
    keys = np.concatenate([reader_.read(u).column(SESSION_KEY).to_numpy() for u in plan.units])
    ingested, mode = parse_session(pa.array(per_row), "hash")
    assert mode == "hash" and keys.tolist() == ingested.values.tolist()
    assert plan.batch_columns == ["clicked", "price", "item"]  # the ids are no feature


def test_the_session_column_may_be_a_feature_too(tmp_path: Path) -> None:
    ids = list(range(100, 130))
    per_row = write_sessions(tmp_path / "t", ids, visits(30, seed=5)[1], column="user")
    config = reader(tmp_path / "t", session_column="user", sparse=["item", "user"])
    plan = build_plan(config)
    assert plan.columns.count("user") == 1 and "user" in plan.batch_columns
    seen = []
    for stream in range(config.streams):
        batches = iter_stream_batches(plan, epoch=0, stream=stream)
        users = [v[0] for b in batches for v in b.rows["user"].to_pylist()]
        assert runs(users) == len(set(users))  # the feature's values: the sessions, in runs
        seen += users
    assert sorted(seen) == sorted(per_row)


def test_a_null_session_id_names_file_row_and_column(tmp_path: Path) -> None:
    ids, lengths = visits(10, seed=6)
    per_row = write_sessions(tmp_path / "t", ids, lengths, column="visit")
    first = pq.read_table(tmp_path / "t" / "part-0.parquet")
    bad = int(lengths[0]) + 1  # inside the first file, not its first row
    column = first["visit"].to_pylist()
    column[bad] = None
    pq.write_table(first.set_column(0, "visit", pa.array(column, pa.string())),
                   tmp_path / "t" / "part-0.parquet", row_group_size=4)  # fmt: skip
    assert len(per_row) > bad
    with pytest.raises(
        BadRowError, match=rf"part-0.parquet: row {bad}: field 'visit': null session id"
    ):
        list(ResumableLoader(reader(tmp_path / "t", session_column="visit")))
    # the same column read by another shuffle: not read, no error
    assert len(read_order(reader(tmp_path / "t", session_column="visit", shuffle="rows"))) == len(
        per_row
    )


def test_session_column_rules(tmp_path: Path) -> None:
    ids, lengths = visits(10, seed=7)
    write_sessions(tmp_path / "t", ids, lengths, column="visit")
    # a plain table without session_id: the default names a column it lacks
    with pytest.raises(SchemaError, match=r"part-0.parquet: missing column 'session_id'"):
        build_plan(reader(tmp_path / "t"))
    with pytest.raises(SchemaError, match=r"column 'price' \(reader.session_column.*double"):
        build_plan(reader(tmp_path / "t", session_column="price"))
    with pytest.raises(ConfigError, match=r"reader.session_column: expected a column name"):
        reader(tmp_path / "t", session_column="")
    with pytest.raises(ConfigError, match=r"session_column = 3"):
        ReaderConfig.from_dict({"table": "t", "session_column": 3})
    # The key decides the order of the session shuffle only: the other shuffles, and the
    # default, keep the fingerprint a config had before it (saved positions stay valid).
    base = reader(tmp_path / "t")
    assert base.fingerprint() != reader(tmp_path / "t", session_column="visit").fingerprint()
    rows = reader(tmp_path / "t", shuffle="rows")
    assert rows.fingerprint() == reader(tmp_path / "t", shuffle="rows",
                                        session_column="visit").fingerprint()  # fmt: skip
    assert "session_column" not in base.position_fields()
