"""Does a warm turn of a loader-bound configuration read its loader's rate? (issue 49, item 4)

A toy whose step is next to nothing and whose DataLoader workers each sleep `--delay` seconds a
sample (no CPU): the workers' rate is known, `--workers` x the micro-batch of 16 over a batch's
sleep. One warm process of it, in this checkout's code: after warming up, `--turns` turns of
`autotune.trial.measure.timed_turn` (asked for 0.5 s, as the race asks), each after an idle
gap of 0.5-1.5 s, as while the other warm processes take theirs (the workers fill their queue
meanwhile). Prints the turns' median rate over the workers' rate, their spread (cv, and half
the range over the median) and their median length. Run it in two checkouts, interleaved, to
compare versions:

    python benchmarks/loader_turns.py --workers 8 --delay 0.016 --turns 16
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import MeasureSettings  # noqa: E402
from autotune.trial.measure import timed_turn, warm_up  # noqa: E402
from autotune.trial.training import setup_training  # noqa: E402

MICRO_BATCH = 16
SETTINGS = MeasureSettings(window_steps=5, window_seconds=0.5, window_max_seconds=1.5,
                           warmup_max_seconds=5, profile_steps=0)


class Sleepy(torch.utils.data.Dataset):
    """Samples that cost `delay` seconds of waiting each (a read from slow storage)."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay)
        return torch.ones(16), torch.ones(1)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--delay", type=float, default=0.016, help="seconds a sample")
    parser.add_argument("--turns", type=int, default=16)
    args = parser.parse_args()
    random.seed(0)
    config = TrainConfig(micro_batch_size=MICRO_BATCH, num_workers=args.workers,
                         prefetch_factor=2, persistent_workers=True)
    setup = setup_training(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)),
                           Sleepy(args.delay), config, "cpu", loss_fn=loss_fn)
    batches = setup.batches()
    warm_up(setup, batches, SETTINGS)
    rates, seconds = [], []
    for _ in range(args.turns):
        time.sleep(random.uniform(0.5, 1.5))
        turn = timed_turn(setup, batches, SETTINGS, 1, 0.5)
        rates.append(turn.samples_per_sec)
        seconds.append(turn.seconds)
    workers_rate = args.workers / args.delay
    median = statistics.median(rates)
    print(f"median {median:7.1f} /s ({median / workers_rate:.3f} of the workers' "
          f"{workers_rate:.0f}), cv {statistics.stdev(rates) / statistics.mean(rates):.1%}, "
          f"half the range {(max(rates) - min(rates)) / 2 / median:.1%}, "
          f"turns of {statistics.median(seconds):.2f} s")


if __name__ == "__main__":
    main()
