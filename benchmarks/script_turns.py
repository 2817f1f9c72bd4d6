"""A training script's warm turns against its fresh trials, for the same configurations.

Probes the script as a study would, measures each configuration in a fresh trial, then takes
turns of each in its own warm process (`autotune.search.warm`), then fresh trials again; prints
every figure. Turns that agree with the trials around them are what lets a script's race be
judged in warm turns. Written for issue 39's open question (turns under gradient accumulation
8 once ran at half their trials' speed):

    python benchmarks/script_turns.py --out /tmp/turns
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import MeasureSettings  # noqa: E402
from autotune.search.runner import MeasureJob, ProcessRunner  # noqa: E402
from autotune.search.warm import warm_start  # noqa: E402
from autotune.target import Script  # noqa: E402

SCRIPT = str(ROOT / "benchmarks" / "scripts" / "hf_roberta_mlm.py")
CONFIGS = ['{"micro_batch_size": 2, "grad_accum_steps": 8, "optimizer_impl": "fused"}',
           '{"micro_batch_size": 16, "grad_accum_steps": 1, "optimizer_impl": "fused"}']
SETTINGS = MeasureSettings(window_steps=3, window_seconds=3.0, warmup_max_seconds=30,
                           profile_steps=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the runs' folder")
    parser.add_argument("--turns", type=int, default=8, help="turns of each (default 8)")
    parser.add_argument("--config", action="append", metavar="JSON",
                        help="a configuration's knobs (default: 2 x 8 and 16 x 1, fused AdamW)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    script = Script(SCRIPT, ("--out", str(args.out / "script-out"), "--batch", "2",
                             "--accum", "8"),
                    {"micro_batch_size": "--batch", "grad_accum_steps": "--accum"})
    runner = ProcessRunner(script, args.out, SETTINGS, memory_limit_bytes=None,
                           core_shares=None, on_phase=lambda text, number: None)
    runner.preload(runner.probe("cpu", 600))
    configs = [TrainConfig.from_dict(json.loads(c)) for c in args.config or CONFIGS]

    def fresh(name: str) -> list[float]:
        rates = []
        for i, config in enumerate(configs):
            result = runner.measure(config, MeasureJob(f"{name}-{i}", 600, "cpu", profile=False))
            rates.append(result.measurement.samples_per_sec if result.measurement else 0.0)
        return rates

    before = fresh("fresh-before")
    start = warm_start(runner, "cpu", 600)
    assert start is not None
    rounds = start.start(configs, "turns", None)
    turns: list[list[float]] = [[] for _ in configs]
    try:
        for _ in range(args.turns):
            for i in range(len(configs)):
                run = rounds.turn(i)
                turns[i].append(run.samples_per_sec if run else 0.0)
    finally:
        rounds.close()
    after = fresh("fresh-after")
    runner.close()
    for i, config in enumerate(configs):
        print(f"{config.micro_batch_size} x {config.grad_accum_steps}: trials "
              f"{before[i]:.1f} then {after[i]:.1f} samples/s; turns median "
              f"{statistics.median(turns[i]):.1f} ({', '.join(f'{t:.1f}' for t in turns[i])})")


if __name__ == "__main__":
    main()
