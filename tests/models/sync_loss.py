"""A regression model whose loss reads every row's error back to the host with .item()."""

import torch
from torch import nn


def build_model(dim: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 1))


def build_dataset(dim: int = 16, num_samples: int = 512) -> torch.utils.data.Dataset:
    x = torch.randn(num_samples, dim, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    pred = model(x)
    worst = 0.0
    for row in range(pred.shape[0]):
        worst = max(worst, (pred[row] - y[row]).abs().item())
    return nn.functional.mse_loss(pred, y)


BASELINE = {"micro_batch_size": 16}
