"""The measurement of a script trial, told each optimizer step of the library's own loop: the
first step, warm-up until the last step times agree, the screening window, then a timed window
(data loading included) until its minimum steps and seconds, or a cap; whether every loss in it
was finite; the peak memory. The same protocol as a model file's trial (`trial/measure`), driven
by the library's loop instead of autotune's; in a process group every rank moves on, and stops,
at the step rank 0 decides. Every timed window is bracketed by the contention check: a disturbed
screening never screens a configuration out, and a disturbed window is timed again once the
machine is quiet (after a few untimed steps), the least disturbed one kept and flagged. After
the window (never inside it), the profiler's: a few more of the library's steps under
torch.profiler, for the trial's trace, its syncs per step and top operators, or for `autotune
profile --script`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from autotune.options import MeasureSettings
from autotune.stats import median_precision
from autotune.trial import distributed
from autotune.trial.contention import Contention, ContentionProbe
from autotune.trial.measure import (
    MemoryPeaks,
    group_figures,
    peak_memory,
    synchronize,
    window_measurement,
)
from autotune.trial.profiling import ProfilerWindow, ProfileSummary
from autotune.trial.protocol import FIRST_STEP, Measurement, PhaseTimes
from autotune.trial.script.observer import TrainInfo

# The loop a script trains with, as a phase names it.
_LOOPS = {"transformers": "transformers Trainer", "lightning": "lightning Trainer",
          "accelerate": "Accelerate loop", "loop": "own loop"}
FIRST, WARMUP, SCREEN, WINDOW, REWARM, PROFILE = (
    "first", "warmup", "screen", "window", "rewarm", "profile")


@dataclass(frozen=True)
class _Window:
    """One timed window's figures and what else ran meanwhile."""

    times: list[float]
    samples: int
    wait_s: float
    losses: list[torch.Tensor]
    contention: Contention


class MeasuringObserver:
    """A `StepObserver` that stops the library's loop once the measurement is done."""

    def __init__(self, settings: MeasureSettings, device: torch.device,
                 progress: Callable[[str], None] = lambda phase: None,
                 probe: ContentionProbe | None = None,
                 profiler: ProfilerWindow | None = None) -> None:
        self.settings, self.device, self.progress = settings, device, progress
        self.profiler = profiler  # after the window: None, no profiler window
        self.profile: ProfileSummary | None = None
        self.profiled: list[Any] = []  # the raw profile, for `autotune profile --script`
        self.profile_samples, self.profile_wait_s, self.profile_s = 0, 0.0, 0.0
        self.memory: MemoryPeaks | None = None  # the training's, before the profiler's events
        self.probe = probe or ContentionProbe(settings.contention_threshold, device)
        self.info: TrainInfo | None = None
        self.phase = FIRST
        self.first_step_s: float | None = None
        self.warmup_times: list[float] = []
        self.warmup_s = 0.0
        self.steady = False
        self.screen_rate: float | None = None
        self.screened = False
        self.window_times: list[float] = []
        self.window_samples = 0
        self.window_wait_s = 0.0
        self.losses: list[torch.Tensor] = []
        self.windows: list[_Window] = []
        self.untimed_steps = 0
        # each phase's wall time (`PhaseTimes`): what a confirmation run is priced from
        self.screen_s = self.window_s = self.remeasure_s = 0.0
        self._remeasure_began = 0.0
        self._last = self._phase_start = time.perf_counter()

    def on_train_start(self, info: TrainInfo) -> None:
        self.info = info
        self.progress(f"{FIRST_STEP} of the script's {_LOOPS.get(info.library, 'loop')}")
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._last = self._phase_start = time.perf_counter()

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        synchronize(self.device)
        now = time.perf_counter()
        step_s, self._last = now - self._last, now
        if self.phase == FIRST:
            self.first_step_s = step_s
            self.progress("warming up")
            self._next(WARMUP, now)
        elif self.phase == WARMUP:
            self._warm_up(step_s, now)
        elif self.phase == REWARM:
            self.untimed_steps += 1
            if self.untimed_steps >= self.settings.steady_steps:
                self.progress("re-measuring the window")
                self._next(WINDOW, time.perf_counter())
        elif self.phase == PROFILE:
            return self._profiled(samples, data_wait_s)
        elif self.phase == SCREEN:
            self._count(samples, loss, data_wait_s, step_s)
            if len(self.window_times) >= self.settings.screen_steps:
                return self._screen(now)
        else:
            self._count(samples, loss, data_wait_s, step_s)
            return self._window_done(now)
        return False

    def on_train_end(self) -> None:
        """Nothing to do: the figures are read from this observer after the run."""

    def _next(self, phase: str, now: float) -> None:
        if phase == SCREEN and self.settings.screen_steps <= 0:
            phase = WINDOW
        self.phase, self._phase_start = phase, now
        self.window_times, self.window_samples, self.window_wait_s = [], 0, 0.0
        self.losses = []
        if phase in (SCREEN, WINDOW):
            self.probe.start()

    def _warm_up(self, step_s: float, now: float) -> None:
        settings, times = self.settings, self.warmup_times
        times.append(step_s)
        recent = times[-settings.steady_steps:]
        self.steady = len(times) >= settings.steady_steps and \
            max(recent) <= min(recent) * (1 + settings.steady_tolerance)
        if self._decide(self.steady or len(times) >= settings.warmup_max_steps or
                        now - self._phase_start >= settings.warmup_max_seconds):
            self.warmup_s = now - self._phase_start
            self.progress("timing")
            self._next(SCREEN, now)

    def _count(self, samples: int, loss: torch.Tensor | None, wait_s: float,
               step_s: float) -> None:
        self.window_times.append(step_s)
        self.window_samples += samples
        self.window_wait_s += wait_s
        if loss is not None:
            self.losses.append(loss)

    def _screen(self, now: float) -> bool:
        self.screen_s = now - self._phase_start
        self.screen_rate = self.window_samples / max(sum(self.window_times), 1e-9)
        below = self.settings.screen_below
        disturbed = self.probe.stop().disturbed
        self.screened = self._decide(below is not None and self.screen_rate < below and
                                     not disturbed)
        if not self.screened:
            self._next(WINDOW, now)
        return self.screened

    def _window_done(self, now: float) -> bool:
        """True once a window is full and is clean, or has had its chances to be timed again
        (waiting 1, 2, 4... x the back-off for a quiet moment)."""
        if not self._decide(self._window_full(now)):
            return False
        contention = self.probe.stop()
        self.windows.append(_Window(self.window_times, self.window_samples, self.window_wait_s,
                                    self.losses, contention))
        if len(self.windows) == 1:
            self.window_s = now - self._phase_start
        else:
            self.remeasure_s += now - self._remeasure_began
        retry = len(self.windows) - 1
        if not self._decide(contention.disturbed and retry < self.settings.contention_retries):
            return self._profile_next()
        wait_s = self.settings.contention_backoff_s * 2**retry
        self.progress(f"{contention.describe()} in the window: waiting up to {wait_s:g} s for "
                      "a quiet moment to measure it again")
        self._remeasure_began = now
        self.probe.wait_for_quiet(wait_s)
        self.untimed_steps = 0
        self._next(REWARM, time.perf_counter())
        return False

    def _profile_next(self) -> bool:
        """The measurement done: True to stop the loop, or False with the profiler's window
        started."""
        self.memory = peak_memory(self.device)
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

    def _window_full(self, now: float) -> bool:
        settings, steps = self.settings, len(self.window_times)
        elapsed = now - self._phase_start
        if steps >= settings.window_max_steps or elapsed >= settings.window_max_seconds:
            return True
        if steps < settings.window_steps or elapsed < settings.window_seconds:
            return False
        precision = median_precision(self.window_times)
        return precision is None or precision <= settings.window_precision

    @staticmethod
    def _decide(flag: bool) -> bool:
        """`flag` as every rank of a process group takes it (rank 0's), so that all move to
        the next phase, and stop the library's loop, at the same step."""
        world = distributed.current()
        return flag if world is None else world.decide(flag)

    def measurement(self, startup_s: float) -> Measurement:
        """The figures of the run observed; `startup_s` is the script's own start-up."""
        if not self.windows and self.window_times:  # screened out, or the loop ended early
            self.windows.append(_Window(self.window_times, self.window_samples,
                                        self.window_wait_s, self.losses,
                                        Contention(None, len(self.probe.cpus))))
        if not self.windows:
            raise RuntimeError("the script's training ended before the measurement's window "
                               f"(after {len(self.warmup_times) + 1} steps): give it more "
                               "data or steps, or lower --window-steps")
        kept = min(self.windows, key=lambda w: (w.contention.disturbed,
                                                w.contention.other_cpu_share or 0.0))
        losses = torch.stack([loss.reshape(()) for loss in kept.losses]) if kept.losses \
            else None
        figures = window_measurement(
            times=kept.times, samples=kept.samples, seconds=sum(kept.times),
            wait_s=kept.wait_s, final_loss=float(losses[-1]) if losses is not None else None,
            loss_finite=bool(torch.isfinite(losses).all()) if losses is not None else True,
            contention=kept.contention, memory=self.memory or peak_memory(self.device),
            profile=self.profile,
            # the script's start-up is its build: imports, data and model, before the loop
            phases=PhaseTimes(build_s=startup_s, first_step_s=self.first_step_s or 0.0,
                              warmup_s=self.warmup_s, screen_s=self.screen_s,
                              window_s=self.window_s, remeasure_s=self.remeasure_s,
                              profile_s=self.profile_s),
            time_to_first_step_s=self.first_step_s, setup_s=startup_s,
            warmup_steps=len(self.warmup_times), steady=self.steady, warmup_s=self.warmup_s,
            screen_samples_per_sec=self.screen_rate, screened=self.screened,
            windows_remeasured=len(self.windows) - 1)
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
