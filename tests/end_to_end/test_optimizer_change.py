"""`--allow-optimizer-change`: a study tries the memory-saving optimizers on the user's model,
and whatever it recommends says when the update rule changed."""

from __future__ import annotations

import json

import pytest

from autotune.config import TrainConfig
from autotune.study.records import trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import TrialStatus

from ..conftest import CONFIRM_ONCE, FAST, TINY_MLP, need, run_cli

# Everything held but the optimizer (the micro-batch at 64, which the tiny MLP's global batch
# makes 64 x 4 against its BASELINE's 1024 x 1).
ONLY_THE_OPTIMIZER = ["--fix", "num_workers=0", "--fix", "precision=fp32", "--fix",
                      "micro_batch_size=64", "--fix", "activation_checkpointing=none", "--fix",
                      "optimizer_impl=for_loop"]


@pytest.mark.slow
def test_a_study_allowed_to_change_the_optimizer_measures_it_and_says_so(tmp_path) -> None:
    need("bitsandbytes", "knobs")
    space = tmp_path / "space.yaml"
    space.write_text("optimizer: [adamw, adafactor, adamw_8bit]\n")
    done = run_cli("run", *TINY_MLP, *ONLY_THE_OPTIMIZER, *FAST, "--studies-dir", str(tmp_path),
                   "--trials", "4", "--allow-optimizer-change", "--space", str(space),
                   *CONFIRM_ONCE, "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    # what this CPU never tries, and why
    assert "not on this device: precision=fp8_tensorwise, fp8_rowwise: float8 training needs " \
           "a CUDA GPU of compute capability 8.9+" in done.stderr
    trials = [t for t in trial_records(load_study("mlp", tmp_path)) if not t.duplicate]
    # the baseline with the file's AdamW, then the space's micro-batch with each optimizer
    # (stopped at screening where it is below 75% of the best's rate)
    assert trials[0].config.optimizer == "adamw"
    assert sorted(t.config.optimizer for t in trials[1:]) == ["adafactor", "adamw", "adamw_8bit"]
    assert all(t.status in (TrialStatus.OK, TrialStatus.SCREENED) and t.samples_per_sec > 0
               for t in trials)
    summary = json.loads(done.stdout)
    best = TrainConfig.load(tmp_path / "mlp" / "best.yaml")
    assert best.optimizer == summary["best_config"]["optimizer"]
    if best.optimizer != "adamw":
        assert "another update rule" in summary["verdict"]
