"""How long a study takes: estimated from the trials measured so far, and, under the default
time budget, when to stop starting trials and how many confirmation rounds fit, so that a run
given no `--trials` or `--timeout` ends within the budget, confirmation included."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import optuna

from autotune.formatting import format_seconds
from autotune.study.records import COUNTS_AGAINST_BUDGET, TrialKey

# A run given neither --trials nor --timeout: ten minutes, start to end.


def trial_seconds(study: optuna.Study) -> float | None:
    """A trial's wall time, process start to result: the median over the trials that ran."""
    walls = [t.user_attrs[TrialKey.WALL_S] for t in study.get_trials(deepcopy=False)
             if t.user_attrs.get(TrialKey.STATUS) in COUNTS_AGAINST_BUDGET
             and TrialKey.DUPLICATE_OF not in t.user_attrs and t.user_attrs.get(TrialKey.WALL_S)]
    return statistics.median(walls) if walls else None


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
                f"trials, then up to {self.confirm_rounds} confirmation rounds of {candidates} "
                "runs")


def plan_time(budget_s: float, started: float, now: float, trial_s: float,
              candidates: int, min_rounds: int, max_rounds: int) -> TimePlan:
    """Leave room at the end for at least `min_rounds` confirmation rounds of `candidates`
    runs each (one round when even those do not fit), and for the last search trial to
    finish. Where those rounds would leave no search trial, fewer are kept: confirming the
    baseline against nothing finds nothing."""
    ends = started + budget_s
    round_s = candidates * trial_s
    rounds = min(max_rounds, max(1, min(min_rounds, math.floor((ends - now) / round_s))))
    if ends - rounds * round_s - trial_s < now:
        rounds = max(1, math.floor((ends - now - trial_s) / round_s))
    search_ends = ends - rounds * round_s - trial_s
    search_trials = max(0, math.floor((search_ends - now) / trial_s) + 1)
    return TimePlan(trial_s, search_ends, rounds, search_trials)


def rounds_that_fit(budget_s: float, started: float, now: float, trial_s: float,
                    candidates: int, max_rounds: int) -> int:
    """Confirmation rounds that end before the budget does (at least one)."""
    left = started + budget_s - now
    return max(1, min(max_rounds, math.floor(left / (candidates * trial_s))))


def estimate(trials: int, trial_s: float, candidates: int, rounds: int) -> str:
    """What a run of `trials` more search trials and `rounds` confirmation rounds will take."""
    seconds = (trials + rounds * candidates) * trial_s
    return (f"a trial takes about {format_seconds(trial_s)} here: about "
            f"{format_seconds(seconds)} for {trials} more trials and {rounds} confirmation "
            f"rounds of {candidates} runs")
