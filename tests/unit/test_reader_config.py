"""ReaderConfig: TOML loading, checks that name the field and value, fingerprints."""

from __future__ import annotations

from pathlib import Path

import pytest

from recd.errors import ConfigError
from recd.reader.config import ReaderConfig, Shuffle, load_reader_config

TOML = """
[reader]
table = "table"
start = "2026-11-01/00"
end = "2026-11-01T02:00"
sparse = ["hist", "cart_a", "cart_b"]
dedup_sparse_features = [["hist"], ["cart_a", "cart_b"]]
batch_size = 64
shuffle = "session"
seed = 3
num_workers = 2
preprocessing = [
    { kind = "hash_modulo", features = ["hist"], modulo = 1000 },
    { kind = "truncate_last", features = ["hist"], n = 50 },
    { kind = "log1p", features = ["price"] },
]
"""


def test_load_from_toml_resolves_table_next_to_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text(TOML)
    cfg = load_reader_config(path)
    assert cfg.table == str(tmp_path / "table")
    assert cfg.shuffle is Shuffle.SESSION
    assert cfg.dedup_sparse_features == [["hist"], ["cart_a", "cart_b"]]
    assert cfg.preprocessing[0] == {"kind": "hash_modulo", "features": ["hist"], "modulo": 1000}
    assert cfg.start_ms == 1_793_491_200_000  # 2026-11-01T00:00Z
    assert cfg.end_ms == cfg.start_ms + 2 * 3_600_000  # type: ignore[operator]
    assert cfg.num_global_streams == 4 and cfg.global_stream_id(1) == 1
    assert cfg.worker_streams(0) == [0, 2] and cfg.worker_streams(1) == [1, 3]


def test_unknown_option_and_missing_section(tmp_path: Path) -> None:
    path = tmp_path / "job.toml"
    path.write_text('[reader]\ntable = "t"\nbatchsize = 3\n')
    with pytest.raises(
        ConfigError, match=r"job.toml\[reader\]: unknown reader option\(s\) batchsize"
    ):
        load_reader_config(path)
    with pytest.raises(ConfigError, match=r"no \[train\] table"):
        load_reader_config(path, section="train")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, r"reader.batch_size: expected an integer >= 1, got 0"),
        (
            {"shuffle": "row"},
            r"reader.shuffle: 'row' is not one of none, file, row_group, session, rows",
        ),
        ({"num_workers": 3}, r"reader.num_workers: 3 does not divide reader.streams = 4"),
        ({"streams": 0}, r"reader.streams: expected an integer >= 1, got 0"),
        ({"shuffle_window": 0}, r"reader.shuffle_window: expected an integer >= 1, got 0"),
        ({"rank": 2, "world_size": 2}, r"reader.rank: 2 must be < world_size 2"),
        ({"num_workers": -1}, r"reader.num_workers: expected an integer >= 0, got -1"),
        ({"start": "yesterday"}, r"reader.start: cannot parse 'yesterday'"),
        (
            {"start": "2026-11-01/05", "end": "2026-11-01/02"},
            r"reader.end: '2026-11-01/02' must be after",
        ),
        ({"dedup_sparse_features": [["a"], ["b", "a"]]}, r"feature 'a' is in groups 0 and 1"),
        ({"dedup_sparse_features": [[]]}, r"dedup_sparse_features\[0\]: a group cannot be empty"),
        ({"sparse": ["a"], "dedup_sparse_features": [["b"]]}, r"'b' is not in reader.sparse"),
        ({"dense": ["x", "x"]}, r"reader.dense: column\(s\) listed twice: x"),
        (
            {"preprocessing": [{"kind": "sqrt", "features": ["x"]}]},
            r"preprocessing\[0\].kind: 'sqrt'",
        ),
        (
            {"preprocessing": [{"kind": "hash_modulo", "features": ["x"]}]},
            r"preprocessing\[0\] \(hash_modulo\): missing key 'modulo'",
        ),
        (
            {"preprocessing": [{"kind": "truncate_last", "features": ["x"], "n": -1}]},
            r"preprocessing\[0\].n: expected an integer >= 0, got -1",
        ),
        (
            {
                "preprocessing": [
                    {"kind": "normalize", "features": ["x", "y"], "mean": 0, "std": [1]}
                ]
            },
            r"preprocessing\[0\].std: expected a number or 2 numbers, got \[1\]",
        ),
    ],
)
def test_checks_name_field_and_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReaderConfig(table="t", **kwargs)  # type: ignore[arg-type]


def test_fingerprint_covers_position_fields_only() -> None:
    base = ReaderConfig(table="t", batch_size=8)
    assert base.fingerprint() == ReaderConfig(table="t", batch_size=8).fingerprint()
    assert base.fingerprint() == ReaderConfig(table="t", batch_size=8, num_epochs=5).fingerprint()
    assert (
        base.fingerprint() == ReaderConfig(table="t", batch_size=8, prefetch_factor=4).fingerprint()
    )
    # The reading processes do not change the batches; nor does a window nothing permutes.
    for same in ({"num_workers": 2}, {"engine": "ray"}, {"shuffle_window": 99}):
        other = ReaderConfig(table="t", **{"batch_size": 8, **same})  # type: ignore[arg-type]
        assert other.fingerprint() == base.fingerprint(), same
    rows = ReaderConfig(table="t", batch_size=8, shuffle="rows")
    assert (
        rows.fingerprint()
        != ReaderConfig(table="t", batch_size=8, shuffle="rows", shuffle_window=99).fingerprint()
    )
    for change in ({"batch_size": 9}, {"seed": 1}, {"streams": 2}, {"shuffle": "file"}):
        other = ReaderConfig(table="t", **{"batch_size": 8, **change})  # type: ignore[arg-type]
        assert other.fingerprint() != base.fingerprint(), change
