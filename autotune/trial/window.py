"""The measurement protocol's steps, told one optimizer step at a time: warm-up until steady,
the timed window, and whether to time the window again. Every loop is a thin driver of them:
autotune's own (`trial/measure`), a library's step callback in a script trial
(`trial/script/measuring`), and a warm process's turns of either (`trial/warm`,
`trial/script/turns`), so each measures the same way.

- `WarmUp`: until the last `steady_steps` step times agree within the tolerance, or a cap;
  steps that compiled or recorded a CUDA graph are not steady, however fast they were. Where
  a screening comes next, a step far below its bar ends it (`hopeless`): one step screens.
- `WindowTimer`: at least N optimizer steps and T seconds, then on until the median step time
  is known within ±`window_precision` or a cap (a warm turn that waited on its loader's
  workers: on to many rounds of them); the device synchronised only at the window's
  edges, per-step times from CUDA events (read once completed) or the host clock on CPU,
  bracketed by the contention probe. A window already disturbed at its minimum is not
  lengthened.
- `Remeasures`: a disturbed window is timed again once the machine is quiet (waiting 1, 2,
  4... x the back-off, `contention_retries` times, at most `contention_remeasures` windows
  more); a load the warm-up and screening saw too is the machine's state, kept and flagged. A
  window in which torch.compile compiled (a script's last, smaller batch of an epoch, say,
  after the warm-up) is timed again once, at once: a long run compiles that graph once.

Steps and windows are timed on the training clock (`training_clock`): what a script does
outside its training (its evaluation between epochs) is no step's time, and what it compiles
there no window's compile.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.stats import median_precision
from autotune.trial import training_clock
from autotune.trial.compile_events import CompileCount
from autotune.trial.contention import Contention, ContentionProbe, same_load, similar_shares
from autotune.trial.protocol import (
    LOADER_BOUND_SHARE,
    LOADER_TURN_SLACK,
    loader_round_steps,
    loader_turn_steps,
)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Window:
    """One timed window's figures and what else ran meanwhile."""

    seconds: float
    samples: int
    data_wait_s: float
    step_times: list[float]
    final_loss: float | None
    loss_finite: bool
    contention: Contention
    compiled: CompileCount  # graphs compiled and CUDA graphs recorded in its training

    @property
    def samples_per_sec(self) -> float:
        return self.samples / max(self.seconds, 1e-9)

    @property
    def compiling(self) -> bool:
        """torch.compile compiled a graph or recorded a CUDA graph inside the window: its time
        is not the steady step's."""
        return self.compiled.graphs > 0 or bool(self.compiled.cudagraph_recordings)


def screens_out(window: Window, below: float | None, load: float = 0.0) -> bool:
    """Whether a screening window's rate puts its configuration out as too slow: below the
    threshold, on a window no compile slowed, and no other process either, unless the bar was
    measured beside about the same load (`load`, its share of the CPUs): beside a steady load
    every window is disturbed, and per_feature_towers at dbe2c50 measured in full (45 s) a
    configuration at 405 samples/s against a bar of 2,280 set at the same load. A load the
    bar did not see is no like-for-like comparison: one busy process slows two intra-op
    threads on two cores 8.5x (results/contention_wall.json)."""
    if below is None or window.compiling or window.samples_per_sec >= below:
        return False
    beside = window.contention
    if not beside.disturbed:
        return True
    return load > 0 and beside.other_cpu_share is not None and \
        not beside.device_other_processes and similar_shares(beside.other_cpu_share, load)


# A warm-up step (nothing compiled in it) this many times slower than the screening's bar ends
# the warm-up as `hopeless`: the configuration is screened on one step, not warmed up to steady
# and screened on three (bf16 on a CPU without native bf16, 16 s a step: about two minutes).
FAR_BELOW = 2.0


class WarmUp:
    """Warm-up, told each step's (synchronised) time and samples: `done` once steady, at a
    cap, or `hopeless`: a step far below the screening's bar (`FAR_BELOW`)."""

    def __init__(self, settings: MeasureSettings) -> None:
        self.settings = settings
        self.times: list[float] = []
        self.steady = False
        self.hopeless = False
        self.done = settings.warmup_max_steps <= 0 or settings.warmup_max_seconds <= 0
        self._quiet_since = 0  # steps before this one compiled something
        self._compiled = training_clock.compiles()
        self._start = time.perf_counter()

    def step(self, step_s: float, samples: int) -> None:
        settings, times = self.settings, self.times
        times.append(step_s)
        compiled = training_clock.compiles()
        if compiled != self._compiled:
            self._quiet_since, self._compiled = len(times), compiled
        recent = times[-settings.steady_steps:]
        quiet = len(times) - self._quiet_since
        self.steady = quiet >= settings.steady_steps and \
            max(recent) <= min(recent) * (1 + settings.steady_tolerance)
        bar = settings.screen_below if settings.screen_steps > 0 else None
        self.hopeless = bar is not None and quiet > 0 and samples * FAR_BELOW < bar * step_s
        self.done = self.steady or self.hopeless or len(times) >= settings.warmup_max_steps or \
            time.perf_counter() - self._start >= settings.warmup_max_seconds


class _StepClock:
    """Per-step times of a window: CUDA events, read only once completed so that nothing
    waits on the device, or the host clock on CPU; less the time the script spent outside its
    training between the two marks (`training_clock`)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []
        self.outside: list[float] = []
        self.done: list[float] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())
        self.outside.append(training_clock.outside_s())

    def times(self) -> list[float]:
        """Step times known so far (all of them once the device is synchronised)."""
        while len(self.done) < len(self.marks) - 1:
            i = len(self.done)
            a, b = self.marks[i], self.marks[i + 1]
            if not self.cuda:
                step_s = b - a
            elif b.query():
                step_s = a.elapsed_time(b) / 1000
            else:
                break
            self.done.append(max(0.0, step_s - (self.outside[i + 1] - self.outside[i])))
        return self.done


# A loader-bound turn ends on a whole round of its workers within this many times its cap.
LOADER_ROUND_SLACK = 2.0


class WindowTimer:
    """One timed window, started at a step boundary and told each step after it: `step`
    says when the window is full; `finish` synchronises and reads it."""

    def __init__(self, settings: MeasureSettings, device: torch.device,
                 probe: ContentionProbe) -> None:
        self.settings, self.device, self.probe = settings, device, probe
        self.clock = _StepClock(device)
        self.samples, self.data_wait_s, self.steps = 0, 0.0, 0
        self._lengthening = False
        self._check_at = settings.window_steps  # precision checked after ~10% more steps
        self._finite: torch.Tensor | None = None  # all losses so far, without a sync
        self._loss: torch.Tensor | None = None
        self._compiled = training_clock.compiles()
        synchronize(device)
        probe.start()
        self.start = training_clock.now()
        self.clock.mark()

    def step(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        """Count a step that just ended; True once the window is full."""
        settings = self.settings
        if loss is not None:
            finite = torch.isfinite(loss.detach()).all()
            self._finite = finite if self._finite is None else self._finite & finite
            self._loss = loss
        self.samples += samples
        self.data_wait_s += data_wait_s
        self.clock.mark()
        self.steps += 1
        elapsed = training_clock.now() - self.start
        if self.steps < settings.window_steps or elapsed < settings.window_seconds:
            return False
        if self.data_wait_s >= LOADER_BOUND_SHARE * elapsed and (
                (self.steps < settings.window_loader_steps and
                 elapsed < settings.window_max_seconds) or
                (self.steps % settings.window_loader_round and
                 elapsed < LOADER_ROUND_SLACK * settings.window_max_seconds)):
            return False
        capped = self.steps >= settings.window_max_steps or \
            elapsed >= settings.window_max_seconds
        if capped or (not self._lengthening and self.probe.disturbed_so_far()):
            return True
        self._lengthening = True
        if self.steps < self._check_at:
            return False
        self._check_at = self.steps + max(1, self.steps // 10)
        precision = median_precision(self.clock.times())
        return precision is not None and precision <= settings.window_precision

    def finish(self) -> Window:
        synchronize(self.device)
        seconds = training_clock.now() - self.start
        contention = self.probe.stop()
        loss = self._loss
        return Window(seconds, self.samples, self.data_wait_s, self.clock.times(),
                      float(loss.detach().float().sum()) if loss is not None else None,
                      bool(self._finite) if self._finite is not None else True, contention,
                      training_clock.compiles() - self._compiled)


def turn_settings(settings: MeasureSettings, steps: int, seconds: float,
                  config: TrainConfig | None = None) -> MeasureSettings:
    """A warm process's turn: a window of exactly `steps` steps or `seconds`, whichever is
    longer (no lengthening for precision: the rounds give the interval); of a `config` with
    loader workers, one that waited on them goes on to `loader_turn_steps`, within
    `LOADER_TURN_SLACK` x `seconds`, and ends on a whole round of them (`loader_round_steps`)."""
    loader_steps = loader_turn_steps(config) if config else 0
    cap = seconds * LOADER_TURN_SLACK if loader_steps else seconds
    return replace(settings, window_steps=steps, window_seconds=seconds, window_max_seconds=cap,
                   window_max_steps=steps, window_loader_steps=loader_steps,
                   window_loader_round=loader_round_steps(config) if config else 1)


def screen_settings(settings: MeasureSettings, hopeless: bool = False) -> MeasureSettings:
    """The screening window: `screen_steps` steps, however long they take; one step after a
    `hopeless` warm-up (`WarmUp`)."""
    steps = 1 if hopeless else settings.screen_steps
    return replace(settings, window_steps=steps, window_seconds=0.0, window_max_steps=steps)


class Remeasures:
    """The timed windows of one measurement, and whether to time another: `add` each window;
    True means wait was rewarded with a quiet machine, so time the window again (after
    `steady_steps` untimed steps). `seen`: what ran beside the warm-up and the screening."""

    def __init__(self, settings: MeasureSettings, probe: ContentionProbe,
                 seen: Contention | None, report: Callable[[str], None]) -> None:
        self.settings, self.probe, self.seen, self.report = settings, probe, seen, report
        self.windows: list[Window] = []
        self._retry = 0
        self._steady = False
        self._retimed_compile = False

    def add(self, window: Window) -> bool:
        settings, windows = self.settings, self.windows
        windows.append(window)
        if window.compiling and not self._retimed_compile:
            self._retimed_compile = True
            self.report("torch.compile compiled in the window: timing it again")
            return True
        if len(windows) == 1 and self.seen is not None and \
                same_load(self.seen, window.contention):
            self._steady = True
            self.report(f"{window.contention.describe()} in the window, as in the warm-up: "
                        "the machine's steady load, kept and flagged")
        if self._steady:
            return False
        while self._retry < settings.contention_retries:
            if not windows[-1].contention.disturbed or \
                    len(windows) - self._retimed_compile > settings.contention_remeasures:
                return False
            wait_s = settings.contention_backoff_s * 2**self._retry
            self._retry += 1
            self.report(f"{windows[-1].contention.describe()} in the window: waiting up to "
                        f"{wait_s:g} s for a quiet moment to measure it again")
            if self.probe.wait_for_quiet(wait_s):
                self.report("re-measuring the window")
                return True
        return False

    @property
    def kept(self) -> Window:
        """The first clean window without a compile, else the least disturbed."""
        return min(self.windows, key=lambda w: (w.compiling, w.contention.disturbed,
                                                w.contention.other_cpu_share or 0.0))

    @property
    def load(self) -> float | None:
        """The least share other processes took of any window (or of the warm-up)."""
        shares = [c.other_cpu_share for c in self._every() if c.other_cpu_share is not None]
        return min(shares, default=None)

    @property
    def steady_load(self) -> bool:
        """Every window, and the warm-up, saw a load: the machine's state."""
        return all(c.disturbed for c in self._every())

    def _every(self) -> list[Contention]:
        return [w.contention for w in self.windows] + \
            ([self.seen] if self.seen is not None else [])
