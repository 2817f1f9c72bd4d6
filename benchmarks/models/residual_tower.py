"""A tower of many tiny residual blocks (each a LayerNorm and two small Linears: hundreds of
small parameter tensors), trained with the for-loop AdamW: the kind of model whose optimizer
step is dominated by per-tensor overhead, so that one knob (AdamW's implementation) is worth
much on its own. Never tuned by this project before issue 31's bar."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 16, "optimizer_impl": "for_loop"}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Tower(nn.Module):
    def __init__(self, width: int, depth: int, classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model(width: int = 32, depth: int = 96, classes: int = 10) -> nn.Module:
    return Tower(width, depth, classes)


def build_dataset(width: int = 32, classes: int = 10, size: int = 8192):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, width, generator=g)
    return torch.utils.data.TensorDataset(x, torch.randint(0, classes, (size,), generator=g))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
