"""From a trial's result to its status and score."""

from __future__ import annotations

from dataclasses import replace

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.search.outcome import Scoring, record_measurement, stall_fraction
from autotune.study.records import DETERMINISTIC, TrialKey
from autotune.trial.protocol import FIRST_STEP, Measurement, TrialResult, TrialStatus

GIB = 2**30
METRICS = Measurement(samples_per_sec=1000.0, window_samples=800, window_steps=10,
                      window_s=0.8, setup_s=1.0, time_to_first_step_s=0.5, warmup_steps=3,
                      warmup_s=0.3, step_time_median_s=0.08, data_wait_fraction=0.1,
                      host_sync_s_per_step=0.008, peak_memory_bytes=GIB)


def measured(figures: Measurement = METRICS) -> TrialResult:
    return TrialResult(TrialStatus.OK, "measured", measurement=figures)


def test_stall_fraction() -> None:
    cpu = Measurement(samples_per_sec=1.0, step_time_median_s=0.1, host_sync_s_per_step=0.01,
                      data_wait_fraction=0.2)
    assert stall_fraction(cpu, "cpu") == pytest.approx(0.3)
    assert stall_fraction(replace(cpu, device_idle_fraction=0.05), "cuda") == \
        pytest.approx(0.25)
    assert stall_fraction(replace(cpu, device_idle_fraction=0.9), "cuda") == 1.0


def test_a_peak_above_the_allowed_memory_is_over_memory_and_screening_is_screened() -> None:
    scoring = Scoring("cpu", memory_limit_bytes=GIB // 2, memory_headroom=0.1,
                      stall_penalty=0.1)
    status, message = scoring.classify(measured())
    assert status == "over_memory" and "1.00 GiB is above the 0.50 GiB" in message
    roomy = Scoring("cpu", memory_limit_bytes=2 * GIB, memory_headroom=0.1, stall_penalty=0.1)
    assert roomy.classify(measured())[0] == "ok"
    screened = measured(replace(METRICS, screened=True))
    assert roomy.classify(screened)[0] == "screened"
    assert roomy.classify(TrialResult("oom", "CUDA out of memory"))[0] == "oom"


def test_the_score_penalises_stalls_and_can_count_the_whole_run() -> None:
    steady = Scoring("cpu", None, 0.1, stall_penalty=0.1)
    assert steady.score(METRICS) == pytest.approx(1000.0 * (1 - 0.1 * 0.2))
    whole_run = Scoring("cpu", None, 0.1, stall_penalty=0.0, train_steps=100)
    # 100 steps of 80 samples: 1.5 s to start, 0.3 s of warm-up (3 steps), 96 at 0.08 s
    assert whole_run.score(METRICS) == pytest.approx(8000 / (1.5 + 0.3 + 96 * 0.08))


def record(config: TrainConfig, result: TrialResult, retry: int = 0) -> str:
    """The status `record_measurement` gives a trial of `config` that ended with `result`."""
    study = optuna.create_study(direction="maximize")
    trial = study.ask()
    trial.set_user_attr(TrialKey.CONFIG, config.to_dict())
    if retry:
        trial.set_user_attr(TrialKey.RETRY, retry)
    record_measurement(study, trial, result, Scoring("cuda", None, 0.1, 0.1))
    return study.trials[-1].user_attrs[TrialKey.STATUS]


def test_a_compile_that_ran_out_of_time_is_not_a_deterministic_failure() -> None:
    """A first max-autotune compile can outlast the limit; the compile cache makes a second
    try faster, so it is run once more (by the worker) before it counts as a timeout."""
    compiling = TrialResult("timeout", "still running", phase=FIRST_STEP)
    compiled = TrainConfig(compile_mode="max-autotune")
    assert record(compiled, compiling) == TrialStatus.COMPILE_TIMEOUT
    assert TrialStatus.COMPILE_TIMEOUT not in DETERMINISTIC
    assert record(compiled, compiling, retry=1) == TrialStatus.TIMEOUT  # once only
    assert record(TrainConfig(), compiling) == TrialStatus.TIMEOUT  # no compile
    timing = TrialResult("timeout", "still running", phase="timing")
    assert record(compiled, timing) == TrialStatus.TIMEOUT  # compiled long before
    # an HF Trainer script compiling on an H200 (32 s limit) was a plain timeout, never retried
    script = TrialResult("timeout", "still running",
                         phase=f"{FIRST_STEP} of the script's transformers Trainer")
    assert record(TrainConfig(compile_mode="default"), script) == TrialStatus.COMPILE_TIMEOUT
