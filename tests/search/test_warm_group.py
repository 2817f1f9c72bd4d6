"""A process group as one warm process: torchrun's ranks warm up together, rank 0 reads the
tuner's commands and tells the others, every rank takes every turn, and rank 0 answers with
the group's figures."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.search.warm import WarmRounds
from autotune.target import ModelFile
from autotune.trial.protocol import TrialRequest

from ..conftest import ROOT

MLP = str(ROOT / "models" / "mlp.py")
TINY = {"feature_dim": 32, "hidden": 64, "layers": 2, "num_samples": 4096}
SETTINGS = MeasureSettings(window_steps=3, window_seconds=0.2, warmup_max_seconds=5,
                           profile_steps=1, screen_steps=0)


@pytest.mark.slow
def test_a_process_groups_ranks_take_warm_turns_together_and_stop_together(tmp_path) -> None:
    """Two DDP ranks of the tiny MLP (gloo, a core each) as one warm process: each turn counts
    both ranks' micro-batches, a profiler trace comes on request, and `stop` ends every rank
    and torchrun, leaving neither a process nor the request file."""
    config = TrainConfig(micro_batch_size=8, parallelism="ddp")
    request = TrialRequest(ModelFile(MLP, TINY), config=config.to_dict(), device="cpu",
                           settings=SETTINGS, nproc_per_node=2)
    rounds = WarmRounds([request], [tmp_path / "warm.log"], 120)
    process = rounds.processes[0]
    try:
        turns = [process.turn(60) for _ in range(6)]
        trace = rounds.trace(0, tmp_path / "trace.json")
    finally:
        rounds.close()
    assert all(t.loss_finite and t.seconds > 0 and t.samples > 0 for t in turns)
    # both ranks' steps in every turn: whole steps of 2 ranks x 8 samples
    assert all(t.samples % 16 == 0 for t in turns), [t.samples for t in turns]
    assert Path(trace).is_file()
    assert (tmp_path / "warm.log").read_text().count("autotune warm:") == 2
    assert not process.request_file.exists()
    left = subprocess.run(["pgrep", "-f", process.request_file.name], capture_output=True,
                          text=True).stdout
    assert not left, left
