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

from ...conftest import ROOT

LOOP = str(ROOT / "tests/models/scripts/loop_nanogpt.py")
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

