"""`worker`: the search loop decides, measures and records trials; here with a measurement
that answers from a script, so the loop's own decisions are what is tested."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.options import TuneOptions
from autotune.search.runner import MeasureJob
from autotune.search.tuner import Tuner
from autotune.study.results import load_study
from autotune.trial.measure import FIRST_STEP
from autotune.trial.protocol import TrialResult

from ..conftest import TINY_SOURCE

METRICS = {"samples_per_sec": 1000.0, "window_samples": 800, "window_steps": 10,
           "window_s": 0.8, "setup_s": 1.0, "time_to_first_step_s": 0.5, "warmup_steps": 3,
           "warmup_s": 0.3, "step_time_median_s": 0.08, "data_wait_fraction": 0.0,
           "peak_memory_bytes": 2**20}


def test_a_compile_that_ran_out_of_time_runs_once_more(write_model, tmp_path) -> None:
    model = write_model(TINY_SOURCE)
    jobs: list[tuple[dict, MeasureJob]] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        jobs.append((config.to_dict(), job))
        if config.compile_mode == "none":
            return TrialResult("ok", "measured", dict(METRICS))
        return TrialResult("timeout", "still running", phase=FIRST_STEP)

    tuner = Tuner(TuneOptions(model_path=str(model), device="cpu", trials=3,
                              studies_dir=str(tmp_path), fixes={"compile_mode": "default"},
                              plain_tpe=True, confirm_repeats=0, seed=0))
    tuner.runner.measure = measure  # the probe was real; the trials are scripted
    try:
        tuner.run()
    finally:
        tuner.close()
    trials = load_study(tuner.study.study_name, tmp_path).get_trials(deepcopy=False)
    statuses = [t.user_attrs["status"] for t in trials]
    assert statuses == ["ok", "compile_timeout", "timeout"]
    first, retry = trials[1], trials[2]
    assert retry.user_attrs["requeued_from"] == first.number and retry.user_attrs["retry"] == 1
    assert retry.user_attrs["config"] == first.user_attrs["config"]
    assert len(jobs) == 3  # the retry was measured; nothing else


def test_under_the_time_budget_the_last_search_trial_gets_a_trials_time_to_finish(
        write_model, tmp_path, monkeypatch) -> None:
    """The plan stops starting trials early enough for the last one to end; that one must be
    given that time, not only what is left until the plan's last start (a 69 s rgat trial on
    2 CPU cores was killed at 32 s that way)."""
    import time

    import autotune.search.tuner

    monkeypatch.setattr(autotune.search.tuner, "DEFAULT_TIME_BUDGET_S", 40.0)
    model = write_model(TINY_SOURCE)
    jobs: list[MeasureJob] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        jobs.append(job)
        time.sleep(0.5)
        result = TrialResult("ok", "measured", {**METRICS,
                                                "samples_per_sec": 1000.0 + len(jobs)})
        result.wall_s = 5.0  # what each trial is priced at
        return result

    tuner = Tuner(TuneOptions(model_path=str(model), device="cpu", studies_dir=str(tmp_path),
                              confirm_repeats=0, seed=0))
    tuner.runner.measure = measure  # the probe was real; the trials are scripted
    try:
        tuner.run()
    finally:
        tuner.close()
    searched = [job for job in jobs if job.name.startswith("trial-") and job.number]
    assert searched, "the plan left time for search trials"
    assert min(job.time_limit_s for job in searched) >= 5.0 * 0.95
