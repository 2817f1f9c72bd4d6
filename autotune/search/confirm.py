"""Confirmation: the answer comes from paired rounds, with its uncertainty, not from the
luckiest search trial.

When the budget ends, the top configurations measured in full and the baseline are re-measured
in rounds: each round runs every candidate still in the race and the baseline once, in a
shuffled order, so that whatever the machine does drifts over all of them alike. A round is a
turn of each one's warm process (`search.warm`: seconds apart, so many rounds) where memory
holds them all, else a fresh process for each run. The rounds are
a race (successive elimination, as in F-race): after each one, a candidate whose paired interval
against the leader lies below 1 is dropped, and says so; only those that could still win are
measured again. Rounds are added until one candidate is left besides the baseline and its
speedup over the baseline is known within ±`target` (a 95% interval of the paired ratios,
`stats`), or the cap is reached (rounds, or time: beyond the least rounds, 30% of the study's
wall time by default, and a time budget's end). A round in which some run was disturbed by
another process is measured again.

The recommendation is the simplest configuration that is as fast as the fastest: among the
candidates with no measurable difference from the fastest (their paired interval holds 1.0),
the one with the fewest knobs changed from the baseline, so "1.04x" inside the noise is reported
as no difference and the baseline stays. The baseline is a candidate too, so autotune never
recommends something slower than what the user has. Of several tuners ending together on one
study, exactly one confirms.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import optuna
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.search.conclusion import candidate_summary, conclusion
from autotune.search.contenders import Candidate, Measuring, Plan, candidates, check_entry
from autotune.search.events import StudyView
from autotune.search.race import run_race
from autotune.search.space import SearchSpace
from autotune.search.takeback import SHORT_RACE, changes_to_take_back, minimal_answer, with_variants
from autotune.search.warm import (
    WarmPool,
    WarmStart,
)
from autotune.study.confirmation import (
    Confirmation,
)
from autotune.study.records import (
    StudyKey,
    TrialKey,
    trial_records,
)

# Tuners ending together each claim the confirmation; the claim standing after this wins.
CLAIM_SETTLE_S = 1.0


# Checks that ran something, at most, for each place of the race (`Plan.top`): past them, the
# configurations left unchecked do not race.
CHECKED_PER_PLACE = 2


def should_confirm(study: optuna.Study, owner: str, view: StudyView) -> bool:
    """Whether this tuner confirms: no other tuner is still running trials, nobody confirmed
    since the last trial, and this tuner's claim stood."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if any(t.user_attrs.get(TrialKey.OWNER) != owner for t in running):
        view.note("another tuner is still running trials of this study; the last one to "
                  "finish confirms the best")
        return False
    stored = study.user_attrs.get(StudyKey.CONFIRMATION)
    confirmed = Confirmation.from_json(stored).at if stored else 0
    last = max((t.datetime_complete.timestamp() for t in study.get_trials(
        deepcopy=False, states=(TrialState.COMPLETE,)) if t.datetime_complete), default=0)
    if confirmed > last:
        view.note("another tuner has confirmed the best since the last trial")
        return False
    study.set_user_attr(StudyKey.CONFIRMATION_CLAIM, owner)
    time.sleep(CLAIM_SETTLE_S)
    return study.user_attrs.get(StudyKey.CONFIRMATION_CLAIM) == owner


@dataclass(frozen=True)
class ConfirmRequest:
    """What a confirmation measures against and with: the user's settings, how each run is
    measured and checked (`measuring`: its warm pool made here, from `warm`, where that
    starts warm processes), and the search space its changes are taken back within."""

    baseline: TrainConfig
    measuring: Measuring
    warm: WarmStart | None = None
    space: SearchSpace | None = None


def confirm(study: optuna.Study, plan: Plan, request: ConfirmRequest) -> Confirmation | None:
    """Paired rounds as a race: after each round, a candidate measurably slower than the leader
    (its paired interval against the leader below 1) is dropped, and only those that could
    still win are measured again. It ends when one candidate is left besides the baseline and
    its speedup is known within the target, or at the cap; the outcome is stored in the study
    and returned. None, with nothing run, when the search measured no candidate besides the
    baseline in full: there is nothing to race it against.

    The search's best races beside itself less each of its changes (`search.minimal`, in
    `space` where one is given); the recommendation then keeps only the changes whose taking
    back was measurably slower (`minimal_answer`).

    With `warm` (and memory for them all), each round is a turn of every candidate's warm
    process (`search.warm`): seconds instead of process starts, so the least rounds are
    `WARM_ROUNDS_PER_ROUND` times more and beyond them time caps the race, not a count.

    With `checks`, every configuration that may be recommended is checked before it races
    (`search.checks`: its worst batch, its loss against the user's settings'); one they rule
    out never races, and the next best of the search takes its place (`_admitted`)."""
    baseline, space = request.baseline, request.space
    view, checks = request.measuring.view, request.measuring.checks
    ranked = candidates(study, baseline, len(study.trials) if checks is not None else plan.top)
    if len(ranked) == 1:
        view.note("no configuration besides your settings was measured in full (the others "
                  "were stopped at screening or failed): nothing to confirm")
        return None
    records, began = trial_records(study), time.monotonic()
    how = replace(request.measuring,
                  pool=WarmPool(request.warm) if request.warm is not None else None)
    entries, ruled_out = _admitted(ranked, plan, how)
    if plan.ends_by is not None:  # the checks are priced apart from the rounds' share
        plan = replace(plan, ends_by=plan.ends_by + time.monotonic() - began)
    backs = changes_to_take_back(entries[0].config, baseline, space) if len(entries) > 1 else []
    judged = with_variants(entries, entries[0], backs, records)
    try:
        race = run_race(entries, "confirm", plan, how, reserve=SHORT_RACE if len(backs) > 1 else 0)
        result = conclusion(race.entries, race.reference, wall_s=race.wall_s,
                            target=plan.target, disturbed_rounds=race.disturbed_rounds,
                            measured=race.measured)
        result = minimal_answer(result, race, judged, baseline, plan, how, space, records)
    finally:
        if how.pool is not None:
            how.pool.close()
    out = [*ruled_out, *race.ruled_out]
    result = replace(result, wall_s=time.monotonic() - began,
                     candidates=result.candidates + tuple(candidate_summary(e, race.reference)
                                                          for e in out),
                     checks=checks.summary() if checks is not None else None)
    study.set_user_attr(StudyKey.CONFIRMATION, result.to_json())
    return result


def _admitted(ranked: list[Candidate], plan: Plan, how: Measuring,
              ) -> tuple[list[Candidate], list[Candidate]]:
    """The best `plan.top` of `ranked` (the baseline last) that the checks do not rule out,
    in order, then the baseline (checked too: its worst batch is what the answer is when it
    keeps the user's settings); and those ruled out on the way. A check whose findings were
    known (a loss check of the same numerics) costs nothing, so the search goes on past
    configurations ruled out for one reason (every bf16 one, say) until `CHECKED_PER_PLACE`
    checks a place have run. Without checks, the first `plan.top`."""
    reference = ranked[-1]
    if how.checks is None:
        return ranked[:-1][:plan.top] + [reference], []
    check_entry(reference, how, plan)
    admitted: list[Candidate] = []
    out: list[Candidate] = []
    paid = 0
    for entry in ranked[:-1]:
        if len(admitted) == plan.top or paid >= CHECKED_PER_PLACE * plan.top:
            break
        runs = how.checks.runs
        check_entry(entry, how, plan)
        paid += how.checks.runs > runs
        (out if entry.excluded else admitted).append(entry)
    return admitted + [reference], out
