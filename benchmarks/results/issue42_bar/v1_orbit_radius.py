"""The first version of benchmarks/models/orbit_radius.py, kept with its run (v1_*): the
network predicts the deviation and the forward adds Earth's radius (6,371 km) outside any layer.
Eager bf16 rounds that sum to bf16 (step 32 km near 6,371) and learns worse; compiled, inductor
fuses the addition into fp32 arithmetic, and bf16 + compile learns as fp32 does."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 256}
EARTH_RADIUS_KM = 6371.0


class RadiusNet(nn.Module):
    def __init__(self, features: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(features, width), nn.GELU(),
                                 nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))

    def forward(self, x: torch.Tensor, radius_km: torch.Tensor) -> torch.Tensor:
        predicted = self.net(x).squeeze(1) + EARTH_RADIUS_KM
        return nn.functional.mse_loss(predicted.float(), radius_km)


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
