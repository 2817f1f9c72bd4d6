"""Model FLOPs as MFU counts them: a forward and its backward, never activation checkpointing's
recompute, whichever way the model checkpoints."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from autotune.trial.flops import ModelFlopCounter, StepFlops

BATCH, WIDTH, HIDDEN = 8, 64, 256
# Three linear layers, forward 2 x batch x (in x out) each, backward twice that; the first
# layer's input needs no gradient, so its backward is one matmul, not two.
EXPECTED = 6 * BATCH * (WIDTH * WIDTH + 2 * WIDTH * HIDDEN) - 2 * BATCH * WIDTH * WIDTH


class Checkpointed(nn.Module):
    """A linear layer, then an MLP whose activations are recomputed in the backward."""

    def __init__(self, use_reentrant: bool | None) -> None:
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.up, self.down = nn.Linear(WIDTH, HIDDEN), nn.Linear(HIDDEN, WIDTH)
        self.use_reentrant = use_reentrant

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        if self.use_reentrant is None:
            return self.mlp(x)
        return checkpoint(self.mlp, x, use_reentrant=self.use_reentrant)


def _step(model: nn.Module) -> None:
    model(torch.randn(BATCH, WIDTH)).pow(2).mean().backward()


@pytest.mark.parametrize("use_reentrant", [None, True, False])
def test_checkpointing_recompute_is_not_model_flops(use_reentrant) -> None:
    model = Checkpointed(use_reentrant)
    counter = ModelFlopCounter()
    with counter:
        _step(model)
    assert counter.get_total_flops() == EXPECTED
    if use_reentrant is not None:  # the recompute is there, and torch's own counter counts it
        plain = FlopCounterMode(display=False)
        with plain:
            _step(model)
        assert plain.get_total_flops() > EXPECTED


def test_a_step_is_counted_from_one_boundary_to_the_next_over_its_samples() -> None:
    model = Checkpointed(use_reentrant=False)
    counting = StepFlops()
    _step(model)
    _step(model)  # two micro-batches of one optimizer step
    flops = counting.stop(samples=2 * BATCH)
    assert flops is not None and flops.source == "counted"
    assert flops.per_sample == EXPECTED / BATCH
    assert torch._C._len_torch_dispatch_stack() == 0  # later steps run without it
    # a loop that ended inside the counted step trained no samples: no figure
    assert StepFlops().stop(samples=0) is None
