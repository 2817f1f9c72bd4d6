"""Losses of a few training steps on fixed global batches, as one process or as a rank of a
process group (run by torchrun): what tests/trial/test_distributed.py compares.

    python group_losses.py OUT.json PARALLELISM ACCUM
    python -m torch.distributed.run --nproc-per-node 2 group_losses.py OUT.json ddp ACCUM
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune.config import TrainConfig
from autotune.trial import distributed
from autotune.trial.training import setup_training

GLOBAL_MICRO = 8  # samples per micro-step, over all ranks
STEPS = 4


class Stack(nn.Module):
    """Repeated blocks (FSDP shards each) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh())
                                    for _ in range(3))
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(out: str, parallelism: str, accum: int) -> None:
    world = distributed.join("cpu")
    ranks, rank = (world.size, world.rank) if world else (1, 0)
    torch.manual_seed(0)
    model = Stack()
    data = torch.Generator().manual_seed(1)
    xs = torch.randn(STEPS * accum * GLOBAL_MICRO, 16, generator=data)
    ys = torch.randn(STEPS * accum * GLOBAL_MICRO, 1, generator=data)
    config = TrainConfig(micro_batch_size=GLOBAL_MICRO // ranks, grad_accum_steps=accum,
                         parallelism=parallelism)
    setup = setup_training(model, TensorDataset(xs, ys), config, "cpu", world=world,
                           loss_fn=lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]))
    # The same global micro-batches in order; each rank takes its share of every one.
    micro = [(x[rank::ranks], y[rank::ranks]) for x, y in
             zip(xs.split(GLOBAL_MICRO), ys.split(GLOBAL_MICRO))]
    batches = iter(micro)
    losses = []
    for _ in range(STEPS):
        loss = setup.step(batches).loss
        if world is not None:
            torch.distributed.all_reduce(loss)
            loss /= ranks
        losses.append(float(loss))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(losses, f)
    if world is not None:
        # as autotune's trial children do: DDP and fully_shard keep gloo's worker threads alive,
        # and one still letting go of a tensor as the interpreter exits aborts the rank
        os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
