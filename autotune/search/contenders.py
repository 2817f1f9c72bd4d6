"""The configurations a confirmation races (`Candidate`), how much confirming to do
(`Plan`), how a run is measured and checked (`Measuring`, `check_entry`), and how two
candidates' runs pair into a ratio (`paired`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config import TrainConfig
from autotune.options import (
    DEFAULT_CONFIRM_MAX_ROUNDS,
    DEFAULT_CONFIRM_ROUNDS,
    DEFAULT_CONFIRM_TARGET,
)
from autotune.search.checks import AnswerChecks
from autotune.search.events import StudyView
from autotune.search.outcome import Scoring
from autotune.search.warm import WarmPool, turn_price_s
from autotune.search.worker import Measure
from autotune.stats import Ratio, load_adjusted_ratio, paired_ratio
from autotune.study.checks import LossCheck, WorstBatchCheck
from autotune.study.confirmation import (
    Run,
)
from autotune.study.records import (
    Role,
    TrialRecord,
    config_key,
    rankable,
    trial_records,
)
from autotune.trial.protocol import ScriptAnswer, TrialResult, TrialStatus


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
    search_turn_s: float | None = None  # a warm turn of it, from its search trial (`turn_price_s`)
    trace: str | None = None  # its profiler trace, where its warm process was asked for one
    # A script's configuration in its own terms, as its warm process or a fresh run said it
    script_answer: ScriptAnswer | None = None
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
    # run next to its own: in warm turns the turn taken beside it (`race._paired_turns`).
    partner: Candidate | None = field(default=None, repr=False, compare=False)
    partner_runs: list[Run | None] = field(default_factory=list, repr=False, compare=False)
    # The rounds of the race run before it joined (its warm process started once another's
    # left room in memory: `race._admitted`): its first run pairs with that round's.
    joined: int = field(default=0, compare=False)

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
                                    search_precision=precision_of(r), search_peak_bytes=peak_of(r),
                                    search_disturbed=r.disturbed,
                                    search_turn_s=turn_price_s(r.config, r.measurement))
    baseline_trial = next((r for r in records if r.role == Role.BASELINE
                           and r.state == TrialState.COMPLETE.name), None)
    reference = Candidate(
        baseline, baseline_trial.number if baseline_trial else None,
        bool(baseline_trial and baseline_trial.feasible),
        baseline_trial.samples_per_sec if baseline_trial else None,
        search_precision=precision_of(baseline_trial) if baseline_trial else None,
        search_peak_bytes=peak_of(baseline_trial) if baseline_trial else None,
        search_disturbed=bool(baseline_trial and baseline_trial.disturbed),
        search_turn_s=turn_price_s(baseline, baseline_trial.measurement)
        if baseline_trial else None)
    return [*chosen.values(), reference]  # the baseline last, as the reference


def precision_of(record: TrialRecord) -> float | None:
    """Within what the search trial knew its median step time."""
    return record.measurement.step_time_precision if record.measurement else None


def peak_of(record: TrialRecord) -> float | None:
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


def check_entry(entry: Candidate, how: Measuring, plan: Plan) -> None:
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
    mine, others = entry.runs, entry.partner_runs
    if entry.partner is not reference:  # the same rounds of each, whichever joined later
        mine = entry.runs[max(0, reference.joined - entry.joined):]
        others = reference.runs[max(0, entry.joined - reference.joined):]
    pairs = [(a, b) for a, b in zip(mine, others) if a is not None and b is not None]
    if not pairs:
        return Ratio(float("nan"), None, None, 0)
    numerators, denominators = [figure(a) for a, _ in pairs], [figure(b) for _, b in pairs]
    if all(a.load is not None and b.load is not None for a, b in pairs):
        adjusted = load_adjusted_ratio(numerators, denominators,
                                       [a.load - b.load for a, b in pairs])
        if adjusted is not None:
            return adjusted
    return paired_ratio(numerators, denominators)


def leader_of(entries: Sequence[Candidate], reference: Candidate) -> Candidate | None:
    """The fastest candidate that fitted every round (by the objective, paired with the
    baseline; the baseline itself when it is fastest), or None when none did."""
    ranked = [e for e in entries if e.ok and e.feasible and e.runs and not e.variant]
    if not ranked:
        return None
    if not reference.ok or not reference.runs:
        return max(ranked, key=lambda e: statistics.median(e.values(objective)))
    return max(ranked, key=lambda e: 1.0 if e is reference else
               paired(e, reference, objective).value)
