"""The measurement of a script trial, told each optimizer step of the library's own loop: the
same protocol as a model file's trial (`trial/measure`), its steps the same
(`trial/window`: compile-aware warm-up, the screening window, a timed window synchronised
only at its edges, a disturbed window timed again once quiet unless the warm-up saw the same
load, at most `contention_remeasures` times), driven by the library's loop instead of
autotune's. In a process group every rank moves on, and stops, at the step rank 0 decides.
After the window (never inside it), the profiler's: a few more of the library's steps under
torch.profiler, for the trial's trace, its syncs per step and top operators, or for
`autotune profile --script`.

With `count_flops` (a trial's measurement on CUDA, as a model file's trial counts them), the
step after the first is counted (`flops.StepFlops`): model FLOPs a sample for MFU, from the
script's own training step, its recompute under activation checkpointing left out. It is the
warm-up's, never steady (the counter slows it) and never the window's. A step that runs
torch.compile'd code is not counted (`flops.COMPILED`, which the figures keep): the counter
cannot see compiled kernels, and torch.compile would run the step eagerly under it, or refuse.

Where the profiler's window will be read for findings, the next step is traced for the user's
lines that read tensors back to the host (`diagnosis.HostSyncTrace`, from one step boundary to
the next, as a model file's trial traces a step of autotune's loop): the warm-up's too, never
steady (the wrapped tensor methods slow it) and never the window's; not where the loop ran
compiled code since it started (dynamo would trace the wrappers and compile again).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from autotune.hardware import describe, peak_flops
from autotune.options import MeasureSettings
from autotune.trial import distributed, training_clock
from autotune.trial.compile_events import compile_count
from autotune.trial.contention import ContentionProbe
from autotune.trial.diagnosis import HostSyncTrace, SyncSite
from autotune.trial.flops import COMPILED, SampleFlops, StepFlops
from autotune.trial.measure import MemoryPeaks, group_figures, peak_memory, window_measurement
from autotune.trial.profiling import ProfilerWindow, ProfileSummary
from autotune.trial.protocol import FIRST_STEP, Measurement, PhaseTimes
from autotune.trial.script.libraries import library_of
from autotune.trial.script.observer import TrainInfo
from autotune.trial.window import (
    Remeasures,
    WarmUp,
    Window,
    WindowTimer,
    screen_settings,
    screens_out,
    synchronize,
)

FIRST, COUNT, TRACE, WARMUP, SCREEN, WINDOW, REWARM, PROFILE = (
    "first", "count", "trace", "warmup", "screen", "window", "rewarm", "profile")


class MeasuringObserver:
    """A `StepObserver` that stops the library's loop once the measurement is done."""

    def __init__(self, settings: MeasureSettings, device: torch.device,
                 progress: Callable[[str], None] = lambda phase: None,
                 probe: ContentionProbe | None = None,
                 profiler: ProfilerWindow | None = None,
                 beside: ContentionProbe | None = None, count_flops: bool = False) -> None:
        self.settings, self.device, self.progress = settings, device, progress
        self.count_flops = count_flops
        self.flops: SampleFlops | None = None  # the counted step's, once counted
        self.counting: StepFlops | None = None  # the step being counted
        self.sync_sites: list[SyncSite] = []  # the traced step's, for the findings
        self.tracing: HostSyncTrace | None = None  # the step being traced
        self.profiler = profiler  # after the window: None, no profiler window
        self.profile: ProfileSummary | None = None
        self.profiled: list[Any] = []  # the raw profile, for `autotune profile --script`
        self.profile_samples, self.profile_wait_s, self.profile_s = 0, 0.0, 0.0
        self.memory: MemoryPeaks | None = None  # the training's, before the profiler's events
        self.probe = probe or ContentionProbe(settings.contention_threshold, device)
        # what ran beside the warm-up and the screening: a load the window sees too stays
        self.beside = beside or ContentionProbe(settings.contention_threshold, device)
        self.info: TrainInfo | None = None
        self.phase = FIRST
        self.steps = 0  # the loop's steps told so far
        self.first_step_s: float | None = None
        self.warm = WarmUp(settings)
        self.warmup_s = 0.0
        self.screen_rate: float | None = None
        self.screen: Window | None = None
        self.screened = False
        self.timer: WindowTimer | None = None
        self.windows: Remeasures | None = None
        self.untimed_steps = 0
        # each phase's wall time (`PhaseTimes`): what a confirmation run is priced from
        self.screen_s = self.window_s = self.remeasure_s = self.sync_tracing_s = 0.0
        self.screen_done_s: float | None = None  # since the first step began
        self._compiled = self._compiled_after = compile_count()
        self._remeasure_began = 0.0
        self._phase_start = self._began = time.perf_counter()
        self._last = training_clock.now()  # a step's end, on the training clock

    def on_train_start(self, info: TrainInfo) -> None:
        self.info = info
        self.progress(f"{FIRST_STEP} of the script's {library_of(info.library).loop}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._compiled = compile_count()
        self._phase_start = self._began = time.perf_counter()
        self._last = training_clock.now()

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        self.steps += 1
        if self.phase in (FIRST, COUNT, TRACE, WARMUP):
            synchronize(self.device)
            now, ended = time.perf_counter(), training_clock.now()
            step_s, self._last = ended - self._last, ended
            if self.phase == WARMUP:
                self.warm.step(step_s, samples)
                if distributed.decided(self.warm.done):
                    self.warmup_s = now - self._phase_start - self.sync_tracing_s
                    self.progress("timing")
                    self._start_window(SCREEN)
                return False
            if self.phase == FIRST:
                self.first_step_s = step_s
                self.beside.start()
                self._phase_start = now
            elif self.phase == COUNT:  # the warm-up's, never steady: the counter slowed it
                self._counted(samples)
            else:  # the warm-up's too: the wrapped tensor methods slowed it
                self._traced()
                self.sync_tracing_s = step_s
            self._next_untimed()
            return False
        if self.phase == REWARM:
            self.untimed_steps += 1
            if self.untimed_steps >= self.settings.steady_steps:
                self.progress("re-measuring the window")
                self._start_window(WINDOW)
            return False
        if self.phase == PROFILE:
            return self._profiled(samples, data_wait_s)
        assert self.timer is not None
        if not distributed.decided(self.timer.step(samples, loss, data_wait_s)):
            return False
        return self._screen() if self.phase == SCREEN else self._window_done()

    def on_train_end(self) -> None:
        """The figures are read from this observer after the run; a counter still on (the loop
        ended inside the counted step) goes off, having counted nothing, and a trace still on
        gives the tensor methods back."""
        self._counted(0)
        self._traced()

    def _next_untimed(self) -> None:
        """After the first step, the warm-up's steps that are not timed, each from one step
        boundary to the next: the step counted for FLOPs, then the step traced for host syncs
        (where the profiler's window comes and nothing was compiled: rank 0 decides, so that
        every rank of a group changes phase at one step), then the warm-up."""
        if self.phase == FIRST and self.count_flops:
            self._count_next_step()
        elif self.phase != TRACE and \
                distributed.decided(self.profiler is not None and not self._compiled_since_start()):
            self._trace_next_step()
        else:
            self._warm_up()

    def _compiled_since_start(self) -> bool:
        """The loop ran code torch.compile compiled (a process's earlier compiles are not its
        step's)."""
        return bool((compile_count() - self._compiled).graphs)

    def _count_next_step(self) -> None:
        """The step that starts now counted, unless the loop runs compiled code (then the step
        is left out of the warm-up all the same: every rank of a group changes phase at one
        step)."""
        self.phase = COUNT
        if self._compiled_since_start():
            self.flops = SampleFlops(None, COMPILED)
        else:
            self.progress("counting FLOPs in a step of the script's loop")
            self.counting = StepFlops()

    def _counted(self, samples: int) -> None:
        if self.counting is not None:
            self.flops, self.counting = self.counting.stop(samples), None

    def _trace_next_step(self) -> None:
        """The step that starts now traced for the lines that read tensors back; not on a rank
        of a group that compiled where rank 0 did not."""
        self.phase = TRACE
        if not self._compiled_since_start():
            self.progress("tracing host syncs in a step of the script's loop")
            self.tracing = HostSyncTrace(self.device.type)
            self.tracing.start()

    def _traced(self) -> None:
        if self.tracing is not None:
            self.tracing.stop()
            self.sync_sites, self.tracing = self.tracing.sites(), None

    def _warm_up(self) -> None:
        self.progress("warming up")
        self.warm = WarmUp(self.settings)
        self.phase = WARMUP

    def _start_window(self, phase: str) -> None:
        settings = self.settings
        if phase == SCREEN and settings.screen_steps <= 0:
            phase = WINDOW
        if phase == WINDOW and self.windows is None:
            self.windows = Remeasures(settings, self.probe, self.beside.stop(), self.progress)
        self.phase, self._phase_start = phase, time.perf_counter()
        window = screen_settings(settings, self.warm.hopeless) if phase == SCREEN else settings
        self.timer = WindowTimer(window, self.device, self.probe)

    def _screen(self) -> bool:
        assert self.timer is not None
        self.screen = window = self.timer.finish()
        now = time.perf_counter()
        self.screen_s, self.screen_done_s = now - self._phase_start, now - self._began
        self.screen_rate = window.samples_per_sec
        self.screened = distributed.decided(screens_out(
            window, self.settings.screen_below, self.settings.screen_load))
        if not self.screened:
            self._start_window(WINDOW)
        return self.screened

    def _window_done(self) -> bool:
        """True (stop the loop) once the windows are done, unless the profiler's come next;
        False with the window to be timed again (after untimed steps) once quiet."""
        assert self.timer is not None and self.windows is not None
        window = self.timer.finish()
        now = time.perf_counter()
        if not self.windows.windows:
            self.window_s = now - self._phase_start
        else:
            self.remeasure_s += now - self._remeasure_began
        self._remeasure_began = now
        if distributed.decided(self.windows.add(window)):
            self.untimed_steps = 0
            self.phase = REWARM
            return False
        return self._profile_next()

    def _profile_next(self) -> bool:
        """The measurement done: True to stop the loop, or False with the profiler's window
        started."""
        self.memory = peak_memory(self.device)
        self._compiled_after = compile_count()
        if self.profiler is None:
            return True
        self.progress("profiling")
        self.phase, self._phase_start = PROFILE, time.perf_counter()
        self.profiler.start()
        return False

    def _profiled(self, samples: int, data_wait_s: float) -> bool:
        """A step of the profiler's window; True (stop) after its last, the window read."""
        assert self.profiler is not None
        self.profile_samples += samples
        self.profile_wait_s += data_wait_s
        if not self.profiler.step_done():
            return False
        self.profile = self.profiler.summary(on_profile=self.profiled.append)
        self.profile_s = time.perf_counter() - self._phase_start
        return True

    def _kept(self) -> tuple[Window, int, float | None, bool]:
        """The window the figures come from, the windows timed again, the least load any
        window saw and whether every one saw it: the screening's alone where it screened the
        configuration out, what the loop ran of a window where the script's training ended
        inside it."""
        if self.windows is not None and self.windows.windows:
            windows = self.windows
            return windows.kept, len(windows.windows) - 1, windows.load, windows.steady_load
        if self.screen is not None and self.screened:
            window = self.screen
        elif self.timer is not None and self.timer.steps:
            window = self.timer.finish()
        else:
            raise RuntimeError("the script's training ended before the measurement's window "
                               f"(after {self.steps} steps): give it more data or steps, or "
                               "lower --window-steps")
        return window, 0, window.contention.other_cpu_share, window.contention.disturbed

    def measurement(self, startup_s: float, precision: str | None = None) -> Measurement:
        """The figures of the run observed; `startup_s` is the script's own start-up, and
        `precision` the one it trained in, whose peak FLOP/s its MFU divides by (None: no
        peak)."""
        kept, remeasured, load, steady_load = self._kept()
        compiled = self._compiled_after - self._compiled
        figures = window_measurement(
            times=kept.step_times, samples=kept.samples, seconds=kept.seconds,
            wait_s=kept.data_wait_s, final_loss=kept.final_loss, loss_finite=kept.loss_finite,
            contention=kept.contention, memory=self.memory or peak_memory(self.device),
            profile=self.profile,
            # the script's start-up is its build: imports, data and model, before the loop
            phases=PhaseTimes(build_s=startup_s, first_step_s=self.first_step_s or 0.0,
                              warmup_s=self.warmup_s, screen_s=self.screen_s,
                              window_s=self.window_s, remeasure_s=self.remeasure_s,
                              sync_tracing_s=self.sync_tracing_s, profile_s=self.profile_s),
            flops=self.flops,
            peak=peak_flops(describe(self.device), precision) if precision else None,
            time_to_first_step_s=self.first_step_s, setup_s=startup_s,
            warmup_steps=len(self.warm.times), steady=self.warm.steady, warmup_s=self.warmup_s,
            screen_samples_per_sec=self.screen_rate, screened=self.screened,
            screen_done_s=startup_s + self.screen_done_s
            if self.screen_done_s is not None else None,
            graphs_compiled=compiled.graphs, graphs_compiled_in_window=kept.compiled.graphs,
            cudagraph_recordings=compiled.cudagraph_recordings,
            cudagraph_recordings_in_window=kept.compiled.cudagraph_recordings,
            cpu_affinity=tuple(self.probe.cpus), windows_remeasured=remeasured,
            machine_load=load, steady_load=steady_load)
        return _as_group(figures)


def _as_group(figures: Measurement) -> Measurement:
    """In a process group, the group's figures from every rank's: all samples over the slowest
    window, the largest peak, the loss finite only if every rank's was, each rank's own."""
    world = distributed.current()
    if world is None:
        return figures
    ranks = world.gather({"samples": figures.window_samples, "seconds": figures.window_s,
                          "peak": figures.peak_memory_bytes, "finite": figures.loss_finite})
    return group_figures(figures, ranks)
