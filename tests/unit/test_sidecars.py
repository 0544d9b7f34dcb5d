"""Run-directory sidecars: append-only ``.loss.json`` (torn tail, replay, branches), atomic
``.samples.json`` / ``.state.json``, the pivot archive and ``recd fork``."""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from recd.checkpoint import (
    LOSS_FILE,
    SAMPLES_FILE,
    STATE_FILE,
    CheckpointCorruptError,
    CheckpointError,
    LossLog,
    ParamLayout,
    ParamSpec,
    RetentionPolicy,
    SidecarError,
    append_sample_audit,
    apply_retention,
    archive_policy_sidecars,
    checkpoint_path,
    drop_state_entries,
    fork_run,
    read_checkpoint,
    read_loss_history,
    read_samples,
    read_state,
    write_checkpoint,
    write_layout,
    write_samples,
    write_state,
)
from recd.cli import ckpt as ckpt_cli
from recd.durable import sha256_file


def _loss(step: int) -> float:
    """A float32 loss as a trainer would log it (float(tensor))."""
    return float(np.float32(1.0 / (1.0 + 0.01 * step)))


def _log_steps(run: Path, steps: range) -> None:
    with LossLog(run) as losses:
        for step in steps:
            assert losses.append(step, _loss(step), lr=0.001)


# ----------------------------------------------------------------------------- .loss.json


def test_loss_log_is_strict_json_lines_one_entry_per_step(tmp_path: Path) -> None:
    _log_steps(tmp_path, range(1, 6))
    with LossLog(tmp_path) as losses:
        losses.append(6, math.nan)
        losses.append(7, math.inf)
    lines = (tmp_path / LOSS_FILE).read_text().splitlines()
    records = [json.loads(line, parse_constant=pytest.fail) for line in lines]  # no NaN tokens
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6, 7]
    assert records[0] == {"step": 1, "loss": _loss(1), "lr": 0.001}
    assert records[5] == {"step": 6, "loss": None, "nonfinite": "NaN"}
    assert records[6] == {"step": 7, "loss": None, "nonfinite": "Infinity"}
    history = read_loss_history(tmp_path)
    assert history.steps.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert history.losses[1] == _loss(2) and math.isnan(history.losses[5])
    assert history.loss_at(7) == math.inf and history.records[0]["lr"] == 0.001


def test_the_common_record_is_the_bytes_json_dumps_would_write(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    losses = [0.0, -0.0, 5e-324, 1e300, -2.5, 0.1, 1e16, 123456789.0]
    losses += [float(np.float32(x)) for x in rng.lognormal(0.0, 3.0, 200)]
    with LossLog(tmp_path) as log:
        for step, loss in enumerate(losses, start=1):
            log.append(step, loss)
    expected = "".join(
        json.dumps({"step": step, "loss": loss}, separators=(",", ":")) + "\n"
        for step, loss in enumerate(losses, start=1)
    )
    assert (tmp_path / LOSS_FILE).read_text() == expected
    history = read_loss_history(tmp_path)
    assert [x.hex() for x in history.losses.tolist()] == [x.hex() for x in losses]


def test_reader_ignores_a_torn_last_line_and_writer_truncates_only_it(tmp_path: Path) -> None:
    _log_steps(tmp_path, range(1, 4))
    path = tmp_path / LOSS_FILE
    complete = path.read_bytes()
    path.write_bytes(complete + b'{"step":4,"lo')
    history = read_loss_history(tmp_path)
    assert history.steps.tolist() == [1, 2, 3] and history.torn_tail_bytes == 13
    assert path.read_bytes() == complete + b'{"step":4,"lo'  # the reader modified nothing
    with LossLog(tmp_path) as losses:
        assert path.read_bytes() == complete  # exactly the partial tail is gone
        assert losses.last_step == 3
        losses.append(4, _loss(4))
    assert path.read_bytes().startswith(complete)
    assert read_loss_history(tmp_path).steps.tolist() == [1, 2, 3, 4]


def test_a_damaged_complete_line_is_reported_never_repaired(tmp_path: Path) -> None:
    _log_steps(tmp_path, range(1, 4))
    path = tmp_path / LOSS_FILE
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"\0\0\0garbage"
    path.write_bytes(b"\n".join(lines))
    before = path.read_bytes()
    with pytest.raises(SidecarError, match=r"\.loss\.json: line 2: not a JSON object"):
        read_loss_history(tmp_path)
    with pytest.raises(SidecarError, match="line 2"):
        LossLog(tmp_path)
    assert path.read_bytes() == before


def test_resume_replay_skips_recorded_steps_and_checks_them_bitwise(tmp_path: Path) -> None:
    _log_steps(tmp_path, range(1, 11))
    path = tmp_path / LOSS_FILE
    before = path.read_bytes()
    with LossLog(tmp_path) as losses:  # resumed from the checkpoint at step 5
        assert [losses.append(s, _loss(s)) for s in range(6, 11)] == [False] * 5
        assert path.read_bytes() == before
        assert losses.append(11, _loss(11)) is True
    history = read_loss_history(tmp_path)
    assert history.steps.tolist() == list(range(1, 12)) and history.duplicate_steps == []
    assert path.read_bytes().startswith(before)
    with LossLog(tmp_path) as losses:
        drifted = float(np.nextafter(np.float32(_loss(8)), np.float32(1)))
        with pytest.raises(SidecarError, match=r"step 8: recorded loss .* not bit-exact"):
            losses.append(8, drifted)
    assert read_loss_history(tmp_path).loss_at(8) == _loss(8)


def test_replay_mismatch_can_warn_instead_and_nan_replays_match(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with LossLog(tmp_path) as losses:
        losses.append(1, math.nan)
        losses.append(2, 0.5)
    with LossLog(tmp_path, on_mismatch="warn") as losses:
        assert losses.append(1, math.nan) is False
        with caplog.at_level(logging.WARNING):
            assert losses.append(2, 0.25) is False
    assert "not bit-exact" in caplog.text
    assert read_loss_history(tmp_path).losses[1] == 0.5


def test_a_non_finite_loss_is_null_with_its_kind_kept_for_the_replay_check(
    tmp_path: Path,
) -> None:
    """``null`` as the README says for every JSON file; the kind beside it keeps a replay's
    bitwise check (an infinity replayed as NaN is a mismatch); older files' strings still
    read, and train.json's history has them as null again."""
    with LossLog(tmp_path) as losses:
        losses.append(1, 0.5)
        losses.append(2, -math.inf, lr=0.1)
    lines = (tmp_path / LOSS_FILE).read_text().splitlines()
    assert lines[1] == '{"step":2,"loss":null,"nonfinite":"-Infinity","lr":0.1}'
    history = read_loss_history(tmp_path)
    assert history.loss_at(2) == -math.inf and history.records[1] == {
        "step": 2,
        "loss": -math.inf,
        "lr": 0.1,
    }
    with LossLog(tmp_path) as losses:
        assert losses.append(2, -math.inf) is False  # the same bits: a bit-exact replay
        with pytest.raises(SidecarError, match=r"step 2: recorded loss -inf .* produced nan"):
            losses.append(2, math.nan)
        with pytest.raises(ValueError, match="'nonfinite'"):
            losses.append(3, 0.25, nonfinite="x")
    older = tmp_path / "older"
    older.mkdir()
    (older / LOSS_FILE).write_text(
        '{"step":1,"loss":"NaN"}\n{"step":2,"loss":"Infinity"}\n{"step":3,"loss":null}\n'
    )
    old = read_loss_history(older)
    assert math.isnan(old.losses[0]) and old.losses[1] == math.inf and math.isnan(old.losses[2])
    from recd.train.history import json_safe, run_history

    summary = run_history(
        loss_dir=older, metrics_path=older / "none", first_step=0, losses=[], evals=[]
    ).summary()
    assert json.loads(json.dumps(json_safe(summary), allow_nan=False))["loss_first10_mean"] is None
    (older / LOSS_FILE).write_text('{"step":1,"loss":null,"nonfinite":"big"}\n')
    with pytest.raises(SidecarError, match="line 1: field 'nonfinite': expected one of NaN"):
        read_loss_history(older)


def test_a_branch_supersedes_later_entries_without_rewriting_them(tmp_path: Path) -> None:
    _log_steps(tmp_path, range(1, 11))
    before = (tmp_path / LOSS_FILE).read_bytes()
    with LossLog(tmp_path) as losses:  # pivot: restart from step 5 under a new policy
        losses.begin_branch(5, reason="pivot", policy="v2")
        for step in range(6, 9):
            assert losses.append(step, _loss(step) * 2) is True
    after = (tmp_path / LOSS_FILE).read_bytes()
    assert after.startswith(before)
    history = read_loss_history(tmp_path)
    assert history.steps.tolist() == list(range(1, 9)) and history.superseded == 5
    assert history.loss_at(4) == _loss(4) and history.loss_at(7) == _loss(7) * 2
    assert history.events[0]["event"] == "branch" and history.events[0]["policy"] == "v2"


def test_only_one_writer_and_gaps_are_flagged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with LossLog(tmp_path) as losses:
        with pytest.raises(SidecarError, match="another process is appending"):
            LossLog(tmp_path)
        losses.append(1, 0.5)
        with caplog.at_level(logging.WARNING):
            losses.append(3, 0.5)
        with pytest.raises(ValueError, match="must not be named"):
            losses.append(4, 0.5, event="x")
    assert "gap" in caplog.text
    with LossLog(tmp_path) as losses:  # lock released on close
        assert losses.last_step == 3 and len(losses) == 2


# ----------------------------------------------------------------------------- samples and state


def test_state_and_samples_are_whole_files_replaced_atomically(tmp_path: Path) -> None:
    assert read_state(tmp_path) is None and read_samples(tmp_path) is None
    write_state(tmp_path, {"reader": {"file": 3, "row": 1200}, "policy": "v1"})
    assert read_state(tmp_path) == {"reader": {"file": 3, "row": 1200}, "policy": "v1"}
    for step in (100, 200, 300, 200):
        append_sample_audit(tmp_path, {"step": step, "auc": step / 1000}, keep_last=2)
    samples = read_samples(tmp_path)
    assert samples is not None and [a["step"] for a in samples["audits"]] == [200, 300]
    assert sorted(p.name for p in tmp_path.iterdir()) == [SAMPLES_FILE, STATE_FILE]
    with pytest.raises(ValueError):
        write_samples(tmp_path, {"audits": [math.nan]})  # strict JSON, old file kept
    assert read_samples(tmp_path) is not None
    (tmp_path / STATE_FILE).write_text("[1, 2")
    with pytest.raises(SidecarError, match=r"\.state\.json: not valid JSON"):
        read_state(tmp_path)


def test_retention_drops_the_state_entries_of_the_checkpoints_it_deletes(tmp_path: Path) -> None:
    layout = ParamLayout(specs=(ParamSpec("w", (3,)),))
    zeros = np.zeros(3, dtype=np.float32)
    for step in (2, 4, 6, 8):
        write_checkpoint(checkpoint_path(tmp_path, step), step, zeros, zeros, zeros, layout=layout)
    entries = {str(s): {"step": s, "readers": [{"row": s}]} for s in (2, 4, 6, 8, 10)}
    write_state(
        tmp_path, {"format": "recd-train-state", "data_policy": {"p": 1}, "checkpoints": entries}
    )
    deleted = apply_retention(tmp_path, RetentionPolicy(keep_last=2, keep_every=0), layout=layout)
    assert sorted(p.name for p in deleted) == ["step_000002.bin", "step_000004.bin"]
    state = read_state(tmp_path)
    assert state is not None and state["data_policy"] == {"p": 1}
    # Only the deleted steps go: 10's checkpoint may be a write still in flight.
    assert sorted(int(s) for s in state["checkpoints"]) == [6, 8, 10]
    assert state["checkpoints"]["6"] == entries["6"]
    assert drop_state_entries(tmp_path, [6, 7]) == [6]
    assert drop_state_entries(tmp_path / "nowhere", [8]) == []


def test_pivot_archive_moves_policy_files_and_never_touches_the_loss_history(
    tmp_path: Path,
) -> None:
    _log_steps(tmp_path, range(1, 4))
    loss = tmp_path / LOSS_FILE
    loss_bytes, loss_inode = loss.read_bytes(), loss.stat().st_ino
    write_state(tmp_path, {"arms": {"a": 1.546}})
    append_sample_audit(tmp_path, {"step": 100})
    target = archive_policy_sidecars(tmp_path, "20250101T000000Z")
    assert target == tmp_path / "archive" / "20250101T000000Z"
    assert sorted(p.name for p in target.iterdir()) == [SAMPLES_FILE, STATE_FILE]
    assert json.loads((target / STATE_FILE).read_text()) == {"arms": {"a": 1.546}}
    assert read_state(tmp_path) is None and read_samples(tmp_path) is None
    assert loss.read_bytes() == loss_bytes and loss.stat().st_ino == loss_inode
    with pytest.raises(SidecarError, match="already exists"):
        archive_policy_sidecars(tmp_path, "20250101T000000Z")
    assert archive_policy_sidecars(tmp_path).parent == tmp_path / "archive"


# ----------------------------------------------------------------------------- fork

LAYOUT = ParamLayout(specs=(ParamSpec("w", (3, 2)), ParamSpec("b", (2,))))


def _source_run(root: Path) -> Path:
    run = root / "run"
    write_layout(run, LAYOUT)
    for step in (100, 200):
        w = np.arange(LAYOUT.n_params, dtype=np.float32) + step
        write_checkpoint(checkpoint_path(run, step), step, w, w / 10, w / 100, layout=LAYOUT)
    _log_steps(run, range(1, 201))
    write_state(run, {"policy": "v1"})
    return run


def test_fork_copies_the_checkpoint_and_starts_its_own_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _source_run(tmp_path)
    source = checkpoint_path(run, 100)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    parser = argparse.ArgumentParser(prog="recd")
    ckpt_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fork", str(source), str(tmp_path / "branch"), "--json"])
    assert args.func(args) == 0
    out = json.loads(capsys.readouterr().out)
    branch = tmp_path / "branch"
    assert out["step"] == 100 and out["sha256"] == sha256_file(source)
    assert sorted(p.name for p in branch.iterdir()) == [
        LOSS_FILE,
        STATE_FILE,
        "_layout.json",
        "step_000100.bin",
        "step_000100.bin.crc32",
    ]
    assert (branch / "step_000100.bin").read_bytes() == source.read_bytes()
    assert (branch / "step_000100.bin.crc32").read_bytes() == (
        run / "step_000100.bin.crc32"
    ).read_bytes()
    assert read_checkpoint(branch / "step_000100.bin", LAYOUT).step == 100
    origin = read_state(branch)["fork_origin"]  # type: ignore[index]
    assert origin["source"] == str(source.resolve()) and origin["sha256"] == out["sha256"]
    history = read_loss_history(branch)
    assert len(history.steps) == 0 and history.events[0]["event"] == "fork"
    assert history.events[0]["at_step"] == 100
    with LossLog(branch) as losses:  # the branch's own history starts at step 101
        assert losses.append(101, 0.25) is True
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before  # source untouched


def test_fork_refuses_a_busy_target_and_a_corrupt_source(tmp_path: Path) -> None:
    run = _source_run(tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(CheckpointError, match="not an empty directory"):
        fork_run(checkpoint_path(run, 200), busy)
    bad = checkpoint_path(run, 200)
    with open(bad, "ab") as f:
        f.write(b"\0")
    with pytest.raises(CheckpointCorruptError):
        fork_run(bad, tmp_path / "new")
    assert not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy", "run"]
    fork_run(checkpoint_path(run, 100), tmp_path / "empty_ok")
    assert (tmp_path / "empty_ok" / "step_000100.bin").exists()
