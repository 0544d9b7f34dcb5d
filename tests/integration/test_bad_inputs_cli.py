"""A bad-input battery for the CLI: places recd cannot write (a file where a directory must
be, a read-only file system), a disk that fills up during `recd etl`, a truncated Parquet file
in a table, non-finite numbers in a training config, and a baseline run into a clustered
table. Each ends in exit code 2 and one line naming the path / key / value, with no
traceback, and leaves what was on disk as it was.

Real files and the real CLI (``recd.cli.main``). A read-only file system is real where this
process may mount one (root with ``unshare``: a read-only bind mount in a private mount
namespace, around a ``python -m recd`` child); a user other than root gets a directory
without write permission instead; only root without mounts falls back to refusing writes
under the directory in the calls recd makes (``os.mkdir``, ``os.open``, ``os.access``).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from recd.cli import main
from recd.etl.config import EtlConfig
from recd.etl.local import run_etl
from recd.schema import Catalogue
from recd.table.snapshot import committed_files
from tests.tables import build_table
from tests.unit.etl_shards import all_rows, sessions_clustered

REPO = Path(__file__).resolve().parents[2]

TRAIN_CONFIG = """
[reader]
table = "{table}"
end = "2026-11-01T01:00"
batch_size = 32
{reader_extra}

[model]
kind = "dlrm"
embedding_dim = 4
max_rows = 100

[optim]
lr = 0.01
{optim_extra}

[train]
steps = 2
log_every = 1
seed = 0
run_dir = "{run_dir}"
"""


def write_train_config(
    path: Path, table: Path, run_dir: Path, *, optim: str = "", reader: str = ""
) -> Path:
    text = TRAIN_CONFIG.format(table=table, run_dir=run_dir, optim_extra=optim, reader_extra=reader)
    if optim.startswith("lr ="):  # replaces the default line rather than repeating the key
        text = text.replace("lr = 0.01\n", "")
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, tiny_catalogue: Catalogue) -> Path:
    """A tiny clustered Iceberg table (WORK/table) from its shards (WORK/shards), through the
    real generate -> shard -> ETL path."""
    root = tmp_path_factory.mktemp("bad-inputs")
    build_table(root, tiny_catalogue, seed=3, num_sessions=60)
    return root


@pytest.fixture(scope="module")
def trained(work: Path) -> Path:
    """A train TOML whose run directory holds a checkpoint (2 steps)."""
    config = write_train_config(work / "train.toml", work / "table", work / "run")
    assert main(["train", "--config", str(config)]) == 0
    return config


def new_table(shards: Path, table: Path, **options: Any) -> Path:
    run_etl(
        EtlConfig(
            shard_dir=shards, table_dir=table, row_group_rows=16, show_progress=False, **options
        )
    )
    return table


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None: a directory): what must not change."""
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes()
        for p in sorted(root.rglob("*"))
    }


LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (INFO|WARNING) ")


def error_line(err: str, command: str) -> str:
    """The CLI's one error line on stderr: no traceback, nothing else but log lines."""
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith(f"recd {command}: error: ")]
    assert len(lines) == 1, err[-3000:]
    others = [line for line in err.splitlines() if line != lines[0]]
    assert all(LOG_LINE.match(line) for line in others), err[-3000:]
    return lines[0]


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run ``recd ARGV`` in this process: (exit code, stderr)."""
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


# ----------------------------------------------------------------------------- read-only


@functools.cache
def _can_mount() -> bool:
    """Whether a read-only bind mount works here (root, unshare, mount privileges)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = Path(os.environ.get("TMPDIR", "/tmp"))
    script = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" && test ! -w "$1"'
    try:
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(probe)],
            capture_output=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


READ_ONLY_REASON = {  # what the error line says, by mode
    "mount": "read-only file system",
    "patch": "read-only file system",
    "chmod": "permission denied",
}
READ_ONLY_MODE_ENV = "RECD_TEST_READ_ONLY_MODE"
"""Forces a mode (``mount``, ``chmod``, ``patch``), to check the fallbacks on a machine that
has the real thing (``chmod`` as root: run without CAP_DAC_OVERRIDE, e.g. under
``setpriv --bounding-set -dac_override,-dac_read_search``)."""


def read_only_mode() -> str:
    """How a read-only place is made: ``mount`` (real), ``chmod`` (no write permission) or
    ``patch`` (recd's calls refused)."""
    forced = os.environ.get(READ_ONLY_MODE_ENV)
    if forced:
        assert forced in READ_ONLY_REASON, f"{READ_ONLY_MODE_ENV}={forced!r}"
        return forced
    if os.geteuid() != 0:
        return "chmod"
    return "mount" if _can_mount() else "patch"


def _refuse_writes_under(monkeypatch: pytest.MonkeyPatch, directory: Path) -> None:
    """Root without mounts: the calls recd makes to create or write under ``directory``
    fail with EROFS, as on a read-only file system (pyarrow's own writes are not covered)."""
    root = os.path.realpath(directory)

    def under(path: Any) -> bool:
        if isinstance(path, int):
            return False
        full = os.path.realpath(os.fsdecode(path))
        return full == root or full.startswith(root + os.sep)

    def refuse(path: Any) -> OSError:
        return OSError(errno.EROFS, os.strerror(errno.EROFS), os.fsdecode(path))

    real_mkdir, real_open, real_access = os.mkdir, os.open, os.access
    real_statvfs = os.statvfs
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if under(path) and not os.path.isdir(path):
            raise refuse(path)
        real_mkdir(path, *args, **kwargs)

    def open_(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if under(path) and flags & writes:
            raise refuse(path)
        return real_open(path, flags, *args, **kwargs)

    def access(path: Any, mode: int, *args: Any, **kwargs: Any) -> bool:
        if under(path) and mode & os.W_OK:
            return False
        return real_access(path, mode, *args, **kwargs)

    def statvfs(path: Any) -> os.statvfs_result:
        got = real_statvfs(path)
        if not under(path):
            return got
        values = list(got)
        values[8] |= os.ST_RDONLY  # f_flag
        return os.statvfs_result(values)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "statvfs", statvfs)


def run_read_only(
    directory: Path,
    argv: list[str],
    *,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str]:
    """``recd ARGV`` with ``directory`` read-only: (exit code, stderr)."""
    mode = read_only_mode()
    if mode == "mount":
        mount = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1"'
        done = recd_in_namespace(mount, directory, argv)
        return done.returncode, done.stderr
    if mode == "chmod":
        directory.chmod(0o555)
        try:
            return cli(capsys, *argv)
        finally:
            directory.chmod(0o755)
    with monkeypatch.context() as patch:
        _refuse_writes_under(patch, directory)
        return cli(capsys, *argv)


def recd_in_namespace(
    mount: str, directory: Path, argv: list[str]
) -> subprocess.CompletedProcess[str]:
    """``python -m recd ARGV`` in a private mount namespace where shell command ``mount`` ($1:
    ``directory``) ran first; the mount goes away with the namespace."""
    env = {**os.environ, "RECD_PROGRESS": "0", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    unshare = ["unshare", "-m", "--propagation", "private"]
    shell = ["sh", "-c", f'{mount} && shift && exec "$@"', "sh", str(directory)]
    return subprocess.run(
        [*unshare, *shell, sys.executable, "-m", "recd", *argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "read-only"
    directory.mkdir()
    return directory


# ----------------------------------------------------------------------------- 1. where to write


def test_train_run_dir_that_is_a_file(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "not-a-dir"
    path.write_bytes(b"precious")
    code, err = cli(capsys, "train", "--config", str(trained), "--run-dir", str(path))
    line = error_line(err, "train")
    assert code == 2
    assert str(path) in line and "a file is in the way" in line and "--run-dir" in line
    assert path.read_bytes() == b"precious"


def test_train_run_dir_below_a_file(
    trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_bytes(b"precious")
    code, err = cli(capsys, "train", "--config", str(trained), "--run-dir", str(blocker / "run"))
    line = error_line(err, "train")
    assert code == 2
    assert f"{blocker / 'run'}: cannot write here: a file is in the way" in line
    assert f"({blocker})" in line
    assert blocker.read_bytes() == b"precious"


@pytest.mark.parametrize("where", ["the directory itself", "a new directory inside"])
def test_train_run_dir_read_only(
    trained: Path,
    read_only_dir: Path,
    where: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_dir = read_only_dir if where == "the directory itself" else read_only_dir / "run"
    argv = ["train", "--config", str(trained), "--run-dir", str(run_dir)]
    code, err = run_read_only(read_only_dir, argv, capsys=capsys, monkeypatch=monkeypatch)
    line = error_line(err, "train")
    assert code == 2, err[-3000:]
    assert f"{run_dir}: cannot write here: {READ_ONLY_REASON[read_only_mode()]}" in line
    assert list(read_only_dir.iterdir()) == []


def test_etl_table_that_is_a_file(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "table"
    path.write_bytes(b"precious")
    code, err = cli(capsys, "etl", str(work / "shards"), "--table", str(path), "--no-progress")
    line = error_line(err, "etl")
    assert code == 2
    assert f"{path}: cannot write here: a file is in the way (not a directory)" in line
    assert path.read_bytes() == b"precious"


@pytest.mark.parametrize("where", ["existing table", "new table inside"])
def test_etl_table_read_only(
    work: Path,
    tmp_path: Path,
    where: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if where == "existing table":
        directory = table = new_table(work / "shards", tmp_path / "table")
        before, rows = tree(table), all_rows(table)
    else:
        directory = tmp_path / "read-only"
        directory.mkdir()
        table = directory / "table"
    argv = ["etl", str(work / "shards"), "--table", str(table), "--no-progress"]
    code, err = run_read_only(directory, argv, capsys=capsys, monkeypatch=monkeypatch)
    line = error_line(err, "etl")
    assert code == 2, err[-3000:]
    assert f"{table}: cannot write here: {READ_ONLY_REASON[read_only_mode()]}" in line
    if where == "existing table":
        assert tree(table) == before
        assert all_rows(table).equals(rows)
    else:
        assert list(directory.iterdir()) == []


def test_logs_ingest_out_read_only(
    read_only_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = tmp_path / "events.csv"
    events.write_text("session_id,ts,item_id,event_type\n1,1700000000,3,view\n1,1700000009,4,buy\n")
    out = read_only_dir / "raw"
    argv = ["logs", "ingest", str(events), "--out", str(out)]
    code, err = run_read_only(read_only_dir, argv, capsys=capsys, monkeypatch=monkeypatch)
    line = error_line(err, "logs")
    assert code == 2, err[-3000:]
    assert f"{out}: cannot write here: {READ_ONLY_REASON[read_only_mode()]}" in line
    assert "--out" in line
    assert list(read_only_dir.iterdir()) == []


def test_logs_ingest_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = tmp_path / "events.csv"
    events.write_text("session_id,ts,item_id,event_type\n1,1700000000,3,view\n")
    out = tmp_path / "raw"
    out.write_bytes(b"precious")
    code, err = cli(capsys, "logs", "ingest", str(events), "--out", str(out))
    line = error_line(err, "logs")
    assert code == 2
    assert f"{out}: cannot write here: a file is in the way" in line
    assert out.read_bytes() == b"precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.csv", "raw"]


def test_predict_out_read_only(
    trained: Path,
    work: Path,
    read_only_dir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = read_only_dir / "predictions.parquet"
    argv = ["predict", "--config", str(trained), "--checkpoint", str(work / "run")]
    argv += ["--out", str(out)]
    code, err = run_read_only(read_only_dir, argv, capsys=capsys, monkeypatch=monkeypatch)
    line = error_line(err, "predict")
    assert code == 2, err[-3000:]
    assert f"{out}: cannot write here: {READ_ONLY_REASON[read_only_mode()]}" in line
    assert list(read_only_dir.iterdir()) == []


def test_predict_out_that_is_a_directory(
    trained: Path, work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "predictions"
    (out / "keep").mkdir(parents=True)
    argv = ["predict", "--config", str(trained), "--checkpoint", str(work / "run")]
    code, err = cli(capsys, *argv, "--out", str(out), "--overwrite")
    line = error_line(err, "predict")
    assert code == 2
    assert f"{out}: cannot write here: it is a directory" in line
    assert [p.name for p in out.iterdir()] == ["keep"]


# ----------------------------------------------------------------------------- 2. disk full


def _disk_fills_after(monkeypatch: pytest.MonkeyPatch, writes: int) -> list[int]:
    """Every Parquet row group write after the first ``writes`` fails as on a full disk
    (pyarrow's error: errno 28, no file name). Returns the call count."""
    calls = [0]
    real = pq.ParquetWriter.write_table

    def write_table(self: pq.ParquetWriter, *args: Any, **kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] > writes:
            raise OSError(
                errno.ENOSPC,
                "Error writing bytes to file. Detail: [errno 28] No space left on device",
            )
        real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    return calls


@pytest.mark.parametrize("table_format", ["iceberg", "hive"])
def test_etl_disk_full_keeps_the_committed_table(
    work: Path,
    tmp_path: Path,
    table_format: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shards = work / "shards"
    table = new_table(shards, tmp_path / "table", table_format=table_format)
    before, rows = committed_files(table), all_rows(table)
    calls = _disk_fills_after(monkeypatch, writes=2)
    argv = ["etl", str(shards), "--table", str(table), "--row-group-rows", "16", "--no-progress"]
    code, err = cli(capsys, *argv)
    line = error_line(err, "etl")
    assert code == 2
    assert calls[0] > 2  # the disk filled part-way through the run's writes
    assert f"{table}: the disk is full" in line
    assert "Free space" in line
    if table_format == "iceberg":
        assert "nothing of this run was committed" in line
    else:
        assert "every hour is whole" in line
    monkeypatch.undo()
    assert committed_files(table) == before
    assert all_rows(table).equals(rows)
    assert not list(table.glob("_tmp-*")), "the run's staged files were left behind"


def test_etl_disk_full_on_a_real_small_file_system(work: Path, tmp_path: Path) -> None:
    """A new table on a 16 KiB tmpfs: the run's own writes hit ENOSPC (pyarrow's, or the
    embedded catalog's SQLite), whichever comes first."""
    if read_only_mode() != "mount":
        pytest.skip("needs root with mount namespaces (unshare) for a tmpfs of its own")
    mount_point = tmp_path / "small"
    mount_point.mkdir()
    table = mount_point / "table"
    argv = ["etl", str(work / "shards"), "--table", str(table), "--no-progress"]
    done = recd_in_namespace('mount -t tmpfs -o size=16k tmpfs "$1"', mount_point, argv)
    line = error_line(done.stderr, "etl")
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"{table}: the disk is full" in line and "nothing was committed" in line
    assert list(mount_point.iterdir()) == []  # the tmpfs went away with its namespace


def test_logs_ingest_disk_full_keeps_the_old_raw_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk met by a command with no handling of its own (the CLI's last resort): one
    line, exit 2; the raw log written before is still there, whole."""
    from recd.logs.rawlog import RawLogWriter

    events = tmp_path / "events.csv"
    events.write_text("session_id,ts,item_id,event_type\n1,1700000000,3,view\n")
    out = tmp_path / "raw"
    assert main(["logs", "ingest", str(events), "--out", str(out)]) == 0
    before = tree(out)

    def write(self: RawLogWriter, batch: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "shard.zst"))

    monkeypatch.setattr(RawLogWriter, "write", write)
    code, err = cli(capsys, "logs", "ingest", str(events), "--out", str(out))
    line = error_line(err, "logs")
    assert code == 2
    assert f"{tmp_path / 'shard.zst'}: cannot write here: the disk is full" in line
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.csv", "raw"]


# ----------------------------------------------------------------------------- 3. truncated file


@pytest.mark.parametrize("hour", ["00", "01"])
@pytest.mark.parametrize(
    "command",
    [["table", "info"], ["analyze", "--factor-only"]],
    ids=["table-info", "analyze"],
)
def test_truncated_parquet_file_is_named(
    work: Path,
    tmp_path: Path,
    hour: str,
    command: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = new_table(work / "shards", tmp_path / "table")
    [damaged] = table.glob(f"ds=2026-11-01/hour={hour}/*.parquet")
    data = damaged.read_bytes()
    damaged.write_bytes(data[: len(data) // 2])
    others = {p: p.read_bytes() for p in table.rglob("*.parquet") if p != damaged}
    code, err = cli(capsys, *command, str(table))
    line = error_line(err, command[0])
    assert code == 2
    assert f"{damaged}: not a readable Parquet file" in line
    assert damaged.stat().st_size == len(data) // 2
    assert {p: p.read_bytes() for p in others} == others


# ----------------------------------------------------------------------------- 4. config numbers


NON_FINITE = [
    ("optim", "lr = nan", "optim.lr", "nan"),
    ("optim", "lr = inf", "optim.lr", "inf"),
    ("optim", "embedding_lr = nan", "optim.embedding_lr", "nan"),
    ("optim", "embedding_lr = inf", "optim.embedding_lr", "inf"),
    ("optim", "eps = nan", "optim.eps", "nan"),
    ("optim", "eps = inf", "optim.eps", "inf"),
    ("optim", "weight_decay = nan", "optim.weight_decay", "nan"),
    ("optim", "weight_decay = inf", "optim.weight_decay", "inf"),
    ("optim", "embedding_weight_decay = nan", "optim.embedding_weight_decay", "nan"),
    ("optim", "embedding_weight_decay = inf", "optim.embedding_weight_decay", "inf"),
    (
        "reader",
        'preprocessing = [{ kind = "normalize", features = ["user_age_days"], mean = nan, '
        "std = 1 }]",
        "reader.preprocessing[0].mean",
        "nan",
    ),
    (
        "reader",
        'preprocessing = [{ kind = "normalize", features = ["user_age_days"], mean = 0, '
        "std = inf }]",
        "reader.preprocessing[0].std",
        "inf",
    ),
    (
        "reader",
        'preprocessing = [{ kind = "clamp", features = ["user_age_days"], min = nan }]',
        "reader.preprocessing[0].min",
        "nan",
    ),
    (
        "reader",
        'preprocessing = [{ kind = "clamp", features = ["user_age_days"], max = -inf }]',
        "reader.preprocessing[0].max",
        "-inf",
    ),
]


@pytest.mark.parametrize(
    ("section", "line", "key", "value"), NON_FINITE, ids=[f"{k}={v}" for _, _, k, v in NON_FINITE]
)
def test_non_finite_config_number_is_refused(
    work: Path,
    tmp_path: Path,
    section: str,
    line: str,
    key: str,
    value: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    run_dir = tmp_path / "run"
    config = write_train_config(tmp_path / "train.toml", work / "table", run_dir, **{section: line})
    code, err = cli(capsys, "train", "--config", str(config))
    message = error_line(err, "train")
    assert code == 2
    assert str(config) in message and key in message and value in message
    assert "finite" in message
    assert not run_dir.exists()


# ----------------------------------------------------------------------------- 5. row order


def test_etl_baseline_into_a_clustered_table_is_refused(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = new_table(work / "shards", tmp_path / "table")
    before, rows = committed_files(table), all_rows(table)
    argv = ["etl", str(work / "shards"), "--table", str(table), "--baseline", "--no-progress"]
    code, err = cli(capsys, *argv)
    line = error_line(err, "etl")
    assert code == 2
    assert f"{table}: the table holds rows clustered by session" in line
    assert "session_id, ts" in line and "--baseline" in line
    assert committed_files(table) == before
    assert all_rows(table).equals(rows)


def test_etl_clustered_run_into_a_baseline_table_replaces_its_hours(
    work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reverse is allowed (docs/tables.md): a baseline table records no order, so
    clustered rows keep it true; the run replaces the hours it writes."""
    table = new_table(work / "shards", tmp_path / "table", baseline=True)
    rows = all_rows(table)
    code, err = cli(capsys, "etl", str(work / "shards"), "--table", str(table), "--no-progress")
    assert code == 0, err
    assert all_rows(table).equals(rows)
    assert all(sessions_clustered(pq.read_table(path)) for path in committed_files(table).files)
