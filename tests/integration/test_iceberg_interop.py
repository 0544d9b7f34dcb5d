"""Every kind of Iceberg table recd writes scans with other Iceberg readers, from anywhere.

Each table is written through the CLI (``recd.cli.main``) from one working directory with a
relative ``--table``, then read from another one: by recd (``committed_files`` + pyarrow, and
``recd table info``), by pyiceberg as docs/tables.md says (its snippet, run as written), by
pyiceberg's ``StaticTable`` from the metadata file alone, and by Polars' own Parquet reader
when Polars is installed. The kinds: local and Spark engine, plain and dedup layout, hour and
day partitions, a ``--baseline`` table, and a Hive-layout table converted by ``recd table
migrate``. Iceberg readers return the stored (physical) columns: for a dedup-layout table the
encoded features' ``__new_ids`` / ``__start`` (``__group_ids`` / ``__group_lengths``)
columns. Those are compared too, row by row (rows aligned by ``request_id``): every column
Iceberg returns must hold what the files recd reads hold.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.cli import main
from recd.schema import REQUEST_ID, Catalogue
from recd.table.iceberg import NAME_MAPPING_PROPERTY, live_data_files, load_table, snapshots
from recd.table.snapshot import committed_files
from tests.spark_session import light_local_spark, restore_pyspark_python

try:  # tests/ is a package (tests/__init__.py) or pytest put tests/ itself on sys.path
    from tests.unit.etl_shards import MS_PER_HOUR, make_rows, write_shards
except ModuleNotFoundError:
    from unit.etl_shards import MS_PER_HOUR, make_rows, write_shards  # type: ignore[no-redef]

DOC = Path(__file__).resolve().parents[2] / "docs" / "tables.md"
DEDUP = ["--layout", "dedup", "--dedup-features", "user_history,cart_item_ids,cart_seller_ids"]

LOCAL = {
    "local-hour-plain": [],
    "local-hour-dedup": DEDUP,
    "local-day-plain": ["--partition-by", "day"],
    "local-day-dedup": ["--partition-by", "day", *DEDUP],
    "local-hour-baseline": ["--baseline"],
}
SPARK = {
    "spark-hour-plain": ["--engine", "spark"],
    "spark-day-dedup": ["--engine", "spark", "--partition-by", "day", *DEDUP],
}
MIGRATED = "migrated-hive"
SPARK_MARKS = [pytest.mark.spark, pytest.mark.slow]
KINDS = [
    *LOCAL,
    MIGRATED,
    *(pytest.param(kind, marks=SPARK_MARKS) for kind in SPARK),
]


def cli(cwd: Path, *argv: str) -> None:
    """``recd ARGV`` run in ``cwd``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(cwd)
        assert main([*argv, "--no-progress"] if argv[0] == "etl" else list(argv)) == 0


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory, tiny_catalogue: Catalogue) -> Path:
    """Three hours of ~300 rows, session-sharded."""
    root = tmp_path_factory.mktemp("interop")
    rows = make_rows(tiny_catalogue, num_sessions=50, duration_ms=3 * MS_PER_HOUR, seed=5)
    write_shards(root / "shards", tiny_catalogue, rows, num_shards=2, block_rows=32)
    return root / "shards"


@pytest.fixture(scope="module")
def writer(shards: Path) -> Path:
    """The working directory the tables are written from (each under a relative name)."""
    directory = shards.parent / "writer"
    directory.mkdir()
    return directory


@pytest.fixture(scope="module")
def local_tables(shards: Path, writer: Path) -> Path:
    for name, options in LOCAL.items():
        cli(writer, "etl", "../shards", "--table", name, *options)
    cli(writer, "etl", "../shards", "--table", MIGRATED, "--table-format", "hive")
    cli(writer, "table", "migrate", MIGRATED)
    return writer


@pytest.fixture(scope="module")
def spark_tables(shards: Path, writer: Path) -> Iterator[Path]:
    """The Spark engine's tables, written by a light local[2] session (stopped at the end
    unless one was running already)."""
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("the Spark engine needs Java (not on PATH)")
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    if running is not None:
        session, saved = running, os.environ.get("PYSPARK_PYTHON")
        os.environ["PYSPARK_PYTHON"] = sys.executable
    else:
        session, saved = light_local_spark("local[2]", "recd-tests-interop")
    try:
        for name, options in SPARK.items():
            cli(writer, "etl", "../shards", "--table", name, *options)  # the active session
        yield writer
    finally:
        if running is None:
            session.stop()
        restore_pyspark_python(saved)


def table_from_elsewhere(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """The table of ``kind`` as a path relative to a new working directory (now current)."""
    written = request.getfixturevalue("spark_tables" if kind in SPARK else "local_tables")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    return Path(os.path.relpath(written / kind, elsewhere))


def recd_rows(table_dir: Path) -> pa.Table:
    """The stored rows of the table's current snapshot, as recd finds its files."""
    files = committed_files(table_dir).files
    assert files, f"{table_dir}: nothing committed"
    return pa.concat_tables([pq.ParquetFile(path).read() for path in files])


def assert_same_rows(got: pa.Table, want: pa.Table) -> None:
    """Same columns, same rows (aligned by the unique request_id), value by value."""
    assert got.column_names == want.column_names
    assert got.num_rows == want.num_rows > 0
    got, want = got.sort_by(REQUEST_ID), want.sort_by(REQUEST_ID)
    for name in want.column_names:
        assert got.column(name).to_pylist() == want.column(name).to_pylist(), name


def docs_snippet() -> str:
    """The pyiceberg example of docs/tables.md (``<!-- example: pyiceberg -->``)."""
    match = re.search(r"<!-- example: pyiceberg -->\n```python\n(.*?)```", DOC.read_text(), re.S)
    assert match is not None, "docs/tables.md lost its pyiceberg example"
    return match.group(1)


def run_docs_snippet(table_dir: Path) -> pa.Table:
    source = docs_snippet()
    assert '"TABLE"' in source and "scan().to_arrow()" in source
    namespace: dict[str, object] = {}
    exec(compile(source.replace('"TABLE"', repr(str(table_dir))), str(DOC), "exec"), namespace)
    rows = namespace["rows"]
    assert isinstance(rows, pa.Table)
    return rows


@pytest.mark.parametrize("kind", KINDS)
def test_pyiceberg_scans_the_rows_recd_reads_from_another_directory(
    kind: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    table_dir = table_from_elsewhere(kind, request, tmp_path, monkeypatch)
    want = recd_rows(table_dir)
    capsys.readouterr()
    assert main(["table", "info", str(table_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == want.num_rows

    assert_same_rows(run_docs_snippet(table_dir), want)
    from pyiceberg.table import StaticTable

    table = load_table(table_dir)
    static = StaticTable.from_metadata(table.metadata_location)
    assert_same_rows(static.scan().to_arrow(), want)
    # How: the files' columns are mapped by name, and listed by absolute paths.
    assert table.properties[NAME_MAPPING_PROPERTY]
    assert all(Path(f.file_path).is_absolute() for f in live_data_files(table))


@pytest.mark.parametrize("kind", KINDS)
def test_polars_scans_the_rows_recd_reads(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pl = pytest.importorskip("polars")
    table_dir = table_from_elsewhere(kind, request, tmp_path, monkeypatch)
    # Polars plans with pyiceberg (its own planner is another package) and reads the files
    # with its own Parquet reader, which maps columns through the name mapping as well.
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")
    frame = pl.scan_iceberg(load_table(table_dir), reader_override="native").collect()
    assert_same_rows(frame.to_arrow(), recd_rows(table_dir))


def as_an_older_recd_wrote_it(table_dir: Path) -> None:
    """Make the table's current snapshot what recd wrote before it resolved ``--table`` and
    wrote a name mapping: its files listed by paths relative to the working directory of the
    run (the current one), and no ``schema.name-mapping.default``."""
    from pyiceberg.io.pyarrow import parquet_files_to_data_files

    table = load_table(table_dir)
    live = live_data_files(table)
    relative = [os.path.relpath(f.file_path) for f in live]
    assert all(not Path(p).is_absolute() for p in relative)
    listed = list(parquet_files_to_data_files(table.io, table.metadata, iter(relative)))
    with table.transaction() as tx:
        if NAME_MAPPING_PROPERTY in table.properties:
            tx.remove_properties(NAME_MAPPING_PROPERTY)
        with tx.update_snapshot().overwrite() as overwrite:
            for data_file in live:
                overwrite.delete_data_file(data_file)
            for data_file in listed:
                overwrite.append_data_file(data_file)


def test_a_table_an_older_recd_wrote_heals_on_its_next_commit(
    shards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, elsewhere = tmp_path / "writer", tmp_path / "elsewhere"
    writer.mkdir()
    elsewhere.mkdir()
    cli(writer, "etl", str(shards), "--table", "old")
    table_dir = writer / "old"
    with monkeypatch.context() as patch:  # what users of such a table saw
        patch.chdir(writer)
        as_an_older_recd_wrote_it(Path("old"))
        with pytest.raises(ValueError, match="name-mapping"):
            load_table(table_dir).scan().to_arrow()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(FileNotFoundError):
        load_table(table_dir).scan().to_arrow()

    # recd finds the relatively listed files from anywhere ...
    old = committed_files(table_dir)
    assert len(old.partitions) == 3 and all(path.is_file() for path in old.files)
    want = recd_rows(table_dir)
    # ... so a run from elsewhere (rewriting one hour of three) keeps them: they are not
    # orphans. Its commit lists the other hours' files by absolute paths and adds the name
    # mapping.
    window = ["--start", "2026-11-01/01", "--end", "2026-11-01/02"]
    cli(elsewhere, "etl", str(shards), "--table", "../writer/old", *window)
    assert all(path.is_file() for path in old.files)  # the older snapshots list them all
    table = load_table(table_dir)
    assert_same_rows(table.scan().to_arrow(), want)
    assert_same_rows(recd_rows(table_dir), want)
    assert table.properties[NAME_MAPPING_PROPERTY]
    assert all(Path(f.file_path).is_absolute() for f in live_data_files(table))
    new = committed_files(table_dir).files
    assert len(set(new) & set(old.files)) == 2  # hours 00 and 02 listed again, not rewritten
    # The older snapshot, with its relative paths, still reads through recd.
    relative_snapshot = snapshots(table_dir)[1]["snapshot_id"]
    assert committed_files(table_dir, snapshot_id=relative_snapshot).files == old.files
