"""A deep stack of narrow layers trained in micro-batches of 4 with 16 accumulation steps: each
layer's few microseconds of work cost less than the operator's own dispatch, so the step's time
is the number of forward and backward calls, and a larger micro-batch (fewer accumulation
steps for the same effective batch) does the same work in a fraction of the calls. Written for
issue 31's sweep: one knob (`micro_batch_size`) worth much on its own."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 4, "grad_accum_steps": 16}


def build_model(width: int = 16, depth: int = 48) -> nn.Module:
    layers = [m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def build_dataset(width: int = 16, size: int = 4096) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(size, width, generator=g),
                                          torch.randint(0, 10, (size,), generator=g))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
