"""Opening a study for `autotune run`: the storage, the capability probe (the study's cached one
while the model file, its arguments, the device and torch are unchanged), the baseline and the
search space from it, and the checks that the study is the same workload, on the same space.

Every check runs before the study is written to, so a rejected run leaves the storage as it
found it. Tuners started together each probe; the first creates the study and records it (its
identity written last), and one that finds the study created while it probed waits for that
record and joins with the study's probe, not its own.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.storages import BaseStorage

from autotune.config import TrainConfig, from_baseline
from autotune.errors import ConfigError, ContractError
from autotune.formatting import format_seconds
from autotune.hardware import DeviceInfo, describe
from autotune.options import TuneOptions
from autotune.search.domains import device_refusals
from autotune.search.events import StudyView
from autotune.search.group_checks import group_left_out
from autotune.search.runner import Runner
from autotune.search.space import SearchSpace, build_space, user_values
from autotune.study.records import StudyKey, study_machines
from autotune.study.results import shorter_than_measured, study_identity
from autotune.study.storage import open_storage
from autotune.target import ModelFile, Script, Target
from autotune.trial.protocol import ProbeReport, StudyIdentity

# Sets TPE's share of random start-up trials when the budget is a time, not a count.
TYPICAL_TRIALS = 20
# How long a tuner waits for a study that another has just created to be recorded (its
# creator writes a few attributes right after creating it).
RECORD_WAIT_S = 60.0
# The longest a process-group check may take (a value that hangs a collective ends here).
GROUP_CHECK_LIMIT_S = 120.0


class StudyOpener:
    """Opens (or creates) the study of one run and checks it, before any trial: what it holds
    afterwards (`study`, `storage`, `probe`, `baseline`, `space`, `capacity_bytes`,
    `new_study`) is what the run goes on with."""

    study: optuna.Study
    storage: BaseStorage
    probe: ProbeReport
    baseline: TrainConfig
    space: SearchSpace
    capacity_bytes: int | None
    new_study: bool
    probe_s: float | None = None  # the probe's wall time, when this run probed

    def __init__(self, options: TuneOptions, device: Any, runner: Runner,
                 view: StudyView, directory: Path) -> None:
        self.options, self.device, self.runner = options, device, runner
        self.view, self.directory = view, directory

    def memory_limit(self) -> int | None:
        """The capacity less the headroom: a trial whose peak is above it is infeasible."""
        if not self.capacity_bytes:
            return None
        return int(self.capacity_bytes * (1 - self.options.memory_headroom))

    def open(self, name: str, info: DeviceInfo) -> None:
        """Open the study `name` (creating it when new), probed and checked."""
        opts = self.options
        self.storage = open_storage(opts.storage, self.directory, retry_s=opts.storage_retry_s)
        target = opts.target
        fingerprint = probe_fingerprint(target, info.name, opts.nproc_per_node)
        identity = StudyIdentity(replace(target, path=str(Path(target.path).resolve())),
                                 device_type=self.device.type,
                                 nproc_per_node=opts.nproc_per_node)
        sampler = optuna.samplers.TPESampler(
            seed=opts.seed, multivariate=True, group=True,
            n_startup_trials=min(10, max(3, (opts.trials or TYPICAL_TRIALS) // 3)))
        # bad input refused before the probe; the values it allows spare the group checks
        self.allowed = user_values(info, opts.fixes, opts.space_file)
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
        self.new_study = existing is None
        self._record(identity, info, fingerprint)
        settings = opts.settings
        if short := shorter_than_measured(self.probe.script_run_steps,
                                          1 + settings.steady_steps + settings.window_steps,
                                          opts.train_steps):
            self.view.note(f"warning: {short}")

    def _recorded(self, name: str) -> optuna.Study | None:
        """The study of that name, or None. A study another tuner has just created is read
        once that tuner has recorded what it is for (its identity is written last, before any
        trial), waiting at most `RECORD_WAIT_S`; one with trials and no identity was made
        outside autotune and is read at once."""
        deadline = time.monotonic() + RECORD_WAIT_S
        while True:
            study = _existing(name, self.storage)
            if study is None or StudyKey.IDENTITY in study.user_attrs or \
                    study.get_trials(deepcopy=False) or time.monotonic() > deadline:
                return study
            time.sleep(0.2)

    def _plan_space(self, info: DeviceInfo) -> None:
        """The baseline and the space from the probe's report; checks the memory limit."""
        opts = self.options
        try:
            self.baseline = from_baseline(self.probe.baseline, self.device.type,
                                          opts.nproc_per_node)
        except ConfigError as exc:
            raise ContractError(f"{opts.target.path}: BASELINE: {exc}") from None
        # The space keeps each rank's micro x accumulation; the global batch is N times it.
        per_rank = opts.global_batch // opts.nproc_per_node if opts.global_batch else None
        kept = {k: getattr(self.baseline, k) for k in self.probe.kept}
        refused = [k for k in kept if k in opts.fixes and
                   str(opts.fixes[k]) != str(kept[k])]
        if refused:
            raise ConfigError(f"--fix {refused[0]}={opts.fixes[refused[0]]}: the script keeps "
                              f"its own {refused[0]}={kept[refused[0]]}: "
                              f"{self.probe.kept[refused[0]]}")
        self.space = build_space(self.baseline, info, self.probe.dataset_size,
                                 global_batch=per_rank, free_batch=opts.free_batch,
                                 fixes={**kept, **opts.fixes}, space_file=opts.space_file,
                                 max_grad_accum=opts.max_grad_accum,
                                 left_out=self.probe.left_out_values(),
                                 world_size=opts.nproc_per_node,
                                 convolutional=self.probe.convolutional,
                                 attention=self.probe.attention,
                                 optimizer_change=opts.allow_optimizer_change,
                                 loader_workers=self.probe.timed_workers())
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
        began = time.monotonic()
        report = self.runner.probe(str(self.device), self.options.trial_time_limit_s,
                                   self.options.allow_optimizer_change)
        self.probe_s = time.monotonic() - began
        self.view.note(f"the probe took {format_seconds(self.probe_s)}, within this run's "
                       "budget (once per study: a resumed run uses its findings)")
        ranks = self.options.nproc_per_node
        if ranks > 1:
            self.view.note(f"checking DDP and FSDP on the model in process groups of {ranks} "
                           "ranks")
            report.left_out += group_left_out(
                self.runner, from_baseline(report.baseline, self.device.type, ranks),
                str(self.device), min(self.options.trial_time_limit_s, GROUP_CHECK_LIMIT_S),
                describe(self.device).bf16,
                on_check=lambda what: self.view.phase(f"checking {what}", None),
                allowed=self.allowed)
        for item in report.left_out:
            self.view.note(f"left out: {item.describe()}")
        for knob, reason in report.kept.items():
            self.view.note(f"kept as the script has it: {knob}={report.baseline.get(knob)}: "
                           f"{reason}")
        return report

    def _check_memory_limit(self) -> None:
        """A limit below the model's own training state (fp32 weights, gradients and AdamW's
        two moments) cannot fit any configuration: say so before making a study."""
        limit, state = self.options.memory_limit_bytes, self.probe.state_bytes
        if limit and state > limit:
            raise ConfigError(
                f"--memory-limit {limit / 2**20:.0f} MiB is below what the model alone needs "
                f"to train: {state / 2**20:.0f} MiB for its weights, gradients and AdamW's "
                "two moments")

    def _record(self, identity: StudyIdentity, info: DeviceInfo, fingerprint: str) -> None:
        """What this study is for, written once every check has passed; its identity last, as
        the sign that the rest is there (`_recorded`)."""
        study = self.study
        first = self.new_study or StudyKey.IDENTITY not in study.user_attrs
        if first:
            study.set_user_attr(StudyKey.DEVICE_NAME, info.name)
            study.set_user_attr(StudyKey.BASELINE_CONFIG, self.baseline.to_dict())
            study.set_user_attr(StudyKey.CREATED_AT, time.time())
        machines = study_machines(study.user_attrs)
        if info.name not in machines:
            machines.append(info.name)
        study.set_user_attr(StudyKey.DEVICE_NAMES, machines)
        stored = study.user_attrs.get(StudyKey.PROBE) or {}
        study.set_user_attr(StudyKey.PROBE, {"fingerprint": fingerprint,
                                             "report": self.probe.to_dict(),
                                             "wall_s": self.probe_s or stored.get("wall_s")})
        study.set_user_attr(StudyKey.SPACE, self.space.describe())
        study.set_user_attr(StudyKey.FREE_BATCH, self.space.free_batch)
        study.set_user_attr(StudyKey.MEMORY, {"capacity_bytes": self.capacity_bytes,
                                              "limit_bytes": self.memory_limit(),
                                              "headroom": self.options.memory_headroom})
        if first:
            study.set_user_attr(StudyKey.IDENTITY, identity.to_json())

    def _note_another_machine(self, study: optuna.Study, info: DeviceInfo) -> None:
        """A study resumed on another machine (a cloud VM that came back on another host, say)
        mixes rates that cannot be compared: say so before any trial runs."""
        machines = study_machines(study.user_attrs)
        if machines and info.name not in machines:
            self.view.note(f"warning: this study's trials were measured on {', '.join(machines)}"
                           f"; this machine is {info.name}: their rates are not comparable "
                           "with rates measured here (the confirmation measures the finalists "
                           "again, side by side, here)")


def probe_fingerprint(target: Target, device_name: str, nproc_per_node: int = 1) -> str:
    """What the probe's answer depends on: the model file's (or script's) bytes, its
    arguments (and the flags named for a script's knobs), the device, torch's version and the
    ranks of a process group. Hashed as studies have always hashed it, so a stored probe
    stays the study's own."""
    digest = hashlib.sha256(Path(target.path).read_bytes())
    match target:
        case ModelFile(args=args):
            digest.update(repr(sorted(args.items())).encode())
        case Script(args=args, flags=flags):
            digest.update(repr([]).encode())  # a script's keyword arguments: none
            digest.update(repr(["script", *args]).encode())
            if flags:
                digest.update(repr(sorted(flags.items())).encode())
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


def _check_same(study: optuna.Study, identity: StudyIdentity, space: dict[str, Any]) -> None:
    """A study belongs to one model file, its arguments, one device kind and one space."""
    existing = study_identity(study)
    if existing is not None and existing != identity:
        raise ConfigError(f"study {study.study_name!r} was made for {existing.describe()}; use "
                          "--study NAME to start another study")
    previous = study.user_attrs.get(StudyKey.SPACE)
    if previous and previous["domains"] != space["domains"]:
        raise ConfigError(
            f"study {study.study_name!r} searched another space ({previous['domains']}); "
            "Optuna cannot change a study's choices: run with the same --fix/--space options, "
            "or use --study NAME to start another study")
