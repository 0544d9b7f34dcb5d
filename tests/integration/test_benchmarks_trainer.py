"""benchmarks/trainer.py end to end at toy size (real tables, real child processes, both
profiles), plus its helpers (the batch-size search, the held-out partitions, the seeded round
order, medians with failed runs, per-round ratios, the compute-mix attribution)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from benchmarks.trainer import (
    CONFIGS,
    MIX_CATEGORIES,
    Bench,
    attribute_mix,
    choose_holdout,
    instrument,
    main,
    parse_args,
    round_orders,
    round_ratios,
    search_max_batch,
    summarise,
)


def test_search_doubles_then_bisects_to_the_granularity() -> None:
    probed: list[int] = []

    def peak_of(batch: int) -> int:
        probed.append(batch)
        return 100 + batch

    best, probes = search_max_batch(1024, 100 + 5000, peak_of, granularity=512, max_batch=16384)
    assert best == 4608
    assert probed == [2048, 4096, 8192, 6144, 5120, 4608]
    assert [p["fits"] for p in probes] == [True, True, False, False, False, True]


def test_search_stops_at_the_cap_and_keeps_the_base_when_nothing_larger_fits() -> None:
    best, probes = search_max_batch(1024, 10**9, lambda b: b, granularity=512, max_batch=3072)
    assert best == 3072
    assert [p["batch_size"] for p in probes] == [2048, 3072]
    best, probes = search_max_batch(1024, 1024, lambda b: b, granularity=512, max_batch=8192)
    assert best == 1024
    assert [p["batch_size"] for p in probes] == [2048, 1536]


def test_holdout_takes_the_fewest_latest_partitions() -> None:
    parts = [("2026-11-01/00", 50), ("2026-11-01/01", 30), ("2026-11-01/02", 15), ("x/03", 5)]
    assert choose_holdout(parts, 0.1) == ("2026-11-01/02", 20, 80)
    assert choose_holdout(parts, 0.01) == ("x/03", 5, 95)
    # Never everything: at least one partition stays for training.
    assert choose_holdout(parts, 0.99) == ("2026-11-01/01", 50, 50)
    with pytest.raises(ValueError, match="at least 2 partitions"):
        choose_holdout(parts[:1], 0.1)


def test_round_orders_are_seeded_permutations() -> None:
    names = list(CONFIGS)
    orders = round_orders(names, 5, "1-rm1-like")
    assert len(orders) == 5
    assert all(sorted(order) == sorted(names) for order in orders)
    assert orders == round_orders(names, 5, "1-rm1-like")
    assert len({tuple(o) for o in orders}) > 1  # not one fixed order
    assert orders != round_orders(names, 5, "1-clickstream")


def _run(steps_s: list[float], peak: int = 100) -> dict[str, Any]:
    return {
        "step_s": steps_s,
        "step_cpu_s": [2 * s for s in steps_s],
        "peak_rss_bytes": peak,
        "peak_bytes": peak,
        "rss_ready_bytes": peak,
        "peak_cuda_bytes": None,
        "losses": [0.5],
        "threads": 1,
    }


def test_summarise_takes_the_median_of_runs_and_counts_failures() -> None:
    runs: list[dict[str, Any] | None] = [
        _run([0.1, 0.2, 0.3]),
        None,
        _run([0.4, 0.4]),
        _run([0.05, 0.1, 0.5], peak=300),
    ]
    s = summarise(runs, 100)
    assert (s["runs"], s["failed_runs"]) == (3, 1)
    # Per run: 100 / median step = 500, 250, 1000 samples/s.
    assert s["samples_per_s_spread"]["values"] == pytest.approx([500, 250, 1000])
    assert s["samples_per_s"] == pytest.approx(500)
    assert (s["samples_per_s_spread"]["min"], s["samples_per_s_spread"]["max"]) == (
        pytest.approx(250),
        pytest.approx(1000),
    )
    assert s["samples_per_cpu_s"] == pytest.approx(250)
    assert s["peak_bytes"] == 100
    failed = summarise([None, None], 100)
    assert failed["samples_per_s"] is None and failed["failed_runs"] == 2


def test_round_ratios_pair_runs_of_a_round_and_skip_failed_rounds() -> None:
    runs: dict[str, list[dict[str, Any] | None]] = {
        "kjt": [_run([1.0]), _run([2.0]), _run([1.0])],
        "ikjt_groups": [_run([0.5]), _run([0.5]), None],
    }
    configs = {
        "kjt": summarise(runs["kjt"], 10),
        "ikjt_groups": summarise(runs["ikjt_groups"], 10),
    }
    r = round_ratios(runs, configs, "ikjt_groups", "samples_per_s")
    assert r["per_round"] == pytest.approx([2.0, 4.0])
    assert (r["min"], r["max"], r["rounds_compared"]) == (pytest.approx(2.0), pytest.approx(4.0), 2)
    # Ratio of medians: median(20, 20) / median(10, 5, 10).
    assert r["ratio_of_medians"] == pytest.approx(2.0)


def test_rounds_keep_a_failed_run_in_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = Bench(parse_args(["--quick"]), tmp_path, "rm1-like")
    calls: list[tuple[str, int]] = []

    def step(name: str, batch_size: int, **kwargs: Any) -> dict[str, Any] | None:
        calls.append((name, kwargs["round"]))
        return None if (name, kwargs["round"]) == ("ikjt_groups", 1) else _run([0.1])

    monkeypatch.setattr(bench, "step", step)
    orders = round_orders(list(CONFIGS), 3, "x")
    runs, log = bench.rounds(dict.fromkeys(CONFIGS, 256), orders)
    assert calls == [(name, i) for i, order in enumerate(orders) for name in order]
    assert runs["ikjt_groups"][1] is None and len(runs["ikjt_groups"]) == 3
    assert [e["ok"] for e in log].count(False) == 1
    s = summarise(runs["ikjt_groups"], 256)
    assert (s["runs"], s["failed_runs"]) == (2, 1)
    ratio = round_ratios(
        runs, {n: summarise(runs[n], 256) for n in CONFIGS}, "ikjt_groups", "samples_per_s"
    )
    assert ratio["rounds_compared"] == 2


@pytest.mark.slow
def test_a_failing_child_is_recorded_not_raised(tmp_path: Path) -> None:
    bench = Bench(parse_args(["--quick"]), tmp_path, "rm1-like")
    spec = {"profile": "rm1-like", "batch_dir": str(tmp_path / "missing")}
    assert bench.child("step", "kjt", spec, round=0) is None
    (failure,) = bench.failures
    assert failure["kind"] == "step" and failure["config"] == "kjt" and failure["round"] == 0
    assert "Traceback" in failure["error"]


class _Toy(nn.Module):
    """Parts named like models.DLRM's: the attribution finds them by name."""

    def __init__(self) -> None:
        super().__init__()
        self.dense_arch = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        self.inter_arch = nn.Linear(64, 64)
        self.over_arch = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.over_arch(torch.tanh(self.inter_arch(self.dense_arch(x))))


def test_attribute_mix_splits_forward_and_backward_time_by_part() -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    model = _Toy()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    instrument(model)
    # Large enough that every op lasts well over the profiler's 1 us resolution.
    x, y = torch.randn(4096, 64), torch.rand(4096, 1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with record_function("mix::step"):
                with record_function("mix::optimizer"):
                    opt.zero_grad()
                logits = model(x)
                with record_function("mix::loss"):
                    loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
                with record_function("mix::backward"):
                    loss.backward()
                with record_function("mix::optimizer"):
                    opt.step()
    events = prof.events()
    mix = attribute_mix(events)
    assert set(mix) == set(MIX_CATEGORIES)
    step_us = sum(e.time_range.elapsed_us() for e in events if e.name == "mix::step")
    total_us = sum(sum(phases.values()) for phases in mix.values())
    assert total_us == pytest.approx(step_us, rel=1e-6)
    # The MLP's backward (its matmuls, ReLU, gradient accumulation) is found by sequence_nr.
    assert mix["mlps"]["forward"] > 0 and mix["mlps"]["backward"] > 0
    assert mix["interaction"]["backward"] > 0
    assert mix["loss"]["forward"] > 0 and mix["loss"]["backward"] > 0
    assert mix["optimizer"]["update"] > 0 and mix["optimizer"]["backward"] == 0
    assert mix["other"]["backward"] >= 0
    assert mix["transformers"] == {"forward": 0.0, "backward": 0.0, "update": 0.0}


@pytest.mark.slow
def test_quick_run_writes_results(tmp_path: Path) -> None:
    out = tmp_path / "results"
    argv = [
        "--quick",
        "--rows", "3000",
        "--shards", "2",
        "--batch-size", "64",
        "--embedding-dim", "8",
        "--max-rows", "1000",
        "--seq-len", "16",
        "--ff-dim", "16",
        "--warmup-steps", "1",
        "--steps", "2",
        "--max-batch-factor", "2",
        "--dist-steps", "1",
        "--train-steps", "4",
        "--work-dir", str(tmp_path / "work"),
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    r = json.loads((out / "trainer_quick.json").read_text())
    for key in (
        "speedup_ikjt",
        "speedup_ikjt_range",
        "speedup_ikjt_groups",
        "speedup_ikjt_groups_range",
        "speedup_max_batch",
        "speedup_max_batch_range",
        "max_batch_ratio",
        "ne_clustered",
        "ne_unclustered",
        "samples_per_s",
        "samples_per_s_range",
        "peak_rss_bytes",
        "batch_sizes",
        "threads",
        "ratios",
        "compute_mix",
        "protocol",
        "failed_runs",
        "command",
    ):
        assert key in r, key
    assert r["profile"] == "rm1-like"
    assert r["command"].startswith("python benchmarks/trainer.py --quick")
    assert r["threads"] == 1
    assert set(r["profiles"]) == {"clickstream"}
    click = r["profiles"]["clickstream"]
    assert click["profile"] == "clickstream"
    for p in (r, click):
        check_profile(p)
    # rm1-like's long synchronised histories really are deduplicated on the clustered table.
    assert all(f > 1.0 for f in r["dedup_factor_sequence_groups"].values())
    # The clickstream model: two unsynchronised histories, one transformer each.
    assert click["model"]["sequence_groups"] == [["history_items"], ["history_event_types"]]
    assert click["model"]["seq_len"] == 16  # min(--seq-len, the longest history: 20)
    acc = r["accuracy"]
    assert acc["clustered"]["steps"] == acc["unclustered"]["steps"] == acc["steps"] == 4
    assert acc["clustered"]["eval_rows"] == acc["unclustered"]["eval_rows"] == acc["holdout_rows"]
    for ne in (r["ne_clustered"], r["ne_unclustered"]):
        assert math.isfinite(ne) and ne > 0
    assert "accuracy" not in click and "distributed" not in click
    dist = r["distributed"]
    if dist["measured"]:
        for c in dist["configs"].values():
            assert c["measured"], c
            assert c["samples_per_s"] > 0
            assert all(math.isfinite(x) for x in c["losses_rank0"])
    else:
        assert dist["reason"]
    md = (out / "trainer_quick.md").read_text()
    assert md.startswith("Command: `python benchmarks/")
    assert not md.startswith("# ")
    assert "**clickstream**" in md and "Compute mix of clickstream" in md
    assert (out / "trainer_quick.png").stat().st_size > 1000


def check_profile(r: dict[str, Any]) -> None:
    """One profile's results: medians of 3 seeded rounds, ratios, search, compute mix."""
    assert set(r["samples_per_s"]) == set(CONFIGS)
    assert all(v > 0 for v in r["samples_per_s"].values())
    for name, (lo, hi) in r["samples_per_s_range"].items():
        assert lo <= r["samples_per_s"][name] <= hi
    assert all(v > 100 * 2**20 for v in r["peak_rss_bytes"].values())  # torch alone is more
    sizes = r["batch_sizes"]
    assert sizes["kjt"] == sizes["ikjt_lookup"] == sizes["ikjt_groups"] == 64
    assert sizes["ikjt_groups_max_batch"] in (64, 96, 128)
    assert r["max_batch_ratio"] == sizes["ikjt_groups_max_batch"] / 64
    # Every configuration ran once per round, in a recorded order; none failed.
    protocol = r["protocol"]
    assert protocol["repetitions"] == 3 and len(protocol["order"]) == 3
    assert all(sorted(order) == sorted(CONFIGS) for order in protocol["order"])
    assert [(run["round"], run["config"]) for run in protocol["runs"]] == [
        (i, name) for i, order in enumerate(protocol["order"]) for name in order
    ]
    assert protocol["failed_runs"] == r["failed_runs"] == 0
    assert all(c["runs"] == 3 and c["failed_runs"] == 0 for c in r["configs"].values())
    assert protocol["batch_sizes"] == sizes
    assert protocol["rows_read_per_run"]["kjt"] == 64 * 3  # 1 warm-up + 2 timed steps
    assert protocol["rows_in_table"] == r["data"]["rows"]
    assert set(protocol["load_average_1min"]) == {"before", "after"}
    assert protocol["command"].startswith("python benchmarks/trainer.py --quick")
    # Headline = ratio of the medians; its range = min-max of the 3 per-round ratios.
    for key, name in (("speedup_ikjt", "ikjt_lookup"), ("speedup_ikjt_groups", "ikjt_groups")):
        assert r[key] == pytest.approx(r["samples_per_s"][name] / r["samples_per_s"]["kjt"])
        per_round = r["ratios"][key]["per_round"]
        assert len(per_round) == 3
        assert r[f"{key}_range"] == pytest.approx([min(per_round), max(per_round)])
    # The search kept the largest probe within the baseline's peak (or the base batch).
    search = r["search"]
    fitting = [p["batch_size"] for p in search["probes"] if p["fits"]]
    assert all(p["fits"] == (p["peak_bytes"] <= search["budget_bytes"]) for p in search["probes"])
    assert search["max_batch_size"] == max([64, *fitting])
    # Same batches, same initial weights: the IKJT paths train like the KJT path.
    for name in ("ikjt_lookup", "ikjt_groups"):
        assert r["configs"][name]["max_abs_loss_diff_vs_kjt"] < 1e-4
    # Rows really are deduplicated on the clustered table.
    assert r["dedup_factor_sequence_groups"]
    assert all(f >= 1.0 for f in r["dedup_factor_sequence_groups"].values())
    # Compute mix: both configurations, shares summing to 1, the parts the model has.
    mix = r["compute_mix"]
    assert set(mix["configs"]) == {"kjt", "ikjt_groups"}
    for c in mix["configs"].values():
        assert c["measured"]
        shares = {k: v["share"] for k, v in c["categories"].items()}
        assert set(shares) == set(MIX_CATEGORIES)
        assert sum(shares.values()) == pytest.approx(1.0)
        assert all(v >= 0 for v in shares.values())
        for part in ("embedding_ebc", "embedding_ec", "transformers", "mlps", "optimizer"):
            assert c["categories"][part]["total_ms"] > 0, part
        assert c["categories"]["transformers"]["backward_ms"] > 0
        # The categories partition the profiled steps' time (the mean step, timed outside).
        assert c["step_ms_attributed"] == pytest.approx(c["step_ms_profiled"], rel=0.2)
