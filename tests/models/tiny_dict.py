"""A user's model as Hugging Face models look: dict batches, an output with `.loss`."""

from dataclasses import dataclass

import torch
from torch import nn

BASELINE = {"micro_batch_size": 8, "grad_accum_steps": 2}


@dataclass
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


class TinyClassifier(nn.Module):
    def __init__(self, dim: int, layers: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, dim), nn.GELU()) for _ in range(layers))
        self.head = nn.Linear(dim, 4)

    def forward(self, features: torch.Tensor, labels: torch.Tensor) -> Output:
        x = features
        for block in self.blocks:
            x = x + block(x)
        logits = self.head(x)
        return Output(nn.functional.cross_entropy(logits, labels), logits)


class RandomFeatures(torch.utils.data.Dataset):
    def __init__(self, size: int, dim: int) -> None:
        self.size, self.dim = size, dim

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.dim, generator=g)
        return {"features": x, "labels": int(x[:4].argmax())}


def build_model(dim: int = 32, layers: int = 4) -> nn.Module:
    return TinyClassifier(dim, layers)


def build_dataset(dim: int = 32, size: int = 4096) -> RandomFeatures:
    return RandomFeatures(size, dim)
