"""A process group as one warm process: torchrun's ranks warm up together, rank 0 reads the
tuner's commands and tells the others, every rank takes every turn, and rank 0 answers with
the group's figures; a model file's group, and a training script's own loop on every rank."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.search.warm import WarmRounds, _WarmProcess
from autotune.target import ModelFile, Script
from autotune.trial.protocol import TrialRequest, WarmTurn

from ..conftest import ROOT, need

MLP = str(ROOT / "models" / "mlp.py")
TINY = {"feature_dim": 32, "hidden": 64, "layers": 2, "num_samples": 4096}
LIGHTNING = str(ROOT / "tests/models/scripts/lightning_datamodule.py")
SETTINGS = MeasureSettings(window_steps=3, window_seconds=0.2, warmup_max_seconds=10,
                           profile_steps=1, screen_steps=0)


def six_turns_and_a_trace(request: TrialRequest, tmp_path: Path,
                          ) -> tuple[_WarmProcess, list[WarmTurn], str]:
    """The group's warm process, six of its turns and a trace, then `stop`."""
    rounds = WarmRounds([request], [tmp_path / "warm.log"], 180)
    process = rounds.processes[0]
    try:
        turns = [process.turn(60) for _ in range(6)]
        trace = rounds.trace(0, tmp_path / "trace.json")
    finally:
        rounds.close()
    assert all(t.loss_finite and t.seconds > 0 and t.samples > 0 for t in turns)
    assert Path(trace).is_file()
    return process, turns, trace


@pytest.mark.slow
def test_a_process_groups_ranks_take_warm_turns_together_and_stop_together(tmp_path) -> None:
    """Two DDP ranks of the tiny MLP (gloo, a core each) as one warm process: each turn counts
    both ranks' micro-batches, a profiler trace comes on request, and `stop` ends every rank
    and torchrun, leaving neither a process nor the request file."""
    config = TrainConfig(micro_batch_size=8, parallelism="ddp")
    request = TrialRequest(ModelFile(MLP, TINY), config=config.to_dict(), device="cpu",
                           settings=SETTINGS, nproc_per_node=2)
    process, turns, _ = six_turns_and_a_trace(request, tmp_path)
    # both ranks' steps in every turn: whole steps of 2 ranks x 8 samples
    assert all(t.samples % 16 == 0 for t in turns), [t.samples for t in turns]
    assert (tmp_path / "warm.log").read_text().count("autotune warm:") == 2
    assert not process.request_file.exists()
    left = subprocess.run(["pgrep", "-f", process.request_file.name], capture_output=True,
                          text=True).stdout
    assert not left, left


@pytest.mark.slow
def test_a_scripts_process_group_pauses_and_resumes_its_ranks_together(tmp_path) -> None:
    """A Lightning script as a warm process group of two ranks (Lightning's own DDP): both
    loops pause at the same step between turns (else DDP's collectives would hang), each turn
    counts both ranks' samples, and `stop` ends both; its --root (checkpoints, logs) never
    appears and its scratch folder goes with it."""
    need("lightning")
    root = tmp_path / "user_root"
    request = TrialRequest(Script(LIGHTNING, ("--root", str(root))), device="cpu",
                           settings=SETTINGS, nproc_per_node=2,
                           config=TrainConfig(micro_batch_size=16, grad_accum_steps=2,
                                              parallelism="ddp").to_dict())
    process, turns, _ = six_turns_and_a_trace(request, tmp_path)
    # both ranks' steps in every turn: whole steps of 2 ranks x 2 micro-batches of 16
    assert all(t.samples % 64 == 0 for t in turns), [t.samples for t in turns]
    log = (tmp_path / "warm.log").read_text()
    assert log.count("the script's loop steady after") == 2, log
    assert not root.exists()
    assert process.scratch is not None and not process.scratch.exists()
