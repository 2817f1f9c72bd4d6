"""storage_images (issue 38's bar) with 2,000,000 samples an epoch, so that no epoch ends in a
warm_spread run: a small image classifier whose samples are decoded one at a time from slow
storage (each read waits 4 ms), trained with PyTorch's default DataLoader (no workers)."""

import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 32}


class SlowImages(torch.utils.data.Dataset):
    def __init__(self, count: int, read_ms: float) -> None:
        self.count, self.read_s = count, read_ms / 1000

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.read_s)  # the read: off the CPU, waiting on storage
        g = torch.Generator().manual_seed(i)
        return torch.randn(3, 32, 32, generator=g), torch.tensor(i % 10)


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 10))


def build_dataset(count: int = 2_000_000, read_ms: float = 4.0) -> SlowImages:
    return SlowImages(count, read_ms)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
