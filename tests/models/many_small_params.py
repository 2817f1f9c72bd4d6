"""A model of many tiny parameter tensors whose BASELINE steps AdamW one tensor at a time, so
that fused AdamW alone is a large win on any machine; and a planted loser beside it: fed
channels_last images, each step spins `slow_layout` times as long as the rest of the step
took, as a layout this machine runs slowly would cost, whatever the machine's speed (the probe
times precisions, not layouts, so the search is left to find it). The fast corner bundles the
two, and loses; each alone tells them apart."""

import time

import torch
from torch import nn

BASELINE = {"micro_batch_size": 8, "optimizer_impl": "for_loop"}
# The longest one step spins: a pause between windows is not a step.
MAX_SPIN_S = 0.5


class ManySmall(nn.Module):
    def __init__(self, size: int, tensors: int, slow_layout: float) -> None:
        super().__init__()
        self.slow_layout = slow_layout
        self.conv = nn.Conv2d(3, 3, kernel_size=1)
        self.head = nn.Linear(3 * size * size, 1)
        self.gains = nn.ParameterList(nn.Parameter(torch.ones(4)) for _ in range(tensors))
        self.started: float | None = None
        self.spun = 0.0

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not x.is_contiguous():  # channels_last
            self._spin()
        gain = torch.stack(list(self.gains)).mean()
        return nn.functional.mse_loss(self.head(self.conv(x).flatten(1)).squeeze(1) * gain, y)

    def _spin(self) -> None:
        """Busy, `slow_layout` times as long as the last step took without spinning."""
        now = time.perf_counter()
        if self.started is not None:
            rest = now - self.started - self.spun
            end = now + min(MAX_SPIN_S, self.slow_layout * max(rest, 0.0))
            while time.perf_counter() < end:
                pass
        self.started, self.spun = now, time.perf_counter() - now


def build_model(size: int = 4, tensors: int = 1000, slow_layout: float = 3.0) -> nn.Module:
    # One thread: tiny ops gain nothing from a second, and on a busy machine the wait for a
    # descheduled one (fused AdamW's parallel loop) would decide the figures instead.
    torch.set_num_threads(1)
    return ManySmall(size, tensors, slow_layout)


def build_dataset(size: int = 4, samples: int = 512) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(torch.randn(samples, 3, size, size, generator=g),
                                          torch.randn(samples, generator=g))
