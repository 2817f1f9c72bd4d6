"""The training clock: what a script compiles outside its training (an evaluation under
no_grad) is no window's compile."""

from __future__ import annotations

import torch
from torch import nn

from autotune.trial import training_clock
from autotune.trial.compile_events import compile_count


def test_what_compiles_while_the_training_is_paused_is_not_the_trainings() -> None:
    torch._dynamo.reset()
    model = torch.compile(nn.Linear(4, 4), backend="eager", dynamic=False)
    before, total = training_clock.compiles(), compile_count()
    model(torch.ones(1, 4))  # the training's graph
    training_clock.pause()
    with torch.no_grad():  # an evaluation: a graph of its own
        model(torch.ones(3, 4))
    assert (training_clock.compiles() - before).graphs == 1  # a pause still open counted
    training_clock.resume()
    model(torch.ones(2, 4))  # a new shape in the training: its graph
    assert (compile_count() - total).graphs == 3
    assert (training_clock.compiles() - before).graphs == 2
