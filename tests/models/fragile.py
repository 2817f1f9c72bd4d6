"""A model whose loss goes non-finite under some settings only, as numerically fragile models
do: bf16 rounds away the small margin its loss takes the log of (log 0 = -inf), and its summed
loss overflows fp32 once a micro-batch holds `overflow_at` samples or more."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 8, "grad_accum_steps": 8}


class Fragile(nn.Module):
    def __init__(self, dim: int, overflow_at: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(2))
        self.head = nn.Linear(dim, 1)
        # 2 ** (128 / overflow_at) per sample: the product over a micro-batch is fp32's inf
        # at overflow_at samples (2 ** 128), finite below it.
        self.growth = 2.0 ** (128 / overflow_at)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.relu(block(x))
        out = self.head(x).squeeze(1)
        margin = (out * 0 + 1 + 1e-3) - 1  # 1e-3 in fp32; 0 in bf16, whose step near 1 is 1/128
        loss = ((out - y) ** 2).mean() - torch.log(margin).mean()
        return loss * (torch.tensor(self.growth) ** len(y)) / 2.0 ** 60


def build_model(dim: int = 8, overflow_at: int = 32) -> nn.Module:
    return Fragile(dim, overflow_at)


def build_dataset(dim: int = 8, size: int = 512) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, dim, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1))
