"""``recd analyze``: the analytic model, measurement on a hand-built table, grouping, the CLI."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recd.analyze import (
    adjacent_unchanged,
    analyze_table,
    dedupe_factor,
    dedupe_len,
    propose_groups,
)
from recd.cli import analyze as analyze_cli
from recd.errors import ConfigError
from recd.schema import Catalogue, SparseFeature
from recd.tensors.jagged import JaggedColumn

CATALOGUE = Catalogue(
    name="analyzetest",
    sparse=[
        SparseFeature(name="static"),
        SparseFeature(name="static2"),
        SparseFeature(name="half"),
        SparseFeature(name="cart_a", group="cart"),
        SparseFeature(name="cart_b", group="cart"),
        SparseFeature(name="cart_c"),
        SparseFeature(name="item"),
    ],
)
SESSIONS = 4
S = 3  # rows per session


def hand_table(*, shuffled: bool = False) -> pa.Table:
    """4 sessions x 3 rows. Per session s (rows 0, 1, 2):

    static  [s, s+100, s+200] x 3                 l = 3, d = 1
    static2 [s]               x 3                 l = 1, d = 1
    half    [1,2,3]+10s, [1,2,3]+10s, [4,5,6]+10s l = 3, d = 0.5 (changes at pair 1)
    cart_a  [s], [s+50], [s+50]                   l = 1, d = 0.5 (changes at pair 0)
    cart_b  [s, 7], [s+60, 8], [s+60, 8]          l = 2, synchronised with cart_a (catalogue)
    cart_c  [], [s+1], [s+1]                      l = 2/3, synchronised with cart_a (data only)
    item    [row]                                 l = 1, d = 0
    """
    rows = []
    for s in range(SESSIONS):
        for i in range(S):
            rows.append(
                {
                    "session_id": 1000 + s,
                    "request_id": s * S + i,
                    "ts": 10 * (s * S + i),
                    "label": 0.0,
                    "static": [s, s + 100, s + 200],
                    "static2": [s],
                    "half": [x + 10 * s for x in ([1, 2, 3] if i < 2 else [4, 5, 6])],
                    "cart_a": [s] if i == 0 else [s + 50],
                    "cart_b": [s, 7] if i == 0 else [s + 60, 8],
                    "cart_c": [] if i == 0 else [s + 1],
                    "item": [s * S + i],
                }
            )
    if shuffled:
        order = np.random.default_rng(0).permutation(len(rows))
        rows = [rows[i] for i in order]
    return pa.Table.from_pylist(rows, schema=CATALOGUE.arrow_schema())


def write(root: Path, table: pa.Table, *, hour: str = "00", row_group_rows: int = 5) -> Path:
    """``table`` as the committed partition 2026-11-01 ``hour`` of the table at ``root``."""
    directory = root / "ds=2026-11-01" / f"hour={hour}"
    directory.mkdir(parents=True)
    pq.write_table(table, directory / "part-0000.parquet", row_group_size=row_group_rows)
    (directory / "_SUCCESS").touch()
    return root


def test_analytic_example_of_the_paper() -> None:
    kw = {"batch_size": 3, "mean_length": 3.0, "samples_per_session": 3.0, "unchanged": 0.5}
    assert dedupe_len(**kw) == 6.0  # type: ignore[arg-type]
    assert dedupe_factor(**kw) == 1.5  # type: ignore[arg-type]
    # No duplication (d = 0) gives factor 1; a static feature gives factor S.
    assert (
        dedupe_factor(batch_size=8, mean_length=2.0, samples_per_session=4.0, unchanged=0.0) == 1.0
    )
    assert (
        dedupe_factor(batch_size=8, mean_length=2.0, samples_per_session=4.0, unchanged=1.0) == 4.0
    )


def test_adjacent_unchanged_compares_whole_lists() -> None:
    rows = [[1, 2], [1, 2], [1, 3], [], [], [5], [5, 5], [5, 5]]
    offsets = np.r_[0, np.cumsum([len(r) for r in rows])]
    col = JaggedColumn(
        offsets=offsets, values=np.array([x for r in rows for x in r], dtype=np.int64)
    )
    assert adjacent_unchanged(col).tolist() == [True, False, False, True, False, False, True]


def test_measures_s_d_l_and_factors_on_a_hand_built_table(tmp_path: Path) -> None:
    a = analyze_table(write(tmp_path, hand_table()), batch_size=3)
    assert a.clustered and a.rows == 12 and a.sessions == 4 and a.samples_per_session == 3.0
    f = {r.name: r for r in a.features}
    assert (f["static"].mean_length, f["static"].unchanged) == (3.0, 1.0)
    assert (f["half"].mean_length, f["half"].unchanged) == (3.0, 0.5)
    assert (f["item"].mean_length, f["item"].unchanged) == (1.0, 0.0)
    assert f["cart_c"].mean_length == pytest.approx(2 / 3)
    # The paper's example, analytic and measured: batches of B = 3 are the sessions.
    assert f["half"].dedupe_len == 6.0 and f["half"].dedupe_factor == 1.5
    assert f["half"].values == 36 and f["half"].values_after_dedup == 24
    assert f["half"].measured_factor == 1.5
    assert f["static"].measured_factor == 3.0 and f["static"].dedupe_factor == 3.0
    assert f["item"].measured_factor == 1.0 and f["item"].dedupe_factor == 1.0
    # B = 6 (two sessions per batch): same factors, the model does not depend on B here.
    b6 = {r.name: r for r in analyze_table(tmp_path, batch_size=6).features}
    assert b6["half"].measured_factor == 1.5 and b6["half"].dedupe_len == 12.0


def test_proposal_groups_catalogue_and_data_synchronised_features(tmp_path: Path) -> None:
    a = analyze_table(write(tmp_path, hand_table()), batch_size=3, threshold=1.4)
    groups = {tuple(g.features): g for g in a.groups}
    assert set(groups) == {("static", "static2"), ("half",), ("cart_a", "cart_b", "cart_c")}
    assert groups[("static", "static2")].source == "data"
    assert groups[("cart_a", "cart_b", "cart_c")].source == "catalogue+data"
    assert groups[("half",)].source == "single"
    # The cart group deduplicated as one: 3 rows -> 2 distinct per session, like each member.
    assert groups[("cart_a", "cart_b", "cart_c")].measured_factor == pytest.approx(
        (12 + 24 + 8) / (8 + 16 + 4)
    )
    synced = {tuple(p.features) for p in a.synchronised_pairs}
    assert ("cart_a", "cart_c") in synced and ("half", "cart_a") not in synced
    assert a.dedup_sparse_features == [
        ["static", "static2"],
        ["half"],
        ["cart_a", "cart_b", "cart_c"],
    ]
    # The default threshold 1.5 is strict: features at exactly 1.5 are not proposed.
    default = analyze_table(tmp_path, batch_size=3)
    assert default.dedup_sparse_features == [["static", "static2"], ["cart_c"]]


def test_propose_groups_without_data_evidence() -> None:
    groups = propose_groups(["a", "b", "c"], {"a": "g", "b": "g", "c": None}, [])
    assert groups == [(["a", "b"], "catalogue"), (["c"], "single")]
    # A catalogue group member below the threshold is simply left out.
    assert propose_groups(["a"], {"a": "g", "b": "g"}, [("a", "b")]) == [(["a"], "single")]


def test_unclustered_table_is_reported_and_sorted_for_d(tmp_path: Path) -> None:
    a = analyze_table(write(tmp_path, hand_table(shuffled=True)), batch_size=3)
    assert not a.clustered
    f = {r.name: r for r in a.features}
    assert f["half"].unchanged == 0.5 and f["static"].unchanged == 1.0
    assert a.samples_per_session == 3.0
    assert f["static"].measured_factor < 3.0  # shuffled rows: fewer duplicates per batch


def test_cli_prints_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(tmp_path / "t", hand_table())
    parser = argparse.ArgumentParser(prog="recd")
    sub = parser.add_subparsers(dest="command", required=True)
    analyze_cli.register(sub)
    out = tmp_path / "analysis.json"
    argv = ["analyze", str(tmp_path / "t"), "--batch-size", "3", "--threshold", "1.4"]
    argv.append("--factor-only")  # the paper's rule; the cost model has its own tests
    args = parser.parse_args([*argv, "--json", str(out)])
    assert args.func(args) == 0
    text = capsys.readouterr().out
    assert "S = 3.00" in text and "half" in text
    proposal = [["static", "static2"], ["half"], ["cart_a", "cart_b", "cart_c"]]
    assert f"dedup_sparse_features = {json.dumps(proposal)}" in text
    data = json.loads(out.read_text())
    assert data["dedup_sparse_features"] == proposal
    half = next(r for r in data["features"] if r["name"] == "half")
    assert half["dedupe_len"] == 6.0 and half["measured_factor"] == 1.5


def test_bad_options_are_config_errors(tmp_path: Path) -> None:
    write(tmp_path, hand_table())
    with pytest.raises(ConfigError, match="batch_size must be >= 1, got 0"):
        analyze_table(tmp_path, batch_size=0)
    with pytest.raises(ConfigError, match="no committed rows"):
        analyze_table(tmp_path, start="2027-01-01")
