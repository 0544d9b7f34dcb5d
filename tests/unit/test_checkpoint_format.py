"""The step_NNNNNN.bin format: golden bytes, size equation, corruption checks, atomic writes,
ranged (distributed) writes, fallback to the previous valid checkpoint, retention, and the
``recd ckpt inspect`` / ``recd ckpt diff`` commands."""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recd.checkpoint import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointTooLargeError,
    ParamLayout,
    ParamSpec,
    RetentionPolicy,
    apply_retention,
    apply_retention_in_background,
    checkpoint_filename,
    checkpoint_path,
    clean_stray_temp_files,
    commit,
    list_checkpoints,
    newest_valid_checkpoint,
    parse_checkpoint_step,
    preallocate,
    read_checkpoint,
    read_layout,
    write_checkpoint,
    write_layout,
    write_region_range,
)
from recd.checkpoint.format import pack_header
from recd.cli import ckpt as ckpt_cli
from recd.durable import temp_path_for

LAYOUT = ParamLayout(
    specs=(ParamSpec("emb.t0", (6, 4)), ParamSpec("mlp.w", (4, 3)), ParamSpec("mlp.b", (3,)))
)


def _state(layout: ParamLayout, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(layout.n_params).astype(np.float32)
    m = (rng.standard_normal(layout.n_params) * 0.01).astype(np.float32)
    v = np.abs(rng.standard_normal(layout.n_params) * 1e-4).astype(np.float32)
    return w, m, v


def _write(run: Path, step: int, seed: int = 0, layout: ParamLayout = LAYOUT) -> Path:
    return write_checkpoint(checkpoint_path(run, step), step, *_state(layout, seed), layout=layout)


# ----------------------------------------------------------------------------- golden layout


def test_golden_bytes_of_a_three_param_checkpoint(tmp_path: Path) -> None:
    weights = [1.0, -2.5, 3.25]
    adam_m = [0.5, 0.0, -0.125]
    adam_v = [1e-8, 2.0, 0.25]
    expected = (
        struct.pack("<ii", 7, 3)
        + struct.pack("<3f", *weights)
        + struct.pack("<3f", *adam_m)
        + struct.pack("<3f", *adam_v)
    )
    path = write_checkpoint(
        tmp_path / "step_000007.bin",
        7,
        np.array(weights, dtype=np.float32),
        np.array(adam_m, dtype=np.float32),
        np.array(adam_v, dtype=np.float32),
    )
    assert path.read_bytes() == expected
    assert len(expected) == 8 + 12 * 3
    ckpt = read_checkpoint(path)
    assert (ckpt.step, ckpt.n_params) == (7, 3)
    assert ckpt.weights.tolist() == weights and ckpt.adam_m.tolist() == adam_m
    assert ckpt.adam_v.tobytes() == struct.pack("<3f", *adam_v)


def test_file_names_pad_to_six_digits_and_widen() -> None:
    assert checkpoint_filename(7) == "step_000007.bin"
    assert checkpoint_filename(112_700) == "step_112700.bin"
    assert checkpoint_filename(1_234_567) == "step_1234567.bin"
    assert parse_checkpoint_step("step_1234567.bin") == 1_234_567
    for name in ("step_12.bin", ".step_000100.bin.tmp-12", "step_000100.bin.bak", "x.bin"):
        assert parse_checkpoint_step(name) is None


@settings(max_examples=20, deadline=None)
@given(n=st.integers(0, 3000), step=st.integers(0, 2**31 - 1))
def test_size_is_8_plus_12n_and_roundtrips(
    tmp_path_factory: pytest.TempPathFactory, n: int, step: int
) -> None:
    run = tmp_path_factory.mktemp("size")
    rng = np.random.default_rng(n)
    w, m, v = (rng.standard_normal(n).astype(np.float32) for _ in range(3))
    path = write_checkpoint(checkpoint_path(run, step), step, w, m, v)
    assert path.stat().st_size == 8 + 12 * n
    ckpt = read_checkpoint(path)
    assert ckpt.step == step and ckpt.n_params == n
    assert np.array_equal(ckpt.weights, w) and np.array_equal(ckpt.adam_m, m)
    assert np.array_equal(ckpt.adam_v, v)


def test_reader_maps_read_only_views_and_names_tensors(tmp_path: Path) -> None:
    w, m, v = _state(LAYOUT, 1)
    ckpt = read_checkpoint(_write(tmp_path, 100, seed=1), LAYOUT)
    assert isinstance(ckpt.weights.base, np.memmap) or isinstance(ckpt.weights, np.memmap)
    assert not ckpt.weights.flags.writeable
    assert ckpt.weights.dtype == np.dtype("<f4")
    tensors = ckpt.tensors("adam_m")
    assert list(tensors) == ["emb.t0", "mlp.w", "mlp.b"]
    assert tensors["mlp.w"].shape == (4, 3)
    assert np.array_equal(tensors["mlp.w"].reshape(-1), m[24:36])
    assert np.array_equal(ckpt.tensors()["emb.t0"], w[:24].reshape(6, 4))
    assert np.array_equal(ckpt.region("adam_v"), v)


def test_sources_can_be_per_tensor_iterables_and_torch_tensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    w, m, v = _state(LAYOUT, 2)
    one_shot = _write(tmp_path / "a", 5, seed=2)
    named_w = {n: torch.from_numpy(a.copy()) for n, a in LAYOUT.unflatten(w).items()}
    named_m = LAYOUT.unflatten(m)
    streamed = write_checkpoint(
        checkpoint_path(tmp_path / "b", 5),
        5,
        LAYOUT.iter_flat(named_w),
        LAYOUT.iter_flat(named_m.items()),
        torch.from_numpy(v),
        layout=LAYOUT,
    )
    assert streamed.read_bytes() == one_shot.read_bytes()


def test_iter_flat_rejects_wrong_names_and_shapes() -> None:
    w, _, _ = _state(LAYOUT, 0)
    named = LAYOUT.unflatten(w)
    with pytest.raises(ValueError, match="missing"):
        list(LAYOUT.iter_flat({k: v for k, v in named.items() if k != "mlp.b"}))
    with pytest.raises(ValueError, match=r"'mlp.w' has shape \(3, 4\)"):
        list(LAYOUT.iter_flat({**named, "mlp.w": named["mlp.w"].T}))


# ----------------------------------------------------------------------------- corruption


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return _write(tmp_path, 300, seed=3)


def _expect_corrupt(path: Path, match: str, layout: ParamLayout | None = None) -> None:
    with pytest.raises(CheckpointCorruptError, match=match) as info:
        read_checkpoint(path, layout)
    assert str(path) in str(info.value)


def test_truncated_by_one_byte_is_rejected(good: Path) -> None:
    os.truncate(good, good.stat().st_size - 1)
    _expect_corrupt(good, "not a recd checkpoint, or truncated")


def test_truncated_by_whole_params_is_called_truncated(good: Path) -> None:
    os.truncate(good, good.stat().st_size - 12)
    _expect_corrupt(good, "-12 bytes.*truncated")


def test_extra_byte_and_extra_params_are_rejected(good: Path) -> None:
    with open(good, "ab") as f:
        f.write(b"\0")
    _expect_corrupt(good, r"\+1 bytes")
    with open(good, "ab") as f:
        f.write(b"\0" * 11)
    _expect_corrupt(good, "extra bytes after the adam_v region")


def test_header_n_params_disagreeing_with_size_is_rejected(good: Path) -> None:
    with open(good, "r+b") as f:
        f.write(struct.pack("<ii", 300, LAYOUT.n_params + 1))
    _expect_corrupt(good, f"n_params={LAYOUT.n_params + 1}")


def test_header_disagreeing_with_the_layout_is_rejected(good: Path) -> None:
    other = ParamLayout(specs=(*LAYOUT.specs, ParamSpec("extra", (2,))))
    _expect_corrupt(good, "disagrees with the model layout", other)


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "step_000100.bin"
    path.touch()
    _expect_corrupt(path, "empty file")


def test_foreign_files_are_rejected(tmp_path: Path) -> None:
    text = tmp_path / "step_000100.bin"
    text.write_bytes(b"this is a text file, not a checkpoint at all\n")
    _expect_corrupt(text, "size .* requires|impossible header")
    png = tmp_path / "step_000200.bin"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    _expect_corrupt(png, "not a recd checkpoint")
    tiny = tmp_path / "step_000300.bin"
    tiny.write_bytes(b"abcde")
    _expect_corrupt(tiny, "shorter than the 8-byte header")


def test_negative_header_and_name_mismatch_are_rejected(tmp_path: Path, good: Path) -> None:
    neg = tmp_path / "neg.bin"
    neg.write_bytes(struct.pack("<ii", -1, 0))
    _expect_corrupt(neg, "impossible header")
    renamed = good.rename(tmp_path / "step_000400.bin")
    _expect_corrupt(renamed, "header says step 300 but the file name says step 400")


def test_more_than_int32_params_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointTooLargeError, match="2,147,483,648 parameters"):
        pack_header(0, 2**31)
    with pytest.raises(CheckpointTooLargeError, match="int32"):
        pack_header(2**31, 1)
    tmp = tmp_path / ".step_000001.bin.tmp-x"
    with pytest.raises(CheckpointTooLargeError):
        preallocate(tmp, 1, 2**31)
    assert not tmp.exists()
    huge = ParamLayout(specs=(ParamSpec("emb", (2**20, 2**11)),))
    tiny = np.zeros(1, dtype=np.float32)
    with pytest.raises(CheckpointTooLargeError):
        write_checkpoint(checkpoint_path(tmp_path, 1), 1, tiny, tiny, tiny, layout=huge)
    assert list(tmp_path.iterdir()) == []


def test_bad_input_never_replaces_the_existing_file(tmp_path: Path) -> None:
    path = _write(tmp_path, 100, seed=4)
    before = path.read_bytes()
    w, m, v = _state(LAYOUT, 5)
    with pytest.raises(ValueError, match="float32 only"):
        write_checkpoint(path, 100, w.astype(np.float64), m, v)
    with pytest.raises(ValueError, match="sizes differ"):
        write_checkpoint(path, 100, w, m[:-1], v)
    with pytest.raises(ValueError, match="region sizes"):
        write_checkpoint(path, 100, iter([w]), iter([m, m[:1]]), v, layout=LAYOUT)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_000100.bin",
        "step_000100.bin.crc32",
    ]


# ----------------------------------------------------------------------------- atomic + listing


def test_temp_names_never_look_like_checkpoints_and_are_cleaned(tmp_path: Path) -> None:
    final = checkpoint_path(tmp_path, 100)
    tmp = temp_path_for(final)
    assert tmp.parent == tmp_path and tmp.name == f".step_000100.bin.tmp-{os.getpid()}"
    assert parse_checkpoint_step(tmp.name) is None
    written = _write(tmp_path, 100)
    keep = [written, tmp_path / ".loss.json", tmp_path / "_layout.json"]
    for p in keep[1:]:
        p.write_text("{}\n")
    keep.append(tmp_path / "step_000100.bin.crc32")  # the checkpoint's checksum
    stray = [tmp, temp_path_for(tmp_path / ".state.json", "7"), temp_path_for(final, "job3-r0")]
    for p in stray:
        p.write_bytes(b"partial")
    assert clean_stray_temp_files(tmp_path) == sorted(stray)
    assert sorted(tmp_path.iterdir()) == sorted(keep)


def test_list_checkpoints_sorts_by_step_not_by_name(tmp_path: Path) -> None:
    for step in (1_000_000, 20, 100):
        _write(tmp_path, step)
    (tmp_path / "notes.txt").write_text("x")
    temp_path_for(checkpoint_path(tmp_path, 5)).write_bytes(b"")
    assert [parse_checkpoint_step(p.name) for p in list_checkpoints(tmp_path)] == [
        20,
        100,
        1_000_000,
    ]
    assert list_checkpoints(tmp_path / "missing") == []


def test_newest_valid_falls_back_to_the_previous_one_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert newest_valid_checkpoint(tmp_path, LAYOUT) is None
    for step in (100, 200, 300):
        _write(tmp_path, step)
    newest = checkpoint_path(tmp_path, 300)
    os.truncate(newest, 100)
    with caplog.at_level(logging.WARNING, logger="recd.checkpoint.atomic"):
        assert newest_valid_checkpoint(tmp_path, LAYOUT) == checkpoint_path(tmp_path, 200)
    assert "step_000300.bin" in caplog.text and "truncated" in caplog.text


def test_no_valid_checkpoint_at_all_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    for step in (100, 200):
        _write(tmp_path, step)
    other = ParamLayout(specs=(ParamSpec("w", (5,)),))
    with pytest.raises(CheckpointCorruptError, match="none of 2 checkpoints is valid"):
        newest_valid_checkpoint(tmp_path, other)


def test_layout_json_roundtrip_and_errors(tmp_path: Path) -> None:
    path = write_layout(tmp_path, LAYOUT)
    assert read_layout(tmp_path) == LAYOUT == read_layout(path)
    data = json.loads(path.read_text())
    assert [p["name"] for p in data["params"]] == LAYOUT.names
    assert [p["offset"] for p in data["params"]] == [0, 24, 36]
    path.write_text('{"params": [{"name": "x"}]}')
    with pytest.raises(CheckpointCorruptError, match="not a valid checkpoint layout"):
        read_layout(path)
    with pytest.raises(ValueError, match="appears twice"):
        ParamLayout(specs=(ParamSpec("a", (1,)), ParamSpec("a", (2,))))
    assert LAYOUT.offset_of("emb.t0", row=2) == 8 and LAYOUT.offset_of("mlp.w", row=1) == 27


# ----------------------------------------------------------------------------- ranged writes


def test_ranged_pwrites_assemble_the_same_bytes_as_a_one_shot_write(tmp_path: Path) -> None:
    w, m, v = _state(LAYOUT, 6)
    one_shot = _write(tmp_path / "one", 400, seed=6)
    final = checkpoint_path(tmp_path / "ranks", 400)
    final.parent.mkdir()
    tmp = preallocate(temp_path_for(final, "job1"), 400, LAYOUT.n_params)
    assert tmp.stat().st_size == 8 + 12 * LAYOUT.n_params
    # Two "ranks": the embedding table row-sharded (rows 0-2 / 3-5), the MLP on rank 1.
    emb, dim = LAYOUT.spec("emb.t0"), 4
    ranges = []
    for rows in ((0, 3), (3, 6)):
        start = LAYOUT.offset_of(emb.name, row=rows[0])
        ranges.append((start, start + (rows[1] - rows[0]) * dim))
    ranges.append((LAYOUT.offset_of("mlp.w"), LAYOUT.n_params))
    jobs = [(r, a, b) for r in ("weights", "adam_m", "adam_v") for a, b in ranges]
    random.Random(0).shuffle(jobs)
    data = {"weights": w, "adam_m": m, "adam_v": v}
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda j: write_region_range(tmp, j[0], j[1], data[j[0]][j[1] : j[2]]), jobs))
    assert commit(tmp, final) == final and not tmp.exists()
    assert final.read_bytes() == one_shot.read_bytes()


def test_ranged_writes_stay_inside_their_region_and_commit_checks(tmp_path: Path) -> None:
    tmp = preallocate(tmp_path / ".step_000010.bin.tmp-1", 10, 8)
    with pytest.raises(ValueError, match=r"adam_m range \[6, 9\) outside \[0, 8\)"):
        write_region_range(tmp, "adam_m", 6, np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="unknown checkpoint region"):
        write_region_range(tmp, "grads", 0, np.zeros(1, dtype=np.float32))
    with pytest.raises(CheckpointCorruptError, match="cannot be committed as"):
        commit(tmp, tmp_path / "step_000011.bin")
    os.truncate(tmp, 20)
    with pytest.raises(CheckpointCorruptError):
        commit(tmp, tmp_path / "step_000010.bin")
    assert not (tmp_path / "step_000010.bin").exists()


# ----------------------------------------------------------------------------- retention


def test_retention_keeps_newest_k_and_every_mth_by_step(tmp_path: Path) -> None:
    for step in range(0, 2600, 100):
        _write(tmp_path, step)
    (tmp_path / ".loss.json").write_text("")
    policy = RetentionPolicy(keep_last=3, keep_every=10, checkpoint_every=100)
    deleted = apply_retention(tmp_path, policy, layout=LAYOUT)
    kept = [parse_checkpoint_step(p.name) for p in list_checkpoints(tmp_path)]
    assert kept == [0, 1000, 2000, 2300, 2400, 2500]
    assert len(deleted) == 26 - 6 and (tmp_path / ".loss.json").exists()
    assert apply_retention(tmp_path, policy) == []  # stable: nothing more to delete


def test_retention_never_deletes_the_newest_valid_checkpoint(tmp_path: Path) -> None:
    for step in (100, 200, 300, 400):
        _write(tmp_path, step)
    for step in (300, 400):
        os.truncate(checkpoint_path(tmp_path, step), 3)
    apply_retention_in_background(tmp_path, RetentionPolicy(keep_last=2, keep_every=0)).join()
    kept = [parse_checkpoint_step(p.name) for p in list_checkpoints(tmp_path)]
    assert kept == [200, 300, 400]
    assert newest_valid_checkpoint(tmp_path) == checkpoint_path(tmp_path, 200)


def test_retention_policy_validates_its_fields() -> None:
    with pytest.raises(ValueError, match="keep_last"):
        RetentionPolicy(keep_last=0)


# ----------------------------------------------------------------------------- CLI


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="recd")
    ckpt_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    rc = args.func(args)
    return rc, capsys.readouterr().out


def test_inspect_reports_header_and_stats_per_region_and_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    w, m, v = _state(LAYOUT, 7)
    w[2], w[30] = np.nan, np.inf
    path = write_checkpoint(checkpoint_path(tmp_path, 500), 500, w, m, v)
    write_layout(tmp_path, LAYOUT)
    rc, out = _cli(["ckpt", "inspect", str(path), "--json"], capsys)
    report = json.loads(out)
    assert rc == 0 and report["step"] == 500 and report["n_params"] == 39
    assert report["size_bytes"] == 8 + 12 * 39
    weights = report["regions"]["weights"]
    finite = w[np.isfinite(w)].astype(np.float64)
    assert (weights["nan"], weights["inf"]) == (1, 1)
    assert weights["min"] == finite.min() and weights["max"] == finite.max()
    assert weights["mean"] == pytest.approx(finite.mean(), rel=1e-12)
    assert weights["std"] == pytest.approx(finite.std(), rel=1e-9)
    assert [t["name"] for t in report["tensors"]] == LAYOUT.names
    mlp_b = report["tensors"][2]
    assert mlp_b["offset"] == 36 and mlp_b["shape"] == [3]
    assert mlp_b["regions"]["adam_v"]["max"] == float(v[36:].max())
    assert report["tensors"][1]["regions"]["weights"]["inf"] == 1
    rc, text = _cli(["ckpt", "inspect", str(path)], capsys)
    assert "n_params  39" in text and "mlp.w" in text and "[24, 36)" in text


def test_inspect_without_layout_still_reports_regions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, 1)
    report = json.loads(_cli(["ckpt", "inspect", str(path), "--json"], capsys)[1])
    assert report["layout"] is None and report["tensors"] == []
    assert report["regions"]["adam_v"]["min"] >= 0


def test_diff_counts_differences_per_region_and_tensor(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_layout(tmp_path, LAYOUT)
    a = _write(tmp_path, 100, seed=8)
    w, m, v = _state(LAYOUT, 8)
    w[25] += 0.5
    m[0] = -0.0 if m[0] == 0 else m[0] * 2
    b = write_checkpoint(tmp_path / "b" / "step_000100.bin", 100, w, m, v)
    rc, out = _cli(["ckpt", "diff", str(a), str(a), "--json"], capsys)
    assert rc == 0 and json.loads(out)["bitwise_identical"] is True
    rc, out = _cli(["ckpt", "diff", str(a), str(b), "--json"], capsys)
    report = json.loads(out)
    assert rc == 1 and report["bitwise_identical"] is False
    assert report["regions"]["weights"]["differing"] == 1
    assert report["regions"]["weights"]["max_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert report["regions"]["adam_m"]["differing"] == 1
    assert report["regions"]["adam_v"]["bitwise_identical"] is True
    tensors = {t["name"]: t["regions"] for t in report["tensors"]}
    assert tensors["mlp.w"]["weights"]["differing"] == 1
    assert tensors["emb.t0"]["weights"]["bitwise_identical"] is True
    rc, text = _cli(["ckpt", "diff", str(a), str(b)], capsys)
    assert "bitwise identical (header and all regions): no" in text


def test_diff_of_different_models_is_a_clear_cli_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import recd.cli

    a = _write(tmp_path, 100)
    b = write_checkpoint(
        tmp_path / "other" / "step_000100.bin", 100, *(np.ones(5, np.float32),) * 3
    )
    monkeypatch.setattr(recd.cli, "COMMAND_MODULES", ("ckpt",))
    assert recd.cli.main(["ckpt", "diff", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert "different models" in err and "39 params" in err and "5 params" in err
    assert isinstance(CheckpointCorruptError("x"), CheckpointError)
