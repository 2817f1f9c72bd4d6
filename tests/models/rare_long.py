"""Token sequences of varying length, padded per batch, with one sample far longer than the
rest: rare enough that a trial's random batches seldom draw it, long enough that the batch
holding it needs several times the memory of any other. Samples are slices of one stored
tensor, so reading every one is cheap (the probe scans them all).

Its blocks are elementwise (memory in proportion to the padded tokens, little compute), and
each forward call costs `call_cost_s` of sleep besides: a stand-in for per-call overhead, so
that a larger micro-batch is the faster on any CPU."""

import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 8, "grad_accum_steps": 2}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, size: int, shortest: int, longest: int, long_at: int,
                 long_length: int) -> None:
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(shortest, longest + 1, (size,), generator=g)
        if long_at < size:
            lengths[long_at] = long_length
        self.tokens = torch.randint(0, 1000, (int(lengths.sum()),), generator=g)
        self.lengths = lengths.tolist()
        self.starts = (torch.cumsum(lengths, 0) - lengths).tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        start = self.starts[i]
        return self.tokens[start:start + self.lengths[i]]


def collate_fn(samples: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded to the longest sample of the batch, with its mask."""
    longest = max(len(s) for s in samples)
    tokens = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest)
    for row, sample in enumerate(samples):
        tokens[row, :len(sample)] = sample
        mask[row, :len(sample)] = 1.0
    return tokens, mask


class Pooled(nn.Module):
    """Embedding, elementwise gated blocks, masked mean pool, a class per sequence."""

    def __init__(self, dim: int, blocks: int, call_cost_s: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, dim)
        self.scales = nn.Parameter(torch.ones(blocks, dim))
        self.shifts = nn.Parameter(torch.zeros(blocks, dim))
        self.head = nn.Linear(dim, 10)
        self.call_cost_s = call_cost_s

    def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        time.sleep(self.call_cost_s)
        x = self.embed(tokens)
        for scale, shift in zip(self.scales, self.shifts):
            x = x + torch.relu(x * scale + shift)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        return nn.functional.cross_entropy(self.head(pooled), tokens[:, 0] % 10)


def build_model(dim: int = 256, blocks: int = 2, call_cost_s: float = 0.003) -> nn.Module:
    return Pooled(dim, blocks, call_cost_s)


def build_dataset(size: int = 20_000, shortest: int = 16, longest: int = 64,
                  long_at: int = 14_444, long_length: int = 6144) -> Tokens:
    return Tokens(size, shortest, longest, long_at, long_length)
