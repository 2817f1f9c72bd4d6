"""`--allow-optimizer-change`: a study tries the memory-saving optimizers on the user's model,
and whatever it recommends says when the update rule changed."""

from __future__ import annotations

import json

import pytest

from autotune.config import TrainConfig
from autotune.study.records import trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import TrialStatus

from ..conftest import CONFIRM_ONCE, FAST, run_cli

TINY_MLP = ["--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
            "--model-arg", "hidden=64", "--model-arg", "layers=2", "--model-arg",
            "num_samples=4096", "--global-batch-size", "256", "--fix", "compile_mode=none",
            "--fix", "num_workers=0", "--fix", "precision=fp32", "--fix",
            "micro_batch_size=64", "--fix", "activation_checkpointing=none"]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adafactor", "adamw_8bit"])
def test_a_study_allowed_to_change_the_optimizer_measures_it_and_says_so(optimizer,
                                                                       tmp_path) -> None:
    if optimizer == "adamw_8bit":
        pytest.importorskip("bitsandbytes")
    done = run_cli("run", *TINY_MLP, *FAST, "--studies-dir", str(tmp_path), "--trials", "2",
                   "--allow-optimizer-change", "--fix", f"optimizer={optimizer}",
                   *CONFIRM_ONCE, "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    # what this CPU never tries, and why
    assert "not on this device: precision=fp8_tensorwise, fp8_rowwise: float8 training needs " \
           "a CUDA GPU of compute capability 8.9+" in done.stderr
    trials = trial_records(load_study("mlp", tmp_path))
    # the baseline with the file's AdamW, then the other optimizer on the same model (stopped
    # at screening where it is below 75% of the baseline's rate)
    assert [t.config.optimizer for t in trials] == ["adamw", optimizer]
    assert trials[1].status in (TrialStatus.OK, TrialStatus.SCREENED)
    assert trials[1].samples_per_sec > 0
    summary = json.loads(done.stdout)
    best = TrainConfig.load(tmp_path / "mlp" / "best.yaml")
    assert best.optimizer == summary["best_config"]["optimizer"]
    if best.optimizer != "adamw":
        assert "another update rule" in summary["verdict"]
