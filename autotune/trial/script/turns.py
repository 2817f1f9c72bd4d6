"""A training script as a warm process (`autotune.trial.warm`): its own loop runs the first
step and warms up as a trial's does (`MeasuringObserver`), then pauses at a step boundary
(blocked in the library's step callback) until the tuner asks for a turn: at least N optimizer
steps and S seconds timed as a window is (data loading included, the contention probe around
it, the tuner's other warm processes its own), answered as a `WarmTurn`; or a profiler trace of
a few steps; or `stop`, which ends the loop as a trial's end does. So a script's candidates
take paired turns seconds apart, as a model file's do, instead of a fresh run of the script
each round."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import IO, Any

import torch

from autotune.options import MeasureSettings
from autotune.trial.contention import ContentionProbe
from autotune.trial.measure import peak_memory, synchronize
from autotune.trial.profiling import ProfilerWindow
from autotune.trial.protocol import WarmTurn
from autotune.trial.script.measuring import FIRST, WARMUP, MeasuringObserver
from autotune.trial.script.observer import TrainInfo

STOP = "stop"


@dataclass
class _Turn:
    """One turn under way: what it was asked, and what it has counted."""

    min_steps: int
    min_seconds: float
    probe: ContentionProbe
    began: float
    steps: int = 0
    samples: int = 0
    losses: list[torch.Tensor] = field(default_factory=list)


class TurnObserver:
    """The `StepObserver` of a script's warm process: warm-up as a trial's, then turns on
    request, each step boundary between them a pause in the script's own loop."""

    def __init__(self, settings: MeasureSettings, device: torch.device, commands: IO[str],
                 answers: IO[str], tuner_pid: int | None = None) -> None:
        self.settings, self.device = settings, device
        self.commands, self.answers = commands, answers
        self.warming = MeasuringObserver(settings, device)
        self.tuner_pid = tuner_pid
        self.ready = False
        self._turn: _Turn | None = None
        self._trace: tuple[ProfilerWindow, str] | None = None

    def on_train_start(self, info: TrainInfo) -> None:
        self.warming.on_train_start(info)

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        if not self.ready:
            self.warming.on_step_end(samples, loss, data_wait_s)
            if self.warming.phase in (FIRST, WARMUP):
                return False
            self.ready = True
            print(f"autotune warm: the script's loop steady after "
                  f"{len(self.warming.warmup_times)} steps", flush=True)
            self._say({"ready": True})
            return self._next()
        if self._trace is not None:
            return self._traced()
        turn = self._turn
        assert turn is not None
        turn.steps += 1
        turn.samples += samples
        if loss is not None:
            turn.losses.append(loss.detach().float().sum())
        synchronize(self.device)
        elapsed = time.perf_counter() - turn.began
        if turn.steps < turn.min_steps or elapsed < turn.min_seconds:
            return False
        finite = bool(torch.isfinite(torch.stack(turn.losses).sum())) if turn.losses else True
        self._say(WarmTurn(samples=turn.samples, seconds=elapsed,
                           peak_memory_bytes=peak_memory(self.device).peak,
                           disturbed=turn.probe.stop().disturbed,
                           loss_finite=finite).to_json())
        return self._next()

    def on_train_end(self) -> None:
        """The script's own run ended (its steps ran out): the tuner sees the process exit."""

    def _next(self) -> bool:
        """Wait, paused at this step boundary, for the tuner's next request; True (stop the
        loop) on `stop` or when the tuner is gone."""
        line = self.commands.readline()
        command = json.loads(line) if line.strip() else STOP
        if command == STOP:
            return True
        if "trace" in command:
            window = ProfilerWindow(max(1, self.settings.profile_steps), self.device,
                                    command["trace"])
            window.start()
            self._trace = (window, command["trace"])
            return False
        probe = ContentionProbe(self.settings.contention_threshold, self.device,
                                family=self.tuner_pid)
        synchronize(self.device)
        probe.start()
        self._turn = _Turn(int(command["steps"]), float(command["seconds"]), probe,
                           time.perf_counter())
        return False

    def _traced(self) -> bool:
        assert self._trace is not None
        window, path = self._trace
        if not window.step_done():
            return False
        window.summary()
        self._trace = None
        self._say({"trace": path})
        return self._next()

    def _say(self, message: Any) -> None:
        self.answers.write(json.dumps(message) + "\n")
        self.answers.flush()
