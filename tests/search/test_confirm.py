"""Confirmation: paired rounds, the speedup with its interval, the simplest configuration that
is as fast as the fastest, and drift between the start and the end of a study."""

from __future__ import annotations

import itertools
import time

import optuna

from autotune.config import TrainConfig
from autotune.search.confirm import Candidate, Plan, conclusion, confirm, drift
from autotune.search.events import SilentView
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob
from autotune.show.report import result_rows, speedup_text
from autotune.study.confirmation import Run
from autotune.study.records import MEMORY_CONSTRAINT
from autotune.study.results import study_summary
from autotune.study.storage import open_storage
from autotune.trial.protocol import TrialResult

BASE = TrainConfig(micro_batch_size=64)


def run(rate: float) -> Run:
    return Run("ok", samples_per_sec=rate, objective=rate)


def candidate(config: TrainConfig, rates: list[float | None],
              search: float | None = None) -> Candidate:
    return Candidate(config.to_dict(), 1, True, search,
                     [run(r) if r is not None else None for r in rates])


def test_a_clear_speedup_is_recommended_with_its_interval() -> None:
    baseline = candidate(BASE, [100, 110, 95, 105])
    faster = candidate(BASE.replace(precision="bf16"), [150, 166, 142, 158])
    result = conclusion([faster, baseline], baseline)
    assert result.winner.config["precision"] == "bf16"
    low, high = result.speedup_ci
    assert low < result.speedup < high and low > 1.4
    assert result.no_measurable_difference is False


def test_a_difference_inside_the_noise_keeps_the_simpler_configuration() -> None:
    baseline = candidate(BASE, [100, 112, 93, 104])
    lucky = candidate(BASE.replace(optimizer_impl="fused", num_workers=1,
                                   prefetch_factor=2), [104, 108, 99, 107])
    result = conclusion([lucky, baseline], baseline)
    assert result.fastest.config["optimizer_impl"] == "fused"
    assert result.winner.config == BASE.to_dict()  # no change beats two changes
    assert result.speedup == 1.0 and result.no_measurable_difference
    one_change = candidate(BASE.replace(optimizer_impl="fused"), [103, 111, 96, 106])
    result = conclusion([lucky, one_change, baseline.__class__(BASE.to_dict(), 0, False, None,
                                                             baseline.runs)], baseline)
    # the baseline did not fit in the search: of the two tied, the one with fewer changes
    assert result.winner.config["num_workers"] == 0


def test_a_candidate_that_failed_a_round_is_not_recommended() -> None:
    baseline = candidate(BASE, [100, 100, 100])
    flaky = candidate(BASE.replace(micro_batch_size=128), [300, None, 300])
    result = conclusion([flaky, baseline], baseline)
    assert result.winner.config == BASE.to_dict()


def test_drift_beyond_the_rounds_spread_is_reported() -> None:
    steady = drift(candidate(BASE, [100, 104, 97], search=101))
    assert steady and not steady.beyond_noise
    moved = drift(candidate(BASE, [70, 72, 69], search=100))
    assert moved.beyond_noise and moved.end_samples_per_sec == 70


def _study(tmp_path) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path),
                                direction="maximize")
    for config, rate, role in ((BASE, 100.0, "baseline"),
                               (BASE.replace(precision="bf16"), 150.0, "search")):
        trial = study.ask()
        for key, value in {"config": config.to_dict(), "role": role, "status": "ok",
                           "samples_per_sec": rate, "constraint": 0.0}.items():
            trial.set_user_attr(key, value)
        trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
        study.tell(trial, rate)
    return study


def test_rounds_are_added_until_the_speedup_is_known_and_a_disturbed_round_is_redone(
        tmp_path) -> None:
    """The measurements are scripted here (the decision is what is tested; real rounds run in
    the study tests): bf16 is 1.5x the baseline with 1% noise, the second round is disturbed."""
    noise = itertools.cycle([1.0, 1.01, 0.99, 1.02, 0.98])
    calls: list[tuple[str, str]] = []
    profiled: list[str] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        calls.append((job.name, config.precision))
        if job.profile:
            profiled.append(job.name)
        rate = (150.0 if config.precision == "bf16" else 100.0) * next(noise)
        disturbed = len(calls) in (3, 4)
        return TrialResult("ok", "measured", {"samples_per_sec": rate, "disturbed": disturbed})

    scoring = Scoring("cpu", None, 0.1, 0.0)
    result = confirm(_study(tmp_path), BASE, scoring, measure, SilentView(),
                     Plan(top=1, rounds=3, max_rounds=10, target=0.03), time_limit_s=60,
                     device="cpu", directory=tmp_path)
    assert result.rounds >= 3 and len(calls) == 2 * (result.rounds + 1)
    assert result.winner.config["precision"] == "bf16"
    low, high = result.speedup_ci
    assert (high - low) / 2 / result.speedup <= 0.03 and low > 1.4
    # only the first round profiles (its traces are the report's); the rest time the rate
    assert sorted(profiled) == ["confirm-0-0", "confirm-1-0"]


def test_a_machine_that_stays_busy_keeps_its_rounds_and_says_so(tmp_path) -> None:
    """Every run disturbed: rounds are measured again only while the cap leaves room for the
    minimum, then kept and counted, so the answer comes with its interval and a warning."""
    calls: list[str] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        calls.append(job.name)
        rate = 150.0 if config.precision == "bf16" else 100.0
        return TrialResult("ok", "measured", {"samples_per_sec": rate, "disturbed": True})

    result = confirm(_study(tmp_path), BASE, Scoring("cpu", None, 0.1, 0.0), measure,
                     SilentView(), Plan(top=1, rounds=2, max_rounds=3, target=0.03),
                     time_limit_s=60, device="cpu", directory=tmp_path)
    assert len(calls) == 2 * 3  # one round measured again, two kept
    assert result.rounds == 2 and result.disturbed_rounds == 2
    assert result.winner.config["precision"] == "bf16"
    assert result.speedup_ci is not None


def test_a_baseline_faster_than_everything_keeps_its_closest_contenders_interval() -> None:
    baseline = candidate(BASE, [100, 110, 95, 105])
    slower = candidate(BASE.replace(precision="bf16"), [60, 64, 58, 62])
    close = candidate(BASE.replace(optimizer_impl="fused"), [90, 101, 85, 96])
    result = conclusion([slower, close, baseline], baseline)
    assert result.winner.config == BASE.to_dict() and result.speedup == 1.0
    low, high = result.speedup_ci  # fused against the baseline: how close it came
    assert 0.8 < low < high < 1.0


def test_one_round_leaves_the_difference_unknown_not_absent(tmp_path) -> None:
    """A slow model's budget may leave room for one paired round: no interval can come of it,
    so the baseline is kept and `show` says the difference is not known (not that there is
    none), with a warning naming the fastest's figure."""
    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        rate = 144.0 if config.precision == "bf16" else 100.0
        return TrialResult("ok", "measured", {"samples_per_sec": rate})

    study = _study(tmp_path)
    result = confirm(study, BASE, Scoring("cpu", None, 0.1, 0.0), measure, SilentView(),
                     Plan(top=1, rounds=1, max_rounds=1, target=0.03), time_limit_s=60,
                     device="cpu", directory=tmp_path)
    assert result.rounds == 1 and result.winner.config == BASE.to_dict()
    assert result.fastest.config["precision"] == "bf16"
    assert result.speedup_ci is None and result.no_measurable_difference is None

    summary = study_summary(study)
    shown = " ".join(speedup_text(summary).split() + [r[2] for r in result_rows(summary)])
    assert "1.00x: not known (too few paired rounds" in shown
    assert "1.44x of the baseline, too few paired rounds to tell it from the best" in shown
    assert "no measurable difference" not in shown
    assert any("1 paired round, too few for an interval" in w and "(1.44x in it)" in w
               for w in summary.warnings)


def test_under_a_time_budget_rounds_go_on_while_the_longest_round_still_fits(tmp_path) -> None:
    """The plan's minimum is one round, the cap ten; runs take 0.1 s and the speedup is never
    known within ±3% (20% noise). Rounds are added past the minimum while time is left, and
    none starts that the longest round so far says would end after the budget."""
    noise = itertools.cycle([1.0, 1.2, 0.8, 1.1, 0.9])

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        time.sleep(0.1)
        rate = (150.0 if config.precision == "bf16" else 100.0) * next(noise)
        return TrialResult("ok", "measured", {"samples_per_sec": rate})

    ends_by = time.monotonic() + 1.5
    result = confirm(_study(tmp_path), BASE, Scoring("cpu", None, 0.1, 0.0), measure,
                     SilentView(), Plan(top=1, rounds=1, max_rounds=10, target=0.03,
                                        ends_by=ends_by), time_limit_s=60, device="cpu",
                     directory=tmp_path)
    assert 2 <= result.rounds < 10, result.rounds
    assert time.monotonic() <= ends_by + 0.5  # at most one round's overrun on a slow machine
    assert result.speedup_ci is not None
