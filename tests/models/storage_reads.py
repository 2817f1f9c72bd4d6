"""A tiny classifier whose samples are read one at a time from slow storage (a sleep, as a
file or network read waits): at PyTorch's default of no DataLoader workers the step waits on
them, and workers reading ahead hide the wait even beyond the cores, since a waiting worker
takes no CPU."""

import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 16, "num_workers": 0}


class Reads(torch.utils.data.Dataset):
    def __init__(self, size: int, read_ms: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 32, generator=g)
        self.y = torch.randint(0, 4, (size,), generator=g)
        self.read_s = read_ms / 1000

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_s)
        return self.x[i], self.y[i]


def build_model() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def build_dataset(size: int = 2048, read_ms: float = 2.0) -> Reads:
    return Reads(size, read_ms)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
