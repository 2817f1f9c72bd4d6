"""What the rounds say: the fastest, the recommendation (the simplest as fast as the fastest)
and its speedup over the baseline with its interval, and what the study stores of each
candidate."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

from autotune.search.contenders import Candidate, leader_of, objective, paired, rate, time_to_train
from autotune.stats import Ratio
from autotune.study.confirmation import (
    FAILED,
    FRESH_ROUNDS,
    CandidateSummary,
    Confirmation,
    Drift,
    Run,
)


def _changes(entry: Candidate, reference: Candidate) -> int:
    mine = entry.config.to_dict()
    return sum(mine[k] != v for k, v in reference.config.to_dict().items())


def conclusion(entries: list[Candidate], reference: Candidate, *, wall_s: float = 0.0,
               target: float = 0.0, disturbed_rounds: int = 0,
               measured: str = FRESH_ROUNDS) -> Confirmation:
    """The fastest, the recommendation (the simplest as fast as the fastest) and the speedup
    of the recommendation over the baseline with its interval."""
    fastest = leader_of(entries, reference)
    summaries = [candidate_summary(e, reference) for e in entries]
    outcome = Confirmation(
        candidates=tuple(summaries), winner=None, fastest=None, baseline=summaries[-1],
        contender=None, speedup=None, speedup_ci=None, no_measurable_difference=None,
        search_speedup=None, widened=False,
        rounds=len(reference.runs), wall_s=wall_s, at=time.time(), target=target,
        drift=drift(reference), disturbed_rounds=disturbed_rounds, measured=measured)
    if fastest is None:
        return outcome
    tied = [e for e in entries if e.ok and e.feasible and e.runs and not e.variant and
            (e is fastest or paired(e, fastest, objective).includes_one)]
    recommended = min(tied, key=lambda e: (_changes(e, reference),
                                           -paired(e, fastest, objective).value
                                           if e is not fastest else -1.0))

    def index(entry: Candidate) -> int:
        return next(i for i, e in enumerate(entries) if e is entry)

    speedup, speedup_ci = (1.0 if reference.runs else None), None
    no_difference: bool | None = recommended is not fastest
    # The interval of the comparison that decided: the recommendation against the baseline,
    # or, when the baseline is recommended, the fastest against it; when the baseline is the
    # fastest too, its closest contender's (how much faster an alternative could be).
    decisive = fastest if recommended is reference else recommended
    if decisive is reference:
        contenders = [e for e in entries if e is not reference and e.feasible
                      and not e.variant and paired(e, reference, rate).low is not None]
        decisive = max(contenders, key=lambda e: paired(e, reference, rate).value,
                       default=reference)
    search, widened, load_adjusted = None, False, False
    if decisive is not reference and reference.runs:
        ratio, speedup_ci, search, widened = versus(decisive, reference)
        load_adjusted = ratio.load_adjusted
        holds_one = speedup_ci is not None and speedup_ci[0] <= 1.0 <= speedup_ci[1]
        if ratio.low is None:
            # Too few paired rounds for an interval (one, say): the baseline is kept, and
            # whether the contender differs from it is not known, rather than "no difference".
            no_difference = None
        elif recommended is not reference and holds_one and widened:
            recommended, no_difference = reference, True  # inside the widened noise: kept
        elif recommended is not reference:
            speedup, no_difference = ratio.value, holds_one
    return replace(outcome, winner=summaries[index(recommended)],
                   fastest=summaries[index(fastest)],
                   contender=summaries[index(decisive)] if decisive is not reference else None,
                   speedup=speedup, speedup_ci=speedup_ci,
                   no_measurable_difference=no_difference,
                   search_speedup=search[0] if search else None, widened=widened,
                   load_adjusted=load_adjusted)


def versus(entry: Candidate, reference: Candidate) -> tuple[
        Ratio, tuple[float, float] | None, tuple[float, float, float] | None, bool]:
    """entry / reference paired by round by the rate, its interval (widened to hold the
    search's own ratio where that lies outside it), the search's ratio, and whether it was."""
    ratio = paired(entry, reference, rate)
    interval = (ratio.low, ratio.high) if ratio.low is not None else None
    search = _search_ratio(entry, reference)
    if interval is not None and search is not None and \
            (search[2] < interval[0] or search[1] > interval[1]):
        # The search measured the two at other moments and found another ratio: the machine
        # moved between them, and the rounds alone do not show it.
        return ratio, (min(interval[0], search[1]), max(interval[1], search[2])), search, True
    return ratio, interval, search, False


def _search_ratio(entry: Candidate, reference: Candidate) -> tuple[float, float, float] | None:
    """entry / reference as the search measured them, one trial each at its own moment, with
    the interval their own precisions give (±2% each where unknown); None where either trial
    was disturbed by another process: a busy moment's figure is not evidence of the machine
    moving, and never widens the rounds' interval."""
    if not entry.search_samples_per_sec or not reference.search_samples_per_sec or \
            entry.search_disturbed or reference.search_disturbed:
        return None
    value = entry.search_samples_per_sec / reference.search_samples_per_sec
    spread = (entry.search_precision or 0.02) + (reference.search_precision or 0.02)
    return value, value * (1 - spread), value * (1 + spread)


def candidate_summary(entry: Candidate, reference: Candidate) -> CandidateSummary:
    """What the study stores of one candidate: its runs and their medians."""
    rates = entry.values(rate)
    ratio = paired(entry, reference, rate) if entry is not reference else None
    return CandidateSummary(
        config=entry.config, trial=entry.trial, feasible=entry.feasible,
        ok=entry.ok and not entry.excluded,
        runs=tuple(r if r is not None else Run(FAILED) for r in entry.runs),
        median=statistics.median(rates) if rates else None,
        spread=(max(rates) - min(rates)) / 2 if rates else None,
        objective=_median(entry.values(objective)),
        time_to_train_s=_median(entry.values(time_to_train)),
        search_samples_per_sec=entry.search_samples_per_sec,
        speedup=ratio.value if ratio else 1.0,
        speedup_ci=(ratio.low, ratio.high) if ratio and ratio.low is not None else None,
        trace=entry.trace or next((r.trace for r in entry.runs if r and r.trace), None),
        worst_batch=entry.worst, loss_check=entry.loss, excluded=entry.excluded,
        script_answer=entry.script_answer)


def drift(reference: Candidate) -> Drift | None:
    """The baseline at the start of the search against the end (the confirmation rounds):
    a drift beyond the rounds' own spread is the machine changing under the study."""
    rates = reference.values(rate)
    start = reference.search_samples_per_sec
    if not rates or not start:
        return None
    low, high = min(rates), max(rates)
    noise = max((high - low) / 2, 0.02 * statistics.median(rates))
    outside = start < low - noise or start > high + noise
    return Drift(start_samples_per_sec=start, end_samples_per_sec=statistics.median(rates),
                 end_range=(low, high), beyond_noise=outside)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None
