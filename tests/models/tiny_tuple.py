"""A user's model with tuple batches and its own `loss_fn` (the model returns logits)."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 16}


def build_model(dim: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, 64), nn.ReLU(), nn.Linear(64, 3))


def build_dataset(dim: int = 16, size: int = 2048) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, dim, generator=g)
    return torch.utils.data.TensorDataset(x, (x.sum(dim=1) > 0).long() + (x[:, 0] > 1).long())


def loss_fn(model: nn.Module, batch: tuple) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
