"""A satellite's orbital radius in kilometres from 64 tracking features, the way raw logs
give it: targets un-normalised, the output layer's bias started at their mean (Earth's radius,
6,371 km), as one starts a regression's. Under bf16 autocast the output layer's result is a
bf16 number, whose step near 6,371 is 32 km, so the loss plateaus near that rounding's error
while fp32 fits the targets to their noise; nothing goes NaN, and compiling does not change
it (the layer's output is bf16 either way). Its hidden layers are wide enough that bf16 steps
faster on a CPU with bf16 matrix units."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 256}
EARTH_RADIUS_KM = 6371.0


class RadiusNet(nn.Module):
    def __init__(self, features: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))
        with torch.no_grad():
            self.net[-1].bias.fill_(EARTH_RADIUS_KM)

    def forward(self, x: torch.Tensor, radius_km: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(x).squeeze(1).float(), radius_km)


def build_model(features: int = 64, width: int = 1024) -> nn.Module:
    return RadiusNet(features, width)


def build_optimizer(params, **flags):
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0, **flags)


def build_dataset(features: int = 64, size: int = 65_536) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, features, generator=g)
    w = torch.randn(features, generator=g)
    altitude = 10.0 * (x @ w) + torch.randn(size, generator=g)
    return torch.utils.data.TensorDataset(x, EARTH_RADIUS_KM + altitude)
