"""What does a configuration far below the screening's bar cost before it is stopped? (issue 49)

A search trial of a configuration much slower than the best so far (bf16 on a CPU that emulates
it, a micro-batch of 1) is stopped by the screening; until then it warms up and screens at its
own slow pace. This measures one model's `--config` (its baseline by default) in this process,
against a bar `--times` x its own rate, as a search would set it were the best so far that much
faster than 1/0.75 of it: `--rounds` rounds, each measuring it once as the code does now (a
warm-up step far below the bar ends the warm-up, one step screens: `trial.window.FAR_BELOW`) and
once as before (warm up to steady, then the whole screening: `FAR_BELOW` infinite), their order
alternating. Prints each way's measurement wall time and steps, and the per-round ratio.

    python benchmarks/hopeless_screen.py --model models/rgat.py --times 4 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import MeasureSettings  # noqa: E402
from autotune.stats import paired_ratio  # noqa: E402
from autotune.trial import window  # noqa: E402
from autotune.trial.measure import measure_config  # noqa: E402
from autotune.trial.workload import Workload, load_workload  # noqa: E402

WAYS = {"now": window.FAR_BELOW, "before": math.inf}


def measured(workload: Workload, config: TrainConfig, settings: MeasureSettings,
             far_below: float) -> tuple[float, int, int, bool]:
    """One measurement's wall time, warm-up steps, screening steps and whether it screened."""
    window.FAR_BELOW = far_below
    start = time.perf_counter()
    m = measure_config(workload, config, torch.device("cpu"), settings)
    return time.perf_counter() - start, m.warmup_steps, m.window_steps, m.screened


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--config", default=None, help="JSON of knob values over the baseline")
    parser.add_argument("--times", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    workload = load_workload(args.model, {})
    config = workload.train_config(json.loads(args.config or "{}"), "cpu")
    reference = measure_config(workload, config, torch.device("cpu"), MeasureSettings(
        window_steps=3, window_seconds=0.0, screen_steps=0, profile_steps=0))
    bar = reference.samples_per_sec * args.times
    print(f"{args.model} {config.to_dict()}: {reference.samples_per_sec:.2f} samples/s, "
          f"the bar {bar:.2f}", flush=True)
    settings = MeasureSettings(screen_below=bar, profile_steps=1)
    walls: dict[str, list[float]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        for way in (list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]):
            wall, warm, screen, screened = measured(workload, config, settings, WAYS[way])
            walls[way].append(wall)
            print(f"round {r + 1} {way:6}: {wall:6.1f} s, warm-up {warm} steps, screening "
                  f"{screen}, screened {screened}", flush=True)
    for way, times in walls.items():
        print(f"{way:6}: median {statistics.median(times):.1f} s "
              f"({min(times):.1f}-{max(times):.1f})")
    ratio = paired_ratio(walls["now"], walls["before"])
    print(f"now / before: {ratio.value:.2f} [{ratio.low:.2f}-{ratio.high:.2f}], "
          f"95% interval, {args.rounds} paired rounds")


if __name__ == "__main__":
    main()
