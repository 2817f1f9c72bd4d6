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

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.formatting import describe_changes, format_seconds
from autotune.options import (
    DEFAULT_CONFIRM_MAX_ROUNDS,
    DEFAULT_CONFIRM_ROUNDS,
    DEFAULT_CONFIRM_TARGET,
)
from autotune.search.events import StudyView
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob
from autotune.search.warm import (
    WARM_MAX_ROUNDS,
    WARM_ROUNDS_PER_ROUND,
    WARM_WORTH_ROUNDS,
    PairJudge,
    WarmRounds,
    WarmStart,
    WarmUnavailable,
    memory_holds,
    warm_or_why,
)
from autotune.search.worker import Measure
from autotune.stats import Ratio, paired_ratio
from autotune.study.confirmation import (
    FAILED,
    FRESH_ROUNDS,
    WARM_TURNS,
    CandidateSummary,
    Confirmation,
    Drift,
    Run,
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
    trace: str | None = None  # its profiler trace, where its warm process was asked for one

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
                                    search_precision=_precision(r), search_peak_bytes=_peak(r))
    baseline_trial = next((r for r in records if r.role == Role.BASELINE
                           and r.state == TrialState.COMPLETE.name), None)
    reference = Candidate(
        baseline, baseline_trial.number if baseline_trial else None,
        bool(baseline_trial and baseline_trial.feasible),
        baseline_trial.samples_per_sec if baseline_trial else None,
        search_precision=_precision(baseline_trial) if baseline_trial else None,
        search_peak_bytes=_peak(baseline_trial) if baseline_trial else None)
    return [*chosen.values(), reference]  # the baseline last, as the reference


def _precision(record: TrialRecord) -> float | None:
    """Within what the search trial knew its median step time."""
    return record.measurement.step_time_precision if record.measurement else None


def _peak(record: TrialRecord) -> float | None:
    return record.measurement.peak_memory_bytes if record.measurement else None


def confirm(study: optuna.Study, baseline: TrainConfig, scoring: Scoring, measure: Measure,
            view: StudyView, plan: Plan, *, time_limit_s: float, device: str,
            directory: Path, warm: WarmStart | None = None) -> Confirmation | None:
    """Paired rounds as a race: after each round, a candidate measurably slower than the leader
    (its paired interval against the leader below 1) is dropped, and only those that could
    still win are measured again. It ends when one candidate is left besides the baseline and
    its speedup is known within the target, or at the cap; the outcome is stored in the study
    and returned. None, with nothing run, when the search measured no candidate besides the
    baseline in full: there is nothing to race it against.

    With `warm` (and memory for them all), each round is a turn of every candidate's warm
    process (`search.warm`): seconds instead of process starts, so the least rounds are
    `WARM_ROUNDS_PER_ROUND` times more and beyond them time caps the race, not a count."""
    entries = candidates(study, baseline, plan.top)
    if len(entries) == 1:
        view.note("no configuration besides your settings was measured in full (the others "
                  "were stopped at screening or failed): nothing to confirm")
        return None
    turns, warm_plan = _warm_rounds(entries, scoring, warm, view, plan)
    try:
        return _race(study, entries, scoring, measure, view, warm_plan, plan, turns,
                     time_limit_s=time_limit_s, device=device, directory=directory)
    finally:
        if turns is not None:
            turns.close()


def warm_expected(warm: WarmStart | None, scoring: Scoring, max_rounds: int,
                  peaks: Sequence[float | None]) -> bool:
    """Whether the confirmation will take warm turns (`_warm_rounds`), as far as it is known
    before it starts: a warm process may still fail to start."""
    return max_rounds > WARM_WORTH_ROUNDS and not scoring.train_steps and warm is not None \
        and memory_holds(peaks, warm.capacity)


def _warm_rounds(entries: Sequence[Candidate], scoring: Scoring, warm: WarmStart | None,
                 view: StudyView, plan: Plan) -> tuple[WarmRounds | None, Plan]:
    """Warm processes for the candidates, where the plan has room for more rounds than they
    cost to start, the objective is a rate, and the memory holds them all; with the plan's
    rounds counted in warm ones."""
    if plan.max_rounds <= WARM_WORTH_ROUNDS:
        return None, plan
    if scoring.train_steps:
        view.note("measuring in fresh-process rounds: --train-steps times whole runs from "
                  "their first step")
        return None, plan
    turns, why = warm_or_why(warm, [e.config for e in entries],
                             [e.search_peak_bytes for e in entries], "confirm")
    view.note(why)
    if turns is None:
        return None, plan
    least = plan.rounds * WARM_ROUNDS_PER_ROUND
    timed = plan.ends_by is not None or plan.budget_ends is not None
    most = WARM_MAX_ROUNDS if timed else plan.max_rounds * WARM_ROUNDS_PER_ROUND
    return turns, replace(plan, rounds=least, max_rounds=max(least, most))


def _race(study: optuna.Study, entries: list[Candidate], scoring: Scoring, measure: Measure,
          view: StudyView, plan: Plan, fresh_plan: Plan, turns: WarmRounds | None, *,
          time_limit_s: float, device: str, directory: Path) -> Confirmation:
    """The rounds of `confirm`, in warm turns while `turns` answer, else in fresh runs."""
    reference = entries[-1]
    measured = WARM_TURNS if turns is not None else FRESH_ROUNDS
    racing = list(range(len(entries)))
    shuffle = random.Random(0)
    start, rounds, kept_disturbed, run_s = time.monotonic(), 0, 0, 0.0
    judge = PairJudge()
    while rounds < plan.max_rounds:
        next_ends = time.monotonic() + run_s * len(racing)
        if rounds and plan.budget_ends is not None and next_ends > plan.budget_ends:
            break
        if len(reference.runs) >= plan.rounds and plan.ends_by is not None and \
                next_ends > plan.ends_by:
            break
        began = time.monotonic()
        rounds += 1
        order = list(racing)
        shuffle.shuffle(order)
        runs = None
        if turns is not None:
            try:
                runs = [turns.turn(i) for i in order]
            except WarmUnavailable as exc:
                view.note(f"a warm process stopped ({exc}): the rest in fresh-process rounds")
                turns.close()
                turns, plan, measured = None, fresh_plan, FRESH_ROUNDS
        if runs is None:
            runs = [_run(entries[i], i, rounds, scoring, measure, view, time_limit_s, device,
                         directory, len(entries)) for i in order]
        run_s = max(run_s, (time.monotonic() - began) / len(order))
        if turns is not None and not judge.keeps(runs):
            continue  # not a pair (`PairJudge`): taken again, at the cost of seconds
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
        for i, why in _eliminated(entries, racing, reference):
            racing.remove(i)
            view.note(f"confirmation: candidate {i + 1} "
                      f"({describe_changes(entries[i].config, reference.config)}) is out of "
                      f"the race after round {len(reference.runs)}: {why}")
        leader = _leader(entries, reference)
        known = leader is None or leader is reference or \
            (paired(leader, reference, objective).half_width or 1.0) <= plan.target
        one_left = sum(entries[i] is not reference for i in racing) <= 1
        if len(reference.runs) >= plan.rounds and one_left and known:
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
        _warm_traces(entries, racing, turns, directory, view)
    result = conclusion(entries, reference, wall_s=time.monotonic() - start, target=plan.target,
                        disturbed_rounds=kept_disturbed, measured=measured)
    study.set_user_attr(StudyKey.CONFIRMATION, result.to_json())
    return result


def _warm_traces(entries: Sequence[Candidate], racing: Sequence[int], turns: WarmRounds,
                 directory: Path, view: StudyView) -> None:
    """Each racing candidate's profiler trace, from its warm process after the last turn: a
    fresh round's first run leaves one for the report and `best-trace.json`; turns do not."""
    for i in racing:
        try:
            entries[i].trace = turns.trace(i, directory / "traces" / f"candidate-{i}.json")
        except WarmUnavailable as exc:
            view.note(f"no profiler trace of candidate {i + 1}: {exc}")
            return


def _eliminated(entries: Sequence[Candidate], racing: Sequence[int],
                reference: Candidate) -> list[tuple[int, str]]:
    """The candidates still racing that cannot win any more, and why: one that failed a run,
    and one whose paired interval against the leader lies below 1. The baseline stays: it is
    the reference."""
    alive = [entries[i] for i in racing]
    leader = _leader(alive, reference)
    out = []
    for i in racing:
        entry = entries[i]
        if entry is reference or entry is leader:
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
    return out


def _run(entry: Candidate, index: int, round_: int, scoring: Scoring, measure: Measure,
         view: StudyView, time_limit_s: float, device: str, directory: Path,
         count: int) -> Run | None:
    """One fresh run of a candidate: its figures, or None when it did not run within memory."""
    view.note(f"confirming: round {round_}, candidate {index + 1}/{count}")
    # The first round profiles each candidate for the report; later ones need only the rate.
    trace = directory / "traces" / f"candidate-{index}.json" if round_ == 1 else None
    job = MeasureJob(f"confirm-{index}-{round_ - 1}", time_limit_s, device, trace=trace,
                     profile=trace is not None, round_run=True)
    return run_of(measure(entry.config, job), scoring)


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
               disturbed=m.disturbed, trace=m.trace_path)


def paired(entry: Candidate, reference: Candidate, figure: Figure) -> Ratio:
    """entry / reference, paired by round over the rounds both ran."""
    pairs = [(figure(a), figure(b)) for a, b in zip(entry.runs, reference.runs)
             if a is not None and b is not None]
    if not pairs:
        return Ratio(float("nan"), None, None, 0)
    return paired_ratio([a for a, _ in pairs], [b for _, b in pairs])


def _leader(entries: Sequence[Candidate], reference: Candidate) -> Candidate | None:
    """The fastest candidate that fitted every round (by the objective, paired with the
    baseline; the baseline itself when it is fastest), or None when none did."""
    ranked = [e for e in entries if e.ok and e.feasible and e.runs]
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
    tied = [e for e in entries if e.ok and e.feasible and e.runs and
            (e is fastest or paired(e, fastest, objective).includes_one)]
    recommended = min(tied, key=lambda e: (_changes(e, reference),
                                           -paired(e, fastest, objective).value
                                           if e is not fastest else -1.0))
    index = entries.index
    speedup, speedup_ci = (1.0 if reference.runs else None), None
    no_difference: bool | None = recommended is not fastest
    # The interval of the comparison that decided: the recommendation against the baseline,
    # or, when the baseline is recommended, the fastest against it; when the baseline is the
    # fastest too, its closest contender's (how much faster an alternative could be).
    decisive = fastest if recommended is reference else recommended
    if decisive is reference:
        contenders = [e for e in entries if e is not reference and e.feasible
                      and paired(e, reference, rate).low is not None]
        decisive = max(contenders, key=lambda e: paired(e, reference, rate).value,
                       default=reference)
    search, widened = None, False
    if decisive is not reference and reference.runs:
        ratio = paired(decisive, reference, rate)
        speedup_ci = (ratio.low, ratio.high) if ratio.low is not None else None
        search = _search_ratio(decisive, reference)
        if speedup_ci is not None and search is not None and \
                (search[2] < speedup_ci[0] or search[1] > speedup_ci[1]):
            # The search measured the two at other moments and found another ratio: the
            # machine moved between them, and the rounds alone do not show it.
            speedup_ci = (min(speedup_ci[0], search[1]), max(speedup_ci[1], search[2]))
            widened = True
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
                   search_speedup=search[0] if search else None, widened=widened)


def _search_ratio(entry: Candidate, reference: Candidate) -> tuple[float, float, float] | None:
    """entry / reference as the search measured them, one trial each at its own moment, with
    the interval their own precisions give (±2% each where unknown)."""
    if not entry.search_samples_per_sec or not reference.search_samples_per_sec:
        return None
    value = entry.search_samples_per_sec / reference.search_samples_per_sec
    spread = (entry.search_precision or 0.02) + (reference.search_precision or 0.02)
    return value, value * (1 - spread), value * (1 + spread)


def _summary(entry: Candidate, reference: Candidate) -> CandidateSummary:
    """What the study stores of one candidate: its runs and their medians."""
    rates = entry.values(rate)
    ratio = paired(entry, reference, rate) if entry is not reference else None
    return CandidateSummary(
        config=entry.config, trial=entry.trial, feasible=entry.feasible, ok=entry.ok,
        runs=tuple(r if r is not None else Run(FAILED) for r in entry.runs),
        median=statistics.median(rates) if rates else None,
        spread=(max(rates) - min(rates)) / 2 if rates else None,
        objective=_median(entry.values(objective)),
        time_to_train_s=_median(entry.values(time_to_train)),
        search_samples_per_sec=entry.search_samples_per_sec,
        speedup=ratio.value if ratio else 1.0,
        speedup_ci=(ratio.low, ratio.high) if ratio and ratio.low is not None else None,
        trace=entry.trace or next((r.trace for r in entry.runs if r and r.trace), None))


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
