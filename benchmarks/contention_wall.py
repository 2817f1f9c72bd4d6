"""Does a side load multiply a trial's time? (issue 33, item 3)

Measures one configuration (`autotune bench`, the model file's BASELINE) in fresh processes,
quiet and beside a `steady` side load (one process busy all along) or a `bursty` one (busy 2 s,
idle 2 s), interleaved in rounds (the loads' order rotates each round). Each loaded run is
paired with its round's quiet run: its wall time over the quiet one's, against what the load
itself slows the training (the quiet rate over the loaded rate). The bar: the wall-time ratio
at most 1.5x the slowdown, that is, no more than half again beyond what the load costs anyway
(re-measured windows, waits for a quiet moment).

    python benchmarks/contention_wall.py --model benchmarks/models/patch_mixer.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from run_end import side_loaded

RESULTS = Path(__file__).resolve().parent / "results"
BAR = 1.5


@dataclass(frozen=True)
class Bench:
    """One `autotune bench` run: its wall time, its rate and what it saw of the load."""

    load: str
    round: int
    wall_s: float
    samples_per_sec: float
    windows_remeasured: int
    disturbed: bool
    machine_load: float | None
    steady_load: bool | None


def bench(model: str, load: str, round_: int) -> Bench:
    command = [sys.executable, "-m", "autotune", "bench", "--model", model, "--device", "cpu",
               "--json"]
    with side_loaded(load):
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        wall = time.monotonic() - started
    figures = json.loads(done.stdout)
    return Bench(load, round_, wall, figures["samples_per_sec"],
                 figures.get("windows_remeasured") or 0, bool(figures.get("disturbed")),
                 figures.get("machine_load"), figures.get("steady_load"))


def spread(values: list[float]) -> str:
    return (f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"
            if values else "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loads", nargs="+", default=["steady", "bursty"],
                        choices=["steady", "bursty"])
    parser.add_argument("--name", default="contention_wall")
    args = parser.parse_args()
    runs: list[Bench] = []
    for round_ in range(args.rounds):
        order = ["quiet", *args.loads]
        shift = round_ % len(order)
        for load in order[shift:] + order[:shift]:
            run = bench(args.model, load, round_)
            runs.append(run)
            print(f"round {round_ + 1} {load:6}: {run.wall_s:6.1f} s, "
                  f"{run.samples_per_sec:8.1f} samples/s, re-measured {run.windows_remeasured}, "
                  f"disturbed {run.disturbed}, load {run.machine_load}", flush=True)
    quiet = {r.round: r for r in runs if r.load == "quiet"}
    summary = {}
    for load in args.loads:
        pairs = [(r, quiet[r.round]) for r in runs if r.load == load]
        wall = [r.wall_s / q.wall_s for r, q in pairs]
        slowdown = [q.samples_per_sec / r.samples_per_sec for r, q in pairs]
        beyond = [w / s for w, s in zip(wall, slowdown)]
        summary[load] = {"wall_ratio": wall, "slowdown": slowdown, "wall_over_slowdown": beyond,
                         "bar_met": all(b <= BAR for b in beyond)}
        print(f"{load:6}: wall {spread(wall)}x the quiet run's, the load slows training "
              f"{spread(slowdown)}x: wall / slowdown {spread(beyond)} "
              f"(bar <= {BAR}: {'met' if summary[load]['bar_met'] else 'NOT met'})")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(
        {"model": args.model, "runs": [asdict(r) for r in runs], "summary": summary},
        indent=2))


if __name__ == "__main__":
    main()
