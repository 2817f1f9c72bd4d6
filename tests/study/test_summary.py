"""The study summary as a typed record: what `show --json` prints keeps its keys, unconfirmed
and confirmed alike."""

from __future__ import annotations

import json

import optuna

from autotune.config import TrainConfig
from autotune.search.conclusion import conclusion
from autotune.search.contenders import Candidate
from autotune.study.confirmation import Confirmation, Run
from autotune.study.records import StudyKey
from autotune.study.results import load_study, study_summary
from autotune.study.storage import open_storage

from .test_results import _told

# What `autotune show --json` prints for a study with a search and no confirmation (`knobs`,
# the knobs that apply to the study, came with the typed records).
SEARCH_KEYS = {
    "study", "model", "model_args", "device", "devices", "nproc_per_node", "confirmed",
    "best_config", "best_samples_per_sec", "best_spread", "best_trial",
    "best_peak_memory_bytes", "best_mfu",
    "baseline_config", "knobs", "baseline_samples_per_sec", "speedup", "verdict", "trials",
    "statuses",
    "oom_trials", "retried_trials", "tuning_wall_s", "free_batch", "train_steps",
    "memory_predictions", "loader_rates", "baseline_trial", "left_out", "convolutional",
    "warnings",
    "queued_trials", "trial_times", "probe_s", "disturbed_trials",
    "best_disturbed", "compile_payoff", "diagnosis", "answer_diagnosis", "device_type",
    "best_mfu_basis", "best_worst_batch_peak_bytes", "best_worst_batch_headroom_bytes"}
# ... and the keys the paired rounds add (their checks of the answer among them).
CONFIRMED_KEYS = {
    "best_runs", "baseline_spread", "speedup_ci", "no_measurable_difference",
    "confirmation_repeats", "best_search_samples_per_sec", "fastest_config", "fastest_speedup",
    "fastest_speedup_ci", "best_time_to_train_s", "baseline_time_to_train_s",
    "confirmation_measured", "taken_back", "taken_from_config", "worst_batch", "loss_check",
    "checks", "ruled_out"}

BASE = TrainConfig(micro_batch_size=8)


def _study(tmp_path) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path / "s"),
                                direction="maximize")
    study.set_user_attr(StudyKey.BASELINE_CONFIG, BASE.to_dict())
    _told(study, BASE, "ok", 100.0, role="baseline")
    _told(study, BASE.replace(precision="bf16"), "ok", 150.0)
    return study


def _confirmation() -> Confirmation:
    def runs(*rates: float | None) -> list[Run | None]:
        return [Run("ok", samples_per_sec=r, objective=r) if r else None for r in rates]

    baseline = Candidate(BASE, 0, True, 100.0, runs(100, 104, 98))
    faster = Candidate(BASE.replace(precision="bf16"), 1, True, 150.0, runs(151, 160, 149))
    flaky = Candidate(BASE.replace(optimizer_impl="foreach"), 2, True, 120.0,
                      runs(120, None, 121))
    return conclusion([faster, flaky, baseline], baseline, wall_s=12.0, target=0.03)


def test_an_unconfirmed_summary_prints_the_keys_it_always_has(tmp_path) -> None:
    summary = study_summary(_study(tmp_path))
    data = summary.to_json()
    assert set(data) == SEARCH_KEYS
    assert data["confirmed"] is False and data["left_out"] == []
    json.dumps(data)  # plain data all the way down


def test_a_confirmed_summary_adds_the_rounds_keys_and_reads_from_storage_alone(
        tmp_path) -> None:
    study = _study(tmp_path)
    study.set_user_attr(StudyKey.CONFIRMATION, _confirmation().to_json())
    summary = study_summary(load_study("s", tmp_path))
    data = summary.to_json()
    assert set(data) == SEARCH_KEYS | CONFIRMED_KEYS
    assert summary.confirmed and data["confirmed"] is True
    assert summary.best_config.precision == "bf16" and data["best_config"]["precision"] == "bf16"
    assert summary.confirmation.confirmation_repeats == 3
    low, high = data["speedup_ci"]
    assert low < data["speedup"] < high
    assert data["best_runs"] == [151, 160, 149]
    json.dumps(data)




def test_a_budget_too_short_for_an_answer_says_what_is_unknown_and_the_timeout(
        tmp_path) -> None:
    """The default budget grown its most (30 min) could not hold the rounds an answer needs
    (82 min): the verdict says the interval is unknown and names the --timeout that answers
    it; a study whose rounds gave an interval anyway says nothing of it."""
    study = _study(tmp_path)
    study.set_user_attr(StudyKey.SHORT_BUDGET, {"budget_s": 1800.0, "needed_s": 4920.0,
                                                "timeout": "58m"})
    verdict = " ".join(study_summary(study).verdict.split())
    assert "Left unknown: the speedup's interval" in verdict
    assert "`--timeout 58m` would answer it" in verdict
    # a given --budget is named as such, and the verdict's sentences stay apart
    study.set_user_attr(StudyKey.SHORT_BUDGET, {"budget_s": 240.0, "needed_s": 1380.0,
                                                "fixed": True, "flag": "--budget 23m"})
    verdict = " ".join(study_summary(study).verdict.split())
    assert "the run kept --budget 4.0 min); `--budget 23m` would answer it." in verdict
    assert ". Left unknown:" in verdict and ".. Left" not in verdict
    study.set_user_attr(StudyKey.CONFIRMATION, _confirmation().to_json())
    assert "Left unknown" not in study_summary(study).verdict
