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
   again after a pause (bounded, with back-off), once at most; a load the warm-up and screening
   saw too is the machine's steady state and is not waited out. If it stays disturbed the least
   disturbed one is kept and the measurement says so (`disturbed`, `other_cpu_share`,
   `machine_load`, `steady_load`).
   Before it, a short screening window: with `screen_below` set, a configuration slower than
   that stops there (multi-fidelity: the full window only for promising ones); a disturbed
   screening window stops nothing.
4. A short profiler window after (never inside) the timed one: syncs, device idle, top ops,
   and findings in words (`diagnosis`). Its micro-batches are fetched before it starts: a
   loader that builds samples in Python makes tens of thousands of profiler events per step,
   which cost torch more to parse than the whole trial, while its waits are already measured
   in the timed window (`data_wait_fraction`).

Steps 2 and 3 are `trial/window`'s, told one optimizer step at a time: this module's loop
drives them as a script trial's library loop does (`trial/script/measuring`).
"""

from __future__ import annotations

import itertools
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from autotune.config import TrainConfig
from autotune.formatting import format_seconds
from autotune.hardware import (
    DeviceInfo,
    PeakFlops,
    cuda_total_memory,
    describe,
    nvml_memory_used,
    peak_flops,
)
from autotune.options import MeasureSettings
from autotune.stats import median_precision
from autotune.trial.compile_events import compile_count
from autotune.trial.contention import Contention, ContentionProbe
from autotune.trial.diagnosis import SyncSite, diagnose, trace_host_syncs
from autotune.trial.distributed import World
from autotune.trial.flops import ModelFlopCounter, SampleFlops
from autotune.trial.profiling import (
    FRAMES_READBACK_S,
    ProfileSummary,
    collection_paused,
    frames_readback_s,
    profile_steps,
    recorded_events,
)
from autotune.trial.protocol import (
    FIRST_STEP,
    Finding,
    Measurement,
    PhaseTimes,
    WarmTurn,
    prefetched_steps,
)
from autotune.trial.training import TrainingSetup, move_to_device, setup_from_workload
from autotune.trial.window import (
    Remeasures,
    WarmUp,
    Window,
    WindowTimer,
    screen_settings,
    screens_out,
    synchronize,
    turn_settings,
)
from autotune.trial.workload import Workload

Progress = Callable[[str], None]
# A rank whose own work in a step (its step time less its share in collectives) is this much
# longer than the fastest rank's holds the others back.
STRAGGLER = 0.10


def measure_config(workload: Workload, config: TrainConfig, device: torch.device,
                   settings: MeasureSettings | None = None, trace_path: str | Path | None = None,
                   progress: Progress | None = None) -> Measurement:
    """Build the workload with `config` applied on `device` and measure it end to end."""
    settings = settings or MeasureSettings()
    report = progress or (lambda phase: None)
    setup, flops, setup_s = build_setup(workload, config, device, report)
    return measure_setup(setup, settings, describe(device), flops, setup_s, trace_path, report)


def measure_job(workload: Workload, config: TrainConfig, device: torch.device,
                settings: MeasureSettings, trace_path: str | None,
                progress: Progress) -> Measurement:
    """A trial process's job (`child.JOBS`): every figure of one measurement, and how long
    it took (the rest of the trial's wall time is process start, imports, loading the file)."""
    start = time.perf_counter()
    figures = measure_config(workload, config, device, settings, trace_path, progress)
    return replace(figures, measure_wall_s=time.perf_counter() - start)


def build_setup(workload: Workload, config: TrainConfig, device: torch.device,
                report: Progress) -> tuple[TrainingSetup, SampleFlops | None, float]:
    """The configuration applied to the workload, its FLOPs a sample for MFU (on CUDA only,
    the one device with a peak to divide them by), and the seconds the build took."""
    start = time.perf_counter()
    report("building the model")
    model = workload.build_model()
    given = workload.flops_per_sample()
    flops = SampleFlops(given, "given") if given is not None else None
    if device.type == "cuda":
        torch.cuda.set_device(device)
        if flops is None:
            report("counting FLOPs")
            counted = count_flops_per_sample(workload, config, model, device)
            flops = SampleFlops(counted, "counted") if counted else None
        # Whatever counting cached goes back first: the trial's peak is its own.
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    report("building the dataset and the loader")
    setup = setup_from_workload(workload, config, device, model=model)
    return setup, flops, time.perf_counter() - start


def measure_setup(setup: TrainingSetup, settings: MeasureSettings, info: DeviceInfo,
                  flops: SampleFlops | None = None, setup_s: float = 0.0,
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

    # What ran beside the warm-up and the screening (long enough to read where a screening
    # window alone is a few ticks): a load the timed window sees too was there all along.
    before = ContentionProbe(settings.contention_threshold, device)
    before.start()
    report("warming up")
    start = time.perf_counter()
    warm = warm_up(setup, batches, settings)
    warmup_s = time.perf_counter() - start

    probe = ContentionProbe(settings.contention_threshold, device)
    screen_rate = screen_done = None
    screened = False
    phase_start = time.perf_counter()
    if settings.screen_steps > 0:
        report("screening")
        window = _timed_window(setup, batches, screen_settings(settings, warm.hopeless), probe)
        screen_rate = window.samples_per_sec
        screen_done = setup_s + time.perf_counter() - begun
        screened = screens_out(window, settings.screen_below, settings.screen_load)
    screen_s = time.perf_counter() - phase_start
    seen = before.stop()
    remeasured, first_s, remeasure_s = 0, 0.0, 0.0
    if screened:
        load, steady_load = window.contention.other_cpu_share, window.contention.disturbed
    else:
        report("timing")
        phase_start = time.perf_counter()
        windows, first_s = _undisturbed_window(setup, batches, settings, probe, report, seen)
        window, remeasured = windows.kept, len(windows.windows) - 1
        load, steady_load = windows.load, windows.steady_load
        remeasure_s = time.perf_counter() - phase_start - first_s
    compiled_after = compile_count()

    times = window.step_times
    median = statistics.median(times)
    # The training's peak, before the profiler's own event storage adds to the process's.
    memory = peak_memory(device)
    profile, findings = None, []
    sync_tracing_s = profile_s = 0.0
    if settings.profile_steps > 0 and not screened:
        phase_start = time.perf_counter()
        sites: list[SyncSite] = []
        # the traced step's events, counted without reading them back, say whether frames fit
        frames = frames_fit(setup, lambda: sites.extend(sync_sites(setup, batches, report)),
                            settings.profile_steps, report)
        sync_tracing_s = time.perf_counter() - phase_start
        phase_start = time.perf_counter()
        report("profiling")
        captured: list[Any] = []
        profiled = prefetched(setup, batches, settings.profile_steps)
        rank0 = setup.world is None or setup.world.rank == 0
        profile = profile_steps(lambda: setup.step(profiled), settings.profile_steps, device,
                                trace_path=trace_path if rank0 else None,
                                with_stack=frames, on_profile=captured.append)
        findings = findings_of(captured[0], setup.config, profile, median,
                             window.data_wait_s / window.seconds, sites)
        profile_s = time.perf_counter() - phase_start
    # the kept window's own: not the screening's, nor a disturbed window measured again
    compiled, in_window = compiled_after - compiled_before, window.compiled
    figures = window_measurement(
        times=times, samples=window.samples, seconds=window.seconds,
        wait_s=window.data_wait_s, final_loss=window.final_loss,
        loss_finite=window.loss_finite, contention=window.contention, memory=memory,
        profile=profile,
        phases=PhaseTimes(build_s=setup_s, first_step_s=time_to_first, warmup_s=warmup_s,
                          screen_s=screen_s, window_s=first_s, remeasure_s=remeasure_s,
                          sync_tracing_s=sync_tracing_s, profile_s=profile_s),
        time_to_first_step_s=time_to_first, setup_s=setup_s, warmup_steps=len(warm.times),
        steady=warm.steady, warmup_s=warmup_s,
        flops=flops, peak=peak_flops(info, setup.config.precision), findings=tuple(findings),
        screen_samples_per_sec=screen_rate, screen_done_s=screen_done, screened=screened,
        graphs_compiled=compiled.graphs, graphs_compiled_in_window=in_window.graphs,
        cudagraph_recordings=compiled.cudagraph_recordings,
        cudagraph_recordings_in_window=in_window.cudagraph_recordings,
        cpu_affinity=tuple(probe.cpus), windows_remeasured=remeasured,
        machine_load=load, steady_load=steady_load)
    return _as_group(figures, setup, window, median,
                     profile.communication_fraction if profile else None)


def window_measurement(*, times: list[float], samples: int, seconds: float, wait_s: float,
                       final_loss: float | None, loss_finite: bool, contention: Contention,
                       memory: MemoryPeaks, profile: ProfileSummary | None,
                       phases: PhaseTimes, flops: SampleFlops | None,
                       peak: PeakFlops | None, **rest: Any) -> Measurement:
    """The one place a `Measurement` is made, for autotune's own loop and a script's alike:
    the figures every measurement takes from its kept window (`times` of its steps, its
    `samples` in `seconds`, its data wait and losses, what else ran meanwhile), the training's
    memory peaks and the profiler's window, and its MFU: the model's FLOPs a sample times the
    window's samples/sec over the device's `peak` (CUDA only: elsewhere there is none); `rest`,
    what each gathers its own way (autotune's loop's findings, say: a script's job adds its
    own)."""
    median, mean = statistics.median(times), statistics.fmean(times)
    samples_per_sec = samples / seconds
    return Measurement(
        samples_per_sec=samples_per_sec, window_s=seconds, window_steps=len(times),
        window_samples=samples, step_time_median_s=median,
        step_time_p90_s=percentile(times, 0.9),
        step_time_cv=statistics.pstdev(times) / mean if mean > 0 else 0.0,
        step_time_precision=median_precision(times),
        data_wait_fraction=min(1.0, wait_s / seconds),
        final_loss=final_loss, loss_finite=loss_finite, cpu_threads=torch.get_num_threads(),
        other_cpu_share=contention.other_cpu_share, disturbed=contention.disturbed,
        device_other_processes=contention.device_other_processes,
        device_slowdowns=tuple(contention.device_slowdowns),
        peak_memory_bytes=memory.peak, peak_allocated_bytes=memory.allocated,
        peak_reserved_bytes=memory.reserved, device_memory_used_bytes=memory.device_used,
        device_total_memory_bytes=memory.device_total,
        host_syncs_per_step=profile.host_syncs_per_step if profile else None,
        host_sync_s_per_step=profile.host_sync_s_per_step if profile else None,
        optimizer_fraction=profile.optimizer_fraction if profile else None,
        device_idle_fraction=profile.device_idle_fraction if profile else None,
        top_operators=profile.top_operators if profile else (),
        work_shares=profile.work_shares if profile else None,
        kernels_per_step=profile.kernels_per_step if profile else None,
        trace_path=profile.trace_path if profile else None,
        flops_per_sample=flops.per_sample if flops else None,
        flops_source=flops.source if flops else None,
        peak_flops=peak.flops if peak else None,
        peak_flops_source=peak.source if peak else None,
        mfu=utilization(flops, samples_per_sec, peak),
        phases=phases, **rest)


def _as_group(figures: Measurement, setup: TrainingSetup, window: Window, step_s: float,
              communication: float | None) -> Measurement:
    """A process group's figures from every rank's, gathered: the group's rate (all samples
    over the slowest window), the largest peak, and the straggler, if a rank's own work is
    STRAGGLER slower; the window's loss finite only if every rank's was. A process of its
    own keeps its figures."""
    if setup.world is None:
        return figures
    ranks = setup.world.gather({"samples": window.samples, "seconds": window.seconds,
                                "peak": figures.peak_memory_bytes, "step_s": step_s,
                                "communication": communication, "finite": window.loss_finite})
    work = [r["step_s"] * (1 - (r["communication"] or 0.0)) for r in ranks]
    slowest = max(range(len(ranks)), key=work.__getitem__)
    return replace(
        group_figures(figures, ranks), communication_fraction=communication,
        straggler_rank=slowest if work[slowest] > min(work) * (1 + STRAGGLER) else None)


def group_figures(figures: Measurement, ranks: list[dict[str, Any]]) -> Measurement:
    """The group's rate (all ranks' `samples` over the slowest rank's `seconds`), the largest
    `peak`, the loss finite only if every rank's was, and each rank's own figures."""
    peaks = tuple(r["peak"] for r in ranks)
    return replace(
        figures, samples_per_sec=sum(r["samples"] for r in ranks) /
        max(r["seconds"] for r in ranks),
        peak_memory_bytes=max((p for p in peaks if p is not None), default=None),
        loss_finite=all(r["finite"] for r in ranks), world_size=len(ranks),
        rank_samples_per_sec=tuple(r["samples"] / r["seconds"] for r in ranks),
        rank_peak_memory_bytes=peaks)


def prefetched(setup: TrainingSetup, batches: Iterator[Any], steps: int) -> Iterator[Any]:
    """The micro-batches of `steps` optimizer steps, fetched now, so that a profiler started
    after this records the model's work and not the loader's."""
    return iter(list(itertools.islice(batches, steps * setup.config.grad_accum_steps)))


def python_stacks(setup: TrainingSetup) -> bool:
    """Python frames name the user's functions, but in a compiled model they would hide the
    generated kernels' time inside Python events, so compiled models are profiled without."""
    return setup.config.compile_mode == "none"


def frames_fit(setup: TrainingSetup, count_on: Callable[[], object], steps: int,
               report: Progress) -> bool:
    """Whether a profiler window of `steps` steps records Python frames: where they name the
    user's functions (`python_stacks`) and its events, counted on the step `count_on` runs
    without them (`profiling.recorded_events`), read back with them within
    `profiling.FRAMES_READBACK_S`, or this torch does not count them; `count_on` runs only
    there. In a process group, rank 0's answer."""
    if not python_stacks(setup):
        return False
    events = recorded_events(count_on, setup.device)
    fit = events is None or frames_readback_s(events * steps) <= FRAMES_READBACK_S
    if not fit:
        report(f"profiling without Python frames: {events:,} events a step would take about "
               f"{format_seconds(frames_readback_s(events * steps))} to read back with them")
    return setup.decide(fit)


def sync_sites(setup: TrainingSetup, batches: Iterator[Any], report: Progress) -> list[SyncSite]:
    """One traced step for the lines that read tensors back; compiled models are left alone."""
    if setup.config.compile_mode != "none":
        return []
    report("tracing host syncs")
    return trace_host_syncs(lambda: setup.step(batches), device_type=setup.device.type)


def findings_of(prof: Any, config: TrainConfig, summary: ProfileSummary, step_s: float,
                data_wait_fraction: float, sites: list[SyncSite]) -> list[Finding]:
    """The findings of a profiled window (`sites`: the lines that read tensors back, where
    the loop was traced for them)."""
    with collection_paused():
        return diagnose(prof, config=config, steps=summary.steps, step_s=step_s,
                        data_wait_fraction=data_wait_fraction,
                        syncs_per_step=summary.host_syncs_per_step,
                        sync_s_per_step=summary.host_sync_s_per_step,
                        idle_fraction=summary.device_idle_fraction, sync_sites=sites)


def warm_up(setup: TrainingSetup, batches: Iterator[Any], settings: MeasureSettings) -> WarmUp:
    """Step until the last `steady_steps` step times agree within the tolerance, give up, or
    see a step far below the screening's bar (`window.WarmUp`): its steps and how it ended."""
    warm = WarmUp(settings)
    while not setup.decide(warm.done):
        step_start = time.perf_counter()
        samples = setup.step(batches).samples
        synchronize(setup.device)
        warm.step(time.perf_counter() - step_start, samples)
    return warm


def utilization(flops: SampleFlops | None, samples_per_sec: float,
                peak: PeakFlops | None) -> float | None:
    """MFU: the model's FLOPs a sample times `samples_per_sec` over the device's peak (None
    where either is unknown: a CPU has no peak)."""
    per_sample = flops.per_sample if flops else None
    return per_sample * samples_per_sec / peak.flops if per_sample and peak else None


def timed_turn(setup: TrainingSetup, batches: Iterator[Any], settings: MeasureSettings,
               steps: int, seconds: float, tuner_pid: int | None = None,
               flops: SampleFlops | None = None, peak: PeakFlops | None = None) -> WarmTurn:
    """At least `steps` optimizer steps and `seconds`, timed as a window is (data loading
    included, synchronised only at its edges, bracketed by the contention probe, to which the
    other warm processes of `tuner_pid` are not a load; timed again once where torch.compile
    compiled in it; one that waited on its loader's workers on to many rounds of them,
    `loader_turn_steps`): one turn of a warm process, its MFU from `flops` and `peak` as a
    trial's. Of a process group, the group's turn (`group_turn`), on every rank."""
    probe = ContentionProbe(settings.contention_threshold, setup.device, family=tuner_pid)
    for _ in range(prefetched_steps(setup.config)):
        setup.step(batches)
    synchronize(setup.device)
    settings = turn_settings(settings, steps, seconds, setup.config)
    window = _timed_window(setup, batches, settings, probe)
    if setup.decide(window.compiling):  # timed again once, as a trial's window is
        window = _timed_window(setup, batches, settings, probe)
    turn = WarmTurn(samples=window.samples, seconds=window.seconds,
                    peak_memory_bytes=peak_memory(setup.device).peak,
                    disturbed=window.contention.disturbed, loss_finite=window.loss_finite,
                    load=window.contention.other_cpu_share)
    turn = group_turn(turn, setup.world)
    return replace(turn, mfu=utilization(flops, turn.samples_per_sec, peak))


def group_turn(turn: WarmTurn, world: World | None) -> WarmTurn:
    """A process group's turn from its ranks' (this rank's `turn` gathered from each), as a
    trial's window is (`group_figures`): all their samples over the slowest rank's seconds,
    the largest peak, disturbed and loaded as the most disturbed rank, the loss finite only if
    every rank's was; a process of its own keeps its turn."""
    if world is None:
        return turn
    turns = [WarmTurn.from_json(t) for t in world.gather(turn.to_json())]
    peaks = [t.peak_memory_bytes for t in turns if t.peak_memory_bytes is not None]
    loads = [t.load for t in turns if t.load is not None]
    return WarmTurn(samples=sum(t.samples for t in turns),
                    seconds=max(t.seconds for t in turns),
                    peak_memory_bytes=max(peaks, default=None),
                    disturbed=any(t.disturbed for t in turns),
                    loss_finite=all(t.loss_finite for t in turns),
                    load=max(loads, default=None))


def traced_turn(setup: TrainingSetup, batches: Iterator[Any], steps: int,
                trace_path: str) -> None:
    """`steps` optimizer steps under the profiler, their trace written to `trace_path`: what a
    trial's profiler window leaves for the report, asked of a warm process after its turns."""
    frames = frames_fit(setup, lambda: setup.step(batches), steps, lambda said: None)
    profiled = prefetched(setup, batches, steps)
    rank0 = setup.world is None or setup.world.rank == 0
    profile_steps(lambda: setup.step(profiled), steps, setup.device,
                  trace_path=trace_path if rank0 else None, with_stack=frames)


def _undisturbed_window(setup: TrainingSetup, batches: Iterator[Any], settings: MeasureSettings,
                        probe: ContentionProbe, report: Progress,
                        seen: Contention | None = None) -> tuple[Remeasures, float]:
    """The timed window, measured again while `Remeasures` says so, after a few untimed
    steps; and the first window's wall time."""
    windows = Remeasures(settings, probe, seen, report)
    start = time.perf_counter()
    again = windows.add(_timed_window(setup, batches, settings, probe))
    first_s = time.perf_counter() - start
    while again:
        for _ in range(settings.steady_steps):
            setup.step(batches)
        again = windows.add(_timed_window(setup, batches, settings, probe))
    return windows, first_s


def _timed_window(setup: TrainingSetup, batches: Iterator[Any], settings: MeasureSettings,
                  probe: ContentionProbe) -> Window:
    """One window of autotune's own loop (`window.WindowTimer`)."""
    timer = WindowTimer(settings, setup.device, probe)
    while True:
        result = setup.step(batches)
        if setup.decide(timer.step(result.samples, result.loss, result.data_wait_s)):
            return timer.finish()


def count_flops_per_sample(workload: Workload, config: TrainConfig, model: nn.Module,
                           device: torch.device) -> float | None:
    """FLOPs of one forward and backward per sample, counted by `torch.utils.flop_counter`.

    Model FLOPs, as MFU defines them: the plain model in fp32, no compile, no checkpointing
    recompute (`flops.ModelFlopCounter` leaves out any the model's own forward does). Counted
    on the meta device, where tensors have shapes but no memory and ops do no work, with a
    whole micro-batch, so a batch padded to its largest sample counts as it runs.
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
    counter = ModelFlopCounter()
    with counter:
        workload.loss_fn()(model, batch).backward()
    return counter.get_total_flops()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


class MemoryPeaks(NamedTuple):
    """A process's memory high-water marks, in bytes (on CPU its peak RSS alone)."""

    peak: int
    allocated: int | None = None
    reserved: int | None = None
    device_used: int | None = None
    device_total: int | None = None


def peak_memory(device: torch.device) -> MemoryPeaks:
    """CUDA: allocator peaks and NVML's device figure; CPU: the process's peak RSS."""
    if device.type == "cuda":
        reserved = torch.cuda.max_memory_reserved(device)
        return MemoryPeaks(reserved, torch.cuda.max_memory_allocated(device), reserved,
                      nvml_memory_used(device.index or 0), cuda_total_memory(device))
    return MemoryPeaks(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
