"""A model whose work is a long chain of elementwise operations on wide activations: eager
PyTorch reads and writes the whole tensor once per operation, where torch.compile fuses the
chain into one loop over it. Written for issue 31's sweep: one knob (`compile_mode`) worth much
on its own."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 64}


class Chain(nn.Module):
    def __init__(self, width: int, links: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.head = nn.Linear(width, 10)
        self.links = links

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.links):
            x = torch.tanh(x * self.scale + 0.1 * i) * torch.sigmoid(x) + x.sin() * 0.5
        return self.head(x)


def build_model(width: int = 4096, links: int = 12) -> nn.Module:
    return Chain(width, links)


def build_dataset(width: int = 4096, size: int = 2048) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(size, width, generator=g),
                                          torch.randint(0, 10, (size,), generator=g))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
