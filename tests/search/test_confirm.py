"""Confirmation: paired rounds, the speedup with its interval, the simplest configuration that
is as fast as the fastest, and drift between the start and the end of a study."""

from __future__ import annotations

import itertools
import random
import time
from dataclasses import replace

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.search.conclusion import conclusion, drift
from autotune.search.confirm import ConfirmRequest, confirm
from autotune.search.contenders import Candidate, Measuring, Plan, candidates
from autotune.search.events import SilentView
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob
from autotune.search.verify import verify
from autotune.show.report import result_rows, speedup_text
from autotune.study.confirmation import UNJUDGED, UNMEASURED_TOGETHER, Confirmation, Run
from autotune.study.records import MEMORY_CONSTRAINT, StudyKey, TrialKey, config_key
from autotune.study.results import study_summary
from autotune.study.storage import open_storage
from autotune.study.verdict import confirmed_verdict
from autotune.trial.protocol import (
    LossRunSettings,
    Measurement,
    TrialResult,
    TrialStatus,
    WorstBatchSettings,
)

BASE = TrainConfig(micro_batch_size=64)


def request(baseline: TrainConfig, measure, directory, view=None, scoring=None, checks=None,
            **more) -> ConfirmRequest:
    """A confirmation's inputs as these tests measure: on CPU, each run within 60 s, notes said
    to `view` (none kept by default)."""
    return ConfirmRequest(baseline, Measuring(scoring or Scoring("cpu", None, 0.1, 0.0),
                                              measure, view or SilentView(), 60, "cpu",
                                              directory, checks=checks), **more)


def cpu_request(measure, directory, view=None, **more) -> ConfirmRequest:
    """`request` of the user's settings `BASE`."""
    return request(BASE, measure, directory, view, **more)


def measured(rate: float, disturbed: bool = False) -> TrialResult:
    return TrialResult(TrialStatus.OK, "measured",
                       measurement=Measurement(samples_per_sec=rate, disturbed=disturbed))


def run(rate: float) -> Run:
    return Run("ok", samples_per_sec=rate, objective=rate)


def candidate(config: TrainConfig, rates: list[float | None],
              search: float | None = None) -> Candidate:
    return Candidate(config, 1, True, search,
                     [run(r) if r is not None else None for r in rates])


def test_a_clear_speedup_is_recommended_with_its_interval() -> None:
    baseline = candidate(BASE, [100, 110, 95, 105])
    faster = candidate(BASE.replace(precision="bf16"), [150, 166, 142, 158])
    result = conclusion([faster, baseline], baseline)
    assert result.winner.config.precision == "bf16"
    low, high = result.speedup_ci
    assert low < result.speedup < high and low > 1.4
    assert result.no_measurable_difference is False


def test_beside_a_load_the_speedup_is_read_at_equal_load() -> None:
    """Twelve rounds beside a load: each run seeing its own share of the cores (0.3 to 0.7), a
    run's speed falling with it. The verdict's interval is read at equal load (narrower, still
    holding the true 1.5x) and says so; the same rounds whose runs' loads were not measured
    (a study from before) keep the plain interval."""
    rng = random.Random(5)
    faster_runs, baseline_runs = [], []
    for _ in range(12):
        mine, theirs = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7)
        for runs, share, rate in ((faster_runs, mine, 150), (baseline_runs, theirs, 100)):
            speed = rate * (1 - 0.6 * share) * rng.gauss(1, 0.005)
            runs.append(Run("ok", samples_per_sec=speed, objective=speed, disturbed=True,
                            load=share))
    loaded = conclusion([Candidate(BASE.replace(precision="bf16"), 1, True, None, faster_runs),
                         baseline := Candidate(BASE, 0, True, None, baseline_runs)], baseline)
    plain = conclusion(
        [Candidate(BASE.replace(precision="bf16"), 1, True, None,
                   [replace(r, load=None) for r in faster_runs]),
         unknown := Candidate(BASE, 0, True, None,
                              [replace(r, load=None) for r in baseline_runs])], unknown)
    assert loaded.load_adjusted and not plain.load_adjusted
    (low, high), (plain_low, plain_high) = loaded.speedup_ci, plain.speedup_ci
    assert low < 1.5 < high and high - low < (plain_high - plain_low) / 2
    assert "read at equal load" in loaded.in_rounds and "equal load" not in plain.in_rounds
    assert Confirmation.from_json(loaded.to_json()).load_adjusted


def test_a_difference_inside_the_noise_keeps_the_simpler_configuration() -> None:
    baseline = candidate(BASE, [100, 112, 93, 104])
    lucky = candidate(BASE.replace(optimizer_impl="fused", num_workers=1,
                                   prefetch_factor=2), [104, 108, 99, 107])
    result = conclusion([lucky, baseline], baseline)
    assert result.fastest.config.optimizer_impl == "fused"
    assert result.winner.config == BASE  # no change beats two changes
    assert result.speedup == 1.0 and result.no_measurable_difference
    one_change = candidate(BASE.replace(optimizer_impl="fused"), [103, 111, 96, 106])
    result = conclusion([lucky, one_change, baseline.__class__(BASE, 0, False, None,
                                                             baseline.runs)], baseline)
    # the baseline did not fit in the search: of the two tied, the one with fewer changes
    assert result.winner.config.num_workers == 0


def test_a_candidate_that_failed_a_round_is_not_recommended() -> None:
    baseline = candidate(BASE, [100, 100, 100])
    flaky = candidate(BASE.replace(micro_batch_size=128), [300, None, 300])
    result = conclusion([flaky, baseline], baseline)
    assert result.winner.config == BASE


def test_drift_beyond_the_rounds_spread_is_reported() -> None:
    steady = drift(candidate(BASE, [100, 104, 97], search=101))
    assert steady and not steady.beyond_noise
    moved = drift(candidate(BASE, [70, 72, 69], search=100))
    assert moved.beyond_noise and moved.end_samples_per_sec == 70


def _study(tmp_path) -> optuna.Study:
    """The baseline at 100 samples/s and bf16 at 150."""
    return _study_of(tmp_path, [(BASE, 100.0, "ok"), (BASE.replace(precision="bf16"), 150.0,
                                                      "ok")])


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
        return measured(rate, disturbed=disturbed)

    scoring = Scoring("cpu", None, 0.1, 0.0)
    result = confirm(_study(tmp_path), Plan(top=1, rounds=3, max_rounds=10, target=0.03),
                     request(BASE, measure, tmp_path, scoring=scoring))
    assert result.rounds >= 3 and len(calls) == 2 * (result.rounds + 1)
    assert result.winner.config.precision == "bf16"
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
        return measured(rate, disturbed=True)

    result = confirm(_study(tmp_path), Plan(top=1, rounds=2, max_rounds=3, target=0.03),
                     cpu_request(measure, tmp_path))
    assert len(calls) == 2 * 3  # one round measured again, two kept
    assert result.rounds == 2 and result.disturbed_rounds == 2
    assert result.winner.config.precision == "bf16"
    assert result.speedup_ci is not None


def test_a_baseline_faster_than_everything_keeps_its_closest_contenders_interval() -> None:
    baseline = candidate(BASE, [100, 110, 95, 105])
    slower = candidate(BASE.replace(precision="bf16"), [60, 64, 58, 62])
    close = candidate(BASE.replace(optimizer_impl="fused"), [90, 101, 85, 96])
    result = conclusion([slower, close, baseline], baseline)
    assert result.winner.config == BASE and result.speedup == 1.0
    low, high = result.speedup_ci  # fused against the baseline: how close it came
    assert 0.8 < low < high < 1.0


def test_one_round_leaves_the_difference_unknown_not_absent(tmp_path) -> None:
    """A slow model's budget may leave room for one paired round: no interval can come of it,
    so the baseline is kept and `show` says the difference is not known (not that there is
    none), with a warning naming the fastest's figure."""
    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        rate = 144.0 if config.precision == "bf16" else 100.0
        return measured(rate)

    study = _study(tmp_path)
    result = confirm(study, Plan(top=1, rounds=1, max_rounds=1, target=0.03),
                     cpu_request(measure, tmp_path))
    assert result.rounds == 1 and result.winner.config == BASE
    assert result.fastest.config.precision == "bf16"
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
        return measured(rate)

    ends_by = time.monotonic() + 1.5
    result = confirm(_study(tmp_path),
                     Plan(top=1, rounds=1, max_rounds=10, target=0.03, ends_by=ends_by),
                     cpu_request(measure, tmp_path))
    assert 2 <= result.rounds < 10, result.rounds
    assert time.monotonic() <= ends_by + 0.5  # at most one round's overrun on a slow machine
    assert result.speedup_ci is not None



def test_a_time_budget_ends_the_least_rounds_too(tmp_path) -> None:
    """Five rounds at least, but the budget holds about three rounds of 0.1 s runs: the
    rounds stop before the budget's end rather than at the least."""
    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        time.sleep(0.1)
        return measured(150.0 if config.precision == "bf16" else 100.0)

    budget_ends = time.monotonic() + 0.65
    result = confirm(_study(tmp_path),
                     Plan(top=1, rounds=5, max_rounds=10, target=0.0, budget_ends=budget_ends),
                     cpu_request(measure, tmp_path))
    assert 1 <= result.rounds <= 3, result.rounds
    assert time.monotonic() <= budget_ends + 0.1

class _Notes(SilentView):
    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)


def test_the_race_drops_a_clearly_slower_candidate_and_keeps_two_close_ones(tmp_path) -> None:
    """Recorded rates with 2% noise: fused AdamW and foreach are within 1% of each other, 1.5x
    the baseline; checkpointing is 0.7x. The slow one is out after the first rounds and never
    measured again; the close two race on only while their difference could be told within
    the cap of 8 rounds: a 1% gap in 2% noise cannot, so the race ends and says why; a
    screened trial never enters."""
    rates = {"fused": 150.0, "foreach": 149.0, "selective": 70.0, "base": 100.0}
    noise = itertools.cycle([1.0, 1.02, 0.98, 1.01, 0.99, 1.015, 0.985])

    def kind(config: TrainConfig) -> str:
        if config.activation_checkpointing == "selective":
            return "selective"
        return "base" if config.optimizer_impl == "for_loop" else config.optimizer_impl

    calls: list[str] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        calls.append(kind(config))
        return measured(rates[kind(config)] * next(noise))

    study = _study_of(tmp_path, [
        (BASE, 100.0, "ok"), (BASE.replace(optimizer_impl="fused"), 150.0, "ok"),
        (BASE.replace(optimizer_impl="foreach"), 149.0, "ok"),
        (BASE.replace(activation_checkpointing="selective"), 90.0, "ok"),
        (BASE.replace(precision="bf16"), 200.0, "screened")])
    view = _Notes()
    result = confirm(study, Plan(top=4, rounds=2, max_rounds=8, target=0.005),
                     cpu_request(measure, tmp_path, view=view))
    assert "bf16" not in {c.config.precision for c in result.candidates}
    dropped_after = calls.count("selective")
    assert 2 <= dropped_after <= 4 and 3 <= result.rounds < 8
    assert calls.count("fused") == calls.count("foreach") == calls.count("base") == result.rounds
    ended = [line for line in view.lines if "no more rounds would resolve" in line]
    assert len(ended) == 1 and "against the leader in about" in ended[0]
    assert any("out of the race" in line and "selective checkpointing" in line
               and "of the leader's speed" in line for line in view.lines)
    assert result.winner.config.optimizer_impl in ("fused", "foreach")


def _study_of(tmp_path, trials: list[tuple[TrainConfig, float, str]],
              disturbed: frozenset[int] = frozenset(), peak: int | None = None,
              peaks: dict[TrainConfig, int] | None = None) -> optuna.Study:
    """A study whose first trial is the baseline, with the given rates and statuses (the
    trials numbered in `disturbed` timed on a busy machine, each with the search's `peak`, or
    its configuration's in `peaks`)."""
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path),
                                direction="maximize")
    for number, (config, rate, status) in enumerate(trials):
        trial = study.ask()
        figures = Measurement(samples_per_sec=rate, disturbed=number in disturbed,
                              peak_memory_bytes=(peaks or {}).get(config, peak))
        for key, value in {TrialKey.CONFIG: config.to_dict(), TrialKey.STATUS: status,
                           TrialKey.ROLE: "baseline" if number == 0 else "search",
                           TrialKey.MEASUREMENT: figures.to_json(),
                           TrialKey.CONSTRAINT: 0.0}.items():
            trial.set_user_attr(key, value)
        trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
        study.tell(trial, rate)
    return study


def test_verify_measures_the_answer_against_the_baseline_in_alternating_rounds(
        tmp_path) -> None:
    """After confirmation, `verify` re-measures the recommendation against the baseline, which
    runs first alternating round by round, and records the check in the study."""
    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        calls.append((job.name, config.precision))
        return measured(rate[config.precision])

    calls: list[tuple[str, str]] = []
    rate = {"bf16": 150.0, "fp32": 100.0}
    study = _study(tmp_path)
    study.set_user_attr(StudyKey.BASELINE_CONFIG, BASE.to_dict())
    confirm(study, Plan(top=1, rounds=2, max_rounds=2, target=0.03), cpu_request(measure, tmp_path))
    calls.clear()
    rate["bf16"] = 120.0  # the machine changed since: the claim of 1.5x moved
    check = verify(study, measure, Scoring("cpu", None, 0.1, 0.0), SilentView(), rounds=3,
                   time_limit_s=60, device="cpu", machine="cpu B")
    assert [precision for _, precision in calls] == ["bf16", "fp32", "fp32", "bf16", "bf16",
                                                     "fp32"]
    assert check.speedup == pytest.approx(1.2) and check.claimed == pytest.approx(1.5)
    assert check.holds is False
    summary = study_summary(study)
    assert summary.verifications == (check,)
    assert "moved by -20%" in summary.verifications[0].describe()


def test_a_search_that_disagrees_with_the_rounds_widens_the_interval_and_says_so() -> None:
    """The rounds say 1.2x, tightly; the search trials, measured minutes apart, said 0.9x: the
    machine moved between them. The interval is widened to hold both, and once it holds 1 the
    user's settings are kept, with the reason."""
    baseline = candidate(BASE, [100, 101, 99, 100], search=100)
    tight = candidate(BASE.replace(precision="bf16"), [120, 121, 119, 120], search=90)
    result = conclusion([tight, baseline], baseline)
    assert result.widened and result.search_speedup == pytest.approx(0.9)
    low, high = result.speedup_ci
    assert low == pytest.approx(0.9 * 0.96) and high > 1.2
    assert result.winner.config == BASE and result.no_measurable_difference
    assert result.contender.config.precision == "bf16"
    verdict = confirmed_verdict(result, BASE)
    assert verdict.startswith("not known: bf16 is 1.20x [0.86-")
    assert verdict.endswith("inside the noise; your settings kept")
    agreeing = candidate(BASE.replace(precision="bf16"), [120, 121, 119, 120], search=121)
    assert not conclusion([agreeing, baseline], baseline).widened
    # a busy moment's search figure is not evidence: it never widens the rounds' interval
    busy = replace(baseline, search_disturbed=True)
    assert not conclusion([tight, busy], busy).widened


def test_a_busy_machine_keeps_its_round_when_time_allows_no_other(tmp_path) -> None:
    """Every run disturbed and the time cap already reached after the first round: the least
    rounds still run, and measuring them again would leave none, so each is kept, with its
    warning."""
    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        time.sleep(0.05)
        rate = 150.0 if config.precision == "bf16" else 100.0
        return measured(rate, disturbed=True)

    plan = Plan(top=1, rounds=2, max_rounds=5, target=0.03, ends_by=time.monotonic() + 0.01)
    result = confirm(_study(tmp_path), plan, cpu_request(measure, tmp_path))
    assert result.rounds == 2 and result.disturbed_rounds == 2
    assert result.winner is not None


def test_a_baseline_with_no_candidate_beside_it_is_not_confirmed(tmp_path) -> None:
    """Every searched trial stopped at screening: no round runs, and the study keeps the
    baseline as the search's answer, with no confirmation stored."""
    calls: list[TrainConfig] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        calls.append(config)
        return measured(100.0)

    study = _study_of(tmp_path, [(BASE, 100.0, "ok"),
                                 (BASE.replace(precision="bf16"), 40.0, "screened")])
    view = _Notes()
    assert confirm(study, Plan(top=3, rounds=3), cpu_request(measure, tmp_path, view=view)) is None
    assert calls == [] and StudyKey.CONFIRMATION not in study.user_attrs
    assert any("nothing to confirm" in line for line in view.lines)
    assert study_summary(study).verdict == \
        "kept your settings: no configuration measured faster in the search"


def test_the_baseline_is_raced_against_the_best_other_even_when_it_ranks_first(tmp_path) -> None:
    """On a busy machine only the baseline's trial was clean: the best disturbed configuration
    still races it (the fresh rounds measure it again), and a clean one ranks above it."""
    trials = [(BASE, 100.0, "ok"), (BASE.replace(precision="bf16"), 90.0, "ok"),
              (BASE.replace(optimizer_impl="fused"), 60.0, "ok")]
    mixed = candidates(_study_of(tmp_path / "mixed", trials, frozenset({1})), BASE, top=1)
    assert [c.config for c in mixed] == [trials[2][0], BASE]
    busy = candidates(_study_of(tmp_path / "busy", trials, frozenset({1, 2})), BASE, top=1)
    assert [c.config for c in busy] == [trials[1][0], BASE]


def _scripted(rate_of, shared: float = 0.03, own: float = 0.005):
    """A fresh run's measurement from a rate per configuration, with seeded normal noise: the
    machine's, alike for every run of a round (`shared`, its relative spread), and the run's
    own (`own`)."""
    draw = random.Random(0)
    machine: dict[str, float] = {}
    calls: list[TrainConfig] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        calls.append(config)
        race, _, round_ = job.name.rpartition("-")
        moment = machine.setdefault(f"{race.rpartition('-')[0]}-{round_}",
                                    draw.gauss(0.0, shared))
        return measured(rate_of(config) * (1 + moment) * (1 + draw.gauss(0.0, own)))

    return measure, calls


def _minimal_study(tmp_path, best: TrainConfig, rate: float) -> optuna.Study:
    study = _study_of(tmp_path, [(BASE, 100.0, "ok"), (best, rate, "ok")])
    study.set_user_attr(StudyKey.BASELINE_CONFIG, BASE.to_dict())
    return study


def test_a_change_inside_the_noise_is_dropped_and_one_that_pays_is_kept(tmp_path) -> None:
    """bf16 does the work (1.5x) and fused AdamW rides along: the best races beside itself
    without each. Without bf16 it is measurably slower (kept); without fused AdamW it is as
    fast (dropped): the answer is bf16 alone, and the verdict says what it dropped."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")
    measure, calls = _scripted(lambda c: 150.0 if c.precision == "bf16" else 100.0)
    study = _minimal_study(tmp_path, best, 150.0)
    result = confirm(study, Plan(top=1, rounds=3, max_rounds=6, target=0.03),
                     cpu_request(measure, tmp_path))
    assert {c.config for c in result.candidates} >= {best, BASE.replace(precision="bf16"),
                                                     BASE.replace(optimizer_impl="fused")}
    assert result.winner.config == BASE.replace(precision="bf16")
    assert result.taken_from.config == best
    kept = {t.change: t for t in result.taken_back}
    assert kept["bf16"].outcome == "pays" and kept["bf16"].ratio < 0.8
    assert kept["fused AdamW"].outcome == "inside the noise" and not kept["fused AdamW"].kept
    assert kept["fused AdamW"].describe().startswith("taking back fused AdamW cost ")
    assert kept["fused AdamW"].describe().endswith(", inside the noise: dropped")
    low, high = result.speedup_ci
    assert low > 1.4 and result.no_measurable_difference is False
    verdict = study_summary(study).verdict
    assert verdict.startswith("bf16: 1.50x faster than your settings [1.")
    assert "; dropped as inside the noise: fused AdamW" in verdict
    # the configuration without bf16 was out as soon as it was measurably slower
    assert calls.count(BASE.replace(optimizer_impl="fused")) < calls.count(best)


def test_every_change_that_pays_is_kept(tmp_path) -> None:
    """bf16 and fused AdamW each give 1.3x: taking back either is measurably slower, so the
    answer keeps both and drops nothing."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")

    def rate(config: TrainConfig) -> float:
        return 100.0 * (1.3 if config.precision == "bf16" else 1.0) * \
            (1.3 if config.optimizer_impl == "fused" else 1.0)

    measure, _ = _scripted(rate)
    study = _minimal_study(tmp_path, best, 169.0)
    result = confirm(study, Plan(top=1, rounds=3, max_rounds=6, target=0.03),
                     cpu_request(measure, tmp_path))
    assert result.winner.config == best and result.taken_from is None
    assert [t.outcome for t in result.taken_back] == ["pays", "pays"]
    assert "dropped" not in study_summary(study).verdict


# loader workers that do the work, and a best where three changes ride along with them
LOADER = BASE.replace(num_workers=2, prefetch_factor=4, persistent_workers=True)
RIDERS = LOADER.replace(optimizer_impl="foreach", compile_mode="max-autotune-no-cudagraphs",
                        memory_format="channels_last")


def _loader_rate(config: TrainConfig) -> float:
    """3.4x with loader workers, whatever rides along."""
    return 340.0 if config.num_workers else 100.0


def _loader_with_riders(tmp_path, plan: Plan):
    """The confirmation of a best whose loader workers do the work (3.4x) while foreach AdamW,
    torch.compile and channels-last ride along inside the noise: the study, the result, the
    notes said and the configurations measured."""
    best = RIDERS
    measure, calls = _scripted(_loader_rate)
    study = _minimal_study(tmp_path, best, 346.0)
    view = _Notes()
    result = confirm(study, plan, cpu_request(measure, tmp_path, view=view))
    return study, result, view, calls


def test_a_compile_that_does_not_measurably_pay_is_dropped_with_the_rest(tmp_path) -> None:
    """The issue's run: loader workers do the work; foreach AdamW, torch.compile and
    channels-last ride along inside the noise. Three changes dropped: the configuration
    without all of them races the best and the baseline in a short race of its own, and is the
    answer; the verdict names the three."""
    study, result, view, calls = _loader_with_riders(tmp_path, Plan(top=1, rounds=3,
                                                                     max_rounds=6, target=0.03))
    loader = LOADER
    assert result.winner.config == loader and result.answer_rounds >= 3
    dropped = {t.change for t in result.dropped}
    assert dropped == {"foreach AdamW", "torch.compile max-autotune-no-cudagraphs",
                       "channels-last tensors"}
    assert [t.change for t in result.taken_back if t.kept] == \
        ["2 loader workers, prefetch 4 + persistent workers"]
    assert any("in a short race" in line for line in view.lines)
    assert calls.count(loader) >= 3  # measured in the short race
    verdict = study_summary(study).verdict
    assert verdict.startswith("2 loader workers, prefetch 4 + persistent workers: 3.4")
    assert verdict.endswith("; dropped as inside the noise: foreach AdamW, torch.compile "
                            "max-autotune-no-cudagraphs, channels-last tensors")
    assert f"{result.answer_rounds} paired rounds" in verdict


def test_a_short_race_after_the_race_starts_only_within_the_confirmations_share(
        tmp_path) -> None:
    """--trials, no time budget: the confirmation's share of the study (`ends_by`) has passed
    when the race ends. The short race of the answer less the three changes inside the noise
    would end after it, so it does not start, and the run keeps the time it announced. The
    answer without the three was never measured, and the best single drop still holds two
    changes not shown to pay: nothing unmeasured is recommended, the user's settings are
    kept and the verdict says what was not measured: the answer less them all, not each (each
    was measured alone and reads as such)."""
    study, result, view, _ = _loader_with_riders(tmp_path, Plan(
        top=1, rounds=3, max_rounds=6, target=0.03, ends_by=time.monotonic()))
    assert not any("in a short race" in line for line in view.lines)
    assert result.winner.config == BASE and result.contender.config == result.taken_from.config
    apart = [t for t in result.taken_back if t.why == UNMEASURED_TOGETHER]
    assert len(apart) == 2 and all(t.ratio is not None for t in apart)
    assert all(t.describe().startswith(f"taking back {t.change} cost ") for t in apart)
    assert not any("not measured without" in line for line in view.lines)
    verdict = study_summary(study).verdict
    assert verdict.startswith("not known: ") and "were not measured to pay (each was measured " \
        "alone, the answer less all of them in too few rounds" in verdict, verdict


def test_changes_that_each_do_the_same_work_keep_one(tmp_path) -> None:
    """bf16 or fused AdamW alone gives the whole 1.5x: each is inside the noise taken back
    alone, but without both it is the baseline, which the race measured slower. The best
    single drop is the answer; the other change is kept, and says why."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")
    measure, _ = _scripted(lambda c: 150.0 if c.precision == "bf16" or
                           c.optimizer_impl == "fused" else 100.0)
    study = _minimal_study(tmp_path, best, 150.0)
    result = confirm(study, Plan(top=1, rounds=3, max_rounds=6, target=0.03),
                     cpu_request(measure, tmp_path))
    assert result.winner.config in (BASE.replace(precision="bf16"),
                                    BASE.replace(optimizer_impl="fused"))
    outcomes = sorted(t.outcome for t in result.taken_back)
    assert outcomes == ["inside the noise", "needed together"]
    together = next(t for t in result.taken_back if t.outcome == "needed together")
    assert together.kept and "your settings" in together.describe()


def test_no_time_to_show_that_a_change_pays_leaves_it_out_with_its_measured_effect(
        tmp_path) -> None:
    """A time budget that ends after the least rounds of the race: fused AdamW, measured too
    little to be shown to pay, is left out of the answer (bf16 alone, which the race measured
    beside it), and the verdict says so with its measured effect; "lack of time" keeps
    nothing."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        time.sleep(0.05)
        return measured(150.0 if config.precision == "bf16" else 100.0)

    study = _minimal_study(tmp_path, best, 150.0)
    plan = Plan(top=1, rounds=2, max_rounds=6, target=0.03, budget_ends=time.monotonic() + 0.5)
    result = confirm(study, plan, cpu_request(measure, tmp_path))
    assert result.winner.config == BASE.replace(precision="bf16")
    assert [(t.change, t.outcome) for t in result.taken_back if not t.kept] == \
        [("fused AdamW", "not shown to pay")] and not result.unjudged
    verdict = study_summary(study).verdict
    assert "; not shown to pay here, left out: fused AdamW (0.0%" in verdict
    assert "lack of time" not in verdict


def test_too_few_rounds_asked_for_leave_a_change_out_as_not_shown_to_pay(tmp_path) -> None:
    """--confirm-max-rounds 2: too few to show that fused AdamW pays; it is left out."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")
    measure, _ = _scripted(lambda c: 150.0 if c.precision == "bf16" else 100.0)
    study = _minimal_study(tmp_path, best, 150.0)
    result = confirm(study, Plan(top=1, rounds=2, max_rounds=2, target=0.03),
                     cpu_request(measure, tmp_path))
    assert result.winner.config == BASE.replace(precision="bf16")
    assert "not shown to pay here, left out: fused AdamW" in study_summary(study).verdict


def test_what_the_checks_rule_out_never_races_and_the_next_best_takes_its_place(
        tmp_path) -> None:
    """Scripted runs: bf16 at micro-batch 64 is fastest in the search but learns worse; micro-
    batch 128 is next but runs out of memory on its worst batch; micro-batch 32 (1.2x) and
    fused AdamW (1.1x) pass. Only they race the baseline; the answer carries its worst batch's
    peak as its own, and the verdict says what was ruled out and why."""
    from autotune.search.checks import AnswerChecks, CheckPrices
    from autotune.trial.protocol import SCANNED, LossRun, SampleSizes, WorstBatch

    base = TrainConfig(micro_batch_size=16, grad_accum_steps=8)
    bf16 = base.replace(micro_batch_size=64, grad_accum_steps=2, precision="bf16")
    big = base.replace(micro_batch_size=128, grad_accum_steps=1)
    mid = base.replace(micro_batch_size=32, grad_accum_steps=4)
    fused = base.replace(optimizer_impl="fused")
    rates = {config_key(c): r for c, r in ((base, 100.0), (bf16, 200.0), (big, 160.0),
                                           (mid, 120.0), (fused, 110.0))}
    noise = itertools.cycle([1.0, 1.01, 0.99])
    raced: list[TrainConfig] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        if isinstance(job.settings, WorstBatchSettings):
            if config.micro_batch_size == 128:
                return TrialResult(TrialStatus.OOM, "out of memory")
            return TrialResult(TrialStatus.OK, worst_batch=WorstBatch(
                config.micro_batch_size, config.micro_batch_size * 10 * 2**20, 3))
        if isinstance(job.settings, LossRunSettings):
            final = 2.0 if config.precision == "bf16" else 1.0 + job.settings.seed / 100
            return TrialResult(TrialStatus.OK, loss_run=LossRun(
                job.settings.seed, 50, 3.0, final, final))
        raced.append(config)
        return TrialResult(TrialStatus.OK, measurement=Measurement(
            samples_per_sec=rates[config_key(config)] * next(noise),
            peak_memory_bytes=100 * 2**20))

    study = _study_of(tmp_path, [(base, 100.0, "ok"), (bf16, 200.0, "ok"), (big, 160.0, "ok"),
                                 (mid, 120.0, "ok"), (fused, 110.0, "ok")])
    study.set_user_attr(StudyKey.BASELINE_CONFIG, base.to_dict())
    scoring = Scoring("cpu", 2**30, 0.1, 0.0)
    sizes = SampleSizes(SCANNED, 1000, 1000, (5, 9), (9000, 100), 90, 80)
    view = _Notes()
    checks = AnswerChecks(measure, base, scoring, sizes=sizes, capacity_bytes=2**30,
                          loss_check=True, prices=CheckPrices(1.0, 1.0, 50), time_limit_s=60,
                          device="cpu", view=view)
    result = confirm(study, Plan(top=2, rounds=3, max_rounds=3, target=0.01),
                     request(base, measure, tmp_path, view, scoring, checks))
    assert {config_key(c) for c in raced} == {config_key(c) for c in (mid, fused, base)}
    ruled = {config_key(c.config): c.excluded for c in result.ruled_out}
    assert ruled[config_key(bf16)].startswith("it learns worse: its loss after 50 steps is "
                                              "100.0% above your settings'")
    assert ruled[config_key(big)] == ("its worst batch (the 128 largest samples) runs out of "
                                      "memory")
    assert result.winner.config == mid
    assert result.winner.worst_batch.peak_memory_bytes == 320 * 2**20
    assert result.winner.loss_check is None  # it changes nothing a step computes
    assert result.checks.baseline_losses == (1.0, 1.01)
    assert any("bf16 is ruled out: it learns worse" in line for line in view.lines)
    summary = study_summary(study)
    assert summary.best_peak_memory_bytes == 320 * 2**20  # its worst batch's, not its rounds'
    assert summary.best_worst_batch_headroom_bytes == 2**30 - 320 * 2**20
    assert "The answer's worst batch (the 32 largest samples) peaks at 320.00 MiB, 704.00 MiB " \
           "(69%) below the 1.00 GiB memory." in summary.verdict
    assert "Ruled out by the checks: micro-batch 64 x 2 + bf16 (it learns worse: its loss " \
           "after 50 steps is 100.0% above your settings', beyond their seed-to-seed spread " \
           "of 1.0%); micro-batch 128 x 1 (its worst batch (the 128 largest samples) runs out " \
           "of memory)." in summary.verdict
    rows = {name: (value, how) for name, value, how in result_rows(summary)}
    assert rows["worst batch (best)"][0] == "320.00 MiB"
    assert rows["loss (your settings)"][0] == "1 | 1.01"


def test_configurations_ruled_out_for_a_reason_already_known_cost_nothing_and_the_rest_race(
        tmp_path) -> None:
    """Five bf16 configurations lead the search and bf16 learns worse (the samples are one size:
    no worst batch to run). One loss run of bf16 rules them all out; the search's next two, in
    fp32, race the baseline, and the answer is one of them, not 'your settings kept'."""
    from autotune.search.checks import AnswerChecks, CheckPrices
    from autotune.trial.protocol import SCANNED, LossRun, SampleSizes

    base = TrainConfig(micro_batch_size=8, grad_accum_steps=8)
    bf16s = [base.replace(micro_batch_size=m, grad_accum_steps=64 // m, precision="bf16")
             for m in (2, 4, 8, 16, 32)]
    mid = base.replace(micro_batch_size=16, grad_accum_steps=4)
    fused = base.replace(optimizer_impl="fused")
    rates = {config_key(c): r for c, r in ((base, 100.0), (mid, 130.0), (fused, 120.0),
                                           *((c, 200.0 + i) for i, c in enumerate(bf16s)))}
    noise = itertools.cycle([1.0, 1.01, 0.99])
    losses: list[TrainConfig] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        if isinstance(job.settings, LossRunSettings):
            losses.append(config)
            final = 2.0 if config.precision == "bf16" else 1.0 + job.settings.seed / 100
            return TrialResult(TrialStatus.OK, loss_run=LossRun(
                job.settings.seed, 50, 3.0, final, final))
        assert not isinstance(job.settings, WorstBatchSettings)
        return TrialResult(TrialStatus.OK, measurement=Measurement(
            samples_per_sec=rates[config_key(config)] * next(noise),
            peak_memory_bytes=100 * 2**20))

    study = _study_of(tmp_path, [(base, 100.0, "ok"), (mid, 130.0, "ok"), (fused, 120.0, "ok"),
                                 *((c, rates[config_key(c)], "ok") for c in bf16s)])
    study.set_user_attr(StudyKey.BASELINE_CONFIG, base.to_dict())
    scoring = Scoring("cpu", 2**30, 0.1, 0.0)
    uniform = SampleSizes(SCANNED, 100, 100, (0, 1), (64, 64), 64, 64)
    view = _Notes()
    checks = AnswerChecks(measure, base, scoring, sizes=uniform, capacity_bytes=2**30,
                          loss_check=True, prices=CheckPrices(1.0, 1.0, 50), time_limit_s=60,
                          device="cpu", view=view)
    result = confirm(study, Plan(top=2, rounds=3, max_rounds=3, target=0.01),
                     request(base, measure, tmp_path, view, scoring, checks))
    assert len(losses) == 3  # the baseline's two seeds and bf16's one: each numerics once
    assert {config_key(c.config) for c in result.ruled_out} == {config_key(c) for c in bf16s}
    assert result.winner.config in (mid, fused)
    assert sum("is ruled out" in line for line in view.lines) == len(bf16s)


def test_drops_that_leave_an_answer_inside_the_noise_are_kept_together(tmp_path) -> None:
    """The loader does the work in the race, and foreach AdamW, compile and channels-last each
    ride along inside the noise; but in the short race of the best less all three, the machine
    has moved and nothing differs from the baseline. The answer less the three no longer
    measurably beats your settings: nothing is dropped, the race's answer stands, and each
    change says why it was kept (a new user's nanoGPT loop was answered "fused AdamW: 0.95x
    your settings [0.68-1.34]" before)."""
    best = RIDERS
    race, _ = _scripted(_loader_rate)
    moved, _ = _scripted(lambda c: 100.0, shared=0.0)

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        return (moved if job.name.startswith("minimal") else race)(config, job)

    study = _minimal_study(tmp_path, best, 346.0)
    result = confirm(study, Plan(top=1, rounds=3, max_rounds=6, target=0.03),
                     cpu_request(measure, tmp_path))
    assert result.winner.config == best and result.no_measurable_difference is False
    kept = {t.change: t for t in result.taken_back}
    assert {t.outcome for c, t in kept.items() if c != "2 loader workers, prefetch 4 + "
            "persistent workers"} == {"needed together"}
    assert kept["foreach AdamW"].describe().endswith(
        "not shown to pay alone, but without it the answer did not measurably beat your "
        "settings: kept")
    verdict = study_summary(study).verdict
    assert verdict.startswith("foreach AdamW + 2 loader workers, prefetch 4 + persistent "
                              "workers + torch.compile") and "dropped" not in verdict


def test_drops_whose_answer_ran_too_few_rounds_are_not_kept_together(tmp_path) -> None:
    """As above, but the rounds end at two (--confirm-max-rounds 2), and in the short race of
    the best less its three riders the runs spread 60%: two rounds cannot tell that answer from
    your settings, which is no sign the riders pay together. They are unjudged, none is
    recommended, and the verdict says what is missing (they were kept together before)."""
    best = RIDERS
    race, _ = _scripted(_loader_rate)
    spread, _ = _scripted(_loader_rate, shared=0.0, own=0.6)

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        return (spread if job.name.startswith("minimal") else race)(config, job)

    study = _minimal_study(tmp_path, best, 346.0)
    result = confirm(study, Plan(top=1, rounds=2, max_rounds=2, target=0.03),
                     cpu_request(measure, tmp_path))
    assert result.winner.config == BASE and result.contender.config == best
    riders = [t for t in result.taken_back if not t.change.startswith("2 loader workers")]
    assert {(t.outcome, t.why) for t in riders} == {(UNJUDGED, UNMEASURED_TOGETHER)}
    verdict = study_summary(study).verdict
    assert verdict.startswith("not known: ") and verdict.endswith("your settings kept")


def test_the_rounds_end_once_every_change_is_judged_not_at_the_cap(tmp_path) -> None:
    """bf16 pays 1.5x and fused AdamW does nothing, in runs of 0.5% noise of their own: a
    cap of 40 rounds, but a few judge both and know the speedup, and the race ends there."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")
    measure, _ = _scripted(lambda c: 150.0 if c.precision == "bf16" else 100.0)
    study = _minimal_study(tmp_path, best, 150.0)
    result = confirm(study, Plan(top=1, rounds=3, max_rounds=40, target=0.03),
                     cpu_request(measure, tmp_path))
    assert result.rounds <= 6
    assert {t.change: t.outcome for t in result.taken_back} == {
        "bf16": "pays", "fused AdamW": "inside the noise"}


def test_rounds_that_could_not_resolve_what_is_open_are_not_run(tmp_path) -> None:
    """Runs of 6% noise of their own and fused AdamW worth 2.5%: judging it would take dozens
    of rounds, and the cap is 12. The race ends after its least rounds and says why, and fused
    AdamW is left out as not shown to pay."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")
    measure, _ = _scripted(lambda c: (150.0 if c.precision == "bf16" else 100.0) *
                           (1.025 if c.optimizer_impl == "fused" else 1.0), own=0.06)
    study = _minimal_study(tmp_path, best, 150.0)
    view = _Notes()
    result = confirm(study, Plan(top=1, rounds=3, max_rounds=12, target=0.03),
                     cpu_request(measure, tmp_path, view=view))
    ended = [line for line in view.lines if "no more rounds would resolve" in line]
    assert result.rounds < 12 and len(ended) == 1
    assert "fused AdamW judged in about" in ended[0]
    assert {t.change: t.outcome for t in result.taken_back}["fused AdamW"] == "not shown to pay"


def test_one_slow_run_does_not_end_a_race_that_has_time_for_its_judgement(tmp_path) -> None:
    """The first run takes 0.4 s, every other 0.01 s, and fused AdamW is worth 8% in runs of
    5% noise of their own: judged in a dozen rounds or so, and the 3 s left hold dozens at the
    runs' mean. The race goes on until it is judged (the slowest run alone would have said a
    few rounds fit, and ended it unjudged)."""
    best = BASE.replace(precision="bf16", optimizer_impl="fused")
    scripted, _ = _scripted(lambda c: (150.0 if c.precision == "bf16" else 100.0) *
                            (1.08 if c.optimizer_impl == "fused" else 1.0), own=0.05)
    runs = itertools.count()

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        time.sleep(0.4 if next(runs) == 0 else 0.01)
        return scripted(config, job)

    study = _minimal_study(tmp_path, best, 160.0)
    view = _Notes()
    result = confirm(study, Plan(top=1, rounds=3, max_rounds=60, target=0.03,
                                 ends_by=time.monotonic() + 3.0),
                     cpu_request(measure, tmp_path, view=view))
    assert not [line for line in view.lines if "no more rounds would resolve" in line], view.lines
    assert {t.change: t.outcome for t in result.taken_back}["fused AdamW"] == "pays"
