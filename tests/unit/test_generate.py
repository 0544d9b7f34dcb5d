"""The synthetic log generator: statistics match the catalogue, structure, determinism, CLI."""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from recd.analyze import TableAnalysis, analyze_rows, dedupe_factor
from recd.cli import logs_generate
from recd.errors import ConfigError
from recd.logs.generate import (
    FLUSH_INTERVAL_S,
    BoundedZipf,
    GenerateReport,
    candidate_counts,
    generate_logs,
    lomax_sizes,
    solve_lomax_scale,
)
from recd.logs.rawlog import iter_raw_log, list_segments, read_catalogue
from recd.schema import Catalogue, SparseKind, load_catalogue

STATS_SESSIONS = 2500  # ~15k rows of the tiny catalogue: enough for tight statistics


def _read(directory: Path) -> pa.Table:
    return pa.Table.from_batches([batch for _, _, batch in iter_raw_log(directory)])


@pytest.fixture(scope="module")
def big_tiny(tmp_path_factory: pytest.TempPathFactory, tiny_catalogue: Catalogue) -> pa.Table:
    out = tmp_path_factory.mktemp("raw") / "tiny"
    generate_logs(tiny_catalogue, out, seed=11, num_sessions=STATS_SESSIONS, show_progress=False)
    return _read(out)


def _sessions_in_order(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """Row order clustered by (session_id, ts), and the session id of each row in that order."""
    session = table.column("session_id").to_numpy()
    order = np.lexsort((table.column("ts").to_numpy(), session))
    return order, session[order]


def _lists(table: pa.Table, name: str, order: np.ndarray) -> list[list[int]]:
    return table.column(name).take(pa.array(order)).to_pylist()


def test_schema_and_reserved_columns(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    report = generate_logs(tiny_catalogue, tmp_path / "raw", seed=1, show_progress=False)
    table = _read(tmp_path / "raw")
    assert table.schema.equals(tiny_catalogue.arrow_schema().remove_metadata())
    assert read_catalogue(tmp_path / "raw") == tiny_catalogue
    assert report.rows == table.num_rows > tiny_catalogue.sessions.num_sessions
    assert report.sessions == tiny_catalogue.sessions.num_sessions
    assert report.segments == 1 and report.raw_bytes > 0
    session = table.column("session_id").to_numpy()
    assert len(np.unique(session)) == tiny_catalogue.sessions.num_sessions
    assert (session > 0).all() and not np.all(np.diff(np.unique(session)) == 1)
    request = table.column("request_id").to_numpy()
    assert len(np.unique(request)) == len(request)
    ts = table.column("ts").to_numpy()
    window_start_ms = 1_793_491_200_000  # 2026-11-01T00:00:00Z, the profile's start
    assert ts.min() >= window_start_ms
    starts = [ts[session == s].min() for s in np.unique(session)]
    assert max(starts) < window_start_ms + tiny_catalogue.sessions.duration_s * 1000
    for name in table.column_names:
        assert table.column(name).null_count == 0, name


def test_measured_statistics_match_catalogue(big_tiny: pa.Table, tiny_catalogue: Catalogue) -> None:
    analysis = analyze_rows(big_tiny, catalogue=tiny_catalogue, batch_size=2048)
    assert isinstance(analysis, TableAnalysis)
    assert analysis.sessions == STATS_SESSIONS
    assert analysis.samples_per_session == pytest.approx(
        tiny_catalogue.sessions.mean_samples, rel=0.05
    )
    measured = {f.name: f for f in analysis.features}
    for f in tiny_catalogue.sparse:
        got = measured[f.name]
        assert got.unchanged == pytest.approx(f.unchanged_prob, abs=0.02), f.name
        assert got.mean_length == pytest.approx(f.mean_length, rel=0.06), f.name
        expected_df = dedupe_factor(
            batch_size=2048,
            mean_length=f.mean_length,
            samples_per_session=tiny_catalogue.sessions.mean_samples,
            unchanged=f.unchanged_prob,
        )
        assert got.dedupe_factor == pytest.approx(expected_df, rel=0.08), f.name
    label = big_tiny.column("label").to_numpy()
    assert label.mean() == pytest.approx(tiny_catalogue.sessions.label_rate, abs=0.02)


def test_analysis_of_generated_rows_agrees_with_plain_python(
    big_tiny: pa.Table, tiny_catalogue: Catalogue
) -> None:
    table = big_tiny.slice(0, 3000)
    analysis = analyze_rows(table, catalogue=tiny_catalogue, batch_size=256)
    measured = {f.name: f for f in analysis.features}
    order, session = _sessions_in_order(table)
    same = session[1:] == session[:-1]
    for f in tiny_catalogue.sparse:
        rows = _lists(table, f.name, order)
        unchanged = [rows[i] == rows[i + 1] for i in range(len(rows) - 1)]
        d = sum(u for u, s in zip(unchanged, same, strict=True) if s) / same.sum()
        ids = sum(len(r) for r in rows)
        distinct = 0
        for start in range(0, len(rows), 256):
            distinct += sum(len(r) for r in {tuple(r) for r in rows[start : start + 256]})
        got = measured[f.name]
        assert got.unchanged == pytest.approx(d, abs=1e-12)
        assert got.mean_length == pytest.approx(ids / len(rows))
        assert got.measured_factor == pytest.approx(ids / distinct)


def test_session_sizes_are_heavy_tailed_with_the_configured_mean() -> None:
    for mean, shape, cap in ((6.0, 1.8, 200), (25.0, 1.8, 2000), (3.0, 2.5, 50)):
        scale = solve_lomax_scale(mean, shape, cap)
        sizes = lomax_sizes((np.arange(100_000) + 0.5) / 100_000, shape, scale, cap)
        assert sizes.mean() == pytest.approx(mean, rel=0.01)
        assert sizes.min() == 1 and sizes.max() <= cap
        assert np.median(sizes) < mean  # mass in the tail: median well below the mean


def test_ids_within_cardinality(big_tiny: pa.Table, tiny_catalogue: Catalogue) -> None:
    for f in tiny_catalogue.sparse:
        values = big_tiny.column(f.name).combine_chunks().flatten().to_numpy()
        assert values.min() >= 0 and values.max() < f.cardinality, f.name
        # Zipf: the most frequent id is far more frequent than a uniform id would be
        counts = np.bincount(values)
        assert counts.max() > 5 * len(values) / f.cardinality, f.name


def test_group_changes_on_identical_rows(big_tiny: pa.Table, tiny_catalogue: Catalogue) -> None:
    (members,) = tiny_catalogue.groups().values()
    order, session = _sessions_in_order(big_tiny)
    same = session[1:] == session[:-1]
    lists = {name: _lists(big_tiny, name, order) for name in members}
    changes = []
    for rows in lists.values():
        changes.append(np.array([rows[i] != rows[i + 1] for i in range(len(rows) - 1)]) & same)
    assert changes[0].any()
    for other in changes[1:]:
        assert np.array_equal(changes[0], other)
    item, seller = lists["cart_item_ids"], lists["cart_seller_ids"]
    assert [len(r) for r in item] == [len(r) for r in seller]
    # the seller of an item is a function of the item (synchronised appends)
    pairs = {
        (i, s) for ri, rs in zip(item, seller, strict=True) for i, s in zip(ri, rs, strict=True)
    }
    assert len({i for i, _ in pairs}) == len(pairs)


def test_history_features_are_append_only(big_tiny: pa.Table, tiny_catalogue: Catalogue) -> None:
    order, session = _sessions_in_order(big_tiny)
    histories = [f for f in tiny_catalogue.sparse if f.kind is SparseKind.HISTORY]
    assert histories
    for f in histories:
        rows = _lists(big_tiny, f.name, order)
        assert max(len(r) for r in rows) == f.max_length
        appended = 0
        for i in range(1, len(rows)):
            if session[i] != session[i - 1] or rows[i] == rows[i - 1]:
                continue
            prev, cur = rows[i - 1], rows[i]
            new = next(
                (k for k in range(1, len(cur) + 1) if (prev + cur[-k:])[-f.max_length :] == cur),
                None,
            )
            assert new is not None, (f.name, prev, cur)
            appended += 1
        assert appended > 100


def test_static_and_item_kinds(big_tiny: pa.Table, tiny_catalogue: Catalogue) -> None:
    order, session = _sessions_in_order(big_tiny)
    same = session[1:] == session[:-1]
    country = _lists(big_tiny, "user_country", order)
    assert all(country[i] == country[i + 1] for i in np.flatnonzero(same))
    item = _lists(big_tiny, "item_id", order)
    assert all(item[i] != item[i + 1] for i in np.flatnonzero(same))


def test_arrival_order_interleaves_sessions(big_tiny: pa.Table, tiny_catalogue: Catalogue) -> None:
    session = big_tiny.column("session_id").to_numpy()
    ts = big_tiny.column("ts").to_numpy()
    # a real log bus: consecutive rows rarely come from the same session...
    assert (session[1:] == session[:-1]).mean() < 0.2
    # ...many sessions are in flight at once (spans in arrival position overlap)...
    _, first = np.unique(session, return_index=True)
    _, last_rev = np.unique(session[::-1], return_index=True)
    last = len(session) - 1 - last_rev
    active = np.zeros(len(session) + 1, dtype=np.int64)
    np.add.at(active, first, 1)
    np.add.at(active, last + 1, -1)
    assert np.cumsum(active).max() >= 20
    # ...and the log is only roughly time-ordered: not sorted, but never later than a
    # server flush plus the delivery delay behind the newest row seen so far
    assert (np.diff(ts) < 0).any()
    lag_ms = np.maximum.accumulate(ts) - ts
    assert lag_ms.max() < 1.5 * FLUSH_INTERVAL_S * 1000


def test_label_is_learnable(big_tiny: pa.Table) -> None:
    """Rows whose item id is popular (frequent) are more often positive: AUC > 0.5."""
    item = big_tiny.column("item_id").combine_chunks().flatten().to_numpy()
    label = big_tiny.column("label").to_numpy()
    popularity = np.bincount(item)[item].astype(np.float64)
    ranks = np.argsort(np.argsort(popularity + 1e-9 * np.arange(len(item))))
    pos = label == 1
    auc = (ranks[pos].sum() - pos.sum() * (pos.sum() - 1) / 2) / (pos.sum() * (~pos).sum())
    assert auc > 0.6


def test_deterministic_for_a_seed(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    reports: list[GenerateReport] = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        reports.append(
            generate_logs(
                tiny_catalogue,
                tmp_path / name,
                seed=seed,
                num_sessions=300,
                segment_rows=500,
                show_progress=False,
            )
        )
    a, b, c = (list_segments(tmp_path / n) for n in "abc")
    assert len(a) == reports[0].segments > 1
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]
    assert reports[0].raw_bytes == sum(p.stat().st_size for p in a)


def test_small_chunks_carry_every_row_once(
    tmp_path: Path, tiny_catalogue: Catalogue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small chunks exercise the carry-over merge: every row lands once, in arrival order."""
    import recd.logs.generate as generate

    generate_logs(tiny_catalogue, tmp_path / "one", seed=3, num_sessions=400, show_progress=False)
    monkeypatch.setattr(generate, "CHUNK_ROWS", 60)  # ~10 sessions per chunk
    generate_logs(tiny_catalogue, tmp_path / "many", seed=3, num_sessions=400, show_progress=False)
    one, many = _read(tmp_path / "one"), _read(tmp_path / "many")
    assert one.num_rows == many.num_rows
    request = many.column("request_id").to_numpy()
    assert np.array_equal(np.sort(one.column("request_id").to_numpy()), np.sort(request))
    assert len(np.unique(request)) == len(request)
    ts = many.column("ts").to_numpy()
    assert (np.maximum.accumulate(ts) - ts).max() < 1.5 * FLUSH_INTERVAL_S * 1000


def test_rows_target_scales_sessions(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    report = generate_logs(tiny_catalogue, tmp_path / "raw", seed=2, rows=3000, show_progress=False)
    assert report.sessions == 500
    assert report.rows == pytest.approx(3000, rel=0.15)


def test_refuses_to_overwrite_unless_asked(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    out = tmp_path / "raw"
    generate_logs(
        tiny_catalogue, out, seed=1, num_sessions=200, segment_rows=100, show_progress=False
    )
    before = len(list_segments(out))
    with pytest.raises(ConfigError, match="--overwrite"):
        generate_logs(tiny_catalogue, out, seed=1, show_progress=False)
    report = generate_logs(
        tiny_catalogue, out, seed=1, num_sessions=20, overwrite=True, show_progress=False
    )
    assert before > report.segments == len(list_segments(out))
    assert _read(out).num_rows == report.rows


def test_bad_configurations_are_reported(tmp_path: Path, tiny_catalogue: Catalogue) -> None:
    sparse = [
        dataclasses.replace(f, mean_length=5.0) if f.name == "cart_seller_ids" else f
        for f in tiny_catalogue.sparse
    ]
    bad_group = dataclasses.replace(tiny_catalogue, sparse=sparse)
    with pytest.raises(ConfigError, match=r"cart_seller_ids.*mean_length"):
        generate_logs(bad_group, tmp_path / "a", seed=1, show_progress=False)
    with pytest.raises(ConfigError, match="not both"):
        generate_logs(tiny_catalogue, tmp_path / "b", seed=1, num_sessions=5, rows=5)
    sessions = dataclasses.replace(tiny_catalogue.sessions, start="yesterday")
    with pytest.raises(ConfigError, match=r"sessions\.start"):
        generate_logs(
            dataclasses.replace(tiny_catalogue, sessions=sessions), tmp_path / "c", seed=1
        )


def _cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="recd logs")
    logs_generate.register(parser.add_subparsers(dest="verb", required=True))
    return parser


def test_cli_generates_and_prints_a_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = _cli_parser().parse_args(
        [
            *("generate", "--profile", "tiny", "--out", str(tmp_path / "raw")),
            *("--seed", "4", "--sessions", "50", "--segment-rows", "100"),
        ]
    )
    assert args.func(args) == 0
    line = capsys.readouterr().out.strip()
    rows = _read(tmp_path / "raw").num_rows
    assert line.startswith(f"generated {rows:,} rows in 50 sessions (tiny, seed 4)")
    assert f"{len(list_segments(tmp_path / 'raw'))} segments" in line


def test_cli_help_and_argument_errors(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _cli_parser()
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["generate", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for option in ("--profile", "--catalogue", "--out", "--seed", "--sessions", "--rows"):
        assert option in text
    assert "rm1-like" in text and "examples:" in text
    for bad in (
        ["generate", "--out", "x"],  # no catalogue
        ["generate", "--profile", "tiny", "--catalogue", "a.toml", "--out", "x"],
        ["generate", "--profile", "tiny", "--out", "x", "--sessions", "0"],
        ["generate", "--profile", "tiny", "--out", "x", "--sessions", "3", "--rows", "9"],
    ):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(bad)
        assert exc.value.code == 2


@pytest.mark.parametrize(
    ("cardinality", "exponent"), [(2_000_000, 1.1), (300, 1.5), (40_000, 1.05)]
)
def test_bounded_zipf_matches_exact_probabilities(cardinality: int, exponent: float) -> None:
    zipf = BoundedZipf(cardinality, exponent)
    weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -exponent
    assert zipf.total == pytest.approx(weights.sum(), rel=1e-9)
    n = 400_000
    ranks = zipf.ranks(np.random.default_rng(0).random(n))
    assert ranks.min() >= 0 and ranks.max() < cardinality
    edges = np.unique(np.geomspace(1, cardinality + 1, 25).astype(np.int64)) - 1
    observed = np.histogram(ranks, bins=edges)[0] / n
    cumulative = np.concatenate([[0.0], np.cumsum(weights / weights.sum())])
    expected = cumulative[edges[1:]] - cumulative[edges[:-1]]
    assert np.abs(observed - expected).max() < 5 * np.sqrt(0.25 / n)


def test_unusual_catalogues(tmp_path: Path) -> None:
    """Item groups with a follower, sparse lists shorter than one id on average, cardinality
    1, a static feature that does change, and single-sample sessions all work."""
    catalogue = Catalogue.from_dict(
        {
            "name": "odd",
            "labels": ["click", "buy"],
            "sessions": {"num_sessions": 300, "mean_samples": 4.0, "servers": 1},
            "sparse": [
                {"name": "ad", "kind": "item", "group": "ad", "cardinality": 7},
                {"name": "advertiser", "kind": "item", "group": "ad", "cardinality": 3},
                {"name": "maybe", "kind": "item", "mean_length": 0.3, "cardinality": 50},
                {"name": "one", "kind": "static", "unchanged_prob": 1.0, "cardinality": 1},
                {"name": "mood", "kind": "static", "unchanged_prob": 0.5, "cardinality": 1000},
            ],
        }
    )
    generate_logs(catalogue, tmp_path / "odd", seed=0, show_progress=False)
    table = _read(tmp_path / "odd")
    measured = {f.name: f for f in analyze_rows(table, catalogue=catalogue).features}
    assert measured["maybe"].mean_length == pytest.approx(0.3, abs=0.05)
    assert measured["one"].unchanged == 1.0
    assert measured["mood"].unchanged == pytest.approx(0.5, abs=0.06)
    assert measured["ad"].unchanged == 0.0
    ad = table.column("ad").to_pylist()
    advertiser = table.column("advertiser").to_pylist()
    assert {(a[0], b[0]) for a, b in zip(ad, advertiser, strict=True)} <= {
        (a, b) for a in range(7) for b in range(3)
    }
    assert len({a[0] for a in ad}) == len(
        {(a[0], b[0]) for a, b in zip(ad, advertiser, strict=True)}
    )
    for name in ("click", "buy"):
        assert 0.0 < table.column(name).to_numpy().mean() < 0.3

    single = Catalogue.from_dict(
        {"name": "single", "sessions": {"num_sessions": 50, "mean_samples": 1.0, "max_samples": 1}}
    )
    report = generate_logs(single, tmp_path / "single", seed=0, show_progress=False)
    assert report.rows == 50


# ---------------------------------------------------------------------------------------------
# Impression logs: one row per candidate item of a request

IMPRESSION_CATALOGUE: dict[str, Any] = {
    "name": "imp",
    "labels": ["click", "book"],
    "sessions": {
        "num_sessions": 300,
        "mean_samples": 24.0,  # 3 requests of 8 candidates
        "candidates_per_request": 8.0,
        "max_candidates": 10,
        "max_samples": 400,
        "servers": 4,
        "duration_s": 3600,
        "label_rate": 0.1,
    },
    "dense": [
        {"name": "user_score", "unchanged_prob": 0.5, "scale": 3.0},
        {"name": "price", "kind": "candidate", "scale": 100.0},
        {"name": "pos", "kind": "position"},
    ],
    "sparse": [
        {"name": "country", "kind": "static", "unchanged_prob": 1.0, "cardinality": 40},
        {"name": "query", "kind": "static", "unchanged_prob": 0.3, "cardinality": 500},
        {"name": "hist_items", "kind": "history", "group": "hist", "mean_length": 4.0,
         "max_length": 8, "unchanged_prob": 0.3, "cardinality": 2000},
        {"name": "hist_types", "kind": "history", "group": "hist", "mean_length": 4.0,
         "max_length": 8, "unchanged_prob": 0.3, "cardinality": 5},
        {"name": "item", "kind": "item", "group": "item", "cardinality": 3000},
        {"name": "hotel_chain", "kind": "item", "group": "item", "cardinality": 50},
    ],
}  # fmt: skip


def _impression_catalogue(**sessions: float) -> Catalogue:
    data = dict(IMPRESSION_CATALOGUE)
    data["sessions"] = {**IMPRESSION_CATALOGUE["sessions"], **sessions}
    return Catalogue.from_dict(data)


def _request_runs(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """First row and row count of every run of equal request_id in the raw log's order."""
    request = table.column("request_id").to_numpy()
    starts = np.flatnonzero(np.concatenate([[True], request[1:] != request[:-1]]))
    return starts, np.diff(np.append(starts, len(request)))


def _same_as_previous(table: pa.Table, name: str) -> np.ndarray:
    """(R - 1,) bool: row i + 1 of column ``name`` equals row i."""
    values = table.column(name).to_pylist()
    return np.array([a == b for a, b in itertools.pairwise(values)])


@pytest.fixture(scope="module")
def impressions(tmp_path_factory: pytest.TempPathFactory) -> pa.Table:
    out = tmp_path_factory.mktemp("raw") / "imp"
    generate_logs(_impression_catalogue(), out, seed=4, show_progress=False)
    return _read(out)


def test_impression_rows_of_a_request_are_consecutive_and_share_its_features(
    impressions: pa.Table,
) -> None:
    catalogue = _impression_catalogue()
    starts, counts = _request_runs(impressions)
    assert len(starts) == len(np.unique(impressions.column("request_id").to_numpy()))
    assert counts.min() >= 1 and counts.max() == catalogue.sessions.max_candidates
    assert counts.mean() == pytest.approx(catalogue.sessions.candidates_per_request, rel=0.05)
    # a full list with p = 2 * 8 / 10 - 1 = 0.6, else uniform on 1..9
    assert (counts == 10).mean() == pytest.approx(0.6, abs=0.05)
    assert np.isin(np.arange(1, 10), counts).all()

    inside = np.ones(impressions.num_rows - 1, dtype=bool)  # pairs of rows of one request
    inside[starts[1:] - 1] = False
    request_level = ["session_id", "ts", "user_score", "country", "query"]
    for name in [*request_level, "hist_items", "hist_types"]:
        assert _same_as_previous(impressions, name)[inside].all(), name
    expected_position = np.arange(impressions.num_rows) - np.repeat(starts, counts)
    assert np.array_equal(impressions.column("pos").to_numpy(), expected_position)
    # candidate-level features are fresh: items never repeat the previous candidate's
    assert not _same_as_previous(impressions, "item")[inside].any()
    assert _same_as_previous(impressions, "price")[inside].mean() < 0.01
    # ...and request-level ones do change between a session's requests
    session = impressions.column("session_id").to_numpy()
    order = np.lexsort((np.arange(len(session)), impressions.column("ts").to_numpy(), session))
    clustered = impressions.take(pa.array(order))
    next_request = np.flatnonzero(
        (session[order][1:] == session[order][:-1])
        & (
            clustered.column("request_id").to_numpy()[1:]
            != clustered.column("request_id").to_numpy()[:-1]
        )
    )
    for name, unchanged in (("country", 1.0), ("query", 0.3), ("user_score", 0.5)):
        same = _same_as_previous(clustered, name)[next_request].mean()
        assert same == pytest.approx(unchanged, abs=0.08), name


def test_impression_labels_one_click_per_request_at_the_label_rate(
    impressions: pa.Table,
) -> None:
    catalogue = _impression_catalogue()
    starts, _ = _request_runs(impressions)
    click = impressions.column("click").to_numpy()
    book = impressions.column("book").to_numpy()
    for label in (click, book):
        per_request = np.add.reduceat(label, starts)
        assert per_request.max() == 1.0
        assert label.mean() == pytest.approx(catalogue.sessions.label_rate, abs=0.01)
    assert not np.array_equal(click, book)  # independent draws
    # learnable: earlier positions and popular items are clicked more often
    position = impressions.column("pos").to_numpy().astype(np.int64)
    ctr = np.bincount(position, weights=click) / np.bincount(position)
    assert ctr[:3].mean() > 2 * ctr[-3:].mean()
    item = impressions.column("item").combine_chunks().flatten().to_numpy()
    seen = np.bincount(item)[item]
    head = seen >= np.quantile(seen, 0.8)
    assert click[head].mean() > 1.3 * click[~head].mean()


def test_impression_label_rate_is_met_at_one_click_per_request(tmp_path: Path) -> None:
    """The profile's shape: almost every request clicked once, the click rate ~ 1 / C."""
    catalogue = load_catalogue("impressions")
    generate_logs(catalogue, tmp_path / "raw", seed=1, num_sessions=1500, show_progress=False)
    table = _read(tmp_path / "raw")
    starts, counts = _request_runs(table)
    label = table.column("label").to_numpy()
    clicks = np.add.reduceat(label, starts)
    assert clicks.max() == 1.0 and clicks.mean() > 0.97
    assert label.mean() == pytest.approx(catalogue.sessions.label_rate, rel=0.03)
    assert counts.mean() == pytest.approx(catalogue.sessions.candidates_per_request, rel=0.03)
    sessions = len(np.unique(table.column("session_id").to_numpy()))
    assert len(starts) / sessions == pytest.approx(
        catalogue.sessions.mean_samples / catalogue.sessions.candidates_per_request, rel=0.1
    )


def test_candidate_counts_have_the_configured_mean() -> None:
    u = (np.arange(200_000) + 0.5) / 200_000
    for mean, cap in ((23.0, 25), (8.0, 10), (2.0, 10), (1.0, 7), (1.5, 2), (3.0, 3)):
        counts = candidate_counts(u, mean, cap)
        assert counts.mean() == pytest.approx(mean, rel=1e-3), (mean, cap)
        assert counts.min() >= 1 and counts.max() <= cap
    assert (candidate_counts(u, 23.0, 25) == 25).mean() == pytest.approx(2 * 23 / 25 - 1)


def test_impression_logs_are_deterministic_and_chunks_carry_every_row_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import recd.logs.generate as generate

    catalogue = _impression_catalogue(num_sessions=120)
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        generate_logs(catalogue, tmp_path / name, seed=seed, segment_rows=700, show_progress=False)
    a, b, c = (list_segments(tmp_path / n) for n in "abc")
    assert len(a) > 1
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert [p.read_bytes() for p in a] != [p.read_bytes() for p in c]

    monkeypatch.setattr(generate, "CHUNK_ROWS", 200)  # ~8 sessions per chunk
    generate_logs(catalogue, tmp_path / "many", seed=5, show_progress=False)
    one, many = _read(tmp_path / "a"), _read(tmp_path / "many")
    assert one.num_rows == many.num_rows
    request = many.column("request_id").to_numpy()
    assert np.array_equal(np.sort(one.column("request_id").to_numpy()), np.sort(request))
    starts, counts = _request_runs(many)
    assert len(starts) == len(np.unique(request))  # no request split across merges
    assert np.array_equal(
        many.column("pos").to_numpy(), np.arange(len(request)) - np.repeat(starts, counts)
    )
    ts = many.column("ts").to_numpy()
    assert (np.maximum.accumulate(ts) - ts).max() < 1.5 * FLUSH_INTERVAL_S * 1000


def test_one_row_per_request_ignores_max_candidates(
    tmp_path: Path, tiny_catalogue: Catalogue
) -> None:
    """candidates_per_request == 1 takes the plain path: the same bytes for any list cap."""
    sessions = dataclasses.replace(tiny_catalogue.sessions, max_candidates=25)
    wide = dataclasses.replace(tiny_catalogue, sessions=sessions)
    generate_logs(tiny_catalogue, tmp_path / "a", seed=3, show_progress=False)
    generate_logs(wide, tmp_path / "b", seed=3, show_progress=False)
    a, b = list_segments(tmp_path / "a"), list_segments(tmp_path / "b")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_bad_impression_configurations_are_reported(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"label_rate \(0\.2\).*1 / candidates_per_request = 0\.125"
    ) as exc:
        generate_logs(_impression_catalogue(label_rate=0.2), tmp_path / "a", seed=1)
    assert "\n" not in str(exc.value)
    with pytest.raises(
        ConfigError, match=r"candidates_per_request.*max_candidates = 10.*12"
    ) as exc:
        _impression_catalogue(candidates_per_request=12.0, mean_samples=30.0)
    assert "\n" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"max_samples // max_candidates \(2 requests\)"):
        generate_logs(_impression_catalogue(max_samples=29), tmp_path / "b", seed=1)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("repeat", [0.0, 0.6, 1.0])
def test_a_session_repeats_its_previous_candidate_list_at_the_configured_rate(
    tmp_path: Path, repeat: float
) -> None:
    """``repeat_list_prob``: a later request of a session shows the previous request's list
    (items, candidate values, count) with that probability; first requests never do."""
    catalogue = _impression_catalogue(repeat_list_prob=repeat)
    generate_logs(catalogue, tmp_path / "raw", seed=5, show_progress=False)
    table = _read(tmp_path / "raw")
    starts, sizes = _request_runs(table)
    session = table.column("session_id").to_numpy()[starts]
    ts = table.column("ts").to_numpy()[starts]
    item = table.column("item").to_pylist()
    chain = table.column("hotel_chain").to_pylist()
    price = table.column("price").to_numpy()
    lists = {
        (int(s), int(t)): (item[a : a + n], chain[a : a + n], price[a : a + n].tolist())
        for s, t, a, n in zip(session, ts, starts, sizes, strict=True)
    }
    by_session: dict[int, list[int]] = {}
    for s, t in sorted(lists):
        by_session.setdefault(s, []).append(t)
    later = [
        lists[s, t] == lists[s, before]
        for s, times in by_session.items()
        for before, t in itertools.pairwise(times)
    ]
    assert len(later) > 300
    if repeat == 0.0:
        assert not any(later)  # fresh lists are never equal by chance here
    elif repeat == 1.0:
        assert all(later)
    else:
        assert np.mean(later) == pytest.approx(repeat, abs=0.07)
    # every row belongs to exactly one request
    assert table.num_rows == sum(len(v[0]) for v in lists.values())
