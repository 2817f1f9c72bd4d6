"""The search loop: workers ask the study for trials until the budget is spent, and each trial
is decided (a repeat, a known failure, a predicted OOM) or measured, then recorded.

Every trial is one configuration measured in its own process (`isolation`, through the
tuner's `runner.Runner`). What a trial learns goes into the study storage before the next
one starts, so a tuner killed at any moment loses nothing but the trial it was running.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.samplers import BaseSampler, PartialFixedSampler
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from autotune.config import TrainConfig
from autotune.errors import Interrupted, RunFailed
from autotune.formatting import format_disturbance, format_seconds
from autotune.search.events import StudyView
from autotune.search.expert import (
    Fix,
    kept_at_baseline,
    next_bottleneck_trial,
    next_expert_trial,
)
from autotune.search.heartbeat import Heartbeat, recover_orphans, requeue
from autotune.search.loader_plan import apply_loader, workers_share_cores
from autotune.search.memory_model import MemoryModel
from autotune.search.outcome import (
    Scoring,
    record_interrupted,
    record_measurement,
    record_predicted_oom,
    record_repeat,
    record_skipped,
    record_unsupported,
)
from autotune.search.runner import MeasureJob
from autotune.search.shortcuts import (
    bottleneck_fix,
    next_corner,
    planned_loader,
    screen_below,
    screen_load,
)
from autotune.search.space import SearchSpace
from autotune.search.stopping import stopped_finding
from autotune.study.bottleneck import DATA_WAIT, KNOBS, Diagnosis, diagnose, holds_larger_batch
from autotune.study.confirmation import worst_batch_peaks
from autotune.study.records import (
    COUNTS_AGAINST_BUDGET,
    DETERMINISTIC,
    FINISHED,
    Role,
    StudyKey,
    TrialKey,
    TrialRecord,
    config_key,
    fresh_records,
    trial_records,
)
from autotune.study.storage import trial_id
from autotune.target import ModelFile
from autotune.trial.protocol import LoaderRate, TrialResult, TrialStatus

# Trials a tuner proposes that are not measured (repeats, known failures) before it concludes
# the space is exhausted.
MAX_UNMEASURED_IN_A_ROW = 50


# Measures a configuration in a fresh process (`Runner.measure`).
Measure = Callable[[TrainConfig, MeasureJob], TrialResult]


@dataclass(frozen=True)
class Window:
    """Under a time plan, when the search starts its last trial and when that trial must end
    (`budget.TimePlan`), and what a trial that compiles adds to one that does not
    (`budget.compile_start_s`: a first compile, or the longest one measured, as another mode
    compiles anew); the tuner moves it as it makes the plan anew after each trial."""

    last_start: float = math.inf
    finish_by: float = math.inf
    compile_s: float = 0.0

    def holds_a_compile(self) -> bool:
        """Whether a trial that compiles first, started now, ends by `finish_by`."""
        return time.monotonic() + self.compile_s <= self.last_start


@dataclass
class Search:
    """What the workers of one tuner share: the study and how to propose, measure and record
    a trial."""

    study: optuna.Study
    storage: BaseStorage
    space: SearchSpace
    baseline: TrainConfig
    scoring: Scoring
    measure: Measure
    view: StudyView
    owner: str
    trial_time_limit_s: float
    heartbeat_s: float
    shortcuts: bool = True             # memory model, loader plan, screening
    fast_corner: bool = True
    loader_rates: Sequence[LoaderRate] = ()
    state_bytes: Callable[[], int] = lambda: 0
    after_trial: Callable[[], None] = lambda: None  # tells the time left, say
    # Under a time budget: the search ends when it stops finding (`stopping`), and says why.
    ends_when_stale: bool = False
    ended_early: str | None = None
    window: Window = field(default_factory=Window)
    compile_left: bool = False  # the compiled best was left for want of time (said once)
    # False once a figure measured again was disturbed too: the load is the machine's own, and
    # figures are compared as they are (`_measured_calmly`).
    remeasure: bool = True
    baseline_name: str = ModelFile.baseline_name  # the baseline in messages
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    # The study's own sampler; knobs that lost alone (`kept`), and compiling where a first
    # compile would not end in the search's time, are held around it (`held`, `_queue_expert`).
    sampler: BaseSampler = field(init=False)
    kept: dict[str, Any] = field(init=False, default_factory=dict)
    held: dict[str, Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.sampler = self.study.sampler

    def diagnose(self, record: TrialRecord) -> Diagnosis | None:
        """Where a measured trial's step goes (`study/bottleneck`)."""
        if not record.measurement or record.config is None:
            return None
        return diagnose(record.measurement, self.scoring.memory_limit_bytes, holds_larger_batch(
            self.space.domains["micro_batch_size"], record.config.micro_batch_size))


def measured_trials(study: optuna.Study) -> int:
    """Trials that ran a process to its end, failed ones included: the budget. Repeats,
    predicted OOMs and known failures are free; interrupted and orphaned trials run again."""
    return sum(1 for r in trial_records(study)
               if r.finished and not r.duplicate and r.status in COUNTS_AGAINST_BUDGET)


def run_workers(search: Search, devices: Sequence[Any], budget: int | None,
                deadline: float) -> None:
    """One worker per device (or --workers on CPU), each running one trial at a time. No
    trial starts or runs after `deadline`, nor outside the search's `window` (a time plan's:
    its last trial may run past its last start), as the tuner moves it."""
    heartbeat = Heartbeat(search.storage, search.heartbeat_s)
    try:
        if len(devices) == 1:
            _work(search, heartbeat, devices[0], budget, deadline, None)
        else:
            _in_threads(search, heartbeat, devices, budget, deadline)
    finally:
        heartbeat.close()


def _in_threads(search: Search, heartbeat: Heartbeat, devices: Sequence[Any],
                budget: int | None, deadline: float) -> None:
    errors: list[BaseException] = []

    def work(device: Any, slot: int) -> None:
        try:
            _work(search, heartbeat, device, budget, deadline, slot)
        except BaseException as exc:
            errors.append(exc)
            search.stop.set()

    threads = [threading.Thread(target=work, args=(d, i), name=f"autotune-worker-{i}")
               for i, d in enumerate(devices)]
    for thread in threads:
        thread.start()
    try:
        while any(t.is_alive() for t in threads):
            for thread in threads:
                thread.join(0.2)
    except KeyboardInterrupt:
        search.stop.set()
        for thread in threads:
            thread.join()
        raise Interrupted from None
    if errors:
        raise next((e for e in errors if not isinstance(e, Interrupted)), errors[0])


def _work(search: Search, heartbeat: Heartbeat, device: Any, budget: int | None,
          deadline: float, slot: int | None) -> None:
    unmeasured = 0
    while not search.stop.is_set() and search.ended_early is None and \
            time.monotonic() < min(deadline, search.window.last_start):
        recover_orphans(search.study, search.storage, search.owner, search.view.note)
        with search.lock:
            if budget is not None and measured_trials(search.study) >= budget:
                return
            trial = _ask(search, budget)
            if trial is not None:
                tid = trial_id(search.storage, search.study.study_name, trial.number)
                heartbeat.add(tid)
        if trial is None:
            time.sleep(1.0)  # the rest of the budget is running: wait for its outcome
            continue
        try:
            measured = run_trial(search, trial, device,
                                 min(deadline, search.window.finish_by), slot)
        except KeyboardInterrupt:
            _interrupted(search, trial, tid)
            raise Interrupted from None
        finally:
            heartbeat.discard(tid)
        if measured and search.ends_when_stale and _stale(search):
            return
        if measured:
            search.after_trial()
        unmeasured = 0 if measured else unmeasured + 1
        if unmeasured >= MAX_UNMEASURED_IN_A_ROW:
            search.view.note("every configuration the sampler proposes was already measured "
                             "or failed before: the space is exhausted")
            return


def _stale(search: Search) -> bool:
    """Whether the search has stopped finding (said once, for every worker)."""
    with search.lock:
        if search.ended_early is None:
            why = stopped_finding(trial_records(search.study))
            if why is None:
                return False
            search.ended_early = why
            search.view.note(why)
    return True


def _ask(search: Search, budget: int | None) -> Trial | None:
    """The next trial (the fast corner, then an expert's trials, when due), or None while the
    rest of the budget is running elsewhere."""
    running = len(search.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
    if budget is not None and measured_trials(search.study) + running >= budget:
        return None
    if search.shortcuts and search.fast_corner:
        _queue_expert(search, [TrialRecord.of(t)
                               for t in search.study.get_trials(deepcopy=False)])
    trial = search.study.ask()
    trial.set_user_attr(TrialKey.OWNER, search.owner)
    trial.set_user_attr(TrialKey.HEARTBEAT_S, search.heartbeat_s)
    return trial


def _queue_expert(search: Search, records: Sequence[TrialRecord]) -> None:
    """Queue the next fix of the step's bottleneck while there is one (`expert`), else the fast
    corner when due, else the expert's next trial; and keep the knobs that lost alone at the
    baseline's value in the sampler's proposals."""
    space, memory_limit = search.space, search.scoring.memory_limit_bytes
    fix = _fix(search, records)
    move = next_bottleneck_trial(records, space, search.diagnose, fix)
    if move is not None:
        search.study.enqueue_trial(move.params, user_attrs={
            TrialKey.ROLE: move.role, TrialKey.CHANGED: list(move.changed)})
        return
    corner = next_corner(records, space, memory_limit, search.state_bytes)
    if corner is not None:
        search.study.enqueue_trial(corner, user_attrs={TrialKey.ROLE: Role.FAST_CORNER})
        return
    baseline = next((r for r in records if r.role == Role.BASELINE and r.measurement), None)
    diagnosis = search.diagnose(baseline) if baseline else None
    expert = next_expert_trial(records, space, diagnosis.first_knobs() if diagnosis else ())
    if expert is not None and expert.role == Role.COMPILED_BEST and \
            not search.window.holds_a_compile():
        if not search.compile_left:
            search.compile_left = True
            search.view.note("the best so far compiled is not tried: its first compile (about "
                             f"{format_seconds(search.window.compile_s)}) would not end within "
                             "the search's time left; a resumed run, or a longer --budget, "
                             "tries it")
        expert = None
    if expert is not None:
        search.study.enqueue_trial(expert.params, user_attrs={
            TrialKey.ROLE: expert.role, TrialKey.CHANGED: list(expert.changed)})
    kept = kept_at_baseline(records, search.space)
    if kept != search.kept:
        search.kept = kept
        search.view.note("kept at the baseline's value, having lost alone: " +
                         ", ".join(f"{k}={v}" for k, v in kept.items()))
    # where a compile would not end in the search's time, the sampler does not start one
    held = {**kept, **({"compile_mode": "none"} if search.window.compile_s and
                       not search.window.holds_a_compile() and
                       "none" in search.space.domains.get("compile_mode", ()) else {})}
    if held != search.held:
        search.held = held
        search.study.sampler = PartialFixedSampler(held, search.sampler) if held \
            else search.sampler


def _fix(search: Search, records: Sequence[TrialRecord]) -> Fix:
    """The values of a knob that address its share of a trial's step (`bottleneck_fix`)."""
    def fix(knob: str, current: TrialRecord) -> dict[str, Any] | None:
        return bottleneck_fix(knob, current, records, search.space, search.loader_rates,
                              search.scoring.device_type, search.scoring.memory_limit_bytes,
                              search.state_bytes)
    return fix


def _unaddressed(search: Search, baseline: TrialRecord, diagnosis: Diagnosis) -> str | None:
    """Why the dominant share of the baseline's step gets no move of its own, where nothing
    the search offers changes it from the baseline (mlp on this CPU: "Waiting for data first",
    then the fast corner, and no word of the loader); None where a move addresses it."""
    kind = diagnosis.dominant
    share = next((s for s in diagnosis.shares if s.kind == kind), None)
    fix = _fix(search, [baseline])
    if share is None or any(fix(knob, baseline) for knob in KNOBS[kind]):
        return None
    if kind == DATA_WAIT and search.loader_rates and \
            workers_share_cores(search.scoring.device_type, search.loader_rates):
        return (f"{share.words}: no DataLoader workers planned for it: on this CPU they would "
                "take the cores training runs on (its loader computes, it does not wait)")
    held = [f"{knob}={domain[0]}" for knob in KNOBS[kind]
            if len(domain := search.space.domains.get(knob, ())) == 1]
    return f"{share.words}: nothing the search offers changes it from your settings" + \
        (f" ({', '.join(held)}: one value in this study's space)" if held else "")


def run_trial(search: Search, trial: Trial, device: Any, finish_by: float,
              slot: int | None = None) -> bool:
    """Decide or measure an asked trial, and record it. True when a process was run."""
    study, role = search.study, trial.user_attrs.get(TrialKey.ROLE, Role.SEARCH)
    baseline = role == Role.BASELINE
    config = (search.baseline if baseline and not search.space.contains(search.baseline)
              else search.space.suggest(trial))
    shortcuts = search.shortcuts and not baseline
    # What the shortcuts learn from: the study read once for this trial.
    records = fresh_records(study) if shortcuts else []
    if shortcuts and len(search.loader_rates) > 1:
        config = _plan_loader(search, trial, config, records)
    trial.set_user_attr(TrialKey.CONFIG, config.to_dict())
    previous = _previous(study, config_key(config))
    if previous is not None and previous.state == TrialState.FAIL:
        record_skipped(study, trial, previous)
        return False
    if previous is not None:
        record_repeat(study, trial, previous)
        search.view.trial_finished(_record(study, trial))
        return False
    known = _known_unsupported(records or fresh_records(study), config)
    if known is not None:
        record_unsupported(study, trial, known)
        search.view.trial_finished(_record(study, trial))
        return False
    memory = MemoryModel(records, worst_batch_peaks(study.user_attrs.get(
        StudyKey.CONFIRMATION))) if shortcuts else None
    limit = search.scoring.memory_limit_bytes
    verdict = memory.verdict(config, limit) if memory else None
    if verdict is not None:
        record_predicted_oom(study, trial, verdict)
        search.view.trial_finished(_record(study, trial))
        return False
    predicted = memory.predict(config) if memory else None
    if predicted is not None:
        trial.set_user_attr(TrialKey.PREDICTED_PEAK, predicted)
    search.view.trial_started(trial.number, config, role, str(device))
    remaining = (max(1.0, finish_by - time.monotonic()) if math.isfinite(finish_by)
                 else math.inf)
    job = MeasureJob(f"trial-{trial.number}", min(search.trial_time_limit_s, remaining),
                     str(device), trial.number, screen_below(records) if shortcuts else None,
                     screen_load(records, role), slot=slot)
    result = _measured_calmly(search, config, job, baseline, finish_by)
    try:
        record_measurement(study, trial, result, search.scoring)
    except UpdateFinishedTrialError:
        search.view.note(f"trial {trial.number} was taken over by another tuner (this one "
                         "missed its heartbeats); its result is dropped")
        return True
    record = _record(study, trial)
    if record.status == TrialStatus.COMPILE_TIMEOUT:
        requeue(study, study.trials[trial.number], record.retry + 1)
    search.view.trial_finished(record)
    if baseline and (diagnosis := search.diagnose(record)) is not None:
        search.view.note(f"where your step's time goes: {diagnosis.describe()}")
        if (why := _unaddressed(search, record, diagnosis)) is not None:
            search.view.note(why)
    if baseline and record.status == TrialStatus.DIVERGED:
        raise RunFailed(f"the baseline ({search.baseline_name}) diverged: {record.message}; "
                        "a speedup over a run that does not train means nothing, so the study "
                        "stops here")
    return True


def _measured_calmly(search: Search, config: TrainConfig, job: MeasureJob, baseline: bool,
                     finish_by: float) -> TrialResult:
    """The trial's measurement. Where another process's load disturbed it and its figure would
    lead the search (the baseline, which every move is measured from, or a best so far), it is
    measured once more and the calmer of the two kept: a busy moment's figure is not evidence
    (a disturbed baseline makes every calmer trial look like a win). Not where a second
    measurement would not end by `finish_by`."""
    result = search.measure(config, job)
    m = result.measurement
    left_s = finish_by - time.monotonic()
    if result.status != TrialStatus.OK or m is None or not m.disturbed or \
            not search.remeasure or left_s < result.wall_s or \
            not (baseline or _best_so_far(search, search.scoring.score(m))):
        return result
    search.view.note(f"trial {job.number} was {format_disturbance(m.other_cpu_share)}; "
                     "measured again before the search follows its figure")
    again = search.measure(config, replace(job, name=f"{job.name}-again",
                                           time_limit_s=min(job.time_limit_s, left_s)))
    if again.status != TrialStatus.OK or again.measurement is None:
        return result
    if again.measurement.disturbed:
        search.remeasure = False
        search.view.note("disturbed again: the load is the machine's own now, so the search's "
                         "figures are compared as measured (the confirmation's paired rounds "
                         "read them at equal load)")
    return min((result, again), key=_disturbance)


def _best_so_far(search: Search, score: float) -> bool:
    """Whether `score` is above every clean figure the search has."""
    clean = [r.score for r in fresh_records(search.study)
             if r.score and r.measurement is not None and not r.disturbed]
    return score > max(clean, default=0.0)


def _disturbance(result: TrialResult) -> tuple[bool, float]:
    """How much other processes' load was in a measurement's kept window (less is calmer)."""
    m = result.measurement
    assert m is not None
    return m.disturbed, m.other_cpu_share or 0.0


def _interrupted(search: Search, trial: Trial, tid: int) -> None:
    """Ctrl-C or SIGTERM while `trial` was under way: unless it was recorded already, it is
    recorded as interrupted and its configuration queued for the next run."""
    if search.storage.get_trial(tid).state != TrialState.RUNNING:
        return
    record_interrupted(search.study, trial)
    requeue(search.study, search.study.trials[trial.number],
            trial.user_attrs.get(TrialKey.RETRY, 0))


def _known_unsupported(records: Sequence[TrialRecord],
                       config: TrainConfig) -> TrialRecord | None:
    """An earlier trial that found a setting of `config` (or a pair of its settings)
    unsupported on this model: the same cannot run now either, so no process is spent on
    it."""
    return next((r for r in records if r.status == TrialStatus.UNSUPPORTED
                 and r.unsupported is not None and r.unsupported.matches(config)), None)


def _record(study: optuna.Study, trial: Trial) -> TrialRecord:
    return TrialRecord.of(study.trials[trial.number])


def _plan_loader(search: Search, trial: Trial, config: TrainConfig,
                 records: Sequence[TrialRecord]) -> TrainConfig:
    """The cheapest DataLoader setting that feeds the fastest model measured so far (the
    fastest, for a model the loader holds back)."""
    plan = planned_loader(records, search.loader_rates, workers_share_cores(
        search.scoring.device_type, search.loader_rates))
    if plan is None:
        return config  # loader-bound on the training's cores: measured as it is
    chosen, consumption = plan
    trial.set_user_attr(TrialKey.LOADER_PLAN, {**chosen.to_dict(),
                                               "consumption_samples_per_sec": consumption})
    return apply_loader(config, chosen)


def _previous(study: optuna.Study, key: str) -> FrozenTrial | None:
    """A finished trial of the same configuration whose outcome will not change."""
    for t in study.get_trials(deepcopy=False, states=FINISHED):
        stored = t.user_attrs.get(TrialKey.CONFIG)
        if stored is None or config_key(TrainConfig.from_dict(stored)) != key:
            continue
        if t.state == TrialState.COMPLETE or t.user_attrs.get(TrialKey.STATUS) in DETERMINISTIC:
            return t
    return None
