"""A model whose step is a long chain of elementwise operations on small activations: eager
PyTorch dispatches each operation on its own (microseconds of overhead for a few hundred
numbers of work), where torch.compile fuses the chain into a few loops. Its micro-batch is
already the whole batch, so a larger one is no way out. Written for issue 31's sweep: one knob
(`compile_mode`) worth much on its own."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 64, "grad_accum_steps": 1}


class Chain(nn.Module):
    def __init__(self, width: int, links: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.head = nn.Linear(width, 10)
        self.links = links

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.links):
            x = torch.tanh(x * self.scale + 0.01 * i) * torch.sigmoid(x) + 0.5 * x
        return self.head(x)


def build_model(width: int = 32, links: int = 40) -> nn.Module:
    return Chain(width, links)


def build_dataset(width: int = 32, size: int = 4096) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(size, width, generator=g),
                                          torch.randint(0, 10, (size,), generator=g))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
