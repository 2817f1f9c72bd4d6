"""`autotune run`: prepare the study, run the search within the budget, confirm, write files.

The tuner owns what one run opened (the study and its storage) and hands the work to plain
functions: the search loop (`worker`), recording outcomes (`outcome`), confirmation
(`confirm`), orphan recovery (`heartbeat`), the summary (`results`).
"""

from __future__ import annotations

import math
import os
import queue
import shutil
import threading
import time
import warnings
from functools import cached_property
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import ConfigError, TrainConfig, from_baseline
from autotune.confirm import confirm, should_confirm
from autotune.hardware import DeviceInfo, cpu_shares, describe, parse_device
from autotune.heartbeat import recover_orphans, tuner_name
from autotune.isolation import TrialRequest, TrialResult, run_isolated
from autotune.loader_plan import LoaderRate, loader_settings, measure_loader_rates
from autotune.memory_model import training_state_bytes
from autotune.options import DEFAULT_TRIALS, TuneOptions
from autotune.outcome import Scoring
from autotune.report import summary_markdown
from autotune.results import study_summary
from autotune.space import build_space
from autotune.storage import JOURNAL_FILE, open_storage, study_dir, validate_study_name
from autotune.trials import Role, StudyKey, TrialKey
from autotune.views import SilentView, StudyView
from autotune.worker import Measure, MeasureJob, Search, measured_trials, run_workers
from autotune.workload import ContractError, load_workload

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class Tuner:
    """One `autotune run`: prepares the study, runs trials within the budget, confirms."""

    def __init__(self, options: TuneOptions, view: StudyView | None = None,
                 measure: Measure | None = None) -> None:
        self.options, self.view = options, view or SilentView()
        opts = options
        self.workload = load_workload(opts.model_path, opts.model_args)
        self.devices = _devices(opts)
        self.device = self.devices[0]
        info = describe(self.device)
        # Parallel CPU trials share the cores: each runs pinned to its own share of them with
        # one intra-op thread per core, so that they neither thrash each other's threads nor
        # count each other as contention.
        self.cpu_shares = (cpu_shares(len(self.devices))
                           if self.device.type == "cpu" and len(self.devices) > 1 else [])
        self.trial_threads = len(self.cpu_shares[0]) if self.cpu_shares else None
        self._free_shares: queue.SimpleQueue[list[int]] = queue.SimpleQueue()
        for share in self.cpu_shares:
            self._free_shares.put(share)
        self.owner = tuner_name()
        self.stop = threading.Event()  # set by a worker that failed: the others end too
        try:
            self.baseline = from_baseline(self.workload.baseline, self.device.type)
        except ConfigError as exc:
            raise ContractError(f"{self.workload.path}: BASELINE: {exc}") from None
        self.space = build_space(self.baseline, info, len(self.workload.build_dataset()),
                                 global_batch=opts.global_batch, free_batch=opts.free_batch,
                                 fixes=opts.fixes, space_file=opts.space_file,
                                 max_grad_accum=opts.max_grad_accum)
        self.capacity_bytes = opts.memory_limit_bytes or info.total_memory_bytes
        name = validate_study_name(opts.study or self.workload.name)
        self.directory = study_dir(opts.studies_dir, name)
        self._check_memory_limit()
        self._new_folder = opts.storage is None and not (self.directory / JOURNAL_FILE).exists()
        self.storage = open_storage(opts.storage, self.directory, retry_s=opts.storage_retry_s)
        sampler = optuna.samplers.TPESampler(
            seed=opts.seed, multivariate=True, group=True,
            n_startup_trials=min(10, max(3, (opts.trials or DEFAULT_TRIALS) // 3)))
        self.study = optuna.create_study(study_name=name, storage=self.storage, sampler=sampler,
                                         direction="maximize", load_if_exists=True)
        self._new_study = StudyKey.IDENTITY not in self.study.user_attrs
        self._record_identity(info)
        self.scoring = Scoring(self.device.type, self.memory_limit(), opts.memory_headroom,
                               opts.stall_penalty, opts.train_steps)
        self.measure = measure or self._measure_in_a_process
        recover_orphans(self.study, self.storage, self.owner, self.view.note)

    @cached_property
    def state_bytes(self) -> int:
        """The model's training state (built once, when a memory limit or the fast corner's
        first micro-batch needs it)."""
        return training_state_bytes(self.workload.build_model())

    def memory_limit(self) -> int | None:
        """The capacity less the headroom: a trial whose peak is above it is infeasible."""
        if not self.capacity_bytes:
            return None
        return int(self.capacity_bytes * (1 - self.options.memory_headroom))

    def measured_trials(self) -> int:
        return measured_trials(self.study)

    def _check_memory_limit(self) -> None:
        """A limit below the model's own training state (fp32 weights, gradients and AdamW's
        two moments) cannot fit any configuration: say so before making a study."""
        limit = self.options.memory_limit_bytes
        if limit and self.state_bytes > limit:
            raise ConfigError(
                f"--memory-limit {limit / 2**20:.0f} MiB is below what the model alone needs "
                f"to train: {self.state_bytes / 2**20:.0f} MiB for its weights, gradients and "
                "AdamW's two moments")

    def _record_identity(self, info: DeviceInfo) -> None:
        """A study belongs to one model file, its arguments, one device kind and one space."""
        study = self.study
        identity = {"model_path": str(self.workload.path.resolve()),
                    "model_args": self.options.model_args, "device_type": self.device.type}
        existing = study.user_attrs.get(StudyKey.IDENTITY)
        if existing is None:
            study.set_user_attr(StudyKey.IDENTITY, identity)
            study.set_user_attr(StudyKey.DEVICE_NAME, info.name)
            study.set_user_attr(StudyKey.BASELINE_CONFIG, self.baseline.to_dict())
            study.set_user_attr(StudyKey.CREATED_AT, time.time())
        elif existing != identity:
            raise ConfigError(
                f"study {study.study_name!r} was made for {existing['model_path']} "
                f"{existing['model_args']} on {existing['device_type']}; use --study NAME to "
                "start another study")
        space = self.space.describe()
        previous = study.user_attrs.get(StudyKey.SPACE)
        if previous and previous["domains"] != space["domains"]:
            raise ConfigError(
                f"study {study.study_name!r} searched another space ({previous['domains']})"
                "; Optuna cannot change a study's choices: run with the same --fix/--space "
                "options, or use --study NAME to start another study")
        study.set_user_attr(StudyKey.SPACE, space)
        study.set_user_attr(StudyKey.FREE_BATCH, self.space.free_batch)
        study.set_user_attr(StudyKey.MEMORY, {"capacity_bytes": self.capacity_bytes,
                                              "limit_bytes": self.memory_limit(),
                                              "headroom": self.options.memory_headroom})

    def discard_if_new(self) -> None:
        """Remove a study this run created and that holds only a rejected first trial, so that
        bad input leaves nothing behind."""
        if not self._new_study or any(t.state == TrialState.COMPLETE for t in self.study.trials):
            return
        optuna.delete_study(study_name=self.study.study_name, storage=self.storage)
        if self._new_folder:
            shutil.rmtree(self.directory, ignore_errors=True)

    def run(self) -> dict[str, Any]:
        """Trials until the budget is spent, then confirmation; returns the summary."""
        opts, study = self.options, self.study
        budget = opts.trials if opts.trials or opts.timeout_s else DEFAULT_TRIALS
        deadline = time.monotonic() + opts.timeout_s if opts.timeout_s else math.inf
        started = time.monotonic()
        if not any(t.user_attrs.get(TrialKey.ROLE) == Role.BASELINE for t in study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.WAITING,
                                        TrialState.RUNNING))):
            study.enqueue_trial(self.space.params_for(self.baseline) or {},
                                user_attrs={TrialKey.ROLE: Role.BASELINE}, skip_if_exists=True)
        study.set_user_attr(StudyKey.OBJECTIVE, {"train_steps": opts.train_steps,
                                                 "plain_tpe": opts.plain_tpe})
        settings = loader_settings(self.space.domains)
        search = Search(
            study=study, storage=self.storage, space=self.space, baseline=self.baseline,
            scoring=self.scoring, measure=self.measure, view=self.view, owner=self.owner,
            trial_time_limit_s=opts.trial_time_limit_s, heartbeat_s=opts.heartbeat_s,
            shortcuts=not opts.plain_tpe, fast_corner=opts.fast_corner_first,
            loader_rates=self._loader_rates(settings) if not opts.plain_tpe and
            len(settings) > 1 else (), state_bytes=lambda: self.state_bytes,
            stop=self.stop)
        run_workers(search, self.devices, budget, deadline)
        study.set_user_attr(StudyKey.TUNING_WALL_S, study.user_attrs.get(
            StudyKey.TUNING_WALL_S, 0.0) + time.monotonic() - started)
        if opts.confirm_repeats >= 1 and should_confirm(study, self.owner, self.view):
            confirmation = confirm(
                study, self.baseline, self.scoring, self.measure, self.view,
                top=opts.confirm_top, repeats=opts.confirm_repeats,
                time_limit_s=opts.trial_time_limit_s, device=str(self.device),
                directory=self.directory)
            winner = confirmation["winner"]
            if winner and winner.get("trace"):
                shutil.copyfile(winner["trace"], self.directory / "best-trace.json")
        return self.write_outputs()

    def _loader_rates(self, settings: list[tuple[int, int | None]]) -> list[LoaderRate]:
        """Every DataLoader setting's own rate, measured once per study (no model)."""
        stored = self.study.user_attrs.get(StudyKey.LOADER_RATES)
        if stored:
            return [LoaderRate(**r) for r in stored]
        self.view.phase("measuring the DataLoader alone, for each workers/prefetch setting")
        rates = measure_loader_rates(self.workload, self.baseline.micro_batch_size, settings)
        self.study.set_user_attr(StudyKey.LOADER_RATES, [r.to_dict() for r in rates])
        self.view.note("DataLoader alone: " + ", ".join(
            f"{r.num_workers} workers" + (f"/prefetch {r.prefetch_factor}"
                                          if r.prefetch_factor else "")
            + f" {r.samples_per_sec:,.0f}/s" for r in rates))
        return rates

    def _measure_in_a_process(self, config: TrainConfig, job: MeasureJob) -> TrialResult:
        if not self.cpu_shares:
            return self._run_trial(config, job, None)
        cpus = self._free_shares.get()
        try:
            return self._run_trial(config, job, cpus)
        finally:
            self._free_shares.put(cpus)

    def _run_trial(self, config: TrainConfig, job: MeasureJob,
                   cpus: list[int] | None) -> TrialResult:
        opts = self.options
        # Compiled graphs are cached under the study, so each (mode, shapes) compiles once.
        cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(self.directory / "inductor")
        request = TrialRequest(
            model_path=str(self.workload.path), config=config.to_dict(), device=job.device,
            model_args=self.workload.model_args,
            settings={**vars(opts.settings), "screen_below": job.screen_below},
            memory_limit_bytes=opts.memory_limit_bytes,
            trace_path=str(job.trace) if job.trace else None, threads=self.trial_threads,
            cpus=cpus, inductor_cache_dir=cache)
        return run_isolated(request, job.time_limit_s, self.directory / "logs" / f"{job.name}.log",
                            on_phase=lambda text: self.view.phase(text, job.number),
                            stop=self.stop)

    def write_outputs(self) -> dict[str, Any]:
        """best.yaml, best.json, summary.md under the study folder; returns the summary."""
        summary = study_summary(self.study)
        if summary["best_config"]:
            best = TrainConfig.from_dict(summary["best_config"])
            best.save(self.directory / "best.yaml")
            best.save(self.directory / "best.json")
        (self.directory / "summary.md").write_text(summary_markdown(summary))
        summary["files"] = {name: str(self.directory / name) for name in
                            ("best.yaml", "best.json", "summary.md", "best-trace.json")
                            if (self.directory / name).exists()}
        return summary


def _devices(opts: TuneOptions) -> list[Any]:
    """The devices trials run on, one worker each: --devices, or --workers copies of --device."""
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
