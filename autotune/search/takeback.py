"""The minimal answer's races: the recommendation's changes taken back one at a time
(`search.minimal` judges each), in the race or a short race of their own, and the answer less
every change not shown to pay."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from autotune.config import NUMERICS, TrainConfig
from autotune.formatting import describe_changes
from autotune.search.conclusion import candidate_summary, versus
from autotune.search.contenders import (
    Candidate,
    Measuring,
    Plan,
    check_entry,
    objective,
    paired,
    peak_of,
    precision_of,
)
from autotune.search.memory_model import MemoryModel
from autotune.search.minimal import (
    JUDGE_ROUNDS,
    TakeBack,
    judge,
    take_backs,
    without_all,
)
from autotune.search.race import Race, run_race
from autotune.search.space import SearchSpace
from autotune.search.warm import turn_price_s
from autotune.study.confirmation import (
    LOSS_NO_TIME,
    NO_TIME,
    NOT_BEATEN,
    PAYS,
    TOGETHER,
    UNCHECKED,
    UNJUDGED,
    UNMEASURED_TOGETHER,
    Confirmation,
    TakenBack,
)
from autotune.study.records import (
    TrialRecord,
)
from autotune.trial.protocol import TrialStatus

# The short race after the race, of the recommendation less several changes dropped: that
# configuration, the recommendation and the baseline.
SHORT_RACE = 3


def changes_to_take_back(config: TrainConfig, baseline: TrainConfig,
                         space: SearchSpace | None) -> list[TakeBack]:
    """The changes of `config` to take back one at a time: none of a configuration of one
    change, which the race itself takes back (the baseline races beside it)."""
    backs = take_backs(config, baseline, space)
    return backs if len(backs) > 1 else []


def with_variants(entries: list[Candidate], parent: Candidate, backs: Sequence[TakeBack],
                   records: Sequence[TrialRecord]) -> list[tuple[TakeBack, Candidate | None]]:
    """Each change of `backs` with the candidate that judges it: `parent` less the change,
    inserted before the baseline (an entry of that configuration serves where one races
    already); None where the space holds no configuration without it."""
    out: list[tuple[TakeBack, Candidate | None]] = []
    for back in backs:
        same = next((e for e in entries if e.config == back.config), None) \
            if back.config is not None else None
        if back.config is not None and same is None:
            same = _variant(back.config, records, parent, entries[-1])
            entries.insert(len(entries) - 1, same)
        out.append((back, same))
    return out


def _variant(config: TrainConfig, records: Sequence[TrialRecord], parent: Candidate,
             reference: Candidate) -> Candidate:
    """`config`, `parent` less one change, as a candidate: with the search's figures where a
    trial measured it (the expert takes changes back from the fast corner), and its peak
    memory (for the warm processes) as measured, else as the memory model predicts it, else
    the larger of the two it lies between."""
    measured = [r for r in records if r.config == config and r.samples_per_sec
                and r.status != TrialStatus.SCREENED]
    record = max(measured, key=lambda r: r.samples_per_sec, default=None)
    peaks = [p for p in (parent.search_peak_bytes, reference.search_peak_bytes) if p]
    peak = (peak_of(record) if record else None) or MemoryModel(records).predict(config) or \
        max(peaks, default=None)
    return Candidate(config, record.number if record else None,
                     record.feasible if record else True,
                     record.samples_per_sec if record else None,
                     search_precision=precision_of(record) if record else None,
                     search_peak_bytes=peak, search_disturbed=bool(record and record.disturbed),
                     search_turn_s=turn_price_s(config, record.measurement) if record else None,
                     taken_from=parent)


def _again(entry: Candidate) -> Candidate:
    """The same configuration, to be measured afresh in a race of its own."""
    return Candidate(entry.config, entry.trial, entry.feasible, entry.search_samples_per_sec,
                     search_precision=entry.search_precision,
                     search_peak_bytes=entry.search_peak_bytes,
                     search_disturbed=entry.search_disturbed,
                     search_turn_s=entry.search_turn_s, checked=entry.checked,
                     worst=entry.worst, loss=entry.loss, excluded=entry.excluded)


def minimal_answer(result: Confirmation, race: Race,
                   judged: list[tuple[TakeBack, Candidate | None]], baseline: TrainConfig,
                   plan: Plan, how: Measuring, space: SearchSpace | None,
                   records: Sequence[TrialRecord]) -> Confirmation:
    """The race's recommendation less every change not shown to pay. Its changes are judged on
    the configurations without each (`minimal.judge`), raced beside it (the search's best),
    else in a short race of their own; where several are dropped, the configuration without
    them all races it and the baseline, and is the answer unless it is measurably slower,
    else the best of the single drops is. An answer no longer measurably faster than the
    baseline keeps the drops together, where its rounds (`JUDGE_ROUNDS` at least) can say so."""
    if result.winner is None or result.winner.config == baseline:
        return result
    chosen = next(e for e in race.entries if not e.variant and e.config == result.winner.config)
    where: Race | None = race
    pairs = judged if chosen is race.entries[0] else []
    if not pairs:
        backs = changes_to_take_back(chosen.config, baseline, space)
        if not backs:
            return _alone(result, race, chosen, baseline, space, how)
        beside = _raced_beside(race, backs)
        if all(v is not None or back.config is None for back, v in beside):
            pairs, where = beside, race
        else:
            pairs, where = _taken_back_race(chosen, backs, plan, how, records, race)
        if where is None:  # no short race fitted: what raced beside `chosen` is judged there
            pairs = [(back, there or v) for (back, v), (_, there) in zip(pairs, beside)]
        best = race.entries[0]
        if where is None and judged and _not_slower(best, chosen):
            # the simplest as fast cannot be proven in the time left; the race's best, as
            # fast and its changes taken back in the race, is judged instead
            how.view.note(f"confirmation: {describe_changes(chosen.config, baseline)} is as "
                          "fast, but the time left holds no race taking back its changes: "
                          f"{describe_changes(best.config, baseline)}, whose changes the race "
                          "took back, is judged instead")
            chosen, pairs, where = best, judged, race
            result = _recommending(result, best, race)
    with_it = where.entries[0] if where is not None and where is not race else chosen
    unchecked = how.checks is not None and how.checks.loss_unchecked(chosen.config)
    decisions = [_judged(back, v, with_it, race if where is None and _in(race, v) else where,
                         plan, how, unchecked) for back, v in pairs]
    dropped = [i for i, d in enumerate(decisions) if not d.kept]
    follow = [where] if where is not race and where is not None else []
    if _unmeasured(decisions, how):
        return _with_extra(_unproven(result, race, chosen, decisions), follow)
    if not dropped:
        return _with_extra(replace(result, taken_back=tuple(decisions)), follow)
    single = max(dropped, key=lambda i: paired(pairs[i][1], with_it, objective).value)
    answer, answer_race = pairs[single][1], where
    if len(dropped) > 1:
        config = without_all(chosen.config, [pairs[i][0] for i in dropped], baseline, space)
        found = _without_all(config, with_it, where, baseline, plan, how, records)
        if isinstance(found, Race):
            answer, answer_race = found.entries[0], found
            follow.append(found)
        else:
            decisions = [replace(d, outcome=found[0], why=found[1])
                         if i in dropped and i != single else d
                         for i, d in enumerate(decisions)]
            if _unmeasured(decisions, how):
                return _with_extra(_unproven(result, race, chosen, decisions), follow)
    if result.no_measurable_difference is False and _inside_the_noise(answer, answer_race):
        if len(answer_race.reference.runs) < JUDGE_ROUNDS:
            # too few rounds to tell the answer less them from your settings: unjudged
            decisions = [d if d.kept else replace(d, outcome=UNJUDGED, why=UNMEASURED_TOGETHER)
                         for d in decisions]
            _unmeasured(decisions, how)
            return _with_extra(_unproven(result, race, chosen, decisions), follow)
        # no drop shown to pay alone, yet the answer less them no longer measurably beats
        # the baseline that the race's recommendation beat: the drops are kept together
        decisions = [replace(d, outcome=TOGETHER, why=NOT_BEATEN) if not d.kept else d
                     for d in decisions]
        return _with_extra(replace(result, taken_back=tuple(decisions)), follow)
    return _with_extra(_answer(result, race, chosen, answer, answer_race, decisions), follow)


def _raced_beside(race: Race, backs: Sequence[TakeBack]) -> list[tuple[TakeBack, Candidate | None]]:
    """Each change of `backs` with the race's entry of the configuration without it, where one
    raced (a runner-up that is the race's recommendation less a change): their rounds together
    judge it, as a short race would (the ignite script of 2026-12-02: fused AdamW's taking back
    raced 6 rounds beside bf16 + fused AdamW and was measurably slower, yet, with no time for a
    short race, was said never measured)."""
    return [(back, next((e for e in race.entries if back.config is not None
                         and e.config == back.config and e.runs), None)) for back in backs]


def _in(race: Race, entry: Candidate | None) -> bool:
    """Whether `entry` raced in `race` (itself, not an equal configuration raced elsewhere)."""
    return any(entry is e for e in race.entries)


def _judged(back: TakeBack, without: Candidate | None, with_it: Candidate, where: Race | None,
            plan: Plan, how: Measuring, loss_unchecked: bool = False) -> TakenBack:
    """What taking `back` back showed (`minimal.judge`); a change of the numerics shown to pay
    where the loss of the configuration with it was never checked (`loss_unchecked`: the time
    ran out first) is left out, a precision being recommended only with its loss run; a change
    it drops makes the configuration without it a possible answer, which is checked first
    (`contenders.check_entry`): one the checks rule out keeps the change."""
    raced = without is not None and where is not None
    capped = where.why_unmeasured(without.config) if where and without else \
        where.capped if where else NO_TIME
    decision = judge(back, paired(without, with_it, objective) if raced else None,
                     without.ok if raced else True, capped,
                     failed=without.excluded if without else "")
    if loss_unchecked and decision.outcome == PAYS and set(back.knobs) & set(NUMERICS):
        decision = _left_unchecked(decision)
    if decision.kept or without is None:
        return decision
    check_entry(without, how, plan)
    return judge(back, None, True, failed=without.excluded) if without.excluded else decision


def _alone(result: Confirmation, race: Race, chosen: Candidate, baseline: TrainConfig,
           space: SearchSpace | None, how: Measuring) -> Confirmation:
    """A recommendation of one change, which the race took back itself (the baseline raced
    beside it): where it changes the numerics and its loss run never fitted the time, the
    user's settings are kept, it named as the contender (`_unproven`)."""
    if how.checks is None or not how.checks.loss_unchecked(chosen.config):
        return result
    back = take_backs(chosen.config, baseline, space)[0]
    found = judge(back, paired(race.reference, chosen, objective), True)
    return _unproven(result, race, chosen, [_left_unchecked(found)])


def _left_unchecked(decision: TakenBack) -> TakenBack:
    """A change of the numerics shown to pay, left out as its loss run never fitted."""
    return replace(decision, outcome=UNCHECKED, why=LOSS_NO_TIME)


def _inside_the_noise(answer: Candidate, answer_race: Race) -> bool:
    """Whether `answer`'s interval against the baseline of the race it ran in holds 1."""
    if answer is answer_race.reference:
        return True
    interval = versus(answer, answer_race.reference)[1]
    return interval is not None and interval[0] <= 1.0 <= interval[1]


def _taken_back_race(chosen: Candidate, backs: Sequence[TakeBack], plan: Plan, how: Measuring,
                     records: Sequence[TrialRecord], race: Race,
                     ) -> tuple[list[tuple[TakeBack, Candidate | None]], Race | None]:
    """A short race of `chosen`, it less each change, and the baseline (None where the time
    left cannot hold the rounds a change is judged on)."""
    entries = [_again(chosen), _again(race.reference)]
    pairs = with_variants(entries, entries[0], backs, records)
    changes_ = describe_changes(chosen.config, race.reference.config)
    if not _time_for(len(entries), len(entries) - 2, plan, how, race.run_s):
        return pairs, None
    how.view.note(f"confirmation: taking back each change of {changes_} in a short race")
    return pairs, run_race(entries, "taken-back", plan, how, reserve=SHORT_RACE)


def _without_all(config: TrainConfig | None, with_it: Candidate, race: Race,
                 baseline: TrainConfig, plan: Plan, how: Measuring,
                 records: Sequence[TrialRecord]) -> Race | tuple[str, str]:
    """The short race of `config` (the recommendation less every change dropped), it and the
    baseline, where `config` is not measurably slower than it: the changes were not shown to
    pay together either; else what becomes of the changes besides the best single drop (kept:
    their outcome, and why)."""
    if config is None:
        return TOGETHER, "the search space holds no configuration without all of them"
    if config == baseline:
        return TOGETHER, "without all of them it is your settings, which the race measured"
    if not _time_for(SHORT_RACE, 1, plan, how, race.run_s):
        return UNJUDGED, UNMEASURED_TOGETHER
    how.view.note(f"confirmation: {describe_changes(config, baseline)} (the answer less every "
                  "change not shown to pay) in a short race")
    answer = _variant(config, records, with_it, race.reference)
    answer.taken_from = None  # a candidate in its own right: it may be the answer
    check_entry(answer, how, plan)
    if answer.excluded:
        return TOGETHER, f"without all of them {answer.excluded}"
    entries = [answer, _again(with_it), _again(race.reference)]
    answer.partner = entries[1]  # judged against the recommendation, each turn beside one
    short = run_race(entries, "minimal", plan, how)
    ratio = paired(entries[0], entries[1], objective)
    if not entries[0].ok:
        return TOGETHER, "without all of them it did not run in every round"
    if ratio.high is not None and ratio.high < 1.0:
        return TOGETHER, (f"without all of them it was {1 - ratio.value:.1%} slower "
                          f"[{1 - ratio.high:+.1%}, {1 - ratio.low:+.1%}]")
    return short


def _time_for(configurations: int, new: int, plan: Plan, how: Measuring, run_s: float) -> bool:
    """Whether a short race of `configurations` (`new` of them to start) can run the rounds a
    change is judged on before a time budget's end and the confirmation's share of the study
    (`ends_by`): a short race after the race refines the answer, which has its rounds, so it
    starts only where it keeps the time the run announced."""
    ends = [e for e in (plan.budget_ends, plan.ends_by) if e is not None]
    if not ends:
        return True
    warm = how.pool is not None and not how.pool.broken and bool(how.pool.live)
    start = new * how.pool.start_s if warm else 0.0
    return time.monotonic() + start + JUDGE_ROUNDS * configurations * run_s <= min(ends)


def _answer(result: Confirmation, race: Race, chosen: Candidate, answer: Candidate,
            answer_race: Race, decisions: Sequence[TakenBack]) -> Confirmation:
    """The confirmation with `answer` (measured in `answer_race`) as the recommendation, in
    place of `chosen`, the race's, less the changes `decisions` drop."""
    return replace(_recommending(result, answer, answer_race), taken_back=tuple(decisions),
                   taken_from=candidate_summary(chosen, race.reference),
                   answer_rounds=len(answer_race.reference.runs)
                   if answer_race is not race else None)


def _recommending(result: Confirmation, entry: Candidate, race: Race) -> Confirmation:
    """The confirmation with `entry` (measured in `race`) as the recommendation, its speedup
    over that race's baseline as the rounds measured it."""
    ratio, interval, search, widened = versus(entry, race.reference)
    summary = candidate_summary(entry, race.reference)
    return replace(result, winner=summary, contender=summary, speedup=ratio.value,
                   speedup_ci=interval,
                   no_measurable_difference=interval[0] <= 1.0 <= interval[1]
                   if interval else None,
                   search_speedup=search[0] if search else None, widened=widened,
                   load_adjusted=ratio.load_adjusted)


def _not_slower(entry: Candidate, other: Candidate) -> bool:
    """Whether `entry` ran every round and the rounds do not show it slower than `other`."""
    if not entry.ok or not entry.runs or entry.excluded:
        return False
    ratio = paired(entry, other, objective)
    return ratio.high is None or ratio.high >= 1.0


def _unmeasured(decisions: Sequence[TakenBack], how: Measuring) -> bool:
    """Whether changes were never measured to pay or not (the time or the rounds ended first,
    before the race without each, or the short race without them all), said as a note."""
    unjudged = [d for d in decisions if d.outcome == UNJUDGED and d.config]
    if unjudged:
        how.view.note(f"confirmation: not measured to pay: {', '.join(d.change for d in unjudged)}"
                      f" ({unjudged[0].why}): your settings kept")
    return bool(unjudged)


def _unproven(result: Confirmation, race: Race, chosen: Candidate,
              decisions: Sequence[TakenBack]) -> Confirmation:
    """The confirmation where changes of `chosen` (the race's recommendation) were never
    measured without them: only what was measured to pay is recommended, and none of them
    was, so the user's settings are kept, `chosen` and its interval named as the contender."""
    contender = candidate_summary(chosen, race.reference)
    return replace(result, winner=candidate_summary(race.reference, race.reference),
                   contender=contender, taken_back=tuple(decisions), taken_from=contender)


def _with_extra(result: Confirmation, races: Sequence[Race]) -> Confirmation:
    """The confirmation with what the short races after the race measured among its
    candidates (their baselines aside)."""
    extra = tuple(candidate_summary(e, r.reference) for r in races for e in r.entries[:-1])
    return replace(result, candidates=result.candidates + extra)
