"""How long a study takes: estimated from the trials measured so far, and, under the default
time budget, when to stop starting trials and how many confirmation rounds fit, so that a run
given no `--trials` or `--timeout` ends within the budget, confirmation included."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import optuna

from autotune.formatting import format_seconds
from autotune.options import MeasureSettings
from autotune.search.confirm import CLAIM_SETTLE_S
from autotune.search.runner import ROUND_WINDOW_STEPS
from autotune.study.records import COUNTS_AGAINST_BUDGET, Role, TrialRecord, trial_records
from autotune.trial.protocol import Measurement, TrialStatus

# Paired rounds an answer needs: with two, a 95% interval spans t = 12.7 standard errors, with
# three 4.3.
MIN_ROUNDS = 3
# The default budget grows at most to this many times itself for an answer: a person who
# planned for the default is never told an hour.
MAX_GROWTH = 3


def trial_seconds(study: optuna.Study) -> float | None:
    """A trial's wall time, process start to result: the median over the trials that ran."""
    walls = [r.wall_s for r in _measured(study)]
    return statistics.median(walls) if walls else None


def search_trial_seconds(study: optuna.Study, screening: bool) -> float | None:
    """What the next search trial will take: a full trial's wall time, or, where screening is
    on, a mix of it and a screened trial's (stopped after its screening window), in the share
    of search trials screened so far (a half before any: Laplace's rule)."""
    measured = _measured(study)
    unscreened = [r for r in measured if r.status != TrialStatus.SCREENED]
    full = [r.wall_s for r in unscreened]
    if not full:
        return trial_seconds(study)
    if not screening:
        return statistics.median(full)
    searched = [r for r in measured if r.role != Role.BASELINE]
    screened = [r.wall_s for r in searched if r.status == TrialStatus.SCREENED]
    # before one is seen: a full trial's wall less what follows its screening window
    cut = statistics.median(screened) if screened else statistics.median(
        r.wall_s - (r.measurement.window_s if r.measurement else 0.0) for r in unscreened)
    share = (len(screened) + 1) / (len(searched) + 2)
    return share * cut + (1 - share) * statistics.median(full)


def round_run_seconds(study: optuna.Study, settings: MeasureSettings) -> float | None:
    """A confirmation run's wall time (`run_price_s`), priced at the baseline's trial (the
    baseline runs in every round; a compiled trial's start-up would price every run at its
    own). Before the baseline has run, the median of the trials that have."""
    measured = [r for r in _measured(study) if r.measurement is not None
                and r.measurement.step_time_median_s and r.measurement.window_s]
    baseline = [r for r in measured if r.role == Role.BASELINE]
    runs = [run_price_s(r.wall_s, r.measurement, settings) for r in baseline or measured]
    return statistics.median(runs) if runs else None


def run_price_s(wall_s: float, measurement: Measurement, settings: MeasureSettings) -> float:
    """What a confirmation run of a measured configuration will take: what it does, priced
    from the trial's phases: the process's start, the build, the first step, the warm-up,
    then one window of its own (`runner.ROUND_WINDOW_STEPS` steps, or the window's minimum
    seconds where those are longer). Not the trial's screening, its disturbed windows
    measured again, its sync tracing or its profiler window: a round run does none of them.
    A trial stored before phases were recorded: its wall less its windows."""
    m = measurement
    step = m.step_time_median_s or 0.0
    window = max(settings.window_seconds, ROUND_WINDOW_STEPS * step)
    phases = m.phases
    if phases is None or m.measure_wall_s is None:
        return max(window, wall_s - m.window_s - settings.screen_steps * step + window)
    process_start = max(0.0, wall_s - m.measure_wall_s)
    return process_start + phases.build_s + phases.first_step_s + phases.warmup_s + window


def _measured(study: optuna.Study) -> list[TrialRecord]:
    """The trials that ran a process to its end and were not repeats, with their wall time."""
    return [r for r in trial_records(study)
            if r.status in COUNTS_AGAINST_BUDGET and not r.duplicate and r.wall_s]


@dataclass(frozen=True)
class TimePlan:
    """Under a time budget: the search's end, and the confirmation rounds that fit after it."""

    trial_s: float
    search_ends_at: float       # time.monotonic() after which no search trial starts
    confirm_rounds: int         # at most this many rounds fit before the budget ends
    search_trials: int          # about this many search trials fit

    def describe(self, budget_s: float, candidates: int) -> str:
        return (f"a trial takes about {format_seconds(self.trial_s)} here: in the "
                f"{format_seconds(budget_s)} budget, about {self.search_trials} more search "
                f"trials, then up to {self.confirm_rounds} confirmation rounds (the first of "
                f"{candidates} runs)")


def confirmation_seconds(candidates: int, run_s: float, rounds: int = MIN_ROUNDS) -> float:
    """A confirmation of `rounds` rounds: the first of every candidate, then the race's two
    (the best and the baseline)."""
    return (candidates + 2 * (rounds - 1)) * run_s


def plan_time(budget_s: float, started: float, now: float, trial_s: float, run_s: float,
              candidates: int, share: float, max_rounds: int) -> TimePlan:
    """Leave the confirmation its share of the budget (at least the rounds an answer with an
    interval needs; none with no share: no confirmation), and the last search trial room to
    finish."""
    ends = started + budget_s
    confirm_s = max(share * budget_s, confirmation_seconds(candidates, run_s)) if share else 0.0
    room = min(confirm_s, ends - now) - candidates * run_s  # after the first round
    rounds = max(1, min(max_rounds, 1 + math.floor(room / (2 * run_s))))
    search_ends = ends - confirm_s - trial_s
    search_trials = max(0, math.floor((search_ends - now) / trial_s) + 1)
    return TimePlan(trial_s, search_ends, rounds, search_trials)


def answer_budget_s(run_s: float, share: float) -> float:
    """The least wall time a study needs for an answer with an interval: `MIN_ROUNDS` paired
    rounds of one candidate and the baseline, within the confirmation's share."""
    return confirmation_seconds(2, run_s) / share


@dataclass(frozen=True)
class BudgetGrowth:
    """The default budget against the least an answer with an interval needs
    (`answer_budget_s`): kept, grown to it, or grown to `MAX_GROWTH` times and still short."""

    default_s: float
    needed_s: float
    budget_s: float
    share: float

    @property
    def grew(self) -> bool:
        return self.budget_s > self.default_s

    @property
    def short(self) -> bool:
        """Even the grown budget cannot hold the rounds an answer needs."""
        return self.needed_s > self.budget_s

    @property
    def answering_timeout_s(self) -> float:
        """The `--timeout` (the search's time; the confirmation's share comes after it) whose
        study holds the least rounds, to the minute."""
        return math.ceil(self.needed_s * (1 - self.share) / 60) * 60

    def describe(self, run_s: float) -> str:
        if not self.grew:
            return ""
        said = (f"a confirmation run takes about {format_seconds(run_s)} here: the default "
                f"budget grows from {format_seconds(self.default_s)} to "
                f"{format_seconds(self.budget_s)}")
        if not self.short:
            return (f"{said}, so that the confirmation ({self.share:.0%} of the study at most) "
                    f"has room for {MIN_ROUNDS} paired rounds of the best and your settings, "
                    "the least that gives an answer an interval")
        return (f"{said} ({MAX_GROWTH}x, the most it grows); an answer with an interval "
                f"needs {format_seconds(self.needed_s)} in all: the speedup's interval may "
                f"stay unknown (--timeout {self.answering_timeout_flag}, the search's time "
                "before the confirmation, would answer it)")

    @property
    def answering_timeout_flag(self) -> str:
        return f"{self.answering_timeout_s / 60:.0f}m"


def grow_budget(default_s: float, run_s: float, share: float) -> BudgetGrowth:
    """The default budget, grown (to the minute, at most `MAX_GROWTH` times) where the
    confirmation's share of it cannot hold `MIN_ROUNDS` paired rounds."""
    needed = answer_budget_s(run_s, share)
    budget = default_s if needed <= default_s else \
        min(math.ceil(needed / 60) * 60, MAX_GROWTH * default_s)
    return BudgetGrowth(default_s, needed, budget, share)


def candidates_that_fit(budget_s: float, run_s: float, share: float, top: int) -> int:
    """How many candidates besides the baseline the confirmation can take (at most `top`, at
    least one) so that its first round leaves room, within its share, for the race's rounds of
    the best and the baseline that an answer needs."""
    runs = math.floor(share * budget_s / run_s)
    return max(1, min(top, runs - 2 * (MIN_ROUNDS - 1) - 1))


@dataclass(frozen=True)
class Forecast:
    """What is left of a run, priced at the median trial: the search, then the confirmation
    as it is planned now (its rounds, capped by its share of the study's wall time)."""

    search_s: float
    trials: int | None          # search trials left, where a count bounds the search
    confirm_s: float
    rounds: int
    candidates: int

    @property
    def seconds(self) -> float:
        return self.search_s + self.confirm_s

    def describe(self) -> str:
        trials = (f"{self.trials} more search trial{'s' if self.trials != 1 else ''}"
                  if self.trials is not None else "search")
        search = f"{trials} ({format_seconds(self.search_s)})" if self.search_s > 0 else \
            "the search done"
        return (f"about {format_seconds(self.seconds)} left: {search}, then about "
                f"{self.rounds} confirmation "
                f"round{'s' if self.rounds != 1 else ''}, the first of {self.candidates} runs "
                f"({format_seconds(self.confirm_s)})")


def forecast(*, now: float, deadline: float, trials_left: int | None, trial_s: float,
             run_s: float, workers: int, candidates: int, rounds: int, max_rounds: int,
             share: float, searched_s: float, ends_by: float = math.inf) -> Forecast:
    """The rest of a run from now: the search until its trials are done or its deadline, then
    the confirmation: its least `rounds` always, more (to `max_rounds`) while they fit in
    `share` of the study's wall time, and all of it by `ends_by` (a time budget's end)."""
    search_s = max(0.0, deadline - now)
    if trials_left is not None:
        search_s = min(search_s, math.ceil(trials_left / workers) * trial_s)
    least_s = confirmation_seconds(candidates, run_s, rounds)
    within_share = min(confirmation_seconds(candidates, run_s, max_rounds),
                       (searched_s + search_s) * share / (1 - share))
    confirm_s = min(max(least_s, within_share), max(0.0, ends_by - now - search_s))
    # after the first round, the race goes on with the best and the baseline
    fit = 1 + math.floor(max(0.0, confirm_s - candidates * run_s) / (2 * run_s) + 1e-9)
    # and before its first round, its claim settles (`search.confirm.should_confirm`)
    return Forecast(search_s, trials_left, CLAIM_SETTLE_S + confirm_s if rounds else 0.0,
                    min(max_rounds, fit) if rounds else 0, candidates)
