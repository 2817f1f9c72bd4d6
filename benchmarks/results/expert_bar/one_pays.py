"""Written for issue 49's bar: a model where one change pays and the others do not. A small
convolutional net on in-memory 16x16 images, trained in micro-batches of 8 accumulated 8 times
(a batch of 64): every step is many tiny operators, so per-operator overhead is the step and a
larger micro-batch pays several times over. Its parameters are few and small (the optimizer
step is a sliver), its images tiny (bf16 and channels-last have little to speed up) and its
samples already in memory (loader workers have nothing to hide)."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 8, "grad_accum_steps": 8}


class InMemoryImages(torch.utils.data.Dataset):
    def __init__(self, count: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(count, 3, 16, 16, generator=g)
        self.y = torch.randint(0, 10, (count,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


def build_dataset(count: int = 8192) -> InMemoryImages:
    return InMemoryImages(count)


def loss_fn(model: nn.Module, batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)
