"""Wide samples that cost nothing to make (16,384 features each, filled rather than computed):
a micro-batch's memory grows with its size, so the larger ones do not fit a memory limit, while
loading never slows a trial."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 1024, "optimizer_impl": "for_loop"}


class Wide(torch.utils.data.Dataset):
    def __init__(self, size: int, features: int) -> None:
        self.size, self.features = size, features

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((self.features,), (i % 97) / 97), i % 10


def build_model(features: int = 16384, hidden: int = 256) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, 10))


def build_dataset(size: int = 70000, features: int = 16384) -> Wide:
    return Wide(size, features)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
