"""A configuration whose loss becomes NaN or inf is never the answer: the probe leaves out a
precision that diverges at once, a trial that diverges is `diverged` with the knobs that did it,
and a baseline that diverges stops the run."""

from __future__ import annotations

import json
import re

import pytest

from autotune.study.records import trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import TrialStatus

from ..conftest import CONFIRM_ONCE, FAST, TEST_MODELS, run_cli

FRAGILE = ["--model", str(TEST_MODELS / "fragile.py"), "--device", "cpu", "--fix",
           "compile_mode=none", "--fix", "num_workers=0"]


@pytest.mark.slow
def test_diverging_settings_are_left_out_or_recorded_and_never_recommended(tmp_path) -> None:
    done = run_cli("run", *FRAGILE, *FAST, "--studies-dir", str(tmp_path), "--trials", "4",
                   "--seed", "0", "--confirm-top", "3", *CONFIRM_ONCE, "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    assert "left out: precision=bf16: the loss is inf under bf16 on the dataset's first " \
           "samples: training would diverge" in " ".join(done.stderr.split())
    summary = json.loads(done.stdout)
    assert summary["statuses"].get("diverged", 0) >= 1, summary["statuses"]
    records = trial_records(load_study("fragile", tmp_path))
    diverged = [r for r in records if r.status == TrialStatus.DIVERGED]
    for trial in diverged:
        micro = trial.config.micro_batch_size
        assert micro >= 32
        assert f"micro_batch_size={micro}" in trial.message
        assert re.search(r"the loss became (nan|inf) in the timed window", trial.message)
        assert trial.measurement.loss_finite is False
    assert f"trial {diverged[0].number}: diverged" in done.stderr
    assert summary["best_config"]["micro_batch_size"] < 32
    assert summary["best_config"]["precision"] == "fp32"
    # raced, if anything was: a run whose other trials were all screened confirms nothing
    confirmation = load_study("fragile", tmp_path).user_attrs.get("confirmation") or {}
    assert all(c["config"]["micro_batch_size"] < 32 for c in confirmation.get("candidates", []))


@pytest.mark.slow
def test_a_baseline_that_diverges_stops_the_run(tmp_path) -> None:
    done = run_cli("run", *FRAGILE, "--model-arg", "overflow_at=8", *FAST, "--studies-dir",
                   str(tmp_path), "--trials", "4", timeout=600)
    assert done.returncode == 1, done.stderr
    error = " ".join(done.stderr.split())
    assert re.search(r"autotune: error: the baseline \(the model file's BASELINE\) diverged: "
                     r"the loss became (nan|inf) in the timed window, with your own settings",
                     error)
    assert "Traceback" not in done.stderr
    statuses = [t.user_attrs.get("status") for t in
                load_study("fragile", tmp_path).get_trials(deepcopy=False)]
    assert statuses == ["diverged"]
