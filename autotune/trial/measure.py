"""The measurement protocol: one training configuration, timed the way a systems engineer would.

1. Time to first step: the first optimizer step alone, compile and loader start-up included.
2. Warm-up until steady: step times (synchronised) until the last few agree within a tolerance,
   bounded in steps and seconds.
3. Timed window: at least N optimizer steps and T seconds, then on until the median step time
   is known within ±`window_precision` (`stats.median_precision`) or a cap in steps or seconds
   is reached; the device synchronised only at its two edges. samples/sec = samples the loader
   delivered / window wall time, so data loading is in the figure. Per-step times come from
   CUDA events (read once completed, no host sync) or the host clock on CPU.
   Every window is bracketed by `contention`: one that other processes disturbed is measured
   again after a pause (bounded, with back-off); if it stays disturbed the least disturbed one
   is kept and the measurement says so (`disturbed`, `other_cpu_share`).
   Before it, a short screening window: with `screen_below` set, a configuration slower than
   that stops there (multi-fidelity: the full window only for promising ones); a disturbed
   screening window stops nothing.
4. A short profiler window after (never inside) the timed one: syncs, device idle, top ops,
   and findings in words (`diagnosis`). Its micro-batches are fetched before it starts: a
   loader that builds samples in Python makes tens of thousands of profiler events per step,
   which cost torch more to parse than the whole trial, while its waits are already measured
   in the timed window (`data_wait_fraction`).
"""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autotune.config import TrainConfig
from autotune.hardware import (
    DeviceInfo,
    cuda_total_memory,
    describe,
    nvml_memory_used,
    peak_flops,
)
from autotune.options import MeasureSettings
from autotune.stats import median_precision
from autotune.trial.compile_events import CompileCount, compile_count
from autotune.trial.contention import Contention, ContentionProbe
from autotune.trial.diagnosis import Finding, SyncSite, diagnose, trace_host_syncs
from autotune.trial.profiling import ProfileSummary, collection_paused, profile_steps
from autotune.trial.training import TrainingSetup, move_to_device, setup_from_workload
from autotune.trial.workload import Workload


@dataclass
class Measurement:
    """Every figure of one measured configuration; None where it cannot be measured here."""

    samples_per_sec: float
    window_s: float
    window_steps: int
    window_samples: int
    step_time_median_s: float
    step_time_p90_s: float
    step_time_cv: float
    time_to_first_step_s: float
    setup_s: float
    warmup_steps: int
    steady: bool
    peak_memory_bytes: int | None
    data_wait_fraction: float
    host_syncs_per_step: float | None = None
    host_sync_s_per_step: float | None = None
    device_idle_fraction: float | None = None
    flops_per_sample: float | None = None
    mfu: float | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_memory_used_bytes: int | None = None
    final_loss: float | None = None
    # Every step's loss in the timed window was finite (checked on the device, read once).
    loss_finite: bool = True
    top_operators: list[dict[str, Any]] = field(default_factory=list)
    findings: list[dict[str, Any]] = field(default_factory=list)
    trace_path: str | None = None
    warmup_s: float = 0.0
    screen_samples_per_sec: float | None = None
    screen_done_s: float | None = None  # from the start of the build to the screen's end
    screened: bool = False
    # torch.compile's work (`compile_events`): in the whole measurement, and inside the windows
    # (screening and timed), where each one distorts the figure.
    graphs_compiled: int | None = None
    graphs_compiled_in_window: int | None = None
    cudagraph_recordings: int | None = None
    cudagraph_recordings_in_window: int | None = None
    device_total_memory_bytes: int | None = None  # as the trial sees it (a MIG slice's own)
    step_time_precision: float | None = None  # the median step time known within ±this
    cpu_threads: int | None = None            # intra-op threads the trial ran
    cpu_affinity: list[int] = field(default_factory=list)  # CPUs it was allowed to run on
    other_cpu_share: float | None = None      # other processes' share of the trial's CPUs
    disturbed: bool = False                   # the kept window was still above the threshold
    windows_remeasured: int = 0               # windows re-measured because of contention
    device_other_processes: int | None = None
    device_slowdowns: list[str] = field(default_factory=list)
    # A process group's trial: samples_per_sec is the group's (every rank's samples over the
    # slowest rank's window), peak_memory_bytes the largest rank's; each rank's own below.
    world_size: int = 1
    rank_samples_per_sec: list[float] = field(default_factory=list)
    rank_peak_memory_bytes: list[int | None] = field(default_factory=list)
    communication_fraction: float | None = None  # of the profiled steps (rank 0's)
    straggler_rank: int | None = None  # a rank more than STRAGGLER slower than the fastest

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


Progress = Callable[[str], None]
# A rank whose own work in a step (its step time less its share in collectives) is this much
# longer than the fastest rank's holds the others back.
STRAGGLER = 0.10
# The phase a trial reports while its first step runs: a timeout here in a compiled
# configuration is the compile, which the compile cache makes faster the next time.
FIRST_STEP = "first step (compile and loader start-up included)"


def measure_config(workload: Workload, config: TrainConfig, device: torch.device,
                   settings: MeasureSettings | None = None, trace_path: str | Path | None = None,
                   progress: Progress | None = None) -> Measurement:
    """Build the workload with `config` applied on `device` and measure it end to end."""
    settings = settings or MeasureSettings()
    report = progress or (lambda phase: None)
    setup, flops, setup_s = build_setup(workload, config, device, report)
    return measure_setup(setup, settings, describe(device), flops, setup_s, trace_path, report)


def measure_job(workload: Workload, config: TrainConfig, device: torch.device,
                settings: Mapping[str, Any], trace_path: str | None,
                progress: Progress) -> dict[str, Any]:
    """A trial process's job (`child.JOBS`): every figure of one measurement, and how long
    it took (the rest of the trial's wall time is process start, imports, loading the file)."""
    start = time.perf_counter()
    figures = measure_config(workload, config, device, MeasureSettings(**settings), trace_path,
                             progress).to_dict()
    return {**figures, "measure_wall_s": time.perf_counter() - start}


def build_setup(workload: Workload, config: TrainConfig, device: torch.device,
                report: Progress) -> tuple[TrainingSetup, float | None, float]:
    start = time.perf_counter()
    report("building the model")
    model = workload.build_model()
    flops = workload.flops_per_sample()
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if flops is None:
            report("counting FLOPs")
            flops = count_flops_per_sample(workload, config, model, device)
        # Whatever counting cached goes back first: the trial's peak is its own.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    report("building the dataset and the loader")
    setup = setup_from_workload(workload, config, device, model=model)
    return setup, flops, time.perf_counter() - start


def measure_setup(setup: TrainingSetup, settings: MeasureSettings, info: DeviceInfo,
                  flops_per_sample: float | None = None, setup_s: float = 0.0,
                  trace_path: str | Path | None = None,
                  progress: Progress | None = None) -> Measurement:
    """Run the protocol on an already applied set-up."""
    report = progress or (lambda phase: None)
    device = setup.device
    if setup.world is not None:
        # Every rank runs every step: nothing stops one rank early or measures it again alone.
        settings = replace(settings, screen_steps=0, contention_retries=0)
    batches = setup.batches()
    compiled_before = compile_count()

    report(FIRST_STEP)
    begun = time.perf_counter()
    setup.step(batches)
    synchronize(device)
    time_to_first = time.perf_counter() - begun

    report("warming up")
    start = time.perf_counter()
    warmup_steps, steady = warm_up(setup, batches, settings)
    warmup_s = time.perf_counter() - start

    probe = ContentionProbe(settings.contention_threshold, device)
    screen_rate = screen_done = None
    screened = False
    if settings.screen_steps > 0:
        report("screening")
        steps = settings.screen_steps
        window = _timed_window(setup, batches, replace(
            settings, window_steps=steps, window_seconds=0.0, window_max_steps=steps), probe)
        screen_rate = window.samples / window.seconds
        screen_done = setup_s + time.perf_counter() - begun
        screened = settings.screen_below is not None and screen_rate < settings.screen_below \
            and not window.contention.disturbed
    remeasured = 0
    if not screened:
        report("timing")
        window, remeasured = _undisturbed_window(setup, batches, settings, probe, report)
    compiled_after = compile_count()

    times = window.step_times
    median = statistics.median(times)
    # The training's peak, before the profiler's own event storage adds to the process's.
    memory = _peak_memory(device)
    profile, findings = None, []
    if settings.profile_steps > 0 and not screened:
        sites = sync_sites(setup, batches, report)
        report("profiling")
        captured: list[Any] = []
        profiled = prefetched(setup, batches, settings.profile_steps)
        rank0 = setup.world is None or setup.world.rank == 0
        profile = profile_steps(lambda: setup.step(profiled), settings.profile_steps, device,
                                trace_path=trace_path if rank0 else None,
                                with_stack=python_stacks(setup),
                                on_profile=captured.append)
        findings = findings_of(captured[0], setup, profile, median,
                             window.data_wait_s / window.seconds, sites)
    mean = statistics.fmean(times)
    samples_per_sec = window.samples / window.seconds
    mfu = None
    peak = peak_flops(info, setup.config.precision)
    if flops_per_sample and peak:
        mfu = flops_per_sample * samples_per_sec / peak
    # the kept window's own: not the screening's, nor a disturbed window measured again
    compiled, in_window = compiled_after - compiled_before, window.compiled
    group = _group_figures(setup, window, median, memory["peak_memory_bytes"],
                           profile.communication_fraction if profile else None)
    if group:
        samples_per_sec, memory["peak_memory_bytes"] = group.pop("samples_per_sec"), \
            group.pop("peak_memory_bytes")
    return Measurement(
        samples_per_sec=samples_per_sec,
        window_s=window.seconds,
        window_steps=len(times),
        window_samples=window.samples,
        step_time_median_s=median,
        step_time_p90_s=_percentile(times, 0.9),
        step_time_cv=statistics.pstdev(times) / mean if mean > 0 else 0.0,
        time_to_first_step_s=time_to_first,
        setup_s=setup_s,
        warmup_steps=warmup_steps,
        steady=steady,
        data_wait_fraction=min(1.0, window.data_wait_s / window.seconds),
        host_syncs_per_step=profile.host_syncs_per_step if profile else None,
        host_sync_s_per_step=profile.host_sync_s_per_step if profile else None,
        device_idle_fraction=profile.device_idle_fraction if profile else None,
        flops_per_sample=flops_per_sample,
        mfu=mfu,
        final_loss=window.final_loss, loss_finite=window.loss_finite,
        top_operators=[asdict(op) for op in profile.top_operators] if profile else [],
        findings=[f.to_dict() for f in findings],
        trace_path=profile.trace_path if profile else None,
        warmup_s=warmup_s,
        screen_samples_per_sec=screen_rate,
        screen_done_s=screen_done,
        screened=screened,
        graphs_compiled=compiled.graphs,
        graphs_compiled_in_window=in_window.graphs,
        cudagraph_recordings=compiled.cudagraph_recordings,
        cudagraph_recordings_in_window=in_window.cudagraph_recordings,
        step_time_precision=median_precision(times),
        cpu_threads=torch.get_num_threads(),
        cpu_affinity=probe.cpus,
        other_cpu_share=window.contention.other_cpu_share,
        disturbed=window.contention.disturbed,
        windows_remeasured=remeasured,
        device_other_processes=window.contention.device_other_processes,
        device_slowdowns=window.contention.device_slowdowns,
        **memory,
        **group,
    )


def _group_figures(setup: TrainingSetup, window: _Window, step_s: float, peak: int | None,
                   communication: float | None) -> dict[str, Any]:
    """Every rank's figures, gathered: the group's rate (all samples over the slowest window),
    the largest peak, and the straggler, if a rank's own work is STRAGGLER slower. The
    window's loss counts as finite only if every rank's was."""
    if setup.world is None:
        return {}
    ranks = setup.world.gather({"samples": window.samples, "seconds": window.seconds,
                                "peak": peak, "step_s": step_s, "communication": communication,
                                "finite": window.loss_finite})
    window.loss_finite = all(r["finite"] for r in ranks)
    work = [r["step_s"] * (1 - (r["communication"] or 0.0)) for r in ranks]
    slowest = max(range(len(ranks)), key=work.__getitem__)
    straggler = slowest if work[slowest] > min(work) * (1 + STRAGGLER) else None
    peaks = [r["peak"] for r in ranks]
    return {"samples_per_sec": sum(r["samples"] for r in ranks) /
            max(r["seconds"] for r in ranks),
            "peak_memory_bytes": max((p for p in peaks if p is not None), default=None),
            "world_size": len(ranks),
            "rank_samples_per_sec": [r["samples"] / r["seconds"] for r in ranks],
            "rank_peak_memory_bytes": peaks, "communication_fraction": communication,
            "straggler_rank": straggler}


def time_to_train_s(metrics: Mapping[str, Any], steps: int) -> float:
    """Wall time of `steps` optimizer steps from a fresh start, as a real run would spend it:
    the build, the first step (compile included), the warm-up steps as measured, then the
    rest at the timed window's pace (data loading included)."""
    start = metrics["setup_s"] + metrics["time_to_first_step_s"]
    warmup_steps, warmup_s = metrics["warmup_steps"], metrics["warmup_s"]
    if steps <= 1 + warmup_steps:
        return start + warmup_s * max(0, steps - 1) / max(1, warmup_steps)
    steady = metrics["window_s"] / metrics["window_steps"]
    return start + warmup_s + (steps - 1 - warmup_steps) * steady


def prefetched(setup: TrainingSetup, batches: Iterator[Any], steps: int) -> Iterator[Any]:
    """The micro-batches of `steps` optimizer steps, fetched now, so that a profiler started
    after this records the model's work and not the loader's."""
    return iter(list(itertools.islice(batches, steps * setup.config.grad_accum_steps)))


def python_stacks(setup: TrainingSetup) -> bool:
    """Python frames name the user's functions, but in a compiled model they would hide the
    generated kernels' time inside Python events, so compiled models are profiled without."""
    return setup.config.compile_mode == "none"


def sync_sites(setup: TrainingSetup, batches: Iterator[Any], report: Progress) -> list[SyncSite]:
    """One traced step for the lines that read tensors back; compiled models are left alone."""
    if setup.config.compile_mode != "none":
        return []
    report("tracing host syncs")
    return trace_host_syncs(lambda: setup.step(batches), device_type=setup.device.type)


def findings_of(prof: Any, setup: TrainingSetup, summary: ProfileSummary, step_s: float,
              data_wait_fraction: float, sites: list[SyncSite]) -> list[Finding]:
    with collection_paused():
        return diagnose(prof, config=setup.config, steps=summary.steps, step_s=step_s,
                        data_wait_fraction=data_wait_fraction,
                        syncs_per_step=summary.host_syncs_per_step,
                        sync_s_per_step=summary.host_sync_s_per_step,
                        idle_fraction=summary.device_idle_fraction, sync_sites=sites)


@dataclass
class _Window:
    seconds: float
    samples: int
    data_wait_s: float
    step_times: list[float]
    final_loss: float
    loss_finite: bool
    contention: Contention
    compiled: CompileCount  # graphs compiled and CUDA graphs recorded during this window


def warm_up(setup: TrainingSetup, batches: Iterator[Any],
             settings: MeasureSettings) -> tuple[int, bool]:
    """Step until the last `steady_steps` step times agree within the tolerance, or give up.
    Steps that compiled or recorded a CUDA graph are not steady, however fast they were."""
    times: list[float] = []
    quiet_since = 0  # steps before this one compiled something
    start = time.perf_counter()
    while setup.decide(len(times) < settings.warmup_max_steps and
                       time.perf_counter() - start < settings.warmup_max_seconds):
        compiled = compile_count()
        step_start = time.perf_counter()
        setup.step(batches)
        synchronize(setup.device)
        times.append(time.perf_counter() - step_start)
        if compile_count() != compiled:
            quiet_since = len(times)
        recent = times[-settings.steady_steps:]
        if setup.decide(len(times) - quiet_since >= settings.steady_steps and
                        max(recent) <= min(recent) * (1 + settings.steady_tolerance)):
            return len(times), True
    return len(times), False


def _undisturbed_window(setup: TrainingSetup, batches: Iterator[Any], settings: MeasureSettings,
                        probe: ContentionProbe, report: Progress) -> tuple[_Window, int]:
    """The timed window, measured again when other processes disturbed it: once the machine
    is quiet again (waiting at most 1, 2, 4... x the back-off, `contention_retries` times)
    and after a few untimed steps. The first clean window is kept, else the least disturbed;
    returns it and how many windows were measured again."""
    windows = [_timed_window(setup, batches, settings, probe)]
    for retry in range(settings.contention_retries):
        if not windows[-1].contention.disturbed:
            break
        wait_s = settings.contention_backoff_s * 2**retry
        report(f"{windows[-1].contention.describe()} in the window: waiting up to "
               f"{wait_s:g} s for a quiet moment to measure it again")
        if not probe.wait_for_quiet(wait_s):
            continue
        report("re-measuring the window")
        for _ in range(settings.steady_steps):
            setup.step(batches)
        windows.append(_timed_window(setup, batches, settings, probe))
    kept = min(windows, key=lambda w: (w.contention.disturbed,
                                       w.contention.other_cpu_share or 0.0))
    return kept, len(windows) - 1


class _StepClock:
    """Per-step times of a window: CUDA events, read only once completed so that nothing
    waits on the device, or the host clock on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self.done: list[float] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def times(self) -> list[float]:
        """Step times known so far (all of them once the device is synchronised)."""
        while len(self.done) < len(self.marks) - 1:
            a, b = self.marks[len(self.done)], self.marks[len(self.done) + 1]
            if not self.cuda:
                self.done.append(b - a)
            elif b.query():
                self.done.append(a.elapsed_time(b) / 1000)
            else:
                break
        return self.done


def _timed_window(setup: TrainingSetup, batches: Iterator[Any], settings: MeasureSettings,
                  probe: ContentionProbe) -> _Window:
    """At least N steps and T seconds, then until the median step time is known within the
    precision asked or a cap is reached; synchronised only at the edges, bracketed by the
    contention probe. A window already disturbed at its minimum is not lengthened."""
    device = setup.device
    clock = _StepClock(device)
    samples, data_wait, steps = 0, 0.0, 0
    lengthening = False
    check_at = settings.window_steps  # precision is checked after ~10% more steps each time
    finite = torch.ones((), dtype=torch.bool, device=device)  # all losses so far, no sync
    compiled = compile_count()
    synchronize(device)
    probe.start()
    start = time.perf_counter()
    clock.mark()
    while True:
        result = setup.step(batches)
        finite &= torch.isfinite(result.loss)
        samples += result.samples
        data_wait += result.data_wait_s
        clock.mark()
        steps += 1
        elapsed = time.perf_counter() - start
        done = False
        if steps >= settings.window_steps and elapsed >= settings.window_seconds:
            capped = steps >= settings.window_max_steps or \
                elapsed >= settings.window_max_seconds
            if capped or (not lengthening and probe.disturbed_so_far()):
                done = True
            else:
                lengthening = True
                if steps >= check_at:
                    precision = median_precision(clock.times())
                    done = precision is not None and precision <= settings.window_precision
                    check_at = steps + max(1, steps // 10)
        if setup.decide(done):
            break
    synchronize(device)
    seconds = time.perf_counter() - start
    contention = probe.stop()
    return _Window(seconds, samples, data_wait, clock.times(), float(result.loss), bool(finite),
                   contention, compile_count() - compiled)


def count_flops_per_sample(workload: Workload, config: TrainConfig, model: nn.Module,
                           device: torch.device) -> float | None:
    """FLOPs of one forward and backward per sample, counted by `torch.utils.flop_counter`.

    Model FLOPs, as MFU defines them: the plain model in fp32, no checkpointing recompute, no
    compile. Counted on the meta device, where tensors have shapes but no memory and ops do no
    work, with a whole micro-batch, so a batch padded to its largest sample counts as it runs.
    A model that cannot run on meta (an op that reads values, a tensor made on a fixed device)
    is counted on `device` with two samples: little memory, and before the trial's peak is
    reset.
    """
    dataset = workload.build_dataset()
    collate = workload.hook("collate_fn") or torch.utils.data.default_collate
    samples = [dataset[i] for i in range(min(config.micro_batch_size, len(dataset)))]
    to_device = workload.hook("to_device") or move_to_device
    meta = torch.device("meta")
    try:
        with meta:
            meta_model = workload.build_model()
        total = _flops(meta_model, workload, to_device(collate(samples), meta))
    except Exception:
        samples = samples[:2]
        total = _flops(model.to(device), workload, to_device(collate(samples), device))
        model.zero_grad(set_to_none=True)
    return total / len(samples) if total else None


def _flops(model: nn.Module, workload: Workload, batch: Any) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        workload.loss_fn()(model, batch).backward()
    return counter.get_total_flops()


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _peak_memory(device: torch.device) -> dict[str, int | None]:
    """CUDA: allocator peaks and NVML's device figure; CPU: the process's peak RSS."""
    if device.type == "cuda":
        reserved = torch.cuda.max_memory_reserved(device)
        return {"peak_memory_bytes": reserved,
                "peak_allocated_bytes": torch.cuda.max_memory_allocated(device),
                "peak_reserved_bytes": reserved,
                "device_memory_used_bytes": nvml_memory_used(device.index or 0),
                "device_total_memory_bytes": cuda_total_memory(device)}
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_memory_bytes": rss_kib * 1024}
