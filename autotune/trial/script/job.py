"""A trial's job (`child`) for a user's training script: run it (`runner`) under an observer
and answer as a model file's trial does: the probe's `ProbeReport` (the script's own settings
as the baseline, the knob values its library cannot be told left out), a `Measurement` with the
configuration in the script's own terms (`ScriptAnswer`) and the findings of its profiler's
window, for `autotune profile --script` the `ProfileReport` of a few of the library's steps, or
a check's run of the answer (its `WorstBatch` or `LossRun`). The findings name the script's
lines that read tensors back, as its observer traced them in a step of the warm-up. A trial is
told the script's own settings as its probe read them: the answer's baseline, and where each
setting is said, so the trial sets the script's own flags as the answer would."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.target import Script
from autotune.trial import distributed
from autotune.trial.loss_run import seed_everything
from autotune.trial.measure import findings_of
from autotune.trial.profiling import (
    ProfilerWindow,
    memory_categories,
    operator_tables,
    trace_file,
)
from autotune.trial.protocol import (
    SCRIPT_STARTUP,
    Finding,
    LossRun,
    LossRunSettings,
    Measurement,
    ProbeReport,
    ProbeSettings,
    ProfileReport,
    ProfileSettings,
    ScriptAnswer,
    TrialRequest,
    WorstBatch,
    WorstBatchSettings,
)
from autotune.trial.sample_sizes import sizes_or_none
from autotune.trial.script import terms
from autotune.trial.script.libraries import library_of
from autotune.trial.script.loss_run import LossRunObserver
from autotune.trial.script.measuring import MeasuringObserver
from autotune.trial.script.observer import StepObserver
from autotune.trial.script.runner import ScriptRun, run_script
from autotune.trial.script.session import ScriptBaseline, ScriptTrial
from autotune.trial.script.sources import with_flags
from autotune.trial.script.worst_batch import WorstBatchObserver
from autotune.trial.training import training_state_bytes

# The probe times the script's own settings for a few steps only: it reads, it does not rank.
PROBE_SETTINGS = {"window_steps": 2, "window_seconds": 0.0, "window_max_steps": 2,
                  "warmup_max_steps": 1, "screen_steps": 0, "profile_steps": 0}
# `autotune profile` warms up, then profiles: one step of window, only to bring the loop there.
PROFILE_SETTINGS = {"window_steps": 1, "window_seconds": 0.0, "window_max_steps": 1,
                    "screen_steps": 0}
# A dataset without a length (a stream) bounds no micro-batch size.
UNSIZED_DATASET = 1 << 30

Progress = Callable[[str], None]


def script_job(request: TrialRequest, script: Script, device: torch.device, world_size: int,
               progress: Progress,
               ) -> tuple[TrainConfig,
                          Measurement | ProbeReport | ProfileReport | WorstBatch | LossRun]:
    """Run `script` (the request's target) for the request's job (measure, probe, profile,
    worst batch or loss run); the configuration it ran, and the job's answer."""
    if isinstance(request.settings, WorstBatchSettings | LossRunSettings):
        return _check_run(request, script, device, world_size, progress)
    settings = _measure_settings(request)
    # FLOPs counted where a model file's trial counts them: a measurement on CUDA, for MFU
    observer = MeasuringObserver(settings, device, progress,
                                 profiler=_profiler(request, settings, device),
                                 count_flops=request.job == "measure" and device.type == "cuda")
    config, own = _asked(request), _own(request)
    start = time.perf_counter()
    run = run_under(request, script, device, world_size, observer, progress)
    baseline = own or run.baseline
    ran = config or baseline.config(device.type, world_size)
    figures = replace(observer.measurement(run.startup_s, ran.precision),
                      measure_wall_s=time.perf_counter() - start)
    job = request.settings
    if isinstance(job, ProbeSettings):
        return ran, _probe_report(run, observer, job.candidates, device.type, world_size,
                                  progress)
    if isinstance(job, ProfileSettings):
        return ran, _profile_report(ran, observer, device, job.top)
    answer = terms.answer(ran, baseline, device.type, world_size)
    return ran, replace(figures, script_answer=answer,
                        findings=_window_findings(observer, ran, figures))


def _check_run(request: TrialRequest, script: Script, device: torch.device, world_size: int,
               progress: Progress) -> tuple[TrainConfig, WorstBatch | LossRun]:
    """A check's run of the script: its worst batch (every micro-batch made of the training
    data's largest samples until its peak memory is steady, and that peak) or its loss run
    (from the settings' seed, for their steps, and its losses)."""
    settings = request.settings
    observer: WorstBatchObserver | LossRunObserver
    if isinstance(settings, LossRunSettings):
        seed_everything(settings.seed)
        observer = LossRunObserver(settings, device)
    else:
        assert isinstance(settings, WorstBatchSettings)
        observer = WorstBatchObserver(settings, device)
    run = run_under(request, script, device, world_size, observer, progress)
    own = _own(request)
    ran = _asked(request) or (own or run.baseline).config(device.type, world_size)
    return ran, observer.result()


def run_under(request: TrialRequest, script: Script, device: torch.device, world_size: int,
              observer: StepObserver, progress: Progress) -> ScriptRun:
    """`script` (the request's target) run once with the request's knobs and its own flags set
    for them, in a scratch folder of its own (in the tuner's for this trial, where it gave one:
    it removes it however the trial ends; each rank of a process group has its own folder in
    it), `observer` deciding when its loop stops: a trial's measurement, or a warm process's
    turns (`script.turns`)."""
    config, own = _asked(request), _own(request)
    parent = Path(request.scratch_dir) if request.scratch_dir else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    argv, flags_set = script_arguments(list(script.args), config, own, device.type, world_size)
    job = request.settings
    profile_out = job.out if isinstance(job, ProfileSettings) else None
    with tempfile.TemporaryDirectory(prefix="autotune-script-", dir=parent) as scratch:
        trial = ScriptTrial(device, observer, Path(scratch), config=config,
                            library=library_of(own.library) if own is not None else None, own=own,
                            candidates=job.candidates if isinstance(job, ProbeSettings) else {},
                            flag_map=dict(script.flags),
                            flags_set=flags_set,
                            own_paths=[p for p in (
                                request.trace_path and str(Path(request.trace_path).parent),
                                profile_out) if p],
                            worst=job if isinstance(job, WorstBatchSettings) else None,
                            seed=job.seed if isinstance(job, LossRunSettings) else None,
                            startup_limit_s=job.startup_limit_s
                            if isinstance(job, ProbeSettings) else None)
        progress(SCRIPT_STARTUP)
        return run_script(script.path, argv, trial)


def _measure_settings(request: TrialRequest) -> MeasureSettings:
    """How a script's run of the request's job is measured: a measurement's own settings, the
    probe's few steps, or the steps that bring `autotune profile` to its window."""
    job = request.settings
    if isinstance(job, ProbeSettings):
        return MeasureSettings(**PROBE_SETTINGS)
    if isinstance(job, ProfileSettings):
        return MeasureSettings(warmup_max_seconds=job.warmup_max_seconds, **PROFILE_SETTINGS)
    return job


def answer_of(request: TrialRequest, device_type: str, world_size: int) -> ScriptAnswer | None:
    """The request's configuration in the script's own terms, as its trial's measurement says
    it (None where the probe has not read the script's own settings)."""
    own, trained = _own(request), trained_config(request, device_type, world_size)
    return terms.answer(trained, own, device_type, world_size) if own and trained else None


def trained_config(request: TrialRequest, device_type: str, world_size: int,
                   ) -> TrainConfig | None:
    """The configuration a measurement of the request trains: the one it asks for, else the
    script's own (None where neither is known). Its precision is the peak its MFU divides by;
    its loader workers, how its warm turns open and how long they last."""
    own = _own(request)
    return _asked(request) or (own.config(device_type, world_size) if own else None)


def _asked(request: TrialRequest) -> TrainConfig | None:
    """The configuration the request asks for (None: the probe, which reads the script's)."""
    if request.job == "probe" or not request.config:
        return None
    return TrainConfig.from_dict(request.config)


def _own(request: TrialRequest) -> ScriptBaseline | None:
    """The script's own settings as its probe read them (None: the probe itself)."""
    own = request.script_baseline
    return ScriptBaseline.from_dict(own) if own else None


def script_arguments(argv: list[str], config: TrainConfig | None, own: ScriptBaseline | None,
                     device_type: str, world_size: int = 1) -> tuple[list[str], list[str]]:
    """The script's arguments for a trial of `config`: its own flags set as the answer would
    set them (where its settings come from its flags); and those flags, in words."""
    if config is None or own is None:
        return list(argv), []
    asked = terms.answer(config, own, device_type, world_size).script_flags
    return with_flags(argv, asked), [word for flag in asked
                                     for word in flag.words() or [f"(no {flag.flag})"]]


def _profiler(request: TrialRequest, settings: MeasureSettings,
              device: torch.device) -> ProfilerWindow | None:
    """The profiler's window after the measurement's: a trial's short one (its trace on rank 0
    where one is asked for), or `autotune profile`'s, with Python stacks and memory."""
    job = request.settings
    if isinstance(job, ProfileSettings):
        return ProfilerWindow(job.steps, device, trace_file(Path(job.out)), top=job.top,
                              with_stack=True, profile_memory=True)
    if isinstance(job, ProbeSettings) or settings.profile_steps <= 0:
        return None
    world = distributed.current()
    rank0 = world is None or world.rank == 0
    return ProfilerWindow(settings.profile_steps, device,
                          request.trace_path if rank0 else None)


def _window_findings(observer: MeasuringObserver, ran: TrainConfig,
                     figures: Measurement) -> tuple[Finding, ...]:
    """A trial's findings, as a model file's trial has them: of its profiler's window, its
    timed window's median step and data wait, and the lines its observer traced; none where
    the trial did not profile (screened out, or no profiler's window asked for)."""
    if observer.profile is None:
        return ()
    return tuple(findings_of(observer.profiled[0], ran, observer.profile,
                             figures.step_time_median_s, figures.data_wait_fraction,
                             observer.sync_sites))


def _profile_report(ran: TrainConfig, observer: MeasuringObserver, device: torch.device,
                    top: int) -> ProfileReport:
    """`autotune profile`'s report of the library's steps under the profiler, with their
    findings (the lines that read tensors back as the observer traced them in the warm-up)."""
    summary = observer.profile
    if summary is None or not observer.profiled:
        raise RuntimeError("the script's training ended before the profiler's window: give it "
                           "more data or steps, or lower --steps")
    profile, window = observer.profiled[0], summary.window_s
    data_wait = min(1.0, observer.profile_wait_s / window)
    findings = findings_of(profile, ran, summary, window / summary.steps, data_wait,
                           observer.sync_sites)
    return ProfileReport(
        config=ran, device=str(device), steps=summary.steps,
        samples_per_sec=observer.profile_samples / window, window_s=window,
        self_cpu_total_s=summary.self_cpu_total_s,
        self_device_total_s=summary.self_device_total_s,
        host_syncs_per_step=summary.host_syncs_per_step,
        device_idle_fraction=summary.device_idle_fraction,
        data_wait_fraction=data_wait, tables=operator_tables(profile, top),
        findings=tuple(findings),
        memory_timeline=memory_categories(profile, device),
        files={"trace": str(summary.trace_path)})


def _probe_report(run: ScriptRun, observer: MeasuringObserver, candidates: dict[str, Any],
                  device_type: str, world_size: int, progress: Progress) -> ProbeReport:
    """What the search needs of the script: its own settings, its data and model's size, the
    values its library cannot be told (and the knobs the script keeps to itself), and its
    samples' sizes where its library's hook showed its training data."""
    info = observer.info
    assert info is not None
    sizes = sizes_or_none(info.dataset, info.collate, progress) \
        if info.dataset is not None else None
    parameters = sum(p.numel() for p in info.model.parameters())
    return ProbeReport(
        baseline=run.baseline.knobs, dataset_size=info.dataset_size or UNSIZED_DATASET,
        state_bytes=training_state_bytes(info.model), parameters=parameters,
        left_out=terms.left_out(run.baseline, candidates, device_type, world_size),
        script_imports=run.imports.modules(),
        script_environment_changed=run.imports.changed,
        script_run_steps=run.baseline.run_steps, script_baseline=run.baseline.to_dict(),
        kept=terms.kept(run.baseline), sizes=sizes)
