"""Warm paired turns against fresh rounds in the same wall time (issue 31, item 2).

For a model and two configurations (the baseline and one change), it measures the speedup
twice, one way after the other: three rounds of fresh runs as the confirmation takes them
without warm processes (each run a process forked from the fork server, a 3-step window, the
order shuffled in each round), then warm paired turns (`autotune.search.warm`: both kept warm,
taking turns) for the same wall time, start-up included. Prints, per repeat, each way's
speedup, its 95% interval's half-width and its rounds, and whether the two intervals agree;
with `--out`, writes the figures as JSON. The bar: the warm half-width at most half the fresh.

    python benchmarks/warm_rounds.py --repeats 1
    python benchmarks/warm_rounds.py --model models/mlp.py --change optimizer_impl=foreach
    python benchmarks/warm_rounds.py --load bursty   # beside run_end.py's side load
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from run_end import LOADS, side_loaded  # noqa: E402

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import MeasureSettings  # noqa: E402
from autotune.search.runner import MeasureJob, ProcessRunner  # noqa: E402
from autotune.search.warm import PairJudge, WarmRounds  # noqa: E402
from autotune.stats import Ratio, paired_ratio  # noqa: E402
from autotune.target import ModelFile  # noqa: E402

DEFAULT_MODEL = str(ROOT / "models" / "mlp.py")
TINY_MLP_ARGS = {"feature_dim": 32, "hidden": 64, "layers": 2, "num_samples": 4096}
SETTINGS = MeasureSettings(warmup_max_seconds=5.0, profile_steps=0)


@dataclass(frozen=True)
class Way:
    """One way of measuring the speedup in the repeat's wall time."""

    how: str
    speedup: float
    low: float | None
    high: float | None
    half_width: float | None
    rounds: int
    wall_s: float


def _way(how: str, ratio: Ratio, wall_s: float) -> Way:
    return Way(how, ratio.value, ratio.low, ratio.high, ratio.half_width, ratio.rounds, wall_s)


def fresh_rounds(runner: ProcessRunner, configs: list[TrainConfig], rounds: int,
                 order: random.Random) -> tuple[Ratio, float]:
    """`rounds` rounds of fresh runs, shuffled in each: the speedup of configs[0] over
    configs[1], and the wall time they took."""
    began = time.monotonic()
    rates: list[list[float]] = [[], []]
    for round_ in range(rounds):
        for index in order.sample(range(2), 2):
            job = MeasureJob(f"fresh-{index}-{round_}", 300.0, "cpu", profile=False,
                             round_run=True)
            result = runner.measure(configs[index], job)
            if result.measurement is None:
                raise SystemExit(f"a fresh run failed: {result.status} {result.message}")
            rates[index].append(result.measurement.samples_per_sec)
    return paired_ratio(rates[0], rates[1]), time.monotonic() - began


def warm_turns(runner: ProcessRunner, configs: list[TrainConfig], wall_s: float,
               order: random.Random) -> tuple[Ratio, float]:
    """Warm turns for `wall_s`, the processes' start-up included: the same speedup."""
    began = time.monotonic()
    jobs = [MeasureJob(f"warm-{i}", 300.0, "cpu", profile=False) for i in range(2)]
    turns = WarmRounds([runner.request(c, j) for c, j in zip(configs, jobs)],
                       [runner.directory / "logs" / f"{j.name}.log" for j in jobs], 300.0)
    rates: list[list[float]] = [[], []]
    round_s = 0.0
    judge = PairJudge()
    try:
        while not rates[0] or time.monotonic() + round_s < began + wall_s:
            started = time.monotonic()
            indices = order.sample(range(2), 2)
            runs = [turns.turn(index) for index in indices]
            round_s = time.monotonic() - started
            if not judge.keeps(runs):
                continue  # as the confirmation does: not a pair
            for index, run in zip(indices, runs):
                rates[index].append(run.samples_per_sec)
    finally:
        turns.close()
    return paired_ratio(rates[0], rates[1]), time.monotonic() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--model-arg", action="append", default=[], metavar="K=V",
                        help="the model's arguments (default, for the default model: the "
                             "tests' tiny mlp)")
    parser.add_argument("--baseline", default='{"micro_batch_size": 256}', metavar="JSON",
                        help="the baseline's knobs (the rest TrainConfig's defaults)")
    parser.add_argument("--change", default="optimizer_impl=foreach", metavar="KNOB=VALUE",
                        help="what the candidate changes from the baseline")
    parser.add_argument("--rounds", type=int, default=3, help="fresh rounds (default 3)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--load", choices=["quiet", *LOADS], default="quiet",
                        help="a side load beside both ways (run_end.py's)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = parser.parse_args()
    model_args = {k: json.loads(v) for k, v in (a.split("=", 1) for a in args.model_arg)}
    if args.model == DEFAULT_MODEL and not args.model_arg:
        model_args = TINY_MLP_ARGS
    knob, value = args.change.split("=", 1)
    directory = Path(tempfile.mkdtemp(prefix="autotune-warm-rounds-"))
    runner = ProcessRunner(ModelFile(args.model, model_args), directory, SETTINGS,
                           memory_limit_bytes=None, core_shares=None,
                           on_phase=lambda text, number: None)
    baseline = TrainConfig.from_dict(json.loads(args.baseline))
    candidate = baseline.replace(**{knob: json.loads(value) if value[:1].isdigit() else value})
    configs = [candidate, baseline]
    order = random.Random(0)
    results = []
    try:
        with side_loaded(args.load):
            for repeat in range(args.repeats):
                fresh, wall_s = fresh_rounds(runner, configs, args.rounds, order)
                warm, warm_s = warm_turns(runner, configs, wall_s, order)
                ways = [_way("fresh rounds", fresh, wall_s), _way("warm turns", warm, warm_s)]
                agree = None not in (fresh.low, warm.low) and \
                    warm.low <= fresh.high and fresh.low <= warm.high
                results.append({"repeat": repeat, "ways": [asdict(w) for w in ways],
                                "agree": agree})
                for way in ways:
                    width = f"±{way.half_width:.1%}" if way.half_width is not None else "n/a"
                    print(f"repeat {repeat}: {way.how:12s} {way.speedup:.3f}x {width:>8s} "
                          f"in {way.rounds} rounds, {way.wall_s:.0f} s")
                print(f"repeat {repeat}: intervals agree: {agree}")
    finally:
        runner.close()
    widths = {how: [w["half_width"] for r in results for w in r["ways"]
                    if w["how"] == how and w["half_width"] is not None]
              for how in ("fresh rounds", "warm turns")}
    if all(widths.values()):
        fresh_w, warm_w = (statistics.median(widths[h]) for h in ("fresh rounds", "warm turns"))
        print(f"median half-width: fresh ±{fresh_w:.1%}, warm ±{warm_w:.1%} "
              f"({warm_w / fresh_w:.2f} of fresh; the bar is at most 0.5)")
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "model_args": model_args,
                                        "baseline": json.loads(args.baseline),
                                        "change": args.change, "load": args.load,
                                        "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                        "results": results}, indent=1))


if __name__ == "__main__":
    main()
