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

# Paired rounds that give a speedup an interval at all.
MIN_ROUNDS = 2


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
                f"trials, then up to {self.confirm_rounds} confirmation rounds (the first of "
                f"{candidates} runs)")


def plan_time(budget_s: float, started: float, now: float, trial_s: float,
              candidates: int, share: float, max_rounds: int) -> TimePlan:
    """Leave the confirmation its share of the budget (at least its first round of
    `candidates` runs and a second of the best and the baseline, the least that gives an
    interval), and the last search trial room to finish."""
    ends = started + budget_s
    confirm_s = max(share * budget_s, (candidates + 2) * trial_s)
    room = min(confirm_s, ends - now) - candidates * trial_s  # after the first round
    rounds = max(1, min(max_rounds, 1 + math.floor(room / (2 * trial_s))))
    search_ends = ends - confirm_s - trial_s
    search_trials = max(0, math.floor((search_ends - now) / trial_s) + 1)
    return TimePlan(trial_s, search_ends, rounds, search_trials)


def answer_budget_s(trial_s: float, share: float) -> float:
    """The least wall time a study needs for an answer with an interval: two paired rounds of
    one candidate and the baseline, within the confirmation's share."""
    return 2 * MIN_ROUNDS * trial_s / share


def candidates_that_fit(budget_s: float, trial_s: float, share: float, top: int) -> int:
    """How many candidates besides the baseline the confirmation can take (at most `top`, at
    least one) so that its first round leaves room, within its share, for a second round of
    the best and the baseline."""
    runs = math.floor(share * budget_s / trial_s)
    return max(1, min(top, runs - 2 - 1))


def rounds_that_fit(budget_s: float, started: float, now: float, trial_s: float,
                    candidates: int, max_rounds: int) -> int:
    """Confirmation rounds that end before the budget does (at least one)."""
    left = started + budget_s - now
    return max(1, min(max_rounds, math.floor(left / (candidates * trial_s))))


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
        return (f"about {format_seconds(self.seconds)} left: {trials} "
                f"({format_seconds(self.search_s)}), then up to {self.rounds} confirmation "
                f"round{'s' if self.rounds != 1 else ''} of {self.candidates} runs "
                f"({format_seconds(self.confirm_s)})")


def forecast(*, now: float, deadline: float, trials_left: int | None, trial_s: float,
             workers: int, candidates: int, rounds: int, share: float, searched_s: float,
             ends_by: float = math.inf) -> Forecast:
    """The rest of a run from now: the search until its trials are done or its deadline, then
    `rounds` rounds of `candidates` runs, at most `share` of the study's wall time, and all of
    it by `ends_by` (a time budget's end)."""
    search_s = max(0.0, deadline - now)
    if trials_left is not None:
        search_s = min(search_s, math.ceil(trials_left / workers) * trial_s)
    round_s = candidates * trial_s  # the first round always runs, the rest within the share
    confirm_s = min(rounds * round_s,
                    max(round_s, (searched_s + search_s) * share / (1 - share)),
                    max(0.0, ends_by - now - search_s))
    return Forecast(search_s, trials_left, confirm_s if rounds else 0.0, rounds, candidates)
