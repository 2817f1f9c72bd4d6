"""A small MLP classifier whose input pipeline, not the GPU, is the bottleneck.

The classic case: batch size 1024 and a ``__getitem__`` that does real per-sample CPU work
(generate a noisy signal, smooth it, compress it, standardise it), so a training step waits
on the DataLoader unless it uses workers, pinned memory and prefetching. Samples are
``(features, label)`` tuples and ``forward(x, y)`` returns the scalar loss, so this file
exercises the "tuple batch, scalar output" path.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

BASELINE = {
    "micro_batch_size": 1024,
    "grad_accum_steps": 1,
    "precision": "fp32",
    "optimizer_impl": "for_loop",
    "num_workers": 0,
}


class MLPClassifier(nn.Module):
    def __init__(self, feature_dim: int, hidden: int, layers: int, num_classes: int) -> None:
        super().__init__()
        dims = [feature_dim] + [hidden] * layers
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(d_in, d_out), nn.ReLU()) for d_in, d_out in pairwise(dims)
        )
        self.head = nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Returns the mean cross-entropy loss, not logits: the tool reads a scalar output."""
        for layer in self.layers:
            x = layer(x)
        return F.cross_entropy(self.head(x), y)


class NoisySignalDataset(Dataset):
    """Class prototype plus noise, run through a small preprocessing pipeline per sample.

    The prototypes are fixed by ``seed``; each sample's class and noise come from a
    generator seeded with ``seed + idx``, so samples are deterministic and need no storage.
    """

    def __init__(
        self, num_samples: int, feature_dim: int, num_classes: int, noise: float, seed: int
    ) -> None:
        self.num_samples = num_samples
        self.feature_dim = feature_dim
        self.num_classes = num_classes
        self.noise = noise
        self.seed = seed
        self.prototypes = torch.randn(
            num_classes, feature_dim, generator=torch.Generator().manual_seed(seed)
        )
        self.kernel = np.hanning(9) / np.hanning(9).sum()

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(self.seed + 1 + idx)  # seed itself made the prototypes
        label = int(torch.randint(self.num_classes, (), generator=g))
        signal = self.prototypes[label] + self.noise * torch.randn(self.feature_dim, generator=g)
        x = np.convolve(signal.numpy(), self.kernel, mode="same")  # smooth
        x = np.sign(x) * np.log1p(np.abs(x))  # compress the dynamic range
        x = (x - x.mean()) / (x.std() + 1e-6)  # standardise per sample
        return torch.from_numpy(x.astype(np.float32)), label


def build_model(
    feature_dim: int = 512, hidden: int = 1024, layers: int = 3, num_classes: int = 10
) -> nn.Module:
    return MLPClassifier(feature_dim, hidden, layers, num_classes)


def build_dataset(
    num_samples: int = 200_000,
    feature_dim: int = 512,
    num_classes: int = 10,
    noise: float = 1.0,
    seed: int = 0,
) -> Dataset:
    return NoisySignalDataset(num_samples, feature_dim, num_classes, noise, seed)


def flops_per_sample(
    feature_dim: int = 512, hidden: int = 1024, layers: int = 3, num_classes: int = 10
) -> int:
    """Training FLOPs per sample: 2 per weight in the forward pass, 3x that for training."""
    dims = [feature_dim] + [hidden] * layers + [num_classes]
    return 6 * sum(d_in * d_out for d_in, d_out in pairwise(dims))
