"""A small classifier whose samples each take a few milliseconds to read (a sleep, as a
file or a network read waits): with no DataLoader workers every step waits on them, and
workers reading ahead hide the wait even on two cores, since a waiting worker takes no CPU.
Written for issue 31's sweep: one knob (`num_workers`) worth much on its own."""

import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 32, "num_workers": 0}


class Reads(torch.utils.data.Dataset):
    def __init__(self, width: int, size: int, read_ms: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, width, generator=g)
        self.y = torch.randint(0, 10, (size,), generator=g)
        self.read_s = read_ms / 1000

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_s)
        return self.x[i], self.y[i]


def build_model(width: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(width, 256), nn.ReLU(), nn.Linear(256, 10))


def build_dataset(width: int = 64, size: int = 4096, read_ms: float = 1.0) -> Reads:
    return Reads(width, size, read_ms)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
