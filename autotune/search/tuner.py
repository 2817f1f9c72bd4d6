"""`autotune run`: prepare the study, run the search within the budget, confirm, and return
the study's summary (the command line writes the files and tables from it).

The tuner owns what one run opened (the study, its storage, the runner's processes) and hands
the work to plain functions: the search loop (`worker`), recording outcomes (`outcome`),
confirmation (`confirm`), orphan recovery (`heartbeat`), the summary (`results`).
"""

from __future__ import annotations

import hashlib
import math
import shutil
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from autotune.config import from_baseline
from autotune.errors import ConfigError, ContractError
from autotune.formatting import format_seconds
from autotune.hardware import (
    DeviceInfo,
    core_shares,
    describe,
    device_refusals,
    parse_device,
)
from autotune.options import DEFAULT_TIME_BUDGET_S, TuneOptions
from autotune.search.budget import (
    MIN_ROUNDS,
    Forecast,
    answer_budget_s,
    candidates_that_fit,
    forecast,
    plan_time,
    round_run_seconds,
    search_trial_seconds,
    trial_seconds,
)
from autotune.search.confirm import Plan, confirm, should_confirm
from autotune.search.events import SilentView, StudyView
from autotune.search.group_checks import group_left_out
from autotune.search.heartbeat import recover_orphans, tuner_name
from autotune.search.outcome import Scoring
from autotune.search.runner import ProcessRunner, Runner
from autotune.search.space import build_space
from autotune.search.worker import Search, measured_trials, run_workers
from autotune.study.records import Role, StudyKey, TrialKey, study_machines
from autotune.study.results import study_summary
from autotune.study.storage import JOURNAL_FILE, open_storage, study_dir, validate_study_name
from autotune.study.summary import StudySummary
from autotune.trial.loader_rates import loader_settings
from autotune.trial.protocol import LoaderRate, ProbeReport

# Sets TPE's share of random start-up trials when the budget is a time, not a count.
TYPICAL_TRIALS = 20
# How long a tuner waits for a study that another has just created to be recorded (its
# creator writes a few attributes right after creating it).
RECORD_WAIT_S = 60.0
# The longest a process-group check may take (a value that hangs a collective ends here).
GROUP_CHECK_LIMIT_S = 120.0

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


class Tuner:
    """One `autotune run`: prepares the study, runs trials within the budget, confirms.

    Nothing here imports or calls the model file: its facts and what works on this machine come
    from the capability probe (`probe`), run by the `runner` in a child process and cached in
    the study. Every check runs before the study is written to, so a rejected run leaves the
    storage as it found it.
    """

    def __init__(self, options: TuneOptions, view: StudyView | None = None,
                 runner: Runner | None = None) -> None:
        self.options, self.view = options, view or SilentView()
        opts = options
        self.devices, groups = _devices(opts)
        self.device = self.devices[0]
        info = describe(self.device)
        # Parallel trials share the cores on any device: each runs on its own share (threads,
        # DataLoader workers and compile workers alike); one trial alone has them all.
        self.core_shares = core_shares(len(self.devices)) if len(self.devices) > 1 else None
        self.started = time.monotonic()
        # The whole run's time budget when neither --trials nor --timeout was given (it grows
        # for a model whose trials are slow: `_plan_an_answer`).
        self.time_budget_s = None if opts.trials or opts.timeout_s else DEFAULT_TIME_BUDGET_S
        self.owner = tuner_name()
        self.stop = threading.Event()  # set by a worker that failed: the others end too
        model = Path(opts.model_path)
        if not model.is_file():
            raise ContractError(f"model file not found: {model}")
        name = validate_study_name(opts.study or model.stem)
        self.directory = study_dir(opts.studies_dir, name)
        self._new_folder = opts.storage is None and not self.directory.exists()
        self.runner = runner or ProcessRunner(
            str(model), opts.model_args, self.directory, vars(opts.settings),
            memory_limit_bytes=opts.memory_limit_bytes, core_shares=self.core_shares,
            on_phase=lambda text, number: self.view.phase(text, number), stop=self.stop,
            nproc_per_node=opts.nproc_per_node, groups=groups)
        try:
            self._prepare(name, info)
        except BaseException:
            self.close()
            # The folder goes only while no study is in it: another tuner started beside this
            # one may have created the study there meanwhile.
            journal = self.directory / JOURNAL_FILE
            if self._new_folder and not (journal.exists() and journal.stat().st_size):
                shutil.rmtree(self.directory, ignore_errors=True)
            raise

    def _prepare(self, name: str, info: DeviceInfo) -> None:
        opts = self.options
        self.storage = open_storage(opts.storage, self.directory, retry_s=opts.storage_retry_s)
        fingerprint = probe_fingerprint(opts.model_path, opts.model_args, info.name,
                                        opts.nproc_per_node)
        identity = {"model_path": str(Path(opts.model_path).resolve()),
                    "model_args": opts.model_args, "device_type": self.device.type,
                    **({"nproc_per_node": opts.nproc_per_node}
                       if opts.nproc_per_node > 1 else {})}
        sampler = optuna.samplers.TPESampler(
            seed=opts.seed, multivariate=True, group=True,
            n_startup_trials=min(10, max(3, (opts.trials or TYPICAL_TRIALS) // 3)))
        probed: ProbeReport | None = None
        while True:
            existing = self._recorded(name)
            self.probe = probed = self._probed(existing, fingerprint, probed)
            self._plan_space(info)
            if existing is not None:
                _check_same(existing, identity, self.space.describe())
                self._note_another_machine(existing, info)
                self.study = optuna.load_study(study_name=name, storage=self.storage,
                                               sampler=sampler)
                break
            try:
                self.study = optuna.create_study(study_name=name, storage=self.storage,
                                                 sampler=sampler, direction="maximize")
                break
            except optuna.exceptions.DuplicatedStudyError:
                continue  # another tuner created it while this one probed: join it
        self._new_study = existing is None
        self._record(identity, info, fingerprint)
        self.scoring = Scoring(self.device.type, self.memory_limit(), opts.memory_headroom,
                               opts.stall_penalty, opts.train_steps, self.baseline.to_dict())
        recover_orphans(self.study, self.storage, self.owner, self.view.note)

    def _recorded(self, name: str) -> optuna.Study | None:
        """The study of that name, or None. A study another tuner has just created is read
        once that tuner has recorded what it is for (its identity is written last), waiting
        at most `RECORD_WAIT_S`."""
        deadline = time.monotonic() + RECORD_WAIT_S
        while True:
            study = _existing(name, self.storage)
            if study is None or StudyKey.IDENTITY in study.user_attrs or \
                    time.monotonic() > deadline:
                return study
            time.sleep(0.2)

    def _plan_space(self, info: DeviceInfo) -> None:
        """The baseline and the space from the probe's report; checks the memory limit."""
        opts = self.options
        try:
            self.baseline = from_baseline(self.probe.baseline, self.device.type,
                                          opts.nproc_per_node)
        except ConfigError as exc:
            raise ContractError(f"{opts.model_path}: BASELINE: {exc}") from None
        # The space keeps each rank's micro x accumulation; the global batch is N times it.
        per_rank = opts.global_batch // opts.nproc_per_node if opts.global_batch else None
        self.space = build_space(self.baseline, info, self.probe.dataset_size,
                                 global_batch=per_rank, free_batch=opts.free_batch,
                                 fixes=opts.fixes, space_file=opts.space_file,
                                 max_grad_accum=opts.max_grad_accum,
                                 left_out=self.probe.left_out_values(),
                                 world_size=opts.nproc_per_node,
                                 convolutional=self.probe.convolutional,
                                 attention=self.probe.attention,
                                 optimizer_change=opts.allow_optimizer_change)
        refused = device_refusals(self.baseline, info, opts.nproc_per_node,
                                  self.probe.convolutional, self.probe.attention,
                                  opts.allow_optimizer_change)
        for (knob, reason), values in refused.items():
            self.view.note(f"not on this device: {knob}={', '.join(map(str, values))}: {reason}")
        self.capacity_bytes = opts.memory_limit_bytes or info.total_memory_bytes
        self._check_memory_limit()

    def _probed(self, existing: optuna.Study | None, fingerprint: str,
                probed: ProbeReport | None = None) -> ProbeReport:
        """The probe's report: the study's own while the model file, its arguments, the device
        and torch are the same (also when this tuner probed too, while another created the
        study: two probes of a busy machine can disagree, and a study has one space);
        otherwise `probed`, or a probe now, in a child process."""
        cached = existing.user_attrs.get(StudyKey.PROBE) if existing is not None else None
        if cached and cached["fingerprint"] == fingerprint:
            report = ProbeReport.from_dict(cached["report"])
            if probed is not None and report.left_out != probed.left_out:
                self.view.note("another tuner created this study while this one probed: its "
                               "probe's findings decide the space (left out: "
                               f"{'; '.join(i.describe() for i in report.left_out) or 'none'})")
            return report
        if probed is not None:
            return probed
        self.view.note("probing what the model and this machine can do (once per study)")
        report = self.runner.probe(str(self.device), self.options.trial_time_limit_s)
        ranks = self.options.nproc_per_node
        if ranks > 1:
            self.view.note(f"checking DDP and FSDP on the model in process groups of {ranks} "
                           "ranks")
            report.left_out += group_left_out(
                self.runner, from_baseline(report.baseline, self.device.type, ranks),
                str(self.device), min(self.options.trial_time_limit_s, GROUP_CHECK_LIMIT_S),
                describe(self.device).bf16,
                on_check=lambda what: self.view.phase(f"checking {what}", None))
        for item in report.left_out:
            self.view.note(f"left out: {item.describe()}")
        return report

    def close(self) -> None:
        """End the runner's processes (the fork server)."""
        self.runner.close()

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
        limit, state = self.options.memory_limit_bytes, self.probe.state_bytes
        if limit and state > limit:
            raise ConfigError(
                f"--memory-limit {limit / 2**20:.0f} MiB is below what the model alone needs "
                f"to train: {state / 2**20:.0f} MiB for its weights, gradients and AdamW's "
                "two moments")

    def _record(self, identity: dict[str, Any], info: DeviceInfo, fingerprint: str) -> None:
        """What this study is for, written once every check has passed; its identity last, as
        the sign that the rest is there (`_recorded`)."""
        study = self.study
        first = self._new_study or StudyKey.IDENTITY not in study.user_attrs
        if first:
            study.set_user_attr(StudyKey.DEVICE_NAME, info.name)
            study.set_user_attr(StudyKey.BASELINE_CONFIG, self.baseline.to_dict())
            study.set_user_attr(StudyKey.CREATED_AT, time.time())
        machines = study_machines(study.user_attrs)
        if info.name not in machines:
            machines.append(info.name)
        study.set_user_attr(StudyKey.DEVICE_NAMES, machines)
        study.set_user_attr(StudyKey.PROBE, {"fingerprint": fingerprint,
                                             "report": self.probe.to_dict()})
        study.set_user_attr(StudyKey.SPACE, self.space.describe())
        study.set_user_attr(StudyKey.FREE_BATCH, self.space.free_batch)
        study.set_user_attr(StudyKey.MEMORY, {"capacity_bytes": self.capacity_bytes,
                                              "limit_bytes": self.memory_limit(),
                                              "headroom": self.options.memory_headroom})
        if first:
            study.set_user_attr(StudyKey.IDENTITY, identity)

    def _note_another_machine(self, study: optuna.Study, info: DeviceInfo) -> None:
        """A study resumed on another machine (a cloud VM that came back on another host, say)
        mixes rates that cannot be compared: say so before any trial runs."""
        machines = study_machines(study.user_attrs)
        if machines and info.name not in machines:
            self.view.note(f"warning: this study's trials were measured on {', '.join(machines)}"
                           f"; this machine is {info.name}: their rates are not comparable "
                           "with rates measured here (the confirmation measures the finalists "
                           "again, side by side, here)")

    def discard_if_new(self) -> None:
        """Remove a study this run created and that holds only a rejected first trial, so that
        bad input leaves nothing behind."""
        if not self._new_study or any(t.state == TrialState.COMPLETE for t in self.study.trials):
            return
        optuna.delete_study(study_name=self.study.study_name, storage=self.storage)
        if self._new_folder:
            shutil.rmtree(self.directory, ignore_errors=True)

    def run(self) -> StudySummary:
        """Trials until the budget is spent, then confirmation; returns the summary. The
        baseline runs first and prices a trial: the rest is planned from it."""
        opts, study = self.options, self.study
        deadline = time.monotonic() + opts.timeout_s if opts.timeout_s else math.inf
        started = time.monotonic()
        self._queue_baseline()
        search = self._search()
        run_workers(search, self.devices, 1, min(deadline, self._budget_ends()))
        trial_s = trial_seconds(study)
        run_s = round_run_seconds(study, opts.settings) or trial_s
        top = opts.confirm_top
        deadline = finish_by = min(deadline, self._budget_ends())
        if trial_s and self.time_budget_s:
            if opts.confirm_repeats >= 1:
                top = self._plan_an_answer(run_s)
            candidates = min(top, max(1, measured_trials(study))) + 1
            plan = plan_time(self.time_budget_s, self.started, time.monotonic(), trial_s,
                             run_s, candidates, opts.confirm_share if opts.confirm_repeats
                             else 0.0, opts.confirm_max_rounds)
            self.view.note(plan.describe(self.time_budget_s, candidates))
            finish_by, deadline = plan.search_ends_at + plan.trial_s, plan.search_ends_at

        def tell_time_left() -> None:
            trial_s = search_trial_seconds(study, screening=not opts.plain_tpe)
            if trial_s:
                run_s = round_run_seconds(study, opts.settings) or trial_s
                self.view.time_left(self._forecast(trial_s, run_s, deadline, top).describe())

        search.after_trial = tell_time_left
        tell_time_left()
        run_workers(search, self.devices, opts.trials, deadline, finish_by)
        study.set_user_attr(StudyKey.TUNING_WALL_S, study.user_attrs.get(
            StudyKey.TUNING_WALL_S, 0.0) + time.monotonic() - started)
        if opts.confirm_repeats >= 1 and should_confirm(study, self.owner, self.view):
            self._confirm(top)
        return study_summary(study)

    def _queue_baseline(self) -> None:
        """The file's BASELINE first, unless the study has it (done, waiting or running)."""
        if not any(t.user_attrs.get(TrialKey.ROLE) == Role.BASELINE for t in
                   self.study.get_trials(deepcopy=False, states=(
                       TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING))):
            self.study.enqueue_trial(self.space.params_for(self.baseline) or {},
                                     user_attrs={TrialKey.ROLE: Role.BASELINE},
                                     skip_if_exists=True)

    def _search(self) -> Search:
        opts = self.options
        self.study.set_user_attr(StudyKey.OBJECTIVE, {"train_steps": opts.train_steps,
                                                      "plain_tpe": opts.plain_tpe})
        return Search(
            study=self.study, storage=self.storage, space=self.space, baseline=self.baseline,
            scoring=self.scoring, measure=self.runner.measure, view=self.view,
            owner=self.owner, trial_time_limit_s=opts.trial_time_limit_s,
            heartbeat_s=opts.heartbeat_s, shortcuts=not opts.plain_tpe,
            fast_corner=opts.fast_corner_first, loader_rates=self._planned_loader_rates(),
            state_bytes=lambda: self.probe.state_bytes, stop=self.stop)

    def _plan_an_answer(self, run_s: float) -> int:
        """Under the default time budget: grow it where runs are so slow that the
        confirmation's share could not hold an answer with an interval, and say so; returns
        how many candidates the confirmation can take besides the baseline."""
        opts = self.options
        needed = answer_budget_s(run_s, opts.confirm_share)
        if needed > self.time_budget_s:
            grown = math.ceil(needed / 60) * 60
            self.view.note(
                f"a confirmation run takes about {format_seconds(run_s)} here: the default "
                f"budget grows from {format_seconds(self.time_budget_s)} to "
                f"{format_seconds(grown)}, so that the confirmation ({opts.confirm_share:.0%} "
                f"of the study at most) has room for {MIN_ROUNDS} paired rounds of the best "
                "and your settings, the least that gives an answer an interval")
            self.time_budget_s = grown
        return candidates_that_fit(self.time_budget_s, run_s, opts.confirm_share,
                                   opts.confirm_top)

    def _budget_ends(self) -> float:
        return self.started + self.time_budget_s if self.time_budget_s else math.inf

    def _confirm(self, top: int) -> None:
        """The paired rounds: beyond the least, within the confirmation's share of the study's
        wall time (the search so far prices it); all within the time budget."""
        opts, study, budget_ends = self.options, self.study, self._budget_ends()
        share = opts.confirm_share
        plan = Plan(top=top, rounds=opts.confirm_repeats, max_rounds=opts.confirm_max_rounds,
                    target=opts.confirm_target,
                    ends_by=time.monotonic() + self._searched_s() * share / (1 - share),
                    budget_ends=budget_ends if math.isfinite(budget_ends) else None)
        confirmation = confirm(study, self.baseline, self.scoring, self.runner.measure,
                               self.view, plan, time_limit_s=opts.trial_time_limit_s,
                               device=str(self.device), directory=self.directory)
        if confirmation and confirmation.winner and confirmation.winner.trace and \
                Path(confirmation.winner.trace).is_file():
            shutil.copyfile(confirmation.winner.trace, self.directory / "best-trace.json")

    def _forecast(self, trial_s: float, run_s: float, deadline: float, top: int) -> Forecast:
        """What is left of this run, as planned now."""
        opts, study = self.options, self.study
        measured, now = measured_trials(study), time.monotonic()
        return forecast(
            now=now, deadline=deadline,
            trials_left=max(0, opts.trials - measured) if opts.trials else None,
            trial_s=trial_s, run_s=run_s, workers=len(self.devices),
            candidates=min(top, max(1, measured)) + 1,
            rounds=opts.confirm_repeats, max_rounds=opts.confirm_max_rounds,
            share=opts.confirm_share, ends_by=self._budget_ends(), searched_s=self._searched_s())

    def _searched_s(self) -> float:
        """The study's wall time so far: this run's, or all its runs' trials where more."""
        return max(time.monotonic() - self.started,
                   self.study.user_attrs.get(StudyKey.TUNING_WALL_S, 0.0))

    def _planned_loader_rates(self) -> list[LoaderRate]:
        """The probe's DataLoader rates for the settings of this space, when the plan is on."""
        settings = set(loader_settings(self.space.domains))
        if self.options.plain_tpe or len(settings) < 2:
            return []
        rates = [r for r in self.probe.loader_rates
                 if (r.num_workers, r.prefetch_factor) in settings]
        self.study.set_user_attr(StudyKey.LOADER_RATES, [r.to_dict() for r in rates])
        return rates



def probe_fingerprint(model_path: str | Path, model_args: Mapping[str, Any],
                      device_name: str, nproc_per_node: int = 1) -> str:
    """What the probe's answer depends on: the model file's bytes, its arguments, the device,
    torch's version and the ranks of a process group."""
    digest = hashlib.sha256(Path(model_path).read_bytes())
    digest.update(repr(sorted(model_args.items())).encode())
    digest.update(f"{device_name}|{torch.__version__}".encode())
    if nproc_per_node > 1:
        digest.update(f"|ranks={nproc_per_node}".encode())
    return digest.hexdigest()


def _existing(name: str, storage: BaseStorage) -> optuna.Study | None:
    """The study of that name in the storage, read without writing anything, or None."""
    try:
        storage.get_study_id_from_name(name)
    except KeyError:
        return None
    return optuna.load_study(study_name=name, storage=storage)


def _check_same(study: optuna.Study, identity: dict[str, Any], space: dict[str, Any]) -> None:
    """A study belongs to one model file, its arguments, one device kind and one space."""
    existing = study.user_attrs.get(StudyKey.IDENTITY)
    if existing is not None and existing != identity:
        raise ConfigError(
            f"study {study.study_name!r} was made for {existing['model_path']} "
            f"{existing['model_args']} on {existing['device_type']}; use --study NAME to "
            "start another study")
    previous = study.user_attrs.get(StudyKey.SPACE)
    if previous and previous["domains"] != space["domains"]:
        raise ConfigError(
            f"study {study.study_name!r} searched another space ({previous['domains']}); "
            "Optuna cannot change a study's choices: run with the same --fix/--space options, "
            "or use --study NAME to start another study")


def _devices(opts: TuneOptions) -> tuple[list[Any], dict[str, list[str]]]:
    """The devices trials run on, one worker each: --devices, or --workers copies of --device
    (`TuneOptions` has checked them). Under --nproc-per-node N, --devices is cut into groups
    of N side by side, each worker named by its group's first GPU; with the GPUs of each."""
    if not opts.devices:
        return [parse_device(opts.device)] * opts.workers, {}
    devices = [parse_device(name) for name in opts.devices]
    n = opts.nproc_per_node
    if n == 1:
        return devices, {}
    groups = [devices[i:i + n] for i in range(0, len(devices), n)]
    return [g[0] for g in groups], {str(g[0]): [str(d) for d in g] for g in groups}
