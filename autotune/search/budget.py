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
from autotune.search.runner import ROUND_WINDOW_STEPS
from autotune.study.records import COUNTS_AGAINST_BUDGET, Role, TrialKey
from autotune.trial.protocol import TrialStatus

# Paired rounds an answer needs: with two, a 95% interval spans t = 12.7 standard errors, with
# three 4.3.
MIN_ROUNDS = 3


def trial_seconds(study: optuna.Study) -> float | None:
    """A trial's wall time, process start to result: the median over the trials that ran."""
    walls = [t.user_attrs[TrialKey.WALL_S] for t in _measured(study)]
    return statistics.median(walls) if walls else None


def search_trial_seconds(study: optuna.Study, screening: bool) -> float | None:
    """What the next search trial will take: a full trial's wall time, or, where screening is
    on, a mix of it and a screened trial's (stopped after its screening window), in the share
    of search trials screened so far (a half before any: Laplace's rule)."""
    measured = _measured(study)
    unscreened = [t for t in measured if t.user_attrs.get(TrialKey.STATUS) != TrialStatus.SCREENED]
    full = [t.user_attrs[TrialKey.WALL_S] for t in unscreened]
    if not full:
        return trial_seconds(study)
    if not screening:
        return statistics.median(full)
    searched = [t for t in measured if t.user_attrs.get(TrialKey.ROLE) != Role.BASELINE]
    screened = [t.user_attrs[TrialKey.WALL_S] for t in searched
                if t.user_attrs.get(TrialKey.STATUS) == TrialStatus.SCREENED]
    # before one is seen: a full trial's wall less what follows its screening window
    cut = statistics.median(screened) if screened else statistics.median(
        t.user_attrs[TrialKey.WALL_S] - t.user_attrs.get("window_s", 0.0) for t in unscreened)
    share = (len(screened) + 1) / (len(searched) + 2)
    return share * cut + (1 - share) * statistics.median(full)


def round_run_seconds(study: optuna.Study, settings: MeasureSettings) -> float | None:
    """A confirmation run's wall time, priced at the baseline's trial (the baseline runs in
    every round; a compiled trial's start-up would price every run at its own): its wall less
    the timed window and the screening, plus the round run's own window
    (`runner.ROUND_WINDOW_STEPS` steps, or the window's minimum seconds where those are
    longer). Before the baseline has run, the median of the trials that have."""
    measured = [t for t in _measured(study)
                if t.user_attrs.get("step_time_median_s") and t.user_attrs.get("window_s")]
    baseline = [t for t in measured if t.user_attrs.get(TrialKey.ROLE) == Role.BASELINE]
    runs = []
    for trial in baseline or measured:
        a = trial.user_attrs
        step = a["step_time_median_s"]
        window = max(settings.window_seconds, ROUND_WINDOW_STEPS * step)
        screen = settings.screen_steps * step
        runs.append(max(window, a[TrialKey.WALL_S] - a["window_s"] - screen + window))
    return statistics.median(runs) if runs else None


def _measured(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that ran a process to its end and were not repeats, with their wall time."""
    return [t for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(TrialKey.STATUS) in COUNTS_AGAINST_BUDGET
            and TrialKey.DUPLICATE_OF not in t.user_attrs and t.user_attrs.get(TrialKey.WALL_S)]


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
    return Forecast(search_s, trials_left, confirm_s if rounds else 0.0,
                    min(max_rounds, fit) if rounds else 0, candidates)
