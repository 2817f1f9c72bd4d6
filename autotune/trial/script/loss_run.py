"""A training script's loss run (`trial/loss_run`'s, through the library's own loop): the script
run with the configuration's numerics from one seed, stopped after `steps` optimizer steps, its
loss read from what the library's loop computed.

A script builds its own model, data and loader, so the run cannot be given weights and batches
as a model file's is: it is given the seed instead (`loss_run.seed_everything` before the script
starts; a Hugging Face Trainer's `TrainingArguments.seed`, which seeds its weights' dropout and
its sampler), and a script that seeds itself keeps its own. Two runs of one seed at one split of
the step then take the same batches, so the configuration's run and the user's settings' are
paired. There is no held set to read the loss on: the loss is the training loss, the mean of the
first and of the last `TAIL` share of the steps (`LOSS_TAIL_STEPS` at least)."""

from __future__ import annotations

import time

import torch

from autotune.trial import distributed
from autotune.trial.protocol import LossRun, LossRunSettings
from autotune.trial.script.observer import TrainInfo

# The share of the steps whose training loss is averaged into the loss before and after, and
# the fewest steps that makes (a run of fewer than twice as many steps compares nothing).
TAIL = 0.2
LOSS_TAIL_STEPS = 5


class LossRunObserver:
    """The library's loop told of each optimizer step: its loss kept, the loop stopped after
    `settings.steps` steps."""

    def __init__(self, settings: LossRunSettings, device: torch.device) -> None:
        self.settings, self.device = settings, device
        self.losses: list[torch.Tensor] = []
        self._start = time.perf_counter()

    def on_train_start(self, info: TrainInfo) -> None:
        pass

    def on_step_end(self, samples: int, loss: torch.Tensor | None, data_wait_s: float) -> bool:
        if loss is None:
            raise RuntimeError("the script's library gives no loss of its steps: its loss "
                               "cannot be compared")
        self.losses.append(loss.detach().float().reshape(()).to(self.device))
        return distributed.decided(len(self.losses) >= self.settings.steps)

    def on_train_end(self) -> None:
        pass

    def result(self) -> LossRun:
        steps = len(self.losses)
        tail = max(LOSS_TAIL_STEPS, round(steps * TAIL))
        if steps < 2 * tail:
            raise RuntimeError(f"the script's training ended after {steps} optimizer steps: "
                               f"its loss is compared over {2 * tail} at least")
        losses = torch.stack(self.losses).cpu()
        initial, final = float(losses[:tail].mean()), float(losses[-tail:].mean())
        return LossRun(seed=self.settings.seed, steps=steps, initial_loss=initial,
                       final_loss=final, train_loss=final,
                       finite=bool(torch.isfinite(losses).all()),
                       seconds=time.perf_counter() - self._start)
