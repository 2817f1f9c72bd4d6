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

import math
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config import TrainConfig, changes, taken_back
from autotune.formatting import describe_changes, format_seconds
from autotune.options import (
    DEFAULT_CONFIRM_MAX_ROUNDS,
    DEFAULT_CONFIRM_ROUNDS,
    DEFAULT_CONFIRM_TARGET,
)
from autotune.search.checks import AnswerChecks
from autotune.search.events import StudyView
from autotune.search.memory_model import MemoryModel
from autotune.search.minimal import (
    JUDGE_ROUNDS,
    TakeBack,
    decided,
    judge,
    rounds_to_judge,
    take_backs,
    without_all,
)
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob
from autotune.search.space import SearchSpace
from autotune.search.warm import (
    TURN_SECONDS,
    WARM_MAX_ROUNDS,
    WARM_ROUNDS_PER_ROUND,
    WARM_WORTH_ROUNDS,
    PairJudge,
    WarmOutOfTime,
    WarmPool,
    WarmStart,
    WarmTurns,
    WarmUnavailable,
    memory_holds,
)
from autotune.search.worker import Measure
from autotune.stats import Ratio, load_adjusted_ratio, paired_ratio, rounds_for
from autotune.study.checks import LossCheck, WorstBatchCheck
from autotune.study.confirmation import (
    FAILED,
    FRESH_ROUNDS,
    NO_ROUNDS,
    NO_TIME,
    NOT_BEATEN,
    TOGETHER,
    UNJUDGED,
    WARM_TURNS,
    CandidateSummary,
    Confirmation,
    Drift,
    Run,
    TakenBack,
)
from autotune.study.records import (
    Role,
    StudyKey,
    TrialKey,
    TrialRecord,
    config_key,
    rankable,
    trial_records,
)
from autotune.trial.protocol import TrialResult, TrialStatus

# Tuners ending together each claim the confirmation; the claim standing after this wins.
CLAIM_SETTLE_S = 1.0
# Checks that ran something, at most, for each place of the race (`Plan.top`): past them, the
# configurations left unchecked do not race.
CHECKED_PER_PLACE = 2
# The short race after the race, of the recommendation less several changes dropped: that
# configuration, the recommendation and the baseline.
SHORT_RACE = 3
# Warm rounds take seconds: the time left is told every this many.
WARM_REPORT_EVERY = 10


@dataclass(frozen=True)
class Plan:
    """How much confirming to do."""

    top: int
    rounds: int = DEFAULT_CONFIRM_ROUNDS          # at least this many
    max_rounds: int = DEFAULT_CONFIRM_MAX_ROUNDS  # at most this many (disturbed included)
    target: float = DEFAULT_CONFIRM_TARGET        # stop once the leader is known within it
    # Time caps (time.monotonic()), each going by the slowest run so far times the runs of the
    # next round: beyond the least rounds, none starts that would end after `ends_by` (the
    # confirmation's share of the study); after the first, none that would end after
    # `budget_ends` (a time budget's end), the least rounds included.
    ends_by: float | None = None
    budget_ends: float | None = None


# One figure of a run: what rounds are compared by.
Figure = Callable[[Run], "float | None"]


def rate(run: Run) -> float | None:
    """Samples/sec in the run's timed window."""
    return run.samples_per_sec


def objective(run: Run) -> float | None:
    """What the study maximises: the rate, or over a whole run of --train-steps steps."""
    return run.objective


def time_to_train(run: Run) -> float | None:
    return run.time_to_train_s


@dataclass
class Candidate:
    """One configuration being confirmed, with its run in each round (None: it failed)."""

    config: TrainConfig
    trial: int | None
    feasible: bool
    search_samples_per_sec: float | None = None
    runs: list[Run | None] = field(default_factory=list)
    search_precision: float | None = None  # the search trial's median known within ±this
    search_peak_bytes: float | None = None  # its peak memory in the search (warm processes')
    search_disturbed: bool = False  # its search trial's window saw another process's load
    trace: str | None = None  # its profiler trace, where its warm process was asked for one
    # Measured only to judge one change of `taken_from` (that configuration less the change):
    # never the race's answer itself, and out of the race once the change shows it pays.
    taken_from: Candidate | None = field(default=None, repr=False, compare=False)
    # What its checks found (`search.checks`), once checked; why they ruled it out, where
    # they did: it never races.
    checked: bool = False
    worst: WorstBatchCheck | None = None
    loss: LossCheck | None = None
    excluded: str = ""
    # What it is judged against (`taken_from`, else the baseline) and, each round, that one's
    # run next to its own: in warm turns the turn taken beside it (`_paired_turns`).
    partner: Candidate | None = field(default=None, repr=False, compare=False)
    partner_runs: list[Run | None] = field(default_factory=list, repr=False, compare=False)

    @property
    def variant(self) -> bool:
        return self.taken_from is not None

    @property
    def ok(self) -> bool:
        return all(run is not None for run in self.runs)

    def values(self, figure: Figure) -> list[float]:
        """The figure from every round that has it."""
        return [value for run in self.runs if run is not None
                and (value := figure(run)) is not None]


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


def candidates(study: optuna.Study, baseline: TrainConfig, top: int) -> list[Candidate]:
    """The `top` best distinct feasible configurations besides the baseline measured in full (a
    screened trial was too slow to finish its window; a clean trial ranks above a disturbed
    one, which the fresh rounds measure again), then the baseline (the reference for the
    speedup; a winner only if it also fitted in the search)."""
    chosen: dict[str, Candidate] = {}
    records = trial_records(study)
    clean = {r.number for r in rankable(records)}
    measured = [r for r in records if r.score is not None and r.status != TrialStatus.SCREENED
                and config_key(r.config) != config_key(baseline)]
    for r in sorted(measured, key=lambda r: (r.number in clean, r.value), reverse=True):
        key = config_key(r.config)
        if len(chosen) < top and key not in chosen:
            chosen[key] = Candidate(r.config, r.number, True, r.samples_per_sec,
                                    search_precision=_precision(r), search_peak_bytes=_peak(r),
                                    search_disturbed=r.disturbed)
    baseline_trial = next((r for r in records if r.role == Role.BASELINE
                           and r.state == TrialState.COMPLETE.name), None)
    reference = Candidate(
        baseline, baseline_trial.number if baseline_trial else None,
        bool(baseline_trial and baseline_trial.feasible),
        baseline_trial.samples_per_sec if baseline_trial else None,
        search_precision=_precision(baseline_trial) if baseline_trial else None,
        search_peak_bytes=_peak(baseline_trial) if baseline_trial else None,
        search_disturbed=bool(baseline_trial and baseline_trial.disturbed))
    return [*chosen.values(), reference]  # the baseline last, as the reference


def _precision(record: TrialRecord) -> float | None:
    """Within what the search trial knew its median step time."""
    return record.measurement.step_time_precision if record.measurement else None


def _peak(record: TrialRecord) -> float | None:
    return record.measurement.peak_memory_bytes if record.measurement else None


@dataclass(frozen=True)
class Measuring:
    """How a race's rounds are measured: fresh runs through `measure`, or warm turns from the
    `pool` where it has them; each run within `time_limit_s` on `device`, its files under
    `directory`; what may be recommended checked first by `checks` (none: unchecked)."""

    scoring: Scoring
    measure: Measure
    view: StudyView
    time_limit_s: float
    device: str
    directory: Path
    pool: WarmPool | None = None
    checks: AnswerChecks | None = None


@dataclass
class Race:
    """What one race measured: its entries (the baseline last, the reference), how
    (`WARM_TURNS` or `FRESH_ROUNDS`), its disturbed rounds kept, its wall time, its slowest
    run's (a turn's, in warm turns), and why it ended where a cap ended it (`NO_TIME`, or
    `NO_ROUNDS`: what a change it measured too little is kept for)."""

    entries: list[Candidate]
    measured: str
    disturbed_rounds: int
    wall_s: float
    run_s: float
    capped: str = NO_TIME
    ruled_out: list[Candidate] = field(default_factory=list)  # by a check, before it raced

    @property
    def reference(self) -> Candidate:
        return self.entries[-1]


def confirm(study: optuna.Study, baseline: TrainConfig, scoring: Scoring, measure: Measure,
            view: StudyView, plan: Plan, *, time_limit_s: float, device: str,
            directory: Path, warm: WarmStart | None = None,
            space: SearchSpace | None = None,
            checks: AnswerChecks | None = None) -> Confirmation | None:
    """Paired rounds as a race: after each round, a candidate measurably slower than the leader
    (its paired interval against the leader below 1) is dropped, and only those that could
    still win are measured again. It ends when one candidate is left besides the baseline and
    its speedup is known within the target, or at the cap; the outcome is stored in the study
    and returned. None, with nothing run, when the search measured no candidate besides the
    baseline in full: there is nothing to race it against.

    The search's best races beside itself less each of its changes (`search.minimal`, in
    `space` where one is given); the recommendation then keeps only the changes whose taking
    back was measurably slower (`_minimal`).

    With `warm` (and memory for them all), each round is a turn of every candidate's warm
    process (`search.warm`): seconds instead of process starts, so the least rounds are
    `WARM_ROUNDS_PER_ROUND` times more and beyond them time caps the race, not a count.

    With `checks`, every configuration that may be recommended is checked before it races
    (`search.checks`: its worst batch, its loss against the user's settings'); one they rule
    out never races, and the next best of the search takes its place (`_admitted`)."""
    ranked = candidates(study, baseline, len(study.trials) if checks is not None else plan.top)
    if len(ranked) == 1:
        view.note("no configuration besides your settings was measured in full (the others "
                  "were stopped at screening or failed): nothing to confirm")
        return None
    records, began = trial_records(study), time.monotonic()
    how = Measuring(scoring, measure, view, time_limit_s, device, directory,
                    WarmPool(warm) if warm is not None else None, checks)
    entries, ruled_out = _admitted(ranked, plan, how)
    if plan.ends_by is not None:  # the checks are priced apart from the rounds' share
        plan = replace(plan, ends_by=plan.ends_by + time.monotonic() - began)
    backs = _backs(entries[0].config, baseline, space) if len(entries) > 1 else []
    judged = _with_variants(entries, entries[0], backs, records)
    try:
        race = _race(entries, "confirm", plan, how, reserve=SHORT_RACE if len(backs) > 1 else 0)
        result = conclusion(race.entries, race.reference, wall_s=race.wall_s,
                            target=plan.target, disturbed_rounds=race.disturbed_rounds,
                            measured=race.measured)
        result = _minimal(result, race, judged, baseline, plan, how, space, records)
    finally:
        if how.pool is not None:
            how.pool.close()
    out = [*ruled_out, *race.ruled_out]
    result = replace(result, wall_s=time.monotonic() - began,
                     candidates=result.candidates + tuple(_summary(e, race.reference)
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
    _check(reference, how, plan)
    admitted: list[Candidate] = []
    out: list[Candidate] = []
    paid = 0
    for entry in ranked[:-1]:
        if len(admitted) == plan.top or paid >= CHECKED_PER_PLACE * plan.top:
            break
        runs = how.checks.runs
        _check(entry, how, plan)
        paid += how.checks.runs > runs
        (out if entry.excluded else admitted).append(entry)
    return admitted + [reference], out


def _check(entry: Candidate, how: Measuring, plan: Plan) -> None:
    """Check `entry` once (`AnswerChecks.check`, within the time budget): its findings, and
    why it is ruled out where it is; the baseline (the reference) is never ruled out. A
    worst batch that peaked higher than its search trial raises the peak its warm process is
    planned with."""
    if how.checks is None or entry.checked:
        return
    reference = entry.taken_from is None and entry.config == how.checks.baseline
    found = how.checks.check(entry.config, reference=reference, deadline=plan.budget_ends)
    entry.checked, entry.worst, entry.loss = True, found.worst, found.loss
    entry.excluded = found.why_out
    if found.worst is not None and found.worst.peak_memory_bytes:
        entry.search_peak_bytes = max(entry.search_peak_bytes or 0.0,
                                      found.worst.peak_memory_bytes)


def warm_expected(warm: WarmStart | None, scoring: Scoring, max_rounds: int,
                  peaks: Sequence[float | None]) -> bool:
    """Whether the confirmation will take warm turns (`_warm_rounds`), as far as it is known
    before it starts: a warm process may still fail to start."""
    return max_rounds > WARM_WORTH_ROUNDS and not scoring.train_steps and warm is not None \
        and memory_holds(peaks, warm.capacity)


def _warm_rounds(entries: Sequence[Candidate], how: Measuring, plan: Plan,
                 name: str) -> tuple[WarmTurns | None, Plan]:
    """Warm processes for the candidates, where the plan has room for more rounds than they
    cost to start, the objective is a rate, and the memory holds them all; with the plan's
    rounds counted in warm ones."""
    if plan.max_rounds <= WARM_WORTH_ROUNDS or how.pool is None:
        return None, plan
    if how.scoring.train_steps:
        how.view.note("measuring in fresh-process rounds: --train-steps times whole runs from "
                      "their first step")
        return None, plan
    configs, peaks = [e.config for e in entries], [e.search_peak_bytes for e in entries]
    backs = _proof(entries)
    runners_up = [i for i in range(1, len(entries) - 1) if i not in backs]
    later = [*backs, *runners_up] if plan.budget_ends is not None else []
    turns, why = how.pool.turns(configs, peaks, name, plan.budget_ends, skip=later)
    how.view.note(why)
    # Under a time budget, the best and the baseline start first, then the best less each of
    # its changes (the proof of what it found), then the runners-up (breadth, which shrinks
    # first), each only where its processes' start fits the time left after the least
    # rounds' pairs of turns.
    for group, what in ((backs, "the best less each of its changes"),
                        (runners_up, "the search's runners-up")):
        if turns is None or not group or not later:
            continue
        least = plan.rounds * WARM_ROUNDS_PER_ROUND * 2 * len(entries) * TURN_SECONDS
        left = plan.budget_ends - time.monotonic() - least
        if how.pool.start_s * len(group) <= left:
            later = [i for i in later if i not in group]
            turns, why = how.pool.turns(configs, peaks, name, plan.budget_ends, skip=later)
            how.view.note(f"{what}: {why}")
        else:
            how.view.note(f"{what} not raced: {len(group)} more processes at about "
                          f"{format_seconds(how.pool.start_s)} each would not fit the time left")
    if turns is None:
        return None, plan
    least = plan.rounds * WARM_ROUNDS_PER_ROUND
    timed = plan.ends_by is not None or plan.budget_ends is not None
    most = WARM_MAX_ROUNDS if timed else plan.max_rounds * WARM_ROUNDS_PER_ROUND
    return turns, replace(plan, rounds=least, max_rounds=max(least, most))


def _proof(entries: Sequence[Candidate]) -> list[int]:
    """The entries that judge the best's changes (the first entry's): each the best less one
    change, raced for that (a variant), or a candidate of the search that is that
    configuration too."""
    best, baseline = entries[0].config, entries[-1].config
    less_one = {taken_back(best, change, baseline) for change in changes(best, baseline)}
    return [i for i, e in enumerate(entries[1:-1], start=1)
            if e.variant or e.config in less_one]


def _race(entries: list[Candidate], name: str, plan: Plan, how: Measuring, *,
          reserve: int = 0) -> Race:
    """The rounds of a race among `entries` (the baseline last), in warm turns while the
    pool's processes answer, else in fresh runs. Beyond its least rounds it leaves room for a
    short race of `reserve` configurations after it (`_minimal`'s)."""
    entries, ruled_out = _checked(entries, plan, how)
    reference, view = entries[-1], how.view
    fresh_plan = plan
    try:
        turns, plan = _warm_rounds(entries, how, plan, name)
    except WarmOutOfTime as exc:  # no round fits, warm or fresh
        view.note(f"confirmation: {exc}: no paired round fits in it")
        return Race(entries, WARM_TURNS, 0, 0.0, 0.0, NO_TIME,
                    [e for e in ruled_out if not e.variant])
    measured = WARM_TURNS if turns is not None else FRESH_ROUNDS
    racing = turns.racing() if turns is not None else list(range(len(entries)))
    left_out = len(racing) < len(entries)  # for the time left: judged by none
    shuffle = random.Random(0)
    start, rounds, kept_disturbed, run_s = time.monotonic(), 0, 0, 0.0
    capped = NO_ROUNDS  # unless time or the race's own end ends it first
    judge = PairJudge()
    while rounds < plan.max_rounds:
        next_ends = time.monotonic() + run_s * len(racing)
        beyond = len(reference.runs) >= plan.rounds
        slack = _reserve_s(reserve, plan, run_s, how, turns) if beyond else 0.0
        if (rounds and plan.budget_ends is not None and next_ends + slack > plan.budget_ends) \
                or (beyond and plan.ends_by is not None and next_ends + slack > plan.ends_by):
            capped = NO_TIME
            break
        began = time.monotonic()
        rounds += 1
        order = list(racing)
        shuffle.shuffle(order)
        runs: list[Run | None] | None = None
        partners: dict[int, Run | None] = {}
        if turns is not None:
            try:
                paired_turns = _paired_turns(entries, order, racing, turns, judge)
            except WarmUnavailable as exc:
                view.note(f"a warm process stopped ({exc}): the rest in fresh-process rounds")
                turns.close()
                turns, plan, measured = None, fresh_plan, FRESH_ROUNDS
            else:
                if paired_turns is None:  # a pair never kept (`PairJudge`): taken again
                    run_s = max(run_s, (time.monotonic() - began) / len(order))
                    continue
                runs, partners = paired_turns
        if runs is None:
            runs = [_run(entries[i], i, rounds, name, how, len(entries)) for i in order]
        run_s = max(run_s, (time.monotonic() - began) / len(order))
        if any(run is not None and run.disturbed for run in runs):
            # Measured again while the caps leave room (the minimum of clean rounds within the
            # rounds' cap, another round within the time's); a machine that stays busy gets its
            # rounds kept (paired, so still comparable). Warm turns that all saw the load are
            # kept and counted, not waited out, and not a note each (they come by the dozen).
            in_time = plan.ends_by is None or \
                time.monotonic() + run_s * len(order) <= plan.ends_by
            if turns is None and in_time and \
                    plan.max_rounds - rounds >= plan.rounds - len(reference.runs):
                view.note(f"confirmation round {rounds} was disturbed by another process: "
                          "measuring it again")
                continue
            kept_disturbed += 1
            if turns is None:
                view.note(f"confirmation round {rounds} was disturbed by another process: "
                          "kept, the machine stayed busy")
        for i, run in zip(order, runs):
            entries[i].runs.append(run)
        _record_partners(entries, order, racing, runs, partners)
        for i, why in _eliminated(entries, racing, reference, plan.target):
            racing.remove(i)
            view.note(f"confirmation: {_named(entries, i)} is out of the race after round "
                      f"{len(reference.runs)}: {why}")
        leader = _leader(entries, reference)
        lead = paired(leader, reference, objective) \
            if leader is not None and leader is not reference else None
        known = lead is None or (lead.half_width or 1.0) <= plan.target
        one_left = sum(entries[i] is not reference and not entries[i].variant
                       for i in racing) <= 1
        undecided = {i: ratio for i in racing if entries[i].variant
                     and not decided(ratio := paired(entries[i], entries[i].taken_from,
                                                     objective))}
        least_done = len(reference.runs) >= plan.rounds
        foretold = len(reference.runs) >= max(plan.rounds, JUDGE_ROUNDS)  # a spread to go by
        if least_done and one_left and known and not undecided:
            break
        if foretold and one_left and (why := _beyond_reach(
                entries, undecided, None if known else lead, plan, rounds,
                run_s * len(racing), _reserve_s(reserve, plan, run_s, how, turns))):
            view.note(f"confirmation: ended after round {len(reference.runs)}: {why}")
            capped = NO_TIME
            break
        left_s = (plan.max_rounds - rounds) * run_s * len(racing)
        if plan.ends_by is not None:
            left_s = min(left_s, max(0.0, plan.ends_by - time.monotonic()))
        # the least rounds run whatever the cap
        left_s = max(left_s, (plan.rounds - len(reference.runs)) * run_s * len(racing))
        if left_s > 0 and (turns is None or len(reference.runs) % WARM_REPORT_EVERY == 0):
            racers = f"{len(racing)} configuration{'s' if len(racing) != 1 else ''}"
            view.time_left(f"confirmation round {len(reference.runs)} done, {racers} racing: at "
                           f"most about {format_seconds(left_s)} more")
    if turns is not None:
        _warm_traces(entries, racing, turns, how.directory / "traces", name, view)
    return Race(entries, measured, kept_disturbed, time.monotonic() - start, run_s,
                NO_TIME if left_out else capped, [e for e in ruled_out if not e.variant])


def _checked(entries: list[Candidate], plan: Plan, how: Measuring,
             ) -> tuple[list[Candidate], list[Candidate]]:
    """A race's entries that may race (each checked first, `_check`, but the best less one
    change: checked where it may become the answer, `_minimal`), and those the checks ruled
    out; a configuration less one change races only while the one with it does."""
    for entry in entries:
        if not entry.variant:
            _check(entry, how, plan)
    out = [e for e in entries if e.excluded]
    return [e for e in entries if not e.excluded and
            (not e.variant or not e.taken_from.excluded)], out


# A pair of warm turns whose two turns saw a load differently is taken again at once, this
# many times in all; then the whole round is.
PAIR_TRIES = 4


def _comparator(entries: Sequence[Candidate], i: int, racing: Sequence[int]) -> int:
    """What entry i is judged against: its `partner` where one is set, else the configuration
    it was taken back from, while that races; else the baseline (the last entry)."""
    source = entries[i].partner or entries[i].taken_from
    j = next((k for k in racing if entries[k] is source), None) if source is not None else None
    return j if j is not None else len(entries) - 1


def _paired_turns(entries: Sequence[Candidate], order: Sequence[int], racing: Sequence[int],
                  turns: WarmTurns, judge: PairJudge,
                  ) -> tuple[list[Run | None], dict[int, Run | None]] | None:
    """One round of warm turns as pairs: each entry's turn taken beside a turn of what it is
    judged against (`_comparator`), in a random order, and each pair kept or taken again on
    its own (`PairJudge`, up to `PAIR_TRIES` times), so that a load that comes and goes spoils
    a pair, not the round. Returns every entry's run in `order` (the baseline's from its first
    pair) and, by entry, its partner's turn; None where a pair was never kept."""
    reference = len(entries) - 1
    shuffle = random.Random(len(entries[reference].runs))
    mine: dict[int, Run | None] = {}
    partners: dict[int, Run | None] = {}
    for i in order:
        if i == reference:
            continue
        j = _comparator(entries, i, racing)
        for _ in range(PAIR_TRIES):
            first, second = (i, j) if shuffle.random() < 0.5 else (j, i)
            taken = {first: turns.turn(first)}
            taken[second] = turns.turn(second)
            if judge.keeps([taken[i], taken[j]]):
                break
        else:
            return None
        mine[i], partners[i] = taken[i], taken[j]
        if j == reference and reference not in mine:
            mine[reference] = taken[j]
    if reference not in mine:  # nothing was judged against it: a turn of its own
        mine[reference] = turns.turn(reference)
    return [mine[i] for i in order], partners


def _record_partners(entries: Sequence[Candidate], order: Sequence[int], racing: Sequence[int],
                     runs: Sequence[Run | None], partners: Mapping[int, Run | None]) -> None:
    """Each entry's partner run of this round: its warm pair's turn (`partners`), else (fresh
    rounds) its comparator's run of the same round."""
    this_round = dict(zip(order, runs))
    for i in order:
        if i == len(entries) - 1:
            continue
        j = _comparator(entries, i, racing)
        entry = entries[i]
        entry.partner = entry.partner or entries[j]
        beside = partners[i] if i in partners else this_round.get(j)
        entry.partner_runs.append(beside if entries[j] is entry.partner else None)


def _reserve_s(configurations: int, plan: Plan, run_s: float, how: Measuring,
               turns: WarmTurns | None) -> float:
    """The time a short race of `configurations` takes at the race's least rounds and slowest
    run so far (in warm turns, one new process started too)."""
    if not configurations:
        return 0.0
    start = how.pool.start_s if turns is not None and how.pool is not None else 0.0
    return configurations * plan.rounds * run_s + start


def _beyond_reach(entries: Sequence[Candidate], undecided: Mapping[int, Ratio],
                  lead: Ratio | None, plan: Plan, rounds: int, round_s: float,
                  slack_s: float) -> str:
    """Why the race's rounds end before its caps, or "": where nothing still open (a change
    not yet judged, `undecided`; the leader's speedup `lead` where not yet known within the
    target, or as above 1; a configuration less an open change, which may become the answer,
    as faster than the baseline or not) would be resolved within the rounds the caps leave,
    were the spreads so far to stay (`minimal.rounds_to_judge`, `stats.rounds_for`), more rounds
    would only spend the time: the changes are left out as not shown to pay."""
    ends = [e for e in (plan.ends_by, plan.budget_ends) if e is not None]
    fit = plan.max_rounds - rounds
    if ends and round_s > 0:
        fit = min(fit, int((min(ends) - time.monotonic() - slack_s) / round_s))
    needs = {}
    reference = entries[-1]
    for i, ratio in undecided.items():
        change = describe_changes(entries[i].taken_from.config, entries[i].config)
        needs[f"{change} judged"] = rounds_to_judge(ratio) - ratio.rounds
        versus = paired(entries[i], reference, objective)  # a possible answer, once dropped
        if versus.low is not None and versus.includes_one:
            needs[f"the answer without {change} known against your settings"] = \
                rounds_for(versus, abs(math.log(versus.value))) - versus.rounds
    if lead is not None:
        to_target = rounds_for(lead, math.log1p(plan.target))
        if lead.includes_one:
            to_target = min(to_target, rounds_for(lead, abs(math.log(lead.value))))
        needs["the speedup known"] = to_target - lead.rounds
    if not needs or any(more <= fit for more in needs.values()):
        return ""
    wanted = ", ".join(f"{what} in about {more:.0f}" if math.isfinite(more) else
                       f"{what} in none" for what, more in needs.items())
    return (f"no more rounds would resolve what is open ({wanted} more rounds, were the "
            f"spread to stay; {max(0, fit)} fit in the time left)")


def _named(entries: Sequence[Candidate], index: int) -> str:
    """A racing configuration in words, for the notes."""
    entry = entries[index]
    if entry.variant:
        return (f"candidate {index + 1} (the best without "
                f"{describe_changes(entry.taken_from.config, entry.config)})")
    return f"candidate {index + 1} ({describe_changes(entry.config, entries[-1].config)})"


def _backs(config: TrainConfig, baseline: TrainConfig,
           space: SearchSpace | None) -> list[TakeBack]:
    """The changes of `config` to take back one at a time: none of a configuration of one
    change, which the race itself takes back (the baseline races beside it)."""
    backs = take_backs(config, baseline, space)
    return backs if len(backs) > 1 else []


def _with_variants(entries: list[Candidate], parent: Candidate, backs: Sequence[TakeBack],
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
    peak = (_peak(record) if record else None) or MemoryModel(records).predict(config) or \
        max(peaks, default=None)
    return Candidate(config, record.number if record else None,
                     record.feasible if record else True,
                     record.samples_per_sec if record else None,
                     search_precision=_precision(record) if record else None,
                     search_peak_bytes=peak, search_disturbed=bool(record and record.disturbed),
                     taken_from=parent)


def _again(entry: Candidate) -> Candidate:
    """The same configuration, to be measured afresh in a race of its own."""
    return Candidate(entry.config, entry.trial, entry.feasible, entry.search_samples_per_sec,
                     search_precision=entry.search_precision,
                     search_peak_bytes=entry.search_peak_bytes,
                     search_disturbed=entry.search_disturbed, checked=entry.checked,
                     worst=entry.worst, loss=entry.loss, excluded=entry.excluded)


def _minimal(result: Confirmation, race: Race, judged: list[tuple[TakeBack, Candidate | None]],
             baseline: TrainConfig, plan: Plan, how: Measuring, space: SearchSpace | None,
             records: Sequence[TrialRecord]) -> Confirmation:
    """The race's recommendation less every change not shown to pay. Its changes are judged on
    the configurations without each (`minimal.judge`), raced beside it (the search's best),
    else in a short race of their own; where several are dropped, the configuration without
    them all races it and the baseline, and is the answer unless it is measurably slower,
    else the best of the single drops is."""
    if result.winner is None or result.winner.config == baseline:
        return result
    chosen = next(e for e in race.entries if not e.variant and e.config == result.winner.config)
    where: Race | None = race
    pairs = judged if chosen is race.entries[0] else []
    if not pairs:
        backs = _backs(chosen.config, baseline, space)
        if not backs:
            return result
        pairs, where = _taken_back_race(chosen, backs, plan, how, records, race)
    with_it = where.entries[0] if where is not None else chosen
    decisions = [_judged(back, v, with_it, where, plan, how) for back, v in pairs]
    if unjudged := [d for d in decisions if d.outcome == UNJUDGED and d.config]:
        how.view.note(f"confirmation: not taken back ({unjudged[0].why}): "
                      f"{', '.join(d.change for d in unjudged)}")
    dropped = [i for i, d in enumerate(decisions) if not d.kept]
    follow = [where] if where is not race and where is not None else []
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
    if result.no_measurable_difference is False and _inside_the_noise(answer, answer_race):
        # no drop shown to pay alone, yet the answer less them no longer measurably beats
        # the baseline that the race's recommendation beat: the drops are kept together
        decisions = [replace(d, outcome=TOGETHER, why=NOT_BEATEN) if not d.kept else d
                     for d in decisions]
        return _with_extra(replace(result, taken_back=tuple(decisions)), follow)
    return _with_extra(_answer(result, race, chosen, answer, answer_race, decisions), follow)



def _judged(back: TakeBack, without: Candidate | None, with_it: Candidate, where: Race | None,
            plan: Plan, how: Measuring) -> TakenBack:
    """What taking `back` back showed (`minimal.judge`); a change it drops makes the
    configuration without it a possible answer, which is checked first (`_check`): one the
    checks rule out keeps the change."""
    raced = without is not None and where is not None
    decision = judge(back, paired(without, with_it, objective) if raced else None,
                     without.ok if raced else True, where.capped if where else NO_TIME,
                     failed=without.excluded if without else "")
    if decision.kept or without is None:
        return decision
    _check(without, how, plan)
    return judge(back, None, True, failed=without.excluded) if without.excluded else decision


def _inside_the_noise(answer: Candidate, answer_race: Race) -> bool:
    """Whether `answer`'s interval against the baseline of the race it ran in holds 1."""
    if answer is answer_race.reference:
        return True
    interval = _versus(answer, answer_race.reference)[1]
    return interval is not None and interval[0] <= 1.0 <= interval[1]


def _taken_back_race(chosen: Candidate, backs: Sequence[TakeBack], plan: Plan, how: Measuring,
                     records: Sequence[TrialRecord], race: Race,
                     ) -> tuple[list[tuple[TakeBack, Candidate | None]], Race | None]:
    """A short race of `chosen`, it less each change, and the baseline (None where the time
    left cannot hold the rounds a change is judged on)."""
    entries = [_again(chosen), _again(race.reference)]
    pairs = _with_variants(entries, entries[0], backs, records)
    changes_ = describe_changes(chosen.config, race.reference.config)
    if not _time_for(len(entries), len(entries) - 2, plan, how, race.run_s):
        return pairs, None
    how.view.note(f"confirmation: taking back each change of {changes_} in a short race")
    return pairs, _race(entries, "taken-back", plan, how, reserve=SHORT_RACE)


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
        return UNJUDGED, NO_TIME
    how.view.note(f"confirmation: {describe_changes(config, baseline)} (the answer less every "
                  "change not shown to pay) in a short race")
    answer = _variant(config, records, with_it, race.reference)
    answer.taken_from = None  # a candidate in its own right: it may be the answer
    _check(answer, how, plan)
    if answer.excluded:
        return TOGETHER, f"without all of them {answer.excluded}"
    entries = [answer, _again(with_it), _again(race.reference)]
    answer.partner = entries[1]  # judged against the recommendation, each turn beside one
    short = _race(entries, "minimal", plan, how)
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
    reference = answer_race.reference
    ratio, interval, search, widened = _versus(answer, reference)
    summary = _summary(answer, reference)
    return replace(result, winner=summary, contender=summary, speedup=ratio.value,
                   speedup_ci=interval,
                   no_measurable_difference=interval[0] <= 1.0 <= interval[1]
                   if interval else None,
                   search_speedup=search[0] if search else None, widened=widened,
                   load_adjusted=ratio.load_adjusted,
                   taken_back=tuple(decisions), taken_from=_summary(chosen, race.reference),
                   answer_rounds=len(reference.runs) if answer_race is not race else None)


def _with_extra(result: Confirmation, races: Sequence[Race]) -> Confirmation:
    """The confirmation with what the short races after the race measured among its
    candidates (their baselines aside)."""
    extra = tuple(_summary(e, r.reference) for r in races for e in r.entries[:-1])
    return replace(result, candidates=result.candidates + extra)


def _warm_traces(entries: Sequence[Candidate], racing: Sequence[int], turns: WarmTurns,
                 traces: Path, name: str, view: StudyView) -> None:
    """Each racing candidate's profiler trace, from its warm process after the last turn: a
    fresh round's first run leaves one for the report and `best-trace.json`; turns do not."""
    for i in racing:
        try:
            entries[i].trace = turns.trace(i, traces / f"{name}-{i}.json")
        except WarmUnavailable as exc:
            view.note(f"no profiler trace of candidate {i + 1}: {exc}")
            return


def _eliminated(entries: Sequence[Candidate], racing: Sequence[int], reference: Candidate,
                margin: float = 0.0) -> list[tuple[int, str]]:
    """The candidates still racing that cannot win any more, and why: one that failed a run,
    and one whose paired interval against the leader lies below 1. The baseline stays: it is
    the reference. A configuration less one change is out once it failed a run, once it is
    slower than the one with the change by more than `margin` for sure (the change pays: a
    tie looked at after every round would now and then look slower by a little), or once that
    one is out."""
    alive = [entries[i] for i in racing]
    leader = _leader(alive, reference)
    out = []
    for i in racing:
        entry = entries[i]
        if entry is reference or entry is leader or entry.variant:
            continue
        if not entry.ok:
            out.append((i, "it did not run within memory in every round"))
            continue
        if leader is None:
            continue
        ratio = paired(entry, leader, objective)
        if ratio.high is not None and ratio.high < 1.0:
            out.append((i, f"{ratio.value:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}] of the "
                           "leader's speed"))
    gone = {entries[i].config for i, _ in out} | \
        {e.config for j, e in enumerate(entries) if j not in racing}
    for i in racing:
        entry = entries[i]
        if not entry.variant:
            continue
        if not entry.ok:
            out.append((i, "it did not run within memory in every round: the change is kept"))
        elif entry.taken_from.config in gone:
            out.append((i, "the configuration it takes a change back from is out"))
        elif (ratio := paired(entry, entry.taken_from, objective)).high is not None and \
                ratio.high < 1.0 - margin:
            out.append((i, f"{ratio.value:.2f}x [{ratio.low:.2f}-{ratio.high:.2f}] of the "
                           "speed with the change: it pays"))
    return out


def _run(entry: Candidate, index: int, round_: int, name: str, how: Measuring,
         count: int) -> Run | None:
    """One fresh run of a candidate: its figures, or None when it did not run within memory."""
    how.view.note(f"confirming: round {round_}, candidate {index + 1}/{count}")
    # The first round profiles each candidate for the report; later ones need only the rate.
    trace = how.directory / "traces" / f"{name}-{index}.json" if round_ == 1 else None
    job = MeasureJob(f"{name}-{index}-{round_ - 1}", how.time_limit_s, how.device, trace=trace,
                     profile=trace is not None, round_run=True)
    return run_of(how.measure(entry.config, job), how.scoring)


def run_of(result: TrialResult, scoring: Scoring) -> Run | None:
    """A fresh run's figures, or None when it did not run within memory (or diverged)."""
    m = result.measurement
    if scoring.classify(result)[0] != TrialStatus.OK or m is None:
        return None
    return Run(status=TrialStatus.OK.value, samples_per_sec=m.samples_per_sec,
               objective=scoring.objective_rate(m), peak_memory_bytes=m.peak_memory_bytes,
               mfu=m.mfu, step_time_median_s=m.step_time_median_s,
               time_to_train_s=m.time_to_train_s(scoring.train_steps)
               if scoring.train_steps else None,
               disturbed=m.disturbed, load=m.other_cpu_share, trace=m.trace_path)


def paired(entry: Candidate, reference: Candidate, figure: Figure) -> Ratio:
    """entry / reference, paired by round over the rounds both ran: against what it is judged
    against, each of its runs with that one's run beside it (in warm turns, its pair's).
    Where each run's load was measured, read at equal load wherever the load explains a
    measurable part of the rounds' spread (`load_adjusted_ratio`)."""
    others = entry.partner_runs if entry.partner is reference else reference.runs
    pairs = [(a, b) for a, b in zip(entry.runs, others) if a is not None and b is not None]
    if not pairs:
        return Ratio(float("nan"), None, None, 0)
    numerators, denominators = [figure(a) for a, _ in pairs], [figure(b) for _, b in pairs]
    if all(a.load is not None and b.load is not None for a, b in pairs):
        adjusted = load_adjusted_ratio(numerators, denominators,
                                       [a.load - b.load for a, b in pairs])
        if adjusted is not None:
            return adjusted
    return paired_ratio(numerators, denominators)


def _leader(entries: Sequence[Candidate], reference: Candidate) -> Candidate | None:
    """The fastest candidate that fitted every round (by the objective, paired with the
    baseline; the baseline itself when it is fastest), or None when none did."""
    ranked = [e for e in entries if e.ok and e.feasible and e.runs and not e.variant]
    if not ranked:
        return None
    if not reference.ok or not reference.runs:
        return max(ranked, key=lambda e: statistics.median(e.values(objective)))
    return max(ranked, key=lambda e: 1.0 if e is reference else
               paired(e, reference, objective).value)


def _changes(entry: Candidate, reference: Candidate) -> int:
    mine = entry.config.to_dict()
    return sum(mine[k] != v for k, v in reference.config.to_dict().items())


def conclusion(entries: list[Candidate], reference: Candidate, *, wall_s: float = 0.0,
               target: float = 0.0, disturbed_rounds: int = 0,
               measured: str = FRESH_ROUNDS) -> Confirmation:
    """The fastest, the recommendation (the simplest as fast as the fastest) and the speedup
    of the recommendation over the baseline with its interval."""
    fastest = _leader(entries, reference)
    summaries = [_summary(e, reference) for e in entries]
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
        ratio, speedup_ci, search, widened = _versus(decisive, reference)
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


def _versus(entry: Candidate, reference: Candidate) -> tuple[
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


def _summary(entry: Candidate, reference: Candidate) -> CandidateSummary:
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
        worst_batch=entry.worst, loss_check=entry.loss, excluded=entry.excluded)


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
