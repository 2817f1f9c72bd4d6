"""Never seen by autotune before issue 38's bar: a tabular model with one small tower per input
feature (120 features, each embedded by its own two-layer MLP, then mixed): hundreds of small
parameter tensors, stepped by the AdamW its author wrote years ago, one tensor at a time."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 64, "optimizer_impl": "for_loop"}


class Towers(nn.Module):
    def __init__(self, features: int, width: int) -> None:
        super().__init__()
        self.towers = nn.ModuleList(
            nn.Sequential(nn.Linear(1, width), nn.Tanh(), nn.Linear(width, width))
            for _ in range(features))
        self.head = nn.Linear(features * width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = [tower(x[:, i:i + 1]) for i, tower in enumerate(self.towers)]
        return self.head(torch.cat(parts, dim=1)).squeeze(1)


def build_model(features: int = 120, width: int = 8) -> nn.Module:
    return Towers(features, width)


def build_dataset(features: int = 120, rows: int = 16_384) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, features, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :8].sum(dim=1))


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)
