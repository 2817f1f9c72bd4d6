"""A training script as a warm process (`autotune.trial.warm`): its own loop runs the first step
and warms up as a trial's does (`MeasuringObserver`), then pauses at a step boundary (blocked in
the library's step callback) until the tuner asks for a turn: at least N optimizer steps and S
seconds timed as a model file's turn is (`measure.timed_turn`: the batches its loader workers
prefetched while paused taken untimed first, data loading included, a turn that waits on its
workers on to many batches of each, the contention probe around it, the tuner's other warm
processes its own), answered as a `WarmTurn`; or a profiler trace of a few steps; or `stop`,
which ends the loop as a trial's end does. So a script's candidates take paired turns seconds
apart, as a model file's do, instead of a fresh run of the script each round. In a process group
every rank's loop pauses at the same step: each is told the same commands (`trial.warm` reads
them on rank 0), every decision to end a turn is rank 0's, and the turn is the group's
(`group_turn`). A turn in which torch.compile compiled (the script's smaller last batch of an
epoch) is timed again once, at once, as a trial's window is (`window.Remeasures`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, replace
from typing import Any

import torch

from autotune.config import TrainConfig
from autotune.hardware import describe, peak_flops
from autotune.options import MeasureSettings
from autotune.trial import distributed
from autotune.trial.contention import ContentionProbe
from autotune.trial.measure import group_turn, peak_memory, utilization
from autotune.trial.profiling import ProfilerWindow
from autotune.trial.protocol import ScriptAnswer, WarmTurn, prefetched_steps
from autotune.trial.script.measuring import FIRST, WARMUP, MeasuringObserver
from autotune.trial.script.observer import TrainInfo
from autotune.trial.window import WindowTimer, turn_settings

STOP = "stop"


class TurnObserver:
    """The `StepObserver` of a script's warm process: warm-up as a trial's, then turns on
    request, each step boundary between them a pause in the script's own loop. `config`, what
    the script trains (None where not known): the precision of the peak its MFU divides by,
    and the loader workers its turns drain and span."""

    def __init__(self, settings: MeasureSettings, device: torch.device,
                 commands: Iterator[Any], say: Callable[[Any], None],
                 tuner_pid: int | None = None, config: TrainConfig | None = None,
                 answer: ScriptAnswer | None = None) -> None:
        self.settings, self.device = settings, device
        self.commands, self._say = commands, say
        # FLOPs counted where a trial's are (on CUDA), for each turn's MFU
        self.warming = MeasuringObserver(settings, device, count_flops=device.type == "cuda")
        self.peak = peak_flops(describe(device), config.precision) if config else None
        self.config = config
        self.prefetched = prefetched_steps(config) if config else 0
        self.tuner_pid = tuner_pid
        self.answer = answer
        self.ready = False
        self.steps = 0  # the script's optimizer steps so far
        self.stopped = False  # by `stop` (or the tuner gone), not by the script's own end
        self._asked: MeasureSettings | None = None  # the turn asked for, its timer not started
        self._untimed = 0  # steps of it still to take before its timer starts
        self._turn: WindowTimer | None = None
        self._retimed = False  # this turn was timed again after a compile
        self._trace: tuple[ProfilerWindow, str] | None = None

    def on_train_start(self, info: TrainInfo) -> None:
        self.warming.on_train_start(info)

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        self.steps += 1
        if not self.ready:
            self.warming.on_step_end(samples, loss, data_wait_s)
            if self.warming.phase in (FIRST, WARMUP):
                return False
            self.ready = True
            print(f"autotune warm: the script's loop steady after "
                  f"{len(self.warming.warm.times)} steps", flush=True)
            self._say({"ready": True,
                       "script_answer": asdict(self.answer) if self.answer else None})
            return self._next()
        if self._trace is not None:
            return self._traced()
        if self._untimed:
            self._untimed -= 1
            if not self._untimed:
                self._start_turn()
            return False
        turn = self._turn
        assert turn is not None
        if not distributed.decided(turn.step(samples, loss, data_wait_s)):
            return False
        window = turn.finish()
        if not self._retimed and distributed.decided(window.compiling):
            self._retimed = True
            self._turn = WindowTimer(turn.settings, self.device, turn.probe)
            return False
        mine = WarmTurn(samples=window.samples, seconds=window.seconds,
                        peak_memory_bytes=peak_memory(self.device).peak,
                        disturbed=window.contention.disturbed, loss_finite=window.loss_finite,
                        load=window.contention.other_cpu_share)
        group = group_turn(mine, distributed.current())
        mfu = utilization(self.warming.flops, group.samples_per_sec, self.peak)
        self._say(replace(group, mfu=mfu).to_json())
        return self._next()

    def on_train_end(self) -> None:
        """The script's own run ended (its steps ran out): `trial.warm` tells the tuner so."""

    def _next(self) -> bool:
        """Wait, paused at this step boundary, for the tuner's next request; True (stop the
        loop) on `stop` or when the tuner is gone."""
        command = next(self.commands, STOP)
        if command == STOP:
            self.stopped = True
            return True
        if "trace" in command:
            world = distributed.current()
            window = ProfilerWindow(max(1, self.settings.profile_steps), self.device,
                                    command["trace"] if world is None or world.rank == 0
                                    else None)
            window.start()
            self._trace = (window, command["trace"])
            return False
        self._retimed = False
        self._asked = turn_settings(self.settings, int(command["steps"]),
                                    float(command["seconds"]), self.config)
        self._untimed = self.prefetched
        if not self._untimed:
            self._start_turn()
        return False

    def _start_turn(self) -> None:
        """Start timing the turn asked for, at this step boundary."""
        assert self._asked is not None
        probe = ContentionProbe(self.settings.contention_threshold, self.device,
                                family=self.tuner_pid)
        self._turn = WindowTimer(self._asked, self.device, probe)

    def _traced(self) -> bool:
        assert self._trace is not None
        window, path = self._trace
        if not window.step_done():
            return False
        window.summary()
        self._trace = None
        self._say({"trace": path})
        return self._next()
