"""What spreads a loader configuration's warm turns? (issue 49, item 4)

For a model, its baseline and a configuration with DataLoader workers (the answer), measures
both in warm paired turns four ways, one after the other: `alone`, the two processes only;
`beside`, with more warm processes of loader configurations (`--companion`, the race's other
entries) taking their turns in the same shuffled rounds, as a confirmation has them; `stopped`,
the same, but every warm process but the one timed stopped (SIGSTOP to its process group, its
loader workers included) for the turn; `alternate`, the same rounds with the others stopped
in every other round, so that the answer's turns with the others stopped and running pair up
round by round and their ratio (with its 95% interval, `stats.paired_ratio`) says whether the
other warm processes slow it or speed it up, free of the machine's drift. Prints, for each
way and configuration, the median of its turns and their spread: half the range over the
median (what `autotune show` prints beside the confirmed samples/sec) and the coefficient of
variation; and the answer's spread over the baseline's (issue 49's bar: at most 2).
`--turn-seconds` sets each turn's least seconds (autotune's `TURN_SECONDS` by default).

    python benchmarks/warm_spread.py --model benchmarks/results/expert_bar/storage_images.py \\
        --baseline '{"micro_batch_size": 32}' \\
        --answer '{"micro_batch_size": 32, "num_workers": 32, "prefetch_factor": 2,
                   "persistent_workers": true, "precision": "bf16",
                   "memory_format": "channels_last"}' \\
        --companion '{"micro_batch_size": 32, "num_workers": 32, "prefetch_factor": 2,
                      "persistent_workers": true, "memory_format": "channels_last"}'
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import MeasureSettings  # noqa: E402
from autotune.search import warm  # noqa: E402
from autotune.search.runner import MeasureJob, ProcessRunner  # noqa: E402
from autotune.search.warm import WarmRounds  # noqa: E402
from autotune.stats import paired_ratio  # noqa: E402
from autotune.target import ModelFile  # noqa: E402

SETTINGS = MeasureSettings(warmup_max_seconds=5.0, profile_steps=0)
WAYS = ("alone", "beside", "stopped", "alternate")


@contextlib.contextmanager
def others_stopped(turns: WarmRounds, timed: int, stop: bool) -> Iterator[None]:
    """Every warm process but `timed` stopped, its loader workers with it, for the turn."""
    groups = [p.process.pid for i, p in enumerate(turns.processes) if i != timed and p] \
        if stop else []
    for group in groups:
        os.killpg(group, signal.SIGSTOP)
    try:
        yield
    finally:
        for group in groups:
            os.killpg(group, signal.SIGCONT)


def spread(rates: list[float]) -> tuple[float, float, float]:
    """The median, half the range over it, and the coefficient of variation."""
    median = statistics.median(rates)
    return median, (max(rates) - min(rates)) / 2 / median, statistics.stdev(rates) / median


def measure(runner: ProcessRunner, configs: list[TrainConfig], rounds: int,
            stop: Callable[[int], bool], order: random.Random) -> list[list[float]]:
    """`rounds` shuffled rounds of a turn each, the others stopped in the rounds `stop` says;
    the samples/sec of each configuration's."""
    jobs = [MeasureJob(f"spread-{i}", 300.0, "cpu", profile=False) for i in range(len(configs))]
    turns = WarmRounds([runner.request(c, j) for c, j in zip(configs, jobs)],
                       [runner.directory / "logs" / f"{j.name}.log" for j in jobs], 300.0)
    rates: list[list[float]] = [[] for _ in configs]
    try:
        for number in range(rounds):
            for index in order.sample(range(len(configs)), len(configs)):
                with others_stopped(turns, index, stop(number)):
                    run = turns.turn(index)
                if run is not None:
                    rates[index].append(run.samples_per_sec)
    finally:
        turns.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--baseline", required=True, metavar="JSON")
    parser.add_argument("--answer", required=True, metavar="JSON")
    parser.add_argument("--companion", action="append", default=[], metavar="JSON",
                        help="another loader configuration racing beside them (repeatable)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    parser.add_argument("--turn-seconds", type=float, default=warm.TURN_SECONDS,
                        help="each turn's least seconds (autotune's own by default)")
    parser.add_argument("--out", type=Path, help="write the turns as JSON here")
    args = parser.parse_args()
    warm.TURN_SECONDS = args.turn_seconds
    directory = Path(tempfile.mkdtemp(prefix="autotune-warm-spread-"))
    runner = ProcessRunner(ModelFile(args.model, {}), directory, SETTINGS,
                           memory_limit_bytes=None, core_shares=None,
                           on_phase=lambda text, number: None)
    pair = [TrainConfig.from_dict(json.loads(args.baseline)),
            TrainConfig.from_dict(json.loads(args.answer))]
    companions = [TrainConfig.from_dict(json.loads(c)) for c in args.companion]
    order, results = random.Random(0), {}
    try:
        for way in args.ways:
            configs = pair if way == "alone" else pair + companions
            began = time.monotonic()
            stops = {"stopped": lambda number: True,
                     "alternate": lambda number: number % 2 == 0}
            rates = measure(runner, configs, args.rounds,
                            stops.get(way, lambda number: False), order)
            results[way] = {"turns": rates[:2], "wall_s": time.monotonic() - began}
            (base, base_half, base_cv), (ans, ans_half, ans_cv) = map(spread, rates[:2])
            print(f"{way:8s} baseline {base:9.1f} ±{base_half:6.1%} (cv {base_cv:5.1%})  "
                  f"answer {ans:9.1f} ±{ans_half:6.1%} (cv {ans_cv:5.1%})  "
                  f"answer/baseline spread {ans_half / base_half:5.1f}x (cv "
                  f"{ans_cv / base_cv:5.1f}x), {len(rates[1])} turns, "
                  f"{results[way]['wall_s']:.0f} s", flush=True)
            if way == "alternate":
                answer = rates[1]
                ratio = paired_ratio(answer[0::2], answer[1::2])
                print(f"{'':8s} the answer with the others stopped over running: "
                      f"{ratio.value:.3f} [{ratio.low:.3f}-{ratio.high:.3f}], "
                      f"{ratio.rounds} pairs of rounds", flush=True)
    finally:
        runner.close()
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "turn_seconds": args.turn_seconds,
                                        "baseline": pair[0].to_dict(),
                                        "answer": pair[1].to_dict(),
                                        "companions": [c.to_dict() for c in companions],
                                        "rounds": args.rounds, "results": results}, indent=1))


if __name__ == "__main__":
    main()
