"""The Optuna study: storage, sampler, baseline first, objective, constraints, confirmation, resume.

Every trial is one configuration measured in its own process (`isolation`). What a trial learns
goes into the study storage before the next one starts, so a tuner killed at any moment loses
nothing but the trial it was running, which the next run re-queues.

Objective: score = samples/sec x (1 - stall_penalty x stall fraction); with `--train-steps S`
the samples/sec is over a whole run of S steps, build, compile and warm-up included
(`measure.time_to_train_s`). Out-of-memory (or peak memory above the capacity less the headroom)
and configurations the model or device cannot run are COMPLETE trials with score 0 and a
violated constraint, so TPE learns where the wall is; a trial that crashed, raised or timed
out is FAIL, and its configuration is not tried again.

The search spends few trials (unless `--plain-tpe`): right after the baseline it measures the
fast corner (`SearchSpace.fast_corner`: bf16, no checkpointing, fused AdamW at the largest
micro-batch, one size smaller after each that does not fit) so that TPE starts from a strong
configuration; a configuration the memory model says cannot fit is not run (`memory_model`);
DataLoader settings are decided from the loader's own rate, not searched (`loader_plan`); and a
trial whose short screening window is well below the best so far stops there (`measure`).
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import statistics
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, Trial, TrialState

from autotune.config import ConfigError, TrainConfig, from_baseline
from autotune.hardware import describe, parse_device, usable_cpus
from autotune.isolation import TrialRequest, TrialResult, run_isolated
from autotune.loader_plan import (
    LoaderRate,
    apply_loader,
    choose_loader,
    consumption_rate,
    loader_settings,
    measure_loader_rates,
)
from autotune.measure import MeasureSettings, time_to_train_s
from autotune.memory_model import (
    MEASURED_PEAK,
    RAN_OUT,
    MemoryModel,
    largest_fitting_micro,
    prediction_errors,
    training_state_bytes,
)
from autotune.records import compile_rows, trial_records
from autotune.space import DEFAULT_MAX_GRAD_ACCUM, build_space
from autotune.storage import DEFAULT_RETRY_S, JOURNAL_FILE, Heartbeat, open_storage
from autotune.workload import ContractError, load_workload

# Failures that would happen again with the same configuration: not retried.
DETERMINISTIC = ("error", "crash", "timeout")
DEFAULT_TRIALS = 20
# Optuna's constraint (> 0 = violated): fits in memory and runs on this model and device.
MEMORY_CONSTRAINT = "fits"
# Trials a tuner proposes that are not measured (repeats, known failures) before it concludes
# the space is exhausted.
MAX_UNMEASURED_IN_A_ROW = 50
FINISHED = (TrialState.COMPLETE, TrialState.FAIL)
# Attributes about a trial rather than its configuration's outcome: a repeat does not copy
# them (a repeat of a re-run is not itself a re-run).
TRIAL_BOOKKEEPING = ("config", "role", "owner", "heartbeat", "heartbeat_s", "requeued_from",
                     "retry", "loader_plan")
RAN_A_PROCESS = ("ok", "screened", "oom", "over_memory", "unsupported", "error", "crash",
                 "timeout")
# Outcomes that send the fast corner down to the next smaller micro-batch.
TOO_BIG = (*RAN_OUT, "oom_predicted")
# Multi-fidelity: a trial whose screening rate is below this share of the best full
# measurement so far stops after its screening window.
SCREEN_FRACTION = 0.75
DEFAULT_HEARTBEAT_S = 10.0
# A trial whose heartbeat is this many of its intervals old has lost its tuner.
STALE_HEARTBEATS = 3
# A trial whose tuner died is run again this many times at most (a configuration that kills
# its tuner, say by exhausting the node's memory, must not do so forever).
MAX_RETRIES = 1
# Tuners ending together each claim the confirmation; the claim standing after this wins.
CLAIM_SETTLE_S = 1.0
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


@dataclass
class TuneOptions:
    """Everything `autotune run` was asked to do."""

    model_path: str
    model_args: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    study: str | None = None
    studies_dir: str = "studies"
    storage: str | None = None
    trials: int | None = None
    timeout_s: float | None = None
    stall_penalty: float = 0.1
    memory_headroom: float = 0.1
    memory_limit_bytes: int | None = None
    confirm_top: int = 3
    confirm_repeats: int = 2
    trial_time_limit_s: float = 900.0
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    seed: int | None = None
    global_batch: int | None = None
    free_batch: tuple[int, int] | None = None
    fixes: dict[str, Any] = field(default_factory=dict)
    space_file: str | None = None
    max_grad_accum: int = DEFAULT_MAX_GRAD_ACCUM
    workers: int = 1
    devices: tuple[str, ...] = ()
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    storage_retry_s: float = DEFAULT_RETRY_S
    train_steps: int | None = None
    plain_tpe: bool = False
    fast_corner_first: bool = True


class StudyView(Protocol):
    """What the tuner tells the person watching (see `report.LiveView`)."""

    def trial_started(self, number: int, config: TrainConfig, role: str,
                      device: str = "") -> None: ...
    def phase(self, text: str, number: int | None = None) -> None: ...
    def trial_finished(self, trial: FrozenTrial) -> None: ...
    def note(self, text: str) -> None: ...


class Interrupted(Exception):
    """Ctrl-C: the running trial was killed and recorded; the study is intact."""


def validate_study_name(name: str) -> str:
    if not _NAME.fullmatch(name) or ".." in name:
        raise ConfigError(f"study name {name!r} must be letters, digits, '.', '_' or '-' (no "
                          "path separators, no '..')")
    return name


def study_dir(studies_dir: str | Path, name: str) -> Path:
    return Path(studies_dir) / validate_study_name(name)


def load_study(name: str, studies_dir: str | Path = "studies",
               storage: str | None = None) -> optuna.Study:
    """An existing study, for `show` and `export`: read from the storage alone."""
    backend = open_storage(storage, study_dir(studies_dir, name), create=False)
    try:
        return optuna.load_study(study_name=name, storage=backend)
    except KeyError:
        raise ConfigError(f"no study named {name!r} in this storage") from None


def config_key(config: TrainConfig | dict[str, Any]) -> str:
    data = config.to_dict() if isinstance(config, TrainConfig) else config
    return json.dumps(data, sort_keys=True)


def trial_config(trial: FrozenTrial) -> TrainConfig | None:
    data = trial.user_attrs.get("config")
    return TrainConfig.from_dict(data) if data else None


class Tuner:
    """One `autotune run`: prepares the study, runs trials within the budget, confirms."""

    def __init__(self, options: TuneOptions, view: StudyView) -> None:
        self.options, self.view = options, view
        opts = self.options
        workload = load_workload(opts.model_path, opts.model_args)
        self.devices = _devices(opts)
        self.device = self.devices[0]
        info = describe(self.device)
        # Parallel CPU trials share the cores: each gets its share of intra-op threads.
        self.trial_threads = (max(1, usable_cpus() // len(self.devices))
                              if self.device.type == "cpu" and len(self.devices) > 1 else None)
        self.owner = f"{socket.gethostname()}:{os.getpid()}"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.heartbeat: Heartbeat | None = None
        try:
            self.baseline = from_baseline(workload.baseline, self.device.type)
        except ConfigError as exc:
            raise ContractError(f"{workload.path}: BASELINE: {exc}") from None
        self.workload = workload
        self.space = build_space(self.baseline, info, len(workload.build_dataset()),
                                 global_batch=opts.global_batch, free_batch=opts.free_batch,
                                 fixes=opts.fixes, space_file=opts.space_file,
                                 max_grad_accum=opts.max_grad_accum)
        self.loader_settings = loader_settings(self.space.domains)
        self.plans_loader = not opts.plain_tpe and len(self.loader_settings) > 1
        self.loader_rates: list[LoaderRate] = []
        self.capacity_bytes = opts.memory_limit_bytes or info.total_memory_bytes
        name = validate_study_name(opts.study or workload.name)
        self.directory = study_dir(opts.studies_dir, name)
        self._check_memory_limit()
        self._new_folder = opts.storage is None and not (self.directory / JOURNAL_FILE).exists()
        storage = open_storage(opts.storage, self.directory, retry_s=opts.storage_retry_s)
        sampler = optuna.samplers.TPESampler(
            seed=opts.seed, multivariate=True, group=True,
            n_startup_trials=min(10, max(3, (opts.trials or DEFAULT_TRIALS) // 3)))
        self.study = optuna.create_study(study_name=name, storage=storage, sampler=sampler,
                                         direction="maximize", load_if_exists=True)
        self._new_study = "identity" not in self.study.user_attrs
        self._check_same_workload(info)
        self._recover_orphans()

    # -- preparation -----------------------------------------------------------------------

    @cached_property
    def state_bytes(self) -> int:
        """The model's training state (built once, when a memory limit or the fast corner's
        first micro-batch needs it)."""
        return training_state_bytes(self.workload.build_model())

    def _check_memory_limit(self) -> None:
        """A limit below the model's own training state (fp32 weights, gradients and AdamW's
        two moments) cannot fit any configuration: say so before making a study."""
        limit = self.options.memory_limit_bytes
        if limit and self.state_bytes > limit:
            raise ConfigError(
                f"--memory-limit {limit / 2**20:.0f} MiB is below what the model alone needs "
                f"to train: {self.state_bytes / 2**20:.0f} MiB for its weights, gradients and "
                "AdamW's two moments")

    def discard_if_new(self) -> None:
        """Remove a study this run created and that holds only a rejected first trial, so that
        bad input leaves nothing behind."""
        if not self._new_study or any(t.state == TrialState.COMPLETE for t in self.study.trials):
            return
        optuna.delete_study(study_name=self.study.study_name, storage=self.study._storage)
        if self._new_folder:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _check_same_workload(self, info: Any) -> None:
        """A study belongs to one model file, its arguments and one device kind."""
        identity = {"model_path": str(Path(self.options.model_path).resolve()),
                    "model_args": self.options.model_args, "device_type": self.device.type}
        existing = self.study.user_attrs.get("identity")
        if existing is None:
            self.study.set_user_attr("identity", identity)
            self.study.set_user_attr("device_name", info.name)
            self.study.set_user_attr("baseline_config", self.baseline.to_dict())
            self.study.set_user_attr("created_at", time.time())
        elif existing != identity:
            raise ConfigError(
                f"study {self.study.study_name!r} was made for {existing['model_path']} "
                f"{existing['model_args']} on {existing['device_type']}; use --study NAME to "
                "start another study")
        space = self.space.describe()
        previous = self.study.user_attrs.get("space")
        if previous and previous["domains"] != space["domains"]:
            raise ConfigError(
                f"study {self.study.study_name!r} searched another space ({previous['domains']})"
                "; Optuna cannot change a study's choices: run with the same --fix/--space "
                "options, or use --study NAME to start another study")
        self.study.set_user_attr("space", space)
        self.study.set_user_attr("free_batch", self.space.free_batch)
        self.study.set_user_attr("memory", {"capacity_bytes": self.capacity_bytes,
                                            "limit_bytes": self.memory_limit(),
                                            "headroom": self.options.memory_headroom})

    def _recover_orphans(self) -> None:
        """RUNNING trials whose tuner is gone (its process on this host exited, or, on any
        host, its heartbeat stopped): failed, and their configuration queued again once."""
        now = time.time()
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            reason = self._lost(trial, now)
            if reason is None:
                continue
            retry = trial.user_attrs.get("retry", 0)
            again = retry < MAX_RETRIES
            storage = self.study._storage
            try:
                storage.set_trial_user_attr(trial._trial_id, "status", "orphaned")
                storage.set_trial_user_attr(
                    trial._trial_id, "message", f"its tuner died ({reason}); " +
                    ("re-queued" if again else "not re-queued: it was already a retry"))
                storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:
                continue  # another tuner recovered it first
            if again:
                self._requeue(trial, retry + 1)
            self.view.note(f"trial {trial.number} lost its tuner ({reason})" +
                           (": re-queued" if again else ""))

    def _lost(self, trial: FrozenTrial, now: float) -> str | None:
        """Why a RUNNING trial has no live tuner, or None while it has one."""
        owner = trial.user_attrs.get("owner", "")
        if owner == self.owner:
            return None
        host, _, pid = owner.rpartition(":")
        if host == socket.gethostname() and pid.isdigit() and not _alive(int(pid)):
            return "its process exited"
        interval = trial.user_attrs.get("heartbeat_s", DEFAULT_HEARTBEAT_S)
        start = trial.datetime_start.timestamp() if trial.datetime_start else now
        silent = now - trial.user_attrs.get("heartbeat", start)
        if silent > STALE_HEARTBEATS * interval:
            return f"no heartbeat for {silent:.0f} s"
        return None

    def _requeue(self, trial: FrozenTrial, retry: int) -> None:
        attrs = {"requeued_from": trial.number, "retry": retry}
        if trial.user_attrs.get("role"):
            attrs["role"] = trial.user_attrs["role"]
        self.study.enqueue_trial(dict(trial.params), user_attrs=attrs)

    # -- the search ------------------------------------------------------------------------

    def measured_trials(self) -> int:
        """Trials that ran a process to its end, failed ones included: the budget. Repeats,
        predicted OOMs and known failures are free; interrupted and orphaned trials run
        again."""
        return sum(1 for t in self.study.get_trials(deepcopy=False, states=FINISHED)
                   if "duplicate_of" not in t.user_attrs
                   and t.user_attrs.get("status") in RAN_A_PROCESS)

    def run(self) -> dict[str, Any]:
        """Trials until the budget is spent, then confirmation; returns the summary."""
        opts = self.options
        budget = opts.trials if opts.trials or opts.timeout_s else DEFAULT_TRIALS
        deadline = time.monotonic() + opts.timeout_s if opts.timeout_s else math.inf
        started = time.monotonic()
        if not any(t.user_attrs.get("role") == "baseline" for t in self.study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.WAITING,
                                        TrialState.RUNNING))):
            self.study.enqueue_trial(self.space.params_for(self.baseline) or {},
                                     user_attrs={"role": "baseline"}, skip_if_exists=True)
        self.study.set_user_attr("objective", {"train_steps": opts.train_steps,
                                               "plain_tpe": opts.plain_tpe})
        if self.plans_loader:
            self.loader_rates = self._loader_rates()
        self.heartbeat = Heartbeat(self.study._storage, opts.heartbeat_s)
        try:
            self._run_workers(budget, deadline)
        finally:
            self.heartbeat.close()
        self._add_wall_time(time.monotonic() - started)
        if self._others_running():
            self.view.note("another tuner is still running trials of this study; the last "
                           "one to finish confirms the best")
        elif self._confirmed_since_last_trial():
            self.view.note("another tuner has confirmed the best since the last trial")
        elif self._claim_confirmation():
            self.confirm()
        return self.write_outputs()

    def _loader_rates(self) -> list[LoaderRate]:
        """Every DataLoader setting's own rate, measured once per study (no model)."""
        stored = self.study.user_attrs.get("loader_rates")
        if stored:
            return [LoaderRate(**r) for r in stored]
        self.view.phase("measuring the DataLoader alone, for each workers/prefetch setting")
        rates = measure_loader_rates(self.workload, self.baseline.micro_batch_size,
                                     self.loader_settings)
        self.study.set_user_attr("loader_rates", [r.to_dict() for r in rates])
        self.view.note("DataLoader alone: " + ", ".join(
            f"{r.num_workers} workers" + (f"/prefetch {r.prefetch_factor}"
                                          if r.prefetch_factor else "")
            + f" {r.samples_per_sec:,.0f}/s" for r in rates))
        return rates

    def _run_workers(self, budget: int | None, deadline: float) -> None:
        """One worker per device (or --workers on CPU), each running one trial at a time."""
        if len(self.devices) == 1:
            self._work(self.device, budget, deadline)
            return
        errors: list[BaseException] = []

        def work(device: Any) -> None:
            try:
                self._work(device, budget, deadline)
            except BaseException as exc:
                errors.append(exc)
                self._stop.set()

        threads = [threading.Thread(target=work, args=(d,), name=f"autotune-worker-{i}")
                   for i, d in enumerate(self.devices)]
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(0.2)
        except KeyboardInterrupt:
            self._stop.set()
            for thread in threads:
                thread.join()
            raise Interrupted from None
        if errors:
            raise next((e for e in errors if not isinstance(e, Interrupted)), errors[0])

    def _work(self, device: Any, budget: int | None, deadline: float) -> None:
        unmeasured = 0
        while not self._stop.is_set() and time.monotonic() < deadline:
            self._recover_orphans()
            with self._lock:
                if budget is not None and self.measured_trials() >= budget:
                    return
                if budget is not None and self.measured_trials() + self._running() >= budget:
                    trial = None  # the rest of the budget is running: wait for its outcome
                else:
                    corner = self._next_corner()
                    if corner is not None:
                        self.study.enqueue_trial(corner, user_attrs={"role": "fast-corner"})
                    trial = self.study.ask()
                    trial.set_user_attr("owner", self.owner)
                    trial.set_user_attr("heartbeat_s", self.options.heartbeat_s)
                    self.heartbeat.add(trial._trial_id)
            if trial is None:
                time.sleep(1.0)
                continue
            try:
                measured = self._next_trial(trial, device, deadline)
            finally:
                self.heartbeat.discard(trial._trial_id)
            unmeasured = 0 if measured else unmeasured + 1
            if unmeasured >= MAX_UNMEASURED_IN_A_ROW:
                self.view.note("every configuration the sampler proposes was already measured "
                               "or failed before: the space is exhausted")
                return

    def _next_corner(self) -> dict[str, Any] | None:
        """The parameters of the next fast-corner trial, or None: before the baseline has run,
        once a corner ran within memory (or failed, or is under way), or with no smaller
        micro-batch left. The first corner takes the largest micro-batch the baseline's peak
        says fits; each that does not fit sends the next one size down."""
        if self.options.plain_tpe or not self.options.fast_corner_first:
            return None
        micros = self.space.domains["micro_batch_size"]
        cap, tried = max(micros), []
        for t in self.study.get_trials(deepcopy=False):
            role, status = t.user_attrs.get("role"), t.user_attrs.get("status")
            if role == "baseline":
                if t.state in (TrialState.WAITING, TrialState.RUNNING):
                    return None
                own = t.user_attrs.get("config", {}).get("micro_batch_size", cap)
                peak, limit = t.user_attrs.get("peak_memory_bytes"), self.memory_limit()
                if peak and limit and status in MEASURED_PEAK:
                    cap = largest_fitting_micro(micros, peak, own, self.state_bytes, limit)
                elif status == "oom":
                    cap = max((m for m in micros if m < own), default=min(micros))
            if role != "fast-corner":
                continue
            under_way = t.state in (TrialState.WAITING, TrialState.RUNNING)
            settled = t.state == TrialState.COMPLETE or status in RAN_A_PROCESS
            if under_way or (settled and status not in TOO_BIG):
                return None
            if "config" in t.user_attrs:
                tried.append(t.user_attrs["config"]["micro_batch_size"])
        smaller = [m for m in micros if m <= cap and m < min(tried, default=math.inf)]
        return self.space.params_for(self.space.fast_corner(max(smaller))) if smaller else None

    def _running(self) -> int:
        return len(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    def _others_running(self) -> bool:
        return any(t.user_attrs.get("owner") != self.owner for t in
                   self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))

    def _confirmed_since_last_trial(self) -> bool:
        confirmed = (self.study.user_attrs.get("confirmation") or {}).get("at", 0)
        last = max((t.datetime_complete.timestamp() for t in self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)) if t.datetime_complete), default=0)
        return confirmed > last

    def _claim_confirmation(self) -> bool:
        """Of several tuners ending together, exactly one confirms: each writes its claim, the
        writes settle, and the claim that stands wins."""
        self.study.set_user_attr("confirmation_claim", self.owner)
        time.sleep(CLAIM_SETTLE_S)
        return self.study.user_attrs.get("confirmation_claim") == self.owner

    def _next_trial(self, trial: Trial, device: Any, deadline: float) -> bool:
        """Measure (unless known) and tell an asked trial. True when a process was run."""
        role = trial.user_attrs.get("role", "search")
        if role == "baseline" and not self.space.contains(self.baseline):
            config = self.baseline
        else:
            config = self.space.suggest(trial)
        # What the shortcuts learn from: the study read once for this trial.
        measured = self._measured() if role != "baseline" else []
        if self.plans_loader and role != "baseline":
            config = self._plan_loader(trial, config, measured)
        key = config_key(config)
        previous = self._previous(key)
        trial.set_user_attr("config", config.to_dict())
        if previous is not None and previous.state == TrialState.FAIL:
            trial.set_user_attr("status", "skipped")
            trial.set_user_attr("message", f"failed before as trial {previous.number}: "
                                           f"{previous.user_attrs.get('message', '')}")
            self.study.tell(trial, state=TrialState.FAIL)
            return False
        if previous is not None:
            for name, value in previous.user_attrs.items():
                if name not in TRIAL_BOOKKEEPING:
                    trial.set_user_attr(name, value)
            trial.set_user_attr("duplicate_of", previous.number)
            trial.set_constraint(MEMORY_CONSTRAINT, previous.user_attrs["constraint"])
            self.study.tell(trial, previous.value)
            self.view.trial_finished(self.study.trials[trial.number])
            return False
        searching = role != "baseline" and not self.options.plain_tpe
        memory = MemoryModel(measured) if searching else None
        verdict = memory.verdict(config.to_dict(), self.memory_limit()) if memory else None
        if verdict is not None:
            trial.set_user_attr("status", "oom_predicted")
            trial.set_user_attr("message", f"not run: {verdict.message}")
            if verdict.predicted_peak_bytes:
                trial.set_user_attr("predicted_peak_bytes", verdict.predicted_peak_bytes)
            self._tell_complete(trial, 0.0, feasible=False)
            self.view.trial_finished(self.study.trials[trial.number])
            return False
        predicted = memory.predict(config.to_dict()) if memory else None
        if predicted is not None:
            trial.set_user_attr("predicted_peak_bytes", predicted)
        screen_below = _screen_below(measured) if searching else None
        self.view.trial_started(trial.number, config, role, str(device))
        remaining = max(1.0, deadline - time.monotonic()) if math.isfinite(deadline) else None
        limit = min(self.options.trial_time_limit_s, remaining or math.inf)
        try:
            result = self._measure(config, f"trial-{trial.number}", limit, device=device,
                                   number=trial.number, screen_below=screen_below)
        except KeyboardInterrupt:
            trial.set_user_attr("status", "interrupted")
            trial.set_user_attr("message", "interrupted by the user; re-queued")
            self.study.tell(trial, state=TrialState.FAIL)
            self._requeue(self.study.trials[trial.number], trial.user_attrs.get("retry", 0))
            raise Interrupted from None
        try:
            self._tell(trial, result)
        except UpdateFinishedTrialError:
            self.view.note(f"trial {trial.number} was taken over by another tuner (this one "
                           "missed its heartbeats); its result is dropped")
            return True
        self.view.trial_finished(self.study.trials[trial.number])
        return True

    def _previous(self, key: str) -> FrozenTrial | None:
        """A finished trial of the same configuration whose outcome will not change."""
        for t in self.study.get_trials(deepcopy=False,
                                       states=(TrialState.COMPLETE, TrialState.FAIL)):
            if config_key(t.user_attrs.get("config", {})) != key:
                continue
            if t.state == TrialState.COMPLETE or t.user_attrs.get("status") in DETERMINISTIC:
                return t
        return None

    def _measured(self) -> list[dict[str, Any]]:
        """Finished, non-repeated trials as plain mappings (user attributes and number)."""
        return [{**t.user_attrs, "number": t.number} for t in self.study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)) if "duplicate_of" not in t.user_attrs]

    def _plan_loader(self, trial: Trial, config: TrainConfig,
                     measured: list[dict[str, Any]]) -> TrainConfig:
        """The cheapest DataLoader setting that feeds the fastest model measured so far."""
        consumption = max((rate for t in measured if t.get("status") == "ok"
                           and (rate := consumption_rate(t))), default=0.0)
        chosen = choose_loader(self.loader_rates, consumption,
                               workers_share_cores=self.device.type == "cpu")
        if chosen is None:
            return config  # loader-bound: the proposal is measured as it is
        trial.set_user_attr("loader_plan", {**chosen.to_dict(),
                                            "consumption_samples_per_sec": consumption})
        return apply_loader(config, chosen)

    def _measure(self, config: TrainConfig, name: str, limit: float,
                 trace: Path | None = None, device: Any = None,
                 number: int | None = None, screen_below: float | None = None) -> TrialResult:
        opts = self.options
        # Compiled graphs are cached under the study, so each (mode, shapes) compiles once.
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(self.directory / "inductor")
        request = TrialRequest(
            model_path=str(self.workload.path), config=config.to_dict(),
            device=str(device or self.device), model_args=self.workload.model_args,
            settings={**vars(opts.settings), "screen_below": screen_below},
            memory_limit_bytes=opts.memory_limit_bytes,
            trace_path=str(trace) if trace else None, threads=self.trial_threads,
            inductor_cache_dir=cache)
        return run_isolated(request, limit, self.directory / "logs" / f"{name}.log",
                            on_phase=lambda text: self.view.phase(text, number),
                            stop=self._stop)

    def _tell(self, trial: Trial, result: TrialResult) -> None:
        """Record every figure as user attributes, then the state, score and constraint."""
        metrics = dict(result.metrics)
        for name, value in metrics.items():
            trial.set_user_attr(name, value)
        trial.set_user_attr("log_path", result.log_path)
        trial.set_user_attr("wall_s", result.wall_s)
        status, message = self._outcome(result)
        trial.set_user_attr("status", status)
        trial.set_user_attr("message", message)
        if status in ("oom", "over_memory", "unsupported"):
            self._tell_complete(trial, 0.0, feasible=False)
        elif status in ("ok", "screened"):
            stall = stall_fraction(metrics, self.device.type)
            if self.options.train_steps:
                trial.set_user_attr("time_to_train_s",
                                    time_to_train_s(metrics, self.options.train_steps))
            score = self.objective_rate(metrics) * (1 - self.options.stall_penalty * stall)
            trial.set_user_attr("stall_fraction", stall)
            self._tell_complete(trial, score, feasible=True)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
            if result.bad_input:
                raise ContractError(result.message)

    def _tell_complete(self, trial: Trial, score: float, feasible: bool) -> None:
        """A COMPLETE trial: its score, and the constraint TPE learns the memory wall from."""
        constraint = 0.0 if feasible else 1.0
        trial.set_user_attr("constraint", constraint)
        trial.set_user_attr("score", score)
        trial.set_constraint(MEMORY_CONSTRAINT, constraint)
        self.study.tell(trial, score)

    def objective_rate(self, metrics: dict[str, Any]) -> float:
        """Samples/sec in the timed window, or over a whole run of --train-steps steps."""
        steps = self.options.train_steps
        if not steps:
            return float(metrics["samples_per_sec"])
        per_step = metrics["window_samples"] / metrics["window_steps"]
        return steps * per_step / time_to_train_s(metrics, steps)

    def _outcome(self, result: TrialResult) -> tuple[str, str]:
        """The trial's status: a measured peak above the allowed memory is `over_memory`, a
        run stopped after its screening window `screened`."""
        limit = self.memory_limit()
        peak = result.metrics.get("peak_memory_bytes")
        if result.status == "ok" and limit and peak and peak > limit:
            return "over_memory", (f"peak memory {peak / 2**30:.2f} GiB is above the "
                                   f"{limit / 2**30:.2f} GiB allowed (capacity less "
                                   f"{self.options.memory_headroom:.0%} headroom)")
        if result.status == "ok" and result.metrics.get("screened"):
            return "screened", (f"stopped after screening: "
                                f"{result.metrics['samples_per_sec']:,.0f} samples/sec is below "
                                f"{SCREEN_FRACTION:.0%} of the best so far")
        return result.status, result.message

    def memory_limit(self) -> int | None:
        if not self.capacity_bytes:
            return None
        return int(self.capacity_bytes * (1 - self.options.memory_headroom))

    def _add_wall_time(self, seconds: float) -> None:
        total = self.study.user_attrs.get("tuning_wall_s", 0.0) + seconds
        self.study.set_user_attr("tuning_wall_s", total)

    # -- confirmation ----------------------------------------------------------------------

    def confirm(self) -> None:
        """Re-measure the top k configurations and the baseline r times each, interleaved."""
        opts = self.options
        if opts.confirm_repeats < 1:
            return
        candidates: dict[str, dict[str, Any]] = {}
        feasible = [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.user_attrs.get("constraint") == 0.0]
        for t in sorted(feasible, key=lambda t: t.value, reverse=True):
            key = config_key(t.user_attrs["config"])
            if len(candidates) < opts.confirm_top and key not in candidates:
                candidates[key] = {"config": t.user_attrs["config"], "trial": t.number,
                                   "feasible": True, "runs": []}
        baseline_key = config_key(self.baseline)
        if baseline_key not in candidates:
            # The reference for the speedup; the winner only if it also fitted in the search.
            baseline_trial = next((t for t in self.study.get_trials(deepcopy=False)
                                   if t.user_attrs.get("role") == "baseline"
                                   and t.state == TrialState.COMPLETE), None)
            candidates[baseline_key] = {
                "config": self.baseline.to_dict(),
                "trial": baseline_trial.number if baseline_trial else None,
                "feasible": bool(baseline_trial and
                                 baseline_trial.user_attrs.get("constraint") == 0.0),
                "runs": []}
        traces = self.directory / "traces"
        start = time.monotonic()
        for repeat in range(opts.confirm_repeats):
            for index, entry in enumerate(candidates.values()):
                self.view.note(f"confirming {index + 1}/{len(candidates)}, run {repeat + 1}/"
                               f"{opts.confirm_repeats}")
                trace = traces / f"candidate-{index}.json" if repeat == 0 else None
                result = self._measure(TrainConfig.from_dict(entry["config"]),
                                       f"confirm-{index}-{repeat}", opts.trial_time_limit_s,
                                       trace)
                status = self._outcome(result)[0]
                entry["runs"].append({"status": status, **{
                    k: result.metrics.get(k) for k in ("samples_per_sec", "peak_memory_bytes",
                                                       "mfu", "step_time_median_s")},
                    "objective": self.objective_rate(result.metrics) if status == "ok" else None,
                    "time_to_train_s": time_to_train_s(result.metrics, opts.train_steps)
                    if status == "ok" and opts.train_steps else None})
                if repeat == 0:
                    entry["trace"] = result.metrics.get("trace_path")
        for entry in candidates.values():
            rates = [r["samples_per_sec"] for r in entry["runs"] if r["status"] == "ok"]
            entry["ok"] = len(rates) == len(entry["runs"])
            entry["median"] = statistics.median(rates) if rates else None
            entry["spread"] = (max(rates) - min(rates)) / 2 if rates else None
            entry["objective"] = _median_or_none([r["objective"] for r in entry["runs"]])
            entry["time_to_train_s"] = _median_or_none([r["time_to_train_s"]
                                                        for r in entry["runs"]])
        ranked = sorted((e for e in candidates.values() if e["ok"] and e["feasible"]),
                        key=lambda e: e["objective"], reverse=True)
        baseline = candidates[baseline_key]
        winner = ranked[0] if ranked else None
        confirmation = {"candidates": list(candidates.values()), "repeats": opts.confirm_repeats,
                        "winner": winner, "baseline": baseline,
                        "speedup": (winner["median"] / baseline["median"]
                                    if winner and baseline["median"] else None),
                        "wall_s": time.monotonic() - start, "at": time.time()}
        self.study.set_user_attr("confirmation", confirmation)
        if winner and winner.get("trace"):
            shutil.copyfile(winner["trace"], self.directory / "best-trace.json")

    # -- outputs ---------------------------------------------------------------------------

    def write_outputs(self) -> dict[str, Any]:
        """best.yaml, best.json, summary.md under the study folder; returns the summary."""
        summary = study_summary(self.study)
        if summary["best_config"]:
            best = TrainConfig.from_dict(summary["best_config"])
            best.save(self.directory / "best.yaml")
            best.save(self.directory / "best.json")
        from autotune.report import summary_markdown

        (self.directory / "summary.md").write_text(summary_markdown(summary))
        summary["files"] = {name: str(self.directory / name) for name in
                            ("best.yaml", "best.json", "summary.md", "best-trace.json")
                            if (self.directory / name).exists()}
        return summary


def _devices(opts: TuneOptions) -> list[Any]:
    """The devices trials run on, one worker each: --devices, or --workers copies of --device."""
    if opts.workers < 1:
        raise ConfigError("--workers must be >= 1")
    try:
        if not opts.devices:
            return [parse_device(opts.device)] * opts.workers
        devices = [parse_device(name) for name in opts.devices]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if len({d.type for d in devices}) > 1 or len(set(devices)) < len(devices):
        raise ConfigError(f"--devices must be distinct devices of one kind, got "
                          f"{', '.join(opts.devices)}")
    return devices


def _screen_below(measured: list[dict[str, Any]]) -> float | None:
    """The screening threshold: a share of the best-scoring full measurement's rate."""
    full = [t for t in measured if t.get("status") == "ok" and t.get("score")]
    if not full:
        return None
    return SCREEN_FRACTION * max(full, key=lambda t: t["score"])["samples_per_sec"]


def stall_fraction(metrics: dict[str, Any], device_type: str) -> float:
    """Device idle on CUDA; host syncs plus loader waits (per step time) on CPU."""
    if device_type == "cuda" and metrics.get("device_idle_fraction") is not None:
        return float(metrics["device_idle_fraction"])
    step = metrics.get("step_time_median_s") or 0.0
    sync = metrics.get("host_sync_s_per_step") or 0.0
    fraction = (sync / step if step else 0.0) + (metrics.get("data_wait_fraction") or 0.0)
    return min(1.0, fraction)


def study_summary(study: optuna.Study) -> dict[str, Any]:
    """Everything `show` prints, from the storage alone."""
    trials = study.get_trials(deepcopy=False)
    states = Counter(t.state.name for t in trials)
    statuses = Counter(t.user_attrs.get("status", t.state.name.lower()) for t in trials)
    attrs = study.user_attrs
    confirmation = attrs.get("confirmation")
    baseline_config = attrs.get("baseline_config")
    best_trial = _best_feasible(trials)
    summary: dict[str, Any] = {
        "study": study.study_name,
        "model": attrs.get("identity", {}).get("model_path"),
        "model_args": attrs.get("identity", {}).get("model_args"),
        "device": attrs.get("device_name"),
        "confirmed": bool(confirmation and confirmation.get("winner")),
        "best_config": None, "best_samples_per_sec": None, "best_spread": None,
        "best_trial": None, "best_peak_memory_bytes": None, "best_mfu": None,
        "baseline_config": baseline_config, "baseline_samples_per_sec": None,
        "speedup": None,
        "trials": dict(states), "statuses": dict(statuses),
        "oom_trials": statuses.get("oom", 0) + statuses.get("over_memory", 0),
        "retried_trials": sum(1 for t in trials if t.user_attrs.get("retry", 0) > 0),
        "tuning_wall_s": attrs.get("tuning_wall_s"),
        "free_batch": attrs.get("free_batch", False),
        "train_steps": (attrs.get("objective") or {}).get("train_steps"),
        "memory_predictions": prediction_errors(
            t.user_attrs for t in trials if "duplicate_of" not in t.user_attrs),
        "loader_rates": attrs.get("loader_rates"),
    }
    if summary["confirmed"]:
        winner, baseline = confirmation["winner"], confirmation["baseline"]
        ok_runs = [r for r in winner["runs"] if r["status"] == "ok"]
        summary.update(
            best_config=winner["config"], best_samples_per_sec=winner["median"],
            best_spread=winner["spread"], best_trial=winner["trial"],
            best_runs=[r["samples_per_sec"] for r in ok_runs],
            best_peak_memory_bytes=max((r["peak_memory_bytes"] or 0) for r in ok_runs) or None,
            best_mfu=_median_or_none([r["mfu"] for r in ok_runs]),
            baseline_samples_per_sec=baseline["median"], baseline_spread=baseline["spread"],
            speedup=confirmation["speedup"], confirmation_repeats=confirmation["repeats"],
            best_time_to_train_s=winner.get("time_to_train_s"),
            baseline_time_to_train_s=baseline.get("time_to_train_s"))
    elif best_trial is not None:
        baseline = next((t for t in trials if t.user_attrs.get("role") == "baseline"
                         and t.user_attrs.get("status") == "ok"), None)
        best_sps = best_trial.user_attrs.get("samples_per_sec")
        base_sps = baseline.user_attrs.get("samples_per_sec") if baseline else None
        summary.update(
            best_config=best_trial.user_attrs["config"], best_samples_per_sec=best_sps,
            best_trial=best_trial.number,
            best_peak_memory_bytes=best_trial.user_attrs.get("peak_memory_bytes"),
            best_mfu=best_trial.user_attrs.get("mfu"), baseline_samples_per_sec=base_sps,
            speedup=best_sps / base_sps if best_sps and base_sps else None)
    summary["compile_payoff"] = compile_payoff(study, summary["best_trial"])
    if summary["free_batch"] and summary["best_config"] and baseline_config:
        best_eb = summary["best_config"]["micro_batch_size"] * \
            summary["best_config"]["grad_accum_steps"]
        base_eb = baseline_config["micro_batch_size"] * baseline_config["grad_accum_steps"]
        if best_eb != base_eb:
            summary["warnings"] = [f"the effective batch changed from {base_eb} to {best_eb}: "
                                   "the learning rate may need rescaling"]
    return summary


def compile_payoff(study: optuna.Study, best_trial: int | None) -> dict[str, Any] | None:
    """What compiling cost and gained, and after how many steps it pays for itself: for the
    best configuration when it is compiled, else for the compiled one that gained most."""
    rows = compile_rows(trial_records(study))
    row = next((r for r in rows if r["trial"] == best_trial), None) or \
        max(rows, key=lambda r: r["gain"], default=None)
    if row is None:
        return None
    return {k: row[k] for k in ("trial", "reference", "compile_s", "gain", "break_even_steps")}


def list_studies(studies_dir: str | Path = "studies",
                 storage: str | None = None) -> list[dict[str, Any]]:
    """The studies in a storage URL, or in every study folder of the embedded storage."""
    if storage:
        backends = [open_storage(storage, Path(studies_dir))]
    else:
        folders = sorted(Path(studies_dir).glob(f"*/{JOURNAL_FILE}"))
        backends = [open_storage(None, f.parent, create=False) for f in folders]
    rows = []
    for backend in backends:
        for s in optuna.get_all_study_summaries(backend, include_best_trial=False):
            rows.append({"study": s.study_name, "trials": s.n_trials,
                         "created": s.datetime_start.isoformat(timespec="seconds")
                         if s.datetime_start else None,
                         "model": s.user_attrs.get("identity", {}).get("model_path"),
                         "confirmed": bool((s.user_attrs.get("confirmation") or {})
                                           .get("winner"))})
    return rows


def _best_feasible(trials: list[FrozenTrial]) -> FrozenTrial | None:
    feasible = [t for t in trials if t.state == TrialState.COMPLETE
                and t.user_attrs.get("constraint") == 0.0]
    return max(feasible, key=lambda t: t.value, default=None)


def _median_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return True
