"""`autotune profile`: the deeper look at one configuration, in the trial's process.

The same set-up and warm-up as a trial (`measure`), then a profiler window with Python stacks
and memory: the trace, the top operator tables, findings naming the user's lines, and a memory
timeline (the CUDA allocator's history, or the profiler's memory categories on CPU), returned
as data for the command to draw and write.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.trial.measure import (
    Progress,
    build_setup,
    findings_of,
    python_stacks,
    sync_sites,
    warm_up,
)
from autotune.trial.profiling import (
    allocator_timeline,
    memory_categories,
    operator_tables,
    profile_steps,
    trace_file,
)
from autotune.trial.protocol import ProfileReport, ProfileSettings
from autotune.trial.window import synchronize
from autotune.trial.workload import Workload


def profile_job(workload: Workload, config: TrainConfig, device: torch.device,
                settings: ProfileSettings, trace_path: str | None,
                progress: Progress) -> ProfileReport:
    """A child process's job (`child.JOBS`): profile, write the trace under `settings.out`,
    and return the report, its memory timeline included (the tuner's side draws it)."""
    return profile_config(workload, config, device, Path(settings.out), steps=settings.steps,
                          settings=MeasureSettings(warmup_max_seconds=settings.warmup_max_seconds),
                          top=settings.top, progress=progress)


def profile_config(workload: Workload, config: TrainConfig, device: torch.device, out_dir: Path,
                   steps: int = 5, settings: MeasureSettings | None = None, top: int = 15,
                   progress: Progress | None = None) -> ProfileReport:
    """Set up, warm up, then profile `steps` optimizer steps with Python stacks and memory.

    Writes the trace (Perfetto and TensorBoard's profiler plugin read it) and, on CUDA, the
    allocator's memory-history snapshot (pytorch.org/memory_viz reads it) under `out_dir`.
    """
    settings = settings or MeasureSettings()
    report = progress or (lambda phase: None)
    setup, _, _ = build_setup(workload, config, device, report)
    batches = setup.batches()
    report("first step (compile and loader start-up included)")
    setup.step(batches)
    report("warming up")
    warm_up(setup, batches, settings)
    sites = sync_sites(setup, batches, report)

    samples, data_wait = 0, 0.0

    def run_step() -> None:
        nonlocal samples, data_wait
        result = setup.step(batches)
        samples += result.samples
        data_wait += result.data_wait_s

    on_cuda = device.type == "cuda"
    trace = trace_file(out_dir)
    files = {"trace": str(trace)}
    start_bytes = 0
    if on_cuda:
        synchronize(device)
        start_bytes = torch.cuda.memory_allocated(device)
        torch.cuda.memory._record_memory_history(max_entries=200_000)
    report(f"profiling {steps} steps")
    captured: list[Any] = []
    summary = profile_steps(run_step, steps, device, trace_path=trace, top=top,
                            with_stack=python_stacks(setup), profile_memory=True,
                            on_profile=captured.append)
    prof = captured[0]
    if on_cuda:
        snapshot = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        files["memory_snapshot"] = str(out_dir / "memory_snapshot.pickle")
        Path(files["memory_snapshot"]).write_bytes(pickle.dumps(snapshot))
        timeline = allocator_timeline(snapshot, device.index or 0, start_bytes)
    else:
        report("building the memory timeline")
        timeline = memory_categories(prof, device)
    median = summary.window_s / steps
    findings = findings_of(prof, setup.config, summary, median, data_wait / summary.window_s,
                           sites)
    return ProfileReport(
        config=setup.config, device=str(device), steps=steps,
        samples_per_sec=samples / summary.window_s, window_s=summary.window_s,
        self_cpu_total_s=summary.self_cpu_total_s,
        self_device_total_s=summary.self_device_total_s,
        host_syncs_per_step=summary.host_syncs_per_step,
        device_idle_fraction=summary.device_idle_fraction,
        data_wait_fraction=min(1.0, data_wait / summary.window_s),
        tables=operator_tables(prof, top), findings=tuple(findings), memory_timeline=timeline,
        files=files)
