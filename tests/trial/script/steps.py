"""A test's stand-in for the measurement: counts the optimizer steps the library reports and
stops it after a few, recording what each one saw, from inside the run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autotune.config import TrainConfig
from autotune.trial.script.job import script_arguments
from autotune.trial.script.libraries import library_of
from autotune.trial.script.observer import TrainInfo
from autotune.trial.script.runner import ScriptRun, run_script
from autotune.trial.script.session import ScriptBaseline, ScriptTrial

SCRIPTS = Path(__file__).resolve().parents[2] / "models" / "scripts"


class CountingObserver:
    """Stops after `steps` optimizer steps. Records each step's samples, loss and data wait, the
    autocast dtype a linear layer ran under, and the gradient norm the optimizer stepped with
    (after whatever clipping the library did: read once the step is done, before the
    gradients are zeroed)."""

    def __init__(self, steps: int = 3) -> None:
        self.steps = steps
        self.samples: list[int] = []
        self.losses: list[torch.Tensor | None] = []
        self.waits: list[float] = []
        self.step_ends: list[float] = []
        self.autocast: set[torch.dtype | None] = set()
        self.grad_norms: list[float] = []
        self.lrs: list[float] = []
        self.info: TrainInfo | None = None
        self.ended = False

    def on_train_start(self, info: TrainInfo) -> None:
        self.info = info
        linear = next(m for m in info.model.modules() if isinstance(m, nn.Linear))
        device = info.device.type
        linear.register_forward_pre_hook(lambda module, args: self.autocast.add(
            torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None))
        if info.optimizer is not None:
            info.optimizer.register_step_post_hook(self._grad_norm)

    def _grad_norm(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"]
                 if p.grad is not None]
        self.grad_norms.append(float(torch.nn.utils.get_total_norm(grads)))
        self.lrs.append(float(optimizer.param_groups[0]["lr"]))

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        self.samples.append(samples)
        self.losses.append(loss)
        self.waits.append(data_wait_s)
        self.step_ends.append(time.perf_counter())
        return len(self.samples) >= self.steps

    def on_train_end(self) -> None:
        self.ended = True


def run(script: str | Path, argv: list[str], scratch: Path, config: TrainConfig | None = None,
        device: str = "cpu", steps: int = 3, own: ScriptBaseline | None = None,
        flag_map: dict[str, str] | None = None,
        candidates: dict | None = None) -> tuple[ScriptRun, CountingObserver]:
    """Run a script under a trial whose observer stops it after `steps` steps; a trial of
    `config` over the script's own settings `own` (as its probe read them) sets the script's
    flags as a trial does."""
    observer = CountingObserver(steps)
    argv, flags_set = script_arguments(argv, config, own, device)
    trial = ScriptTrial(torch.device(device), observer, scratch, config=config,
                        library=library_of(own.library) if own is not None else None, own=own,
                        flag_map=flag_map or {}, flags_set=flags_set,
                        candidates=candidates or {})
    path = script if Path(script).is_absolute() else SCRIPTS / script
    return run_script(path, argv, trial), observer
