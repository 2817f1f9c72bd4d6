"""Does a new epoch's restart of the loader spread short windows? (issue 49, item 4)

A DataLoader with workers restarts at every epoch: the batches its workers prefetched cannot
cross into the next one, so the first batch of an epoch waits for a worker to make it anew. A
window as short as a warm turn that holds such a restart might read well below one that does
not. This trains a model file's configuration in autotune's own loop (`trial.training`) for
`--seconds`, step after step, and cuts the steps into back-to-back windows of `--window`
seconds. Prints each restart (the first batch's wait over the median fetch's) and the median
rate and spread (half the range over the median) of the windows that hold one and of those that
do not: both from the same run, so the machine's drift touches them alike.

    python benchmarks/epoch_restarts.py --model benchmarks/results/expert_bar/storage_images.py \\
        --config '{"micro_batch_size": 32, "num_workers": 32, "prefetch_factor": 2,
                   "persistent_workers": true, "precision": "bf16",
                   "memory_format": "channels_last"}' --seconds 40
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrainConfig  # noqa: E402
from autotune.trial.training import setup_training  # noqa: E402
from autotune.trial.workload import load_workload  # noqa: E402

WARM_S = 3.0  # steps before the first window: workers started, the first epoch under way


def spread(rates: list[float]) -> str:
    if not rates:
        return "none"
    median = statistics.median(rates)
    return f"{median:8.1f} /s ±{(max(rates) - min(rates)) / 2 / median:5.1%} ({len(rates)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--config", required=True, metavar="JSON")
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--window", type=float, default=0.5)
    parser.add_argument("--out", type=Path, help="write each step as JSON here")
    args = parser.parse_args()
    workload = load_workload(args.model)
    config = TrainConfig(**json.loads(args.config))
    setup = setup_training(workload.build_model(), workload.build_dataset(), config, "cpu",
                           loss_fn=workload.loss_fn())
    per_epoch = len(setup.loader)
    batches = setup.batches()
    steps = []  # (start, seconds, samples, data wait, epoch)
    began = time.perf_counter()
    while (now := time.perf_counter()) - began < WARM_S + args.seconds:
        epoch = len(steps) * config.grad_accum_steps // per_epoch
        result = setup.step(batches)
        steps.append((round(now - began, 6), round(time.perf_counter() - now, 6),
                      result.samples, round(result.data_wait_s, 6), epoch))
    typical = statistics.median(s[3] for s in steps)
    for before, step in zip(steps, steps[1:]):
        if step[4] != before[4]:
            print(f"epoch {step[4]} began at {step[0]:5.1f} s: its first batch waited "
                  f"{(step[3] - typical) * 1000:.0f} ms over the median fetch")
    windows: dict[bool, list[float]] = {False: [], True: []}
    edge = WARM_S
    while edge + args.window <= WARM_S + args.seconds:
        inside = [s for s in steps if edge <= s[0] < edge + args.window]
        edge += args.window
        if len(inside) >= 2:
            wall = inside[-1][0] + inside[-1][1] - inside[0][0]
            windows[inside[0][4] != inside[-1][4]].append(sum(s[2] for s in inside) / wall)
    print(f"windows of {args.window} s without a restart: {spread(windows[False])}")
    print(f"windows of {args.window} s with a restart:    {spread(windows[True])}")
    print(f"all windows:                      {spread(windows[False] + windows[True])}")
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "config": json.loads(args.config),
                                        "steps": steps}, separators=(",", ":")))


if __name__ == "__main__":
    main()
