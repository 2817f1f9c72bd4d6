"""A linear regression whose targets sit on a large offset: fitting them needs more precision
than bf16's 8-bit mantissa holds there (its step near 256 is 2), so under bf16 the loss
plateaus far above fp32's, never NaN. With `offset=0` bf16 learns as fp32 does.

Its forward does extra work outside autocast (`fp32_cost_s` of sleep per call): a stand-in for
a model that bf16 runs faster, so that bf16 is the faster on any CPU."""

import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 64}


class Regression(nn.Module):
    def __init__(self, dim: int, offset: float, fp32_cost_s: float) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, 1)
        self.offset, self.fp32_cost_s = offset, fp32_cost_s

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(x.device.type):
            time.sleep(self.fp32_cost_s)
        out = self.linear(x).squeeze(1) + self.offset  # bf16 under autocast: rounded to 2
        return nn.functional.mse_loss(out.float(), y)


def build_model(dim: int = 16, offset: float = 256.0, fp32_cost_s: float = 0.02) -> nn.Module:
    return Regression(dim, offset, fp32_cost_s)


def build_optimizer(params, **flags):
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.0, **flags)


def build_dataset(dim: int = 16, offset: float = 256.0, noise: float = 0.5,
                  size: int = 8192) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, dim, generator=g)
    w = torch.randn(dim, generator=g)
    return torch.utils.data.TensorDataset(x, offset + x @ w + noise * torch.randn(size,
                                                                                  generator=g))
