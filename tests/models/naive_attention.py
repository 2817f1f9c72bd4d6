"""Attention written the slow way: queries and keys repeated to (B, T, T, D), multiplied
element-wise and summed, as in hand-written graph attention before fused kernels."""

import torch
from torch import nn


class NaiveAttention(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        t = x.shape[1]
        q = q.unsqueeze(2).repeat(1, 1, t, 1)
        k = k.unsqueeze(1).repeat(1, t, 1, 1)
        scores = (q * k).sum(-1).softmax(-1)
        return self.out(scores @ v)


class Model(nn.Module):
    def __init__(self, dim: int, layers: int):
        super().__init__()
        self.blocks = nn.ModuleList(NaiveAttention(dim) for _ in range(layers))
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return nn.functional.mse_loss(self.head(x).squeeze(-1), y)


def build_model(dim: int = 32, layers: int = 2, **_: object) -> nn.Module:
    return Model(dim, layers)


def build_dataset(dim: int = 32, seq: int = 96, num_samples: int = 256,
                  **_: object) -> torch.utils.data.Dataset:
    x = torch.randn(num_samples, seq, dim, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.TensorDataset(x, x.mean(-1))


BASELINE = {"micro_batch_size": 4}
