"""How long a study takes: estimated from the trials measured so far, and, under the default
time budget, when to stop starting trials and how many confirmation rounds fit, so that a run
given no `--trials` or `--timeout` ends within the budget, confirmation included."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

import optuna

from autotune.formatting import format_seconds
from autotune.options import MeasureSettings
from autotune.search.checks import (
    MAX_LOSS_STEPS,
    WORST_PRICED_STEPS,
    CheckPrices,
    loss_steps,
)
from autotune.search.confirm import CLAIM_SETTLE_S
from autotune.search.runner import ROUND_WINDOW_STEPS
from autotune.search.takeback import SHORT_RACE
from autotune.search.warm import WARM_MAX_ROUNDS, WARM_ROUNDS_PER_ROUND, turn_price_s
from autotune.study.records import COUNTS_AGAINST_BUDGET, Role, TrialRecord, trial_records
from autotune.trial.protocol import Measurement, SampleSizes, TrialStatus

# Paired rounds an answer needs: with two, a 95% interval spans t = 12.7 standard errors, with
# three 4.3.
MIN_ROUNDS = 3
# A script's start-up this share of its baseline trial, or more, is said once.
STARTUP_DOMINATES = 0.5
# The default budget grows at most to this many times itself for an answer: a person who
# planned for the default is never told an hour.
MAX_GROWTH = 3
# A worst-batch run's steps (`checks.WORST_PRICED_STEPS`), each priced at the baseline's step
# times the largest sample's size over the median's (at most `WORST_SLOWER`), in a fresh
# interpreter, whose start (torch and the model file imported) is about `FRESH_START_S` more
# than a fork's.
WORST_SLOWER = 100.0
FRESH_START_S = 3.0
# A first torch.compile's price (its trial's first step over the baseline's) before the study
# has measured one: 18 s for GPT-2 small on an H200 (results/gpu_h200_followup), about 30 s
# for the tests' tiny models and 95 s for a small RoBERTa on a 2-core CPU
# (results/issue39_accum_rerun, whose first forecast left it out and ran 1.6x over).
FIRST_COMPILE_PRIOR_S = 60.0
# The expert's first moves: the trials an engineer runs first (the bottleneck's fix, the fast
# corner, a follow-up). A time plan gives them their time before the confirmation its share:
# a proof with nothing found to prove is no answer.
FIRST_MOVES = 3
# The last first move may start this many trials after its place in the plan: the tuner's own
# seconds between trials and a slower trial would otherwise miss it (README command 1 at
# 51441a4: the third missed its start by 6 s and the answer lacked bf16 alone), the
# confirmation's time paying for it.
FIRST_MOVE_SLACK = 0.5
# The configurations besides the baseline whose checks a plan prices: the best, and the one it
# becomes where a change of it is taken back. The others are checked only if they become the
# answer, within the time the rounds leave.
ANSWER_CHECKED = 2


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


def search_compile_s(study: optuna.Study, offers_compile: bool) -> float:
    """What the search's first compiled trial, still to come, adds to a trial's time: where the
    space offers compiling and nothing compiled has run (the expert queues the best so far
    compiled, `expert._compiled_best`), `FIRST_COMPILE_PRIOR_S`; else nothing."""
    if not offers_compile or any(r.config is not None and r.config.compile_mode != "none"
                                 for r in _measured(study)):
        return 0.0
    return FIRST_COMPILE_PRIOR_S


def compile_start_s(study: optuna.Study, offers_compile: bool) -> float:
    """What a trial that compiles adds to one that does not, for the search not to start a
    compile its time left cannot end (`worker.Window`): before one has run,
    `FIRST_COMPILE_PRIOR_S`; after, the longest a compile took (a measured trial's first step
    over the baseline's, or the wall time of one that ran out of time compiling), since another
    mode compiles anew (per_feature_towers at 848bbbe: the sampler started
    max-autotune-no-cudagraphs with 73 s of the search left, after the default mode's 64 s, and
    it timed out compiling). Where the space offers no compile: 0."""
    if not offers_compile:
        return 0.0
    baseline = _baseline(study)
    took = [_compile_took_s(r, baseline) for r in _measured(study)
            if r.config is not None and r.config.compile_mode != "none"]
    return max((s for s in took if s is not None), default=FIRST_COMPILE_PRIOR_S)


def _compile_took_s(compiled: TrialRecord, baseline: TrialRecord | None) -> float | None:
    """How long a compiled trial compiled: its first step's time over the baseline's, or the
    wall time of one killed compiling; None where its first step was not timed."""
    if compiled.status == TrialStatus.COMPILE_TIMEOUT:
        return compiled.wall_s
    first = compiled.measurement.time_to_first_step_s if compiled.measurement else None
    if first is None:
        return None
    own = baseline.measurement.time_to_first_step_s if baseline is not None else None
    return max(0.0, first - (own or 0.0))


def round_run_seconds(study: optuna.Study, settings: MeasureSettings) -> float | None:
    """A confirmation run's wall time (`run_price_s`), priced at the baseline's trial (the
    baseline runs in every round; a compiled trial's start-up would price every run at its
    own). Before the baseline has run, the median of the trials that have."""
    measured = [r for r in _measured(study) if r.measurement is not None
                and r.measurement.step_time_median_s and r.measurement.window_s]
    baseline = [r for r in measured if r.role == Role.BASELINE]
    runs = [run_price_s(r.wall_s, r.measurement, settings) for r in baseline or measured]
    return statistics.median(runs) if runs else None


def confirmation_price(study: optuna.Study, settings: MeasureSettings, fallback_s: float,
                       warm_holds: Callable[[float | None], bool],
                       taken_back: int = 0, checks: CheckPrices | None = None,
                       loss_changes: int = 0) -> ConfirmationPrice:
    """What confirming costs here, priced at the baseline's trial (`round_run_seconds`, else
    `fallback_s`): in warm turns where `warm_holds` the baseline's peak memory for each
    candidate (`confirm.warm_expected`), else in fresh runs; with `taken_back` changes of the
    best taken back beside it, and each process that compiles paying the best's compile
    (`compile_seconds`); and the checks of what it may recommend (`checks`: a run of each, and
    `loss_changes` numerics changes it may need a loss run of: the space's, or the measured
    candidates')."""
    run_s = round_run_seconds(study, settings) or fallback_s
    compile_s = compile_seconds(study)
    baseline = _baseline(study)
    priced = {"worst_s": checks.worst_s, "loss_s": checks.loss_s,
              "loss_changes": loss_changes if checks.loss_s else 0} if checks else {}
    if baseline is None or not warm_holds(baseline.peak_memory_bytes):
        return ConfirmationPrice(run_s, taken_back=taken_back, compile_s=compile_s, **priced)
    return ConfirmationPrice(run_s, _race_turn_s(study, baseline, taken_back), taken_back,
                             compile_s, **priced)


def _race_turn_s(study: optuna.Study, baseline: TrialRecord, taken_back: int) -> float:
    """A warm turn of the race, on average: of its pairs (the best and the baseline, the best
    and each of `taken_back` less one change) one turn in 2 + 2 x `taken_back` is the
    baseline's, the rest priced as the fastest configuration measured (`turn_price_s`: a turn
    that waits on its loader's workers lasts longer)."""
    base_s = turn_price_s(baseline.config, baseline.measurement)
    measured = [r for r in _measured(study) if r.status == TrialStatus.OK and r.config
                and r.samples_per_sec and r.measurement is not None]
    best = max(measured, key=lambda r: r.samples_per_sec, default=None)
    best_s = turn_price_s(best.config, best.measurement) if best else base_s
    return (base_s + best_s * (1 + 2 * taken_back)) / (2 + 2 * taken_back)


def compile_seconds(study: optuna.Study) -> float:
    """What one confirmation process that compiles pays beyond the baseline's start, where the
    fastest configuration measured so far compiles (the candidates and the best less each
    change then compile too): its first step's time over the baseline's. None compiles: 0."""
    baseline = _baseline(study)
    measured = [r for r in _measured(study) if r.status == TrialStatus.OK and r.config
                and r.samples_per_sec and r.measurement.time_to_first_step_s is not None]
    best = max(measured, key=lambda r: r.samples_per_sec, default=None)
    if baseline is None or best is None or best.config.compile_mode == "none":
        return 0.0
    return _compile_took_s(best, baseline) or 0.0


def startup_note(study: optuna.Study) -> str | None:
    """Where a training script's own start-up (imports, data, model: the baseline's build
    phase) is most of its baseline trial's wall time, one line that says so: every trial and
    every fresh confirmation run pays it again."""
    baseline = _baseline(study)
    if baseline is None or baseline.measurement.script_answer is None:
        return None
    startup = baseline.measurement.setup_s
    if startup < STARTUP_DOMINATES * baseline.wall_s:
        return None
    return (f"the script's own start-up (imports, data, model) took {format_seconds(startup)} "
            f"of the baseline trial's {format_seconds(baseline.wall_s)}: every trial and "
            "every fresh confirmation run starts the script again and pays it")


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


def check_prices(study: optuna.Study, sizes: SampleSizes | None, loss_check: bool,
                 run_steps: int | None = None) -> CheckPrices | None:
    """What one run of each check of the answer takes (`search.checks`), priced at the
    baseline's trial: its process start, build and first step, then a worst batch's steps (at
    its step time, scaled by the largest sample over the median, in a fresh interpreter; none
    where the samples are one size or were not sized) or a loss run's (`checks.loss_steps` at
    its step time, at most `run_steps`: a script's own run; none where the loss check is off).
    None before the baseline has run."""
    baseline = _baseline(study)
    if baseline is None or not baseline.measurement.step_time_median_s:
        return None
    m = baseline.measurement
    step = m.step_time_median_s
    start = (max(0.0, (baseline.wall_s or 0.0) - m.measure_wall_s) if m.measure_wall_s
             is not None else 0.0) + m.setup_s + (m.time_to_first_step_s or step)
    steps = min(loss_steps(step), run_steps or MAX_LOSS_STEPS)
    worst = 0.0
    if sizes is not None and not sizes.uniform:
        slower = min(WORST_SLOWER, sizes.largest_bytes[0] / max(1, sizes.median_bytes))
        worst = FRESH_START_S + start + WORST_PRICED_STEPS * step * slower
    return CheckPrices(worst_s=worst, loss_s=start + steps * step if loss_check else 0.0,
                       loss_steps=steps)


def _measured(study: optuna.Study) -> list[TrialRecord]:
    """The trials that ran a process to its end and were not repeats, with their wall time."""
    return [r for r in trial_records(study)
            if r.status in COUNTS_AGAINST_BUDGET and not r.duplicate and r.wall_s]


def _baseline(study: optuna.Study) -> TrialRecord | None:
    """The baseline's trial, where it ran to its end with figures."""
    return next((r for r in _measured(study) if r.role == Role.BASELINE
                 and r.measurement is not None), None)


def pair_turns(racing: int) -> int:
    """The turns of one warm round of `racing` configurations: each but the baseline in a pair
    with a turn of what it is judged against (`race._paired_turns`)."""
    return 2 * (racing - 1)


@dataclass(frozen=True)
class ConfirmationPrice:
    """What the confirmation's rounds cost here: a fresh run of each configuration racing, every
    round (`run_s` each); or, in warm paired turns (`turn_s` set: `search.warm`), each
    configuration's process started once (about a fresh run), a turn each to settle, the pairs
    of turns of the rounds (`pair_turns`), and a profiled turn of the two left. Rounds are
    counted as the confirmation counts them: fresh ones, or warm ones (`WARM_ROUNDS_PER_ROUND`
    for each fresh round asked, up to `WARM_MAX_ROUNDS`).

    With `taken_back` changes of the best taken back (`search.minimal`), the best less each
    races too, every round, and, two or more of them, a short race of the best less those
    dropped, the best and the baseline follows, of the least rounds an answer needs.

    Where the best compiles (`compile_s`), every configuration racing but the baseline and the
    best less its compile compiles too: once per warm process, once per run in fresh rounds.

    Before the rounds, the checks (`search.checks`): each configuration's worst batch
    (`worst_s` a run; 0: none), and the loss runs: the baseline's two and one for each
    configuration that changes the numerics, `loss_changes` the numerics changes the answer
    may make (the space's for the budget a study grows to; the candidates measured so far for
    the search's end: none before one changes the numerics) (`loss_s` a run); each run of a
    configuration that compiles compiles too."""

    run_s: float
    turn_s: float | None = None
    taken_back: int = 0
    compile_s: float = 0.0
    worst_s: float = 0.0
    loss_s: float = 0.0
    loss_changes: int = 0

    @property
    def warm(self) -> bool:
        return self.turn_s is not None

    def least_rounds(self, asked: int) -> int:
        return asked * WARM_ROUNDS_PER_ROUND if self.warm else asked

    def most_rounds(self, asked: int) -> int:
        return WARM_MAX_ROUNDS if self.warm else asked

    def seconds(self, candidates: int, rounds: int) -> float:
        """`rounds` rounds of `candidates` configurations and the best less each change: the
        first of them all, then the race's two (the best and the baseline) and the best less
        each change; then the short race after it."""
        racing, each = candidates + self.taken_back, 2 + self.taken_back
        checks = self.checks_s(candidates)
        if self.turn_s is None:
            return (racing + each * (rounds - 1)) * self.run_s + self.short_race_s() + \
                (self.compiling(racing) + self.compiling(each) * (rounds - 1)) * self.compile_s \
                + checks
        turns = racing + pair_turns(racing) + pair_turns(each) * (rounds - 1) + 2
        return self.start_s(racing) + turns * self.turn_s + self.short_race_s() + checks

    def checks_s(self, candidates: int) -> float:
        """The checks of the configurations that can be the answer: the baseline and, of
        `candidates` (the baseline among them) and the best less each change, at most
        `ANSWER_CHECKED`. A worst batch each; the baseline's loss run (its second seed runs
        only where a loss is beyond the floor, and only where the time left holds it) and one
        for each configuration that changes the numerics (priced at two for each of
        `loss_changes`, at most one a configuration besides the baseline). Where the best
        compiles, each check of a configuration that compiles pays its compile: every process
        of a check is new."""
        checked = min(candidates + self.taken_back, 1 + ANSWER_CHECKED)
        changed = min(2 * self.loss_changes, checked - 1) if self.loss_changes else 0
        loss = 1 + changed if self.loss_changes else 0
        compiles = (self.compiling(checked) if self.worst_s else 0) + \
            (min(changed, self.compiling(checked)) if self.loss_s else 0)
        return checked * self.worst_s + loss * self.loss_s + compiles * self.compile_s

    def compiling(self, racing: int) -> int:
        """Of `racing` configurations (the baseline among them), those that compile."""
        if not self.compile_s:
            return 0
        return max(0, racing - 1 - min(1, self.taken_back))

    def start_s(self, processes: int) -> float:
        """`processes` warm processes started, one after another, their compiles included."""
        return processes * self.run_s + self.compiling(processes) * self.compile_s

    def short_race_s(self) -> float:
        """The short race after the race, where two or more changes may be dropped: the best
        less them, the best and the baseline, `MIN_ROUNDS` paired rounds (warm: one more
        process to start)."""
        if self.taken_back < 2:
            return 0.0
        rounds = self.least_rounds(MIN_ROUNDS)
        if self.turn_s is None:
            return SHORT_RACE * rounds * (self.run_s + self.compile_s)
        return self.run_s + self.compile_s + \
            (SHORT_RACE + pair_turns(SHORT_RACE) * rounds) * self.turn_s

    def rounds_in(self, seconds: float, candidates: int) -> int:
        """The rounds `seconds` hold, the first always."""
        room = seconds - self.seconds(candidates, 1)
        racing = 2 + self.taken_back
        each = pair_turns(racing) * self.turn_s if self.turn_s is not None else \
            racing * self.run_s + self.compiling(racing) * self.compile_s
        return 1 + math.floor(max(0.0, room) / each + 1e-9)

    def describe_rounds(self, rounds: int, candidates: int) -> str:
        backs = ", the best less each of its changes among them" if self.taken_back else ""
        checks = self.checks_s(candidates)
        kinds = " and ".join(kind for kind, price in (("worst batches", self.worst_s),
                                                      ("loss runs", self.loss_s)) if price)
        checked = f" (after about {format_seconds(checks)} of checks: {kinds})" if checks else ""
        if self.warm:
            return (f"{rounds} paired round{'s' if rounds != 1 else ''} of warm turns, after "
                    f"{candidates + self.taken_back} processes warm up{backs}{checked}")
        return (f"{rounds} confirmation round{'s' if rounds != 1 else ''}, the first of "
                f"{candidates + self.taken_back} runs{backs}{checked}")

    def describe(self) -> str:
        compiling = f" (one that compiles {format_seconds(self.compile_s)} more)" \
            if self.compile_s else ""
        if self.warm:
            return (f"a warm process takes about {format_seconds(self.run_s)} to start "
                    f"here{compiling}")
        return f"a confirmation run takes about {format_seconds(self.run_s)} here{compiling}"


@dataclass(frozen=True)
class TimePlan:
    """Under a time budget: the search's end, and the confirmation rounds that fit after it."""

    trial_s: float
    search_ends_at: float       # time.monotonic() after which no search trial starts
    confirm_rounds: int         # at most this many rounds fit before the budget ends
    search_trials: int          # about this many search trials fit
    price: ConfirmationPrice

    @property
    def finish_by(self) -> float:
        """When the last search trial, started by `search_ends_at`, must have ended."""
        return self.search_ends_at + self.trial_s

    def describe(self, budget_s: float, candidates: int) -> str:
        return (f"a trial takes about {format_seconds(self.trial_s)} here: in the "
                f"{format_seconds(budget_s)} budget, about {self.search_trials} more search "
                f"trials, then up to "
                f"{self.price.describe_rounds(self.confirm_rounds, candidates)}")


def plan_time(budget_s: float, started: float, now: float, trial_s: float,
              price: ConfirmationPrice, candidates: int, share: float,
              max_rounds: int, first_moves: int = FIRST_MOVES) -> TimePlan:
    """Leave the confirmation its share of the budget (at least the rounds an answer with an
    interval needs; none with no share: no confirmation), and the last search trial room to
    finish. The expert's `first_moves` still to run come first: where the time left cannot
    hold them and that share, the confirmation gets what they leave (its first round runs
    whatever the plan), and the last of them may start up to `FIRST_MOVE_SLACK` trials late.
    The tuner makes the plan anew after each trial, its checks priced for the candidates
    measured by then."""
    ends = started + budget_s
    least_s = price.seconds(candidates, price.least_rounds(MIN_ROUNDS))
    confirm_s = max(share * budget_s, least_s) if share else 0.0
    confirm_s = max(0.0, min(confirm_s, ends - now - first_moves * trial_s))
    rounds = min(price.most_rounds(max_rounds),
                 price.rounds_in(min(confirm_s, ends - now), candidates))
    last_first_move = now + (first_moves - 1 + FIRST_MOVE_SLACK) * trial_s if first_moves \
        else now - trial_s
    search_ends = min(ends - trial_s, max(ends - confirm_s - trial_s, last_first_move))
    search_trials = max(0, math.floor((search_ends - now) / trial_s) + 1)
    return TimePlan(trial_s, search_ends, max(1, rounds), search_trials, price)


def answer_budget_s(price: ConfirmationPrice, share: float) -> float:
    """The least wall time a study needs for an answer with an interval: `MIN_ROUNDS` paired
    rounds (their warm ones, in warm turns) of one candidate and the baseline, within the
    confirmation's share; taking its changes back is not needed for an answer, so a budget
    does not grow for it."""
    bare = replace(price, taken_back=0)
    return bare.seconds(2, bare.least_rounds(MIN_ROUNDS)) / share


@dataclass(frozen=True)
class BudgetGrowth:
    """The budget against the least an answer with an interval needs (`answer_budget_s`):
    kept, grown to it, or grown to `MAX_GROWTH` times and still short; a given `--budget`
    (`fixed`) is kept, short or not."""

    default_s: float
    needed_s: float
    budget_s: float
    share: float
    fixed: bool = False

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

    def describe(self, price: ConfirmationPrice) -> str:
        if self.fixed and self.short:
            return (f"{price.describe()}: an answer with an interval needs "
                    f"{format_seconds(self.needed_s)} in all, more than --budget "
                    f"{format_seconds(self.budget_s)}: the speedup's interval may stay unknown "
                    f"({self.answering_flag} would answer it)")
        if not self.grew:
            return ""
        said = (f"{price.describe()}: the default budget grows from "
                f"{format_seconds(self.default_s)} to {format_seconds(self.budget_s)}")
        if not self.short:
            return (f"{said}, so that the confirmation ({self.share:.0%} of the study at most) "
                    f"has room for {MIN_ROUNDS} paired rounds of the best and your settings, "
                    "the least that gives an answer an interval")
        return (f"{said} ({MAX_GROWTH}x, the most it grows); an answer with an interval "
                f"needs {format_seconds(self.needed_s)} in all: the speedup's interval may "
                f"stay unknown ({self.answering_flag}, the search's time before the "
                "confirmation, would answer it)")

    @property
    def answering_flag(self) -> str:
        """The flag that would answer: the whole run's `--budget` where one was given, else
        the search's `--timeout`."""
        if self.fixed:
            return f"--budget {math.ceil(self.needed_s / 60):.0f}m"
        return f"--timeout {self.answering_timeout_s / 60:.0f}m"


def grow_budget(default_s: float, price: ConfirmationPrice, share: float,
                may_grow: bool = True) -> BudgetGrowth:
    """The default budget, grown (to the minute, at most `MAX_GROWTH` times) where the
    confirmation's share of it cannot hold `MIN_ROUNDS` paired rounds; a given one
    (`may_grow` false) kept."""
    needed = answer_budget_s(price, share)
    budget = default_s if needed <= default_s or not may_grow else \
        min(math.ceil(needed / 60) * 60, MAX_GROWTH * default_s)
    return BudgetGrowth(default_s, needed, budget, share, fixed=not may_grow)


def candidates_that_fit(budget_s: float, price: ConfirmationPrice, share: float,
                        top: int) -> int:
    """How many candidates besides the baseline the confirmation can take (at most `top`, at
    least one) so that its first round leaves room, within its share, for the race's rounds of
    the best and the baseline that an answer needs."""
    least = price.least_rounds(MIN_ROUNDS)
    return max([1] + [n for n in range(1, top + 1)
                      if price.seconds(n + 1, least) <= share * budget_s + 1e-9])


@dataclass(frozen=True)
class Forecast:
    """What is left of a run, priced at the median trial: the search, then the confirmation
    as it is planned now (its rounds, capped by its share of the study's wall time)."""

    search_s: float
    trials: int | None          # search trials left, where a count bounds the search
    compile_s: float            # of `search_s`: a first compile still to come
    confirm_s: float
    rounds: int
    candidates: int
    price: ConfirmationPrice

    @property
    def seconds(self) -> float:
        return self.search_s + self.confirm_s

    def describe(self) -> str:
        trials = (f"{self.trials} more search trial{'s' if self.trials != 1 else ''}"
                  if self.trials is not None else "search")
        compiling = f", a first compile priced at {format_seconds(self.compile_s)} among " \
            "them" if self.compile_s else ""
        search = f"{trials} ({format_seconds(self.search_s)}{compiling})" \
            if self.search_s > 0 else "the search done"
        return (f"about {format_seconds(self.seconds)} left: {search}, then about "
                f"{self.price.describe_rounds(self.rounds, self.candidates)} "
                f"({format_seconds(self.confirm_s)})")


def forecast(*, now: float, deadline: float, trials_left: int | None, trial_s: float,
             price: ConfirmationPrice, workers: int, candidates: int, rounds: int,
             max_rounds: int, share: float, searched_s: float,
             ends_by: float = math.inf, compile_s: float = 0.0) -> Forecast:
    """The rest of a run from now: the search until its trials are done (one of them paying
    `compile_s` more: `search_compile_s`) or its deadline, then the confirmation: its least
    `rounds` always, more (to `max_rounds`) while they fit in `share` of the study's wall
    time, and all of it by `ends_by` (a time budget's end)."""
    search_s = max(0.0, deadline - now)
    if trials_left is not None:
        compile_s = compile_s if trials_left else 0.0
        search_s = min(search_s, math.ceil(trials_left / workers) * trial_s + compile_s)
    compile_s = min(compile_s, search_s)
    most = price.most_rounds(max_rounds)
    least_s = price.seconds(candidates, price.least_rounds(rounds))
    within_share = min(price.seconds(candidates, most),
                       (searched_s + search_s) * share / (1 - share))
    confirm_s = min(max(least_s, within_share), max(0.0, ends_by - now - search_s))
    fit = price.rounds_in(confirm_s, candidates)
    # before its first round, its claim settles (`search.confirm.should_confirm`)
    return Forecast(search_s, trials_left, compile_s,
                    CLAIM_SETTLE_S + confirm_s if rounds else 0.0,
                    min(most, fit) if rounds else 0, candidates, price)
