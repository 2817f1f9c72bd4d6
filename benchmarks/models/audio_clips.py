"""Keyword spotting on raw audio clips of varying length, padded per batch: 20,000 clips of
1,000 to 4,000 samples and one recording of 24,000 (a long take left in the data). A 1-D
convolution stack keeps the clip's resolution, so a batch's activations grow with its longest
clip: the batch that holds the long take needs several times the memory of any other, and a
trial's random batches seldom draw it.

Each clip is generated from its index (seeded), so reading any one is cheap and the same every
time. `long_only=True` makes every clip the long take: a dataset of the longest samples, to
bench a configuration on its worst batch."""

import torch
from torch import nn

BASELINE = {"micro_batch_size": 16}


class Clips(torch.utils.data.Dataset):
    def __init__(self, size: int, shortest: int, longest: int, long_at: int,
                 long_length: int, long_only: bool) -> None:
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(shortest, longest + 1, (size,), generator=g)
        if long_only:
            lengths[:] = long_length
        elif long_at < size:
            lengths[long_at] = long_length
        self.lengths = lengths.tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        label = i % 12
        t = torch.arange(self.lengths[i]) / 16_000
        tone = torch.sin(2 * torch.pi * (200 + 50 * label) * t)
        return tone + 0.5 * torch.randn(self.lengths[i], generator=g), label


def collate_fn(samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, torch.Tensor,
                                                                  torch.Tensor]:
    """Clips zero-padded to the batch's longest, their lengths' mask, and the labels."""
    longest = max(len(clip) for clip, _ in samples)
    audio = torch.zeros(len(samples), 1, longest)
    mask = torch.zeros(len(samples), 1, longest)
    for row, (clip, _) in enumerate(samples):
        audio[row, 0, :len(clip)] = clip
        mask[row, 0, :len(clip)] = 1.0
    return audio, mask, torch.tensor([label for _, label in samples])


class Spotter(nn.Module):
    """Convolutions at the clip's own rate, a masked mean over time, a class per clip."""

    def __init__(self, channels: int, layers: int, classes: int = 12) -> None:
        super().__init__()
        self.stem = nn.Conv1d(1, channels, 9, padding=4)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Conv1d(channels, channels, 5, padding=2), nn.GELU())
            for _ in range(layers))
        self.head = nn.Linear(channels, classes)

    def forward(self, audio: torch.Tensor, mask: torch.Tensor,
                labels: torch.Tensor) -> torch.Tensor:
        x = self.stem(audio)
        for block in self.blocks:
            x = x + block(x)
        pooled = (x * mask).sum(-1) / mask.sum(-1)
        return nn.functional.cross_entropy(self.head(pooled), labels)


def build_model(channels: int = 32, layers: int = 4) -> nn.Module:
    return Spotter(channels, layers)


def build_dataset(size: int = 20_000, shortest: int = 1_000, longest: int = 4_000,
                  long_at: int = 13_577, long_length: int = 24_000,
                  long_only: bool = False) -> Clips:
    return Clips(size, shortest, longest, long_at, long_length, long_only)
