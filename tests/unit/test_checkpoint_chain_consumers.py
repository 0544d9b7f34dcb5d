"""Every consumer of checkpoints takes a delta chain as "a checkpoint": listing, fallback,
retention (with the chain closure), remove/move/copy, export, fork, pivot, predict's
resolution, the dead rank's shard read, and ``recd ckpt inspect|verify|diff|materialize``."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

import recd.cli
from recd.checkpoint import (
    LOSS_FILE,
    RetentionPolicy,
    apply_retention,
    checkpoint_file,
    checkpoint_path,
    checkpoint_step,
    clean_stray_temp_files,
    copy_checkpoint,
    fork_run,
    list_checkpoints,
    materialize_checkpoint,
    move_checkpoint,
    newest_valid_checkpoint,
    read_any,
    read_checksum,
    read_loss_history,
    read_state,
    remove_checkpoint,
    validate_any,
    verify_checksum,
    write_checkpoint,
    write_layout,
    write_state,
)
from recd.checkpoint.delta import blocks_for, delta_filename, write_delta
from recd.checkpoint.export import export_checkpoint
from recd.checkpoint.format import ParamLayout
from recd.cli import ckpt as ckpt_cli
from recd.errors import CheckpointCorruptError, CheckpointError
from recd.recovery.rejoin import read_checkpoint_of_step
from recd.train.inference import resolve_checkpoint
from recd.train.pivot import prepare_pivot

LAYOUT = ParamLayout.from_named_arrays(
    [
        ("tables.a", np.zeros((30, 4), np.float32)),
        ("dense.w", np.zeros((3, 5), np.float32)),
        ("tables.b", np.zeros((10, 2), np.float32)),
        ("dense.b", np.zeros(5, np.float32)),
    ]
)
TABLES = {"tables.a": 30, "tables.b": 10}
DENSE = ("dense.w", "dense.b")


class Run:
    """A run directory written like a trainer with deltas would: each checkpoint a full file
    or a delta holding the rows touched since its parent (lazy Adam: only looked-up rows and
    the dense tensors change between checkpoints)."""

    def __init__(self, directory: Path, seed: int = 0) -> None:
        self.dir = directory
        self.rng = np.random.default_rng(seed)
        self.regions = [self.rng.standard_normal(LAYOUT.n_params).astype(np.float32)]
        self.regions += [self.rng.random(LAYOUT.n_params).astype(np.float32) for _ in range(2)]
        self.base: int | None = None
        self.parent: int | None = None
        self.touched: dict[str, list[np.ndarray]] = {}
        self.states: dict[int, list[np.ndarray]] = {}
        write_layout(directory, LAYOUT)

    def _train(self) -> None:
        for name, n_rows in TABLES.items():
            rows = self.rng.integers(0, n_rows, size=3)
            self.touched.setdefault(name, []).append(rows)
            width = LAYOUT.spec(name).numel // n_rows
            offset = LAYOUT.offset_of(name)
            for row in rows:
                for region in self.regions:
                    region[offset + row * width : offset + (row + 1) * width] += 0.25
        for name in DENSE:
            for region in self.regions:
                region[LAYOUT.slice_of(name)] *= 0.5

    def full(self, step: int) -> Path:
        self._train()
        path = write_checkpoint(checkpoint_path(self.dir, step), step, *self.regions, layout=LAYOUT)
        self.base = self.parent = step
        self.touched = {}
        self.states[step] = [r.copy() for r in self.regions]
        return path

    def delta(self, step: int) -> Path:
        self._train()
        assert self.base is not None and self.parent is not None
        touched = {name: np.concatenate(rows) for name, rows in self.touched.items()}
        path = write_delta(
            self.dir / delta_filename(step),
            step=step,
            parent=self.parent,
            base=self.base,
            n_params=LAYOUT.n_params,
            blocks=blocks_for(LAYOUT, touched, DENSE),
            regions=dict(zip(("weights", "adam_m", "adam_v"), self.regions, strict=True)),
        )
        self.parent = step
        self.touched = {}
        self.states[step] = [r.copy() for r in self.regions]
        return path

    def direct_full(self, step: int, directory: Path) -> Path:
        """The full checkpoint the run would have written at ``step``."""
        return write_checkpoint(
            checkpoint_path(directory, step), step, *self.states[step], layout=LAYOUT
        )


def _standard(directory: Path) -> Run:
    """Fulls at 0 and 40, deltas 10, 20, 30 onto 0 and 50, 60 onto 40."""
    run = Run(directory)
    run.full(0)
    for step in (10, 20, 30):
        run.delta(step)
    run.full(40)
    for step in (50, 60):
        run.delta(step)
    return run


def _truncate(path: Path, by: int = 5) -> None:
    path.write_bytes(path.read_bytes()[:-by])


def _flip_last_byte(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 0x40]))


def _steps(paths: list[Path]) -> list[int]:
    return [int(checkpoint_step(p) or 0) for p in paths]


# ----------------------------------------------------------------------------- atomic


def test_listing_takes_both_kinds_and_prefers_the_full_file_of_a_step(tmp_path: Path) -> None:
    run = _standard(tmp_path)
    assert _steps(list_checkpoints(tmp_path)) == [0, 10, 20, 30, 40, 50, 60]
    assert [p.suffix for p in list_checkpoints(tmp_path)] == [".bin"] + [".delta"] * 3 + [
        ".bin",
        ".delta",
        ".delta",
    ]
    run.direct_full(30, tmp_path)  # a full file of a step that has a delta too
    listed = list_checkpoints(tmp_path)
    assert tmp_path / "step_000030.bin" in listed and tmp_path / "step_000030.delta" not in listed
    assert checkpoint_file(tmp_path, 30) == tmp_path / "step_000030.bin"
    assert checkpoint_file(tmp_path, 50) == tmp_path / "step_000050.delta"
    assert checkpoint_file(tmp_path, 55) is None
    assert checkpoint_step(tmp_path / "step_000050.delta") == 50
    assert checkpoint_step(tmp_path / "step_000050.bin.crc32") is None


def test_newest_valid_falls_back_past_a_torn_delta(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _standard(tmp_path)
    _truncate(tmp_path / delta_filename(60))
    with caplog.at_level(logging.WARNING, logger="recd.checkpoint.atomic"):
        assert newest_valid_checkpoint(tmp_path, LAYOUT) == tmp_path / delta_filename(50)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "step_000060.delta" in warnings[0].getMessage()


def test_a_damaged_link_invalidates_every_delta_after_it(tmp_path: Path) -> None:
    _standard(tmp_path)
    (tmp_path / delta_filename(50)).unlink()  # 60's chain loses a link
    _flip_last_byte(tmp_path / delta_filename(20))  # 20 and 30 fail their CRC
    assert newest_valid_checkpoint(tmp_path, LAYOUT) == checkpoint_path(tmp_path, 40)
    checkpoint_path(tmp_path, 40).unlink()
    assert newest_valid_checkpoint(tmp_path, LAYOUT) == tmp_path / delta_filename(10)
    # the CRCs are checked only with verify (a resume reading the bytes checks them itself)
    assert newest_valid_checkpoint(tmp_path, LAYOUT, verify=False) == tmp_path / delta_filename(30)


def test_a_damaged_base_sidecar_invalidates_its_deltas(tmp_path: Path) -> None:
    run = Run(tmp_path)
    run.full(0)
    run.delta(10)
    _flip_last_byte(checkpoint_path(tmp_path, 0))  # the base's bytes fail their sidecar
    with pytest.raises(CheckpointCorruptError, match="none of 2 checkpoints is valid"):
        newest_valid_checkpoint(tmp_path, LAYOUT)


def test_remove_move_and_copy_a_delta(tmp_path: Path) -> None:
    _standard(tmp_path)
    delta = tmp_path / delta_filename(30)
    # copy: verified against the CRC in its header, no sidecar
    checksum, sha = copy_checkpoint(delta, tmp_path / "copy" / delta.name, layout=LAYOUT)
    assert checksum is None and sha == hashlib.sha256(delta.read_bytes()).hexdigest()
    assert (tmp_path / "copy" / delta.name).read_bytes() == delta.read_bytes()
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == [delta.name]
    with pytest.raises(CheckpointCorruptError, match="cannot be copied as"):
        copy_checkpoint(delta, tmp_path / "copy2" / delta_filename(31))
    _flip_last_byte(tmp_path / delta_filename(20))
    with pytest.raises(CheckpointCorruptError, match="checksum"):
        copy_checkpoint(tmp_path / delta_filename(20), tmp_path / "copy3" / delta_filename(20))
    assert list((tmp_path / "copy3").iterdir()) == []  # nothing left behind
    # move: the delta alone
    (tmp_path / "moved").mkdir()
    moved = move_checkpoint(delta, tmp_path / "moved")
    assert moved == tmp_path / "moved" / delta.name and not delta.exists()
    # remove: the delta only, never its chain or another checkpoint's sidecar
    assert remove_checkpoint(tmp_path / delta_filename(50))
    assert not remove_checkpoint(tmp_path / delta_filename(50))
    assert checkpoint_path(tmp_path, 40).exists() and read_checksum(checkpoint_path(tmp_path, 40))


def test_clean_stray_temp_files_removes_a_torn_delta_write(tmp_path: Path) -> None:
    _standard(tmp_path)
    torn = tmp_path / ".step_000070.delta.tmp-1234"
    torn.write_bytes(b"RECDDLT1")
    orphan = tmp_path / "step_000050.bin.crc32"  # a sidecar for a step that has only a delta
    orphan.write_text("{}")
    assert clean_stray_temp_files(tmp_path) == sorted([torn, orphan])
    assert _steps(list_checkpoints(tmp_path)) == [0, 10, 20, 30, 40, 50, 60]


def test_materialized_chain_is_the_full_checkpoint_byte_for_byte(tmp_path: Path) -> None:
    run = _standard(tmp_path / "run")
    made = materialize_checkpoint(
        tmp_path / "run" / delta_filename(60), tmp_path / "made" / "step_000060.bin", layout=LAYOUT
    )
    direct = run.direct_full(60, tmp_path / "direct")
    assert made.read_bytes() == direct.read_bytes()
    assert verify_checksum(made) == "ok"
    assert read_checksum(made) == read_checksum(direct)


# ----------------------------------------------------------------------------- retention


def _state_entries(directory: Path, steps: list[int]) -> None:
    entries = {str(s): {"step": s} for s in steps}
    write_state(directory, {"format": "recd-train-state", "checkpoints": entries})


@pytest.mark.parametrize(
    ("keep_every", "kept"),
    [
        (0, [40, 50, 60]),
        (10, [0, 40, 50, 60]),  # every 100 steps: 0
        (2, [0, 10, 20, 40, 50, 60]),  # every 20 steps: 0, 20 (its chain: 0, 10), 40, 60
    ],
)
def test_retention_keeps_every_file_a_kept_chain_needs(
    tmp_path: Path, keep_every: int, kept: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = _standard(tmp_path)
    _state_entries(tmp_path, [0, 10, 20, 30, 40, 50, 60])
    order: list[Path] = []

    def remove(path: Path) -> bool:
        order.append(path)
        return remove_checkpoint(path)

    monkeypatch.setattr("recd.checkpoint.retention.remove_checkpoint", remove)
    policy = RetentionPolicy(keep_last=2, keep_every=keep_every, checkpoint_every=10)
    deleted = apply_retention(tmp_path, policy, layout=LAYOUT)
    assert _steps(list_checkpoints(tmp_path)) == kept
    gone = sorted(set(range(0, 70, 10)) - set(kept))
    assert _steps(deleted) == gone
    assert _steps(order) == gone[::-1]  # newest first: a delta before the links it needs
    for path in list_checkpoints(tmp_path):  # no delta is left with a broken chain
        ckpt = read_any(path, LAYOUT)
        assert all(
            np.array_equal(got, want)
            for got, want in zip(
                (ckpt.weights, ckpt.adam_m, ckpt.adam_v), run.states[ckpt.step], strict=True
            )
        )
    assert not list(tmp_path.glob("*.crc32")) or all(
        (tmp_path / p.name.removesuffix(".crc32")).exists() for p in tmp_path.glob("*.crc32")
    )
    state = read_state(tmp_path)
    assert state is not None and sorted(int(s) for s in state["checkpoints"]) == kept


def test_retention_protects_the_newest_valid_chain(tmp_path: Path) -> None:
    _standard(tmp_path)
    _truncate(tmp_path / delta_filename(60))
    apply_retention(tmp_path, RetentionPolicy(keep_last=1, keep_every=0), layout=LAYOUT)
    # 60 is the newest (kept by the policy), 50 the newest valid: with its base 40
    assert _steps(list_checkpoints(tmp_path)) == [40, 50, 60]
    assert newest_valid_checkpoint(tmp_path, LAYOUT) == tmp_path / delta_filename(50)


def test_retention_keeps_what_an_unresolvable_chain_might_need(tmp_path: Path) -> None:
    _standard(tmp_path)
    (tmp_path / delta_filename(50)).unlink()  # 60's chain cannot be resolved
    apply_retention(tmp_path, RetentionPolicy(keep_last=1, keep_every=0), layout=LAYOUT)
    # 60 is kept and with it everything from its base (40) up: nothing it might need goes
    assert _steps(list_checkpoints(tmp_path)) == [40, 60]


def test_retention_deletes_a_shadowed_delta_with_its_full_file(tmp_path: Path) -> None:
    run = _standard(tmp_path)
    run.direct_full(20, tmp_path)  # step 20 has both files; 30's chain runs through the delta
    apply_retention(tmp_path, RetentionPolicy(keep_last=1, keep_every=0), layout=LAYOUT)
    names = sorted(p.name for p in tmp_path.glob("step_*"))
    assert names == [
        "step_000040.bin",
        "step_000040.bin.crc32",
        "step_000050.delta",
        "step_000060.delta",
    ]


# ----------------------------------------------------------------------------- readers


def test_export_of_a_delta_is_the_state_its_chain_restores(tmp_path: Path) -> None:
    run = _standard(tmp_path / "run")
    out = export_checkpoint(
        tmp_path / "run" / delta_filename(30), tmp_path / "d.pt", LAYOUT, with_optimizer=True
    )
    direct = run.direct_full(30, tmp_path / "direct")
    export_checkpoint(direct, tmp_path / "f.pt", LAYOUT, with_optimizer=True)
    got, want = torch.load(tmp_path / "d.pt"), torch.load(tmp_path / "f.pt")
    assert out.step == 30 and got["step"] == want["step"] == 30
    for part in ("model", "adam_m", "adam_v"):
        assert all(torch.equal(got[part][k], want[part][k]) for k in want[part])
    _truncate(tmp_path / "run" / delta_filename(20))
    with pytest.raises(CheckpointCorruptError, match=r"step_000020\.delta"):
        export_checkpoint(tmp_path / "run" / delta_filename(30), tmp_path / "x.pt", LAYOUT)


def test_fork_of_a_delta_materialises_a_full_file(tmp_path: Path) -> None:
    run = _standard(tmp_path / "run")
    result = fork_run(tmp_path / "run" / delta_filename(50), tmp_path / "branch")
    branch = tmp_path / "branch"
    assert sorted(p.name for p in branch.glob("step_*")) == [
        "step_000050.bin",
        "step_000050.bin.crc32",
    ]
    direct = run.direct_full(50, tmp_path / "direct")
    assert result.checkpoint.read_bytes() == direct.read_bytes()
    assert verify_checksum(result.checkpoint) == "ok"
    assert result.step == 50 and result.chain == [
        "step_000040.bin",
        "step_000050.delta",
    ]
    assert result.sha256 == hashlib.sha256(direct.read_bytes()).hexdigest()
    origin = read_state(branch)["fork_origin"]  # type: ignore[index]
    assert origin["chain"] == result.chain and origin["sha256"] == result.sha256
    assert read_loss_history(branch).events[0]["at_step"] == 50
    (tmp_path / "run" / delta_filename(50)).write_bytes(b"")  # torn: nothing created
    with pytest.raises(CheckpointCorruptError):
        fork_run(tmp_path / "run" / delta_filename(60), tmp_path / "branch2")
    assert not (tmp_path / "branch2").exists()


def test_predict_resolves_a_run_directory_to_its_newest_valid_chain(tmp_path: Path) -> None:
    _standard(tmp_path)
    assert resolve_checkpoint(tmp_path) == tmp_path / delta_filename(60)
    assert resolve_checkpoint(tmp_path / delta_filename(20)) == tmp_path / delta_filename(20)
    _truncate(tmp_path / delta_filename(60))
    assert resolve_checkpoint(tmp_path) == tmp_path / delta_filename(50)


def test_the_dead_ranks_shard_comes_from_the_checkpoint_of_the_step(tmp_path: Path) -> None:
    run = _standard(tmp_path)
    for step in (40, 60):
        ckpt = read_checkpoint_of_step(tmp_path, step, LAYOUT)
        assert ckpt.step == step and np.array_equal(ckpt.adam_v, run.states[step][2])
    _flip_last_byte(tmp_path / delta_filename(50))
    with pytest.raises(CheckpointCorruptError, match=r"step_000050\.delta"):
        read_checkpoint_of_step(tmp_path, 60, LAYOUT)
    with pytest.raises(CheckpointCorruptError, match="no such checkpoint"):
        read_checkpoint_of_step(tmp_path, 70, LAYOUT)


def test_pivot_from_a_delta_materialises_it_and_archives_the_newer_ones(tmp_path: Path) -> None:
    run = _standard(tmp_path / "run")
    directory = tmp_path / "run"
    run.direct_full(60, directory)  # a newer step with both files: both are archived
    result = prepare_pivot(directory, from_checkpoint=20, layout=LAYOUT)
    assert result.step == 20 and result.checkpoint == checkpoint_path(directory, 20)
    direct = run.direct_full(20, tmp_path / "direct")
    assert result.checkpoint.read_bytes() == direct.read_bytes()
    assert not (directory / delta_filename(20)).exists()
    assert _steps(list_checkpoints(directory)) == [0, 10, 20]
    assert sorted(p.name for p in result.archive.glob("step_*")) == [
        "step_000030.delta",
        "step_000040.bin",
        "step_000040.bin.crc32",
        "step_000050.delta",
        "step_000060.bin",
        "step_000060.bin.crc32",
        "step_000060.delta",
    ]
    assert newest_valid_checkpoint(directory, LAYOUT) == checkpoint_path(directory, 20)
    branch = read_loss_history(directory).events[-1]
    assert branch["checkpoint"] == "step_000020.bin"
    assert branch["materialized_from"] == "step_000020.delta"
    assert (directory / LOSS_FILE).exists()


# ----------------------------------------------------------------------------- the CLI


def _recd(*argv: str) -> int:
    return recd.cli.main(list(argv))


def test_ckpt_materialize_writes_the_full_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _standard(tmp_path / "run")
    direct = run.direct_full(60, tmp_path / "direct")
    out = tmp_path / "out" / "step_000060.bin"
    assert (
        _recd("ckpt", "materialize", str(tmp_path / "run" / delta_filename(60)), "--out", str(out))
        == 0
    )
    captured = capsys.readouterr()
    assert "step_000040.bin + 2 delta(s)" in captured.err
    assert "materialized" in captured.out and str(out) in captured.out
    assert out.read_bytes() == direct.read_bytes()
    assert verify_checksum(out) == "ok"
    # a run directory: --step, or its newest valid checkpoint
    other = tmp_path / "step30.bin"
    assert (
        _recd("ckpt", "materialize", str(tmp_path / "run"), "--step", "30", "--out", str(other))
        == 0
    )
    assert other.read_bytes() == run.direct_full(30, tmp_path / "d30").read_bytes()
    capsys.readouterr()
    newest = tmp_path / "newest.bin"
    assert _recd("ckpt", "materialize", str(tmp_path / "run"), "--out", str(newest), "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 60 and report["chain"] == [
        "step_000040.bin",
        "step_000050.delta",
        "step_000060.delta",
    ]
    assert newest.read_bytes() == direct.read_bytes()


def test_ckpt_materialize_refuses_bad_input_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _standard(tmp_path / "run")
    run_dir = tmp_path / "run"
    out = tmp_path / "out.bin"
    _truncate(run_dir / delta_filename(50))
    assert _recd("ckpt", "materialize", str(run_dir / delta_filename(60)), "--out", str(out)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "step_000050.delta" in err and not out.exists()
    assert _recd("ckpt", "materialize", str(run_dir), "--step", "55", "--out", str(out)) == 2
    assert "no checkpoint of step 55" in capsys.readouterr().err
    assert _recd("ckpt", "materialize", str(tmp_path / "nowhere"), "--out", str(out)) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    out.write_bytes(b"x")
    assert _recd("ckpt", "materialize", str(run_dir / delta_filename(30)), "--out", str(out)) == 2
    assert "already exists" in capsys.readouterr().err and out.read_bytes() == b"x"
    assert (
        _recd(
            "ckpt",
            "materialize",
            str(run_dir / delta_filename(30)),
            "--out",
            str(out),
            "--overwrite",
        )
        == 0
    )
    capsys.readouterr()
    assert _recd("ckpt", "materialize", str(run_dir / delta_filename(30)), "--step", "20",
                 "--out", str(tmp_path / "o2.bin")) == 2  # fmt: skip
    assert "not --step 20" in capsys.readouterr().err


def test_ckpt_materialize_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _recd("ckpt", "materialize", "--help")
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "RUN_DIR_OR_DELTA" in text and "--step" in text and "--out FILE.bin" in text


def test_ckpt_inspect_verify_and_diff_take_a_delta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _standard(tmp_path / "run")
    run_dir = tmp_path / "run"
    delta = run_dir / delta_filename(60)
    report = ckpt_cli.inspect_checkpoint(str(delta))
    assert report["step"] == 60 and report["size_bytes"] == delta.stat().st_size
    chain = report["chain"]
    assert chain["base"] == "step_000040.bin" and chain["base_checksum"] == "ok"
    assert [link["file"] for link in chain["links"]] == ["step_000050.delta", "step_000060.delta"]
    assert [link["parent"] for link in chain["links"]] == [40, 50]
    assert all(link["crc"] == "ok" for link in chain["links"])
    assert chain["size_bytes"] == sum(
        (run_dir / n).stat().st_size
        for n in ("step_000040.bin", *(x["file"] for x in chain["links"]))
    )
    assert report["checksum"].startswith("ok")
    assert ckpt_cli.inspect_checkpoint(str(checkpoint_path(run_dir, 40)))["chain"] is None
    assert _recd("ckpt", "inspect", str(delta)) == 0
    text = capsys.readouterr().out
    assert "chain: base step_000040.bin" in text and "step_000050.delta" in text

    reports = ckpt_cli.verify_checkpoints([str(run_dir)])
    assert [r["ok"] for r in reports] == [True] * 7
    assert reports[0]["chain"] == ["step_000040.bin", "step_000050.delta", "step_000060.delta"]
    _flip_last_byte(run_dir / delta_filename(50))
    bad = {r["path"]: r for r in ckpt_cli.verify_checkpoints([str(run_dir)])}
    for step in (50, 60):
        r = bad[str(run_dir / delta_filename(step))]
        assert not r["ok"] and r["checksum"] == "mismatch" and "step_000050.delta" in r["error"]
    assert bad[str(checkpoint_path(run_dir, 40))]["ok"]
    inspected = ckpt_cli.inspect_checkpoint(str(delta))  # shown, not refused
    assert inspected["checksum"] == "MISMATCH in step_000050.delta"
    assert _recd("ckpt", "verify", str(delta)) == 1
    capsys.readouterr()

    direct = run.direct_full(30, tmp_path / "direct")
    diff = ckpt_cli.diff_checkpoints(str(run_dir / delta_filename(30)), str(direct))
    assert diff["bitwise_identical"] and diff["chain_a"][0] == "step_000000.bin"
    assert diff["chain_b"] is None
    other = ckpt_cli.diff_checkpoints(str(run_dir / delta_filename(20)), str(direct))
    assert not other["bitwise_identical"]


def test_validate_any_reports_the_chains_final_step(tmp_path: Path) -> None:
    _standard(tmp_path)
    header = validate_any(tmp_path / delta_filename(30), LAYOUT, verify=True)
    assert header.step == 30
    with pytest.raises(CheckpointError):
        validate_any(tmp_path / delta_filename(70), LAYOUT)
