"""A training script as a warm process: its own loop warms up, then pauses between turns the
tuner asks for, each timed as a window is; the script's output folder is never written, and
its scratch folder goes with the process."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.search.warm import WarmRounds
from autotune.target import Script
from autotune.trial.protocol import TrialRequest

from ...conftest import ROOT, need

LOOP = str(ROOT / "tests/models/scripts/loop_nanogpt.py")
LIGHTNING = str(ROOT / "tests/models/scripts/lightning_datamodule.py")
SETTINGS = MeasureSettings(window_steps=3, window_seconds=0.2, warmup_max_seconds=10,
                           profile_steps=1, screen_steps=0)


@pytest.mark.slow
def test_a_scripts_own_loop_takes_warm_turns_and_is_stopped_between_them(tmp_path) -> None:
    """Two configurations of a nanoGPT-style loop, each in a warm process: after warming up,
    each answers turns of its own loop's steps (fused AdamW and the baseline's for-loop one
    both measured), a profiler trace on request, and `stop` ends the loop between two steps;
    its --out_dir (checkpoints every step) never appears, and its scratch folders are gone."""
    out = tmp_path / "loop-out"
    requests = [TrialRequest(Script(LOOP, ("--out_dir", str(out), "--eval_interval", "1")),
                             device="cpu", settings=SETTINGS,
                             config=TrainConfig(micro_batch_size=8, grad_accum_steps=2,
                                                optimizer_impl=impl).to_dict())
                for impl in ("for_loop", "fused")]
    rounds = WarmRounds(requests, [tmp_path / f"warm-{i}.log" for i in range(2)], 120)
    scratch = [process.scratch for process in rounds.processes]
    try:
        turns = [[rounds.turn(i) for i in range(2)] for _ in range(3)]
        trace = rounds.trace(1, tmp_path / "trace.json")
    finally:
        rounds.close()
    assert all(run is not None and run.samples_per_sec > 0 and run.ok
               for pair in turns for run in pair)
    assert Path(trace).is_file()
    logs = [(tmp_path / f"warm-{i}.log").read_text() for i in range(2)]
    assert all("the script's loop steady after" in log for log in logs), logs
    assert not out.exists()
    assert all(folder is not None and not folder.exists() for folder in scratch)


@pytest.mark.slow
def test_a_scripts_process_group_pauses_and_resumes_its_ranks_together(tmp_path) -> None:
    """A Lightning script as a warm process group of two ranks (Lightning's own DDP): rank 0
    reads each command and tells the other, both loops pause at the same step between turns
    (else DDP's collectives would hang), each turn counts both ranks' samples, and `stop` ends
    both; its --root (checkpoints, logs) never appears."""
    need("lightning")
    root = tmp_path / "user_root"
    request = TrialRequest(Script(LIGHTNING, ("--root", str(root))), device="cpu",
                           settings=SETTINGS, nproc_per_node=2,
                           config=TrainConfig(micro_batch_size=16, grad_accum_steps=2,
                                              parallelism="ddp").to_dict())
    rounds = WarmRounds([request], [tmp_path / "warm.log"], 180)
    process = rounds.processes[0]
    try:
        turns = [process.turn(60) for _ in range(6)]
        trace = rounds.trace(0, tmp_path / "trace.json")
    finally:
        rounds.close()
    assert all(t.loss_finite and t.seconds > 0 for t in turns)
    # both ranks' steps in every turn: whole steps of 2 ranks x 2 micro-batches of 16
    assert all(t.samples % 64 == 0 for t in turns), [t.samples for t in turns]
    assert Path(trace).is_file()
    log = (tmp_path / "warm.log").read_text()
    assert log.count("the script's loop steady after") == 2, log
    assert not root.exists()
    assert process.scratch is not None and not process.scratch.exists()
