"""Can a calibration loop correct a rate for the machine's state, and does pairing cancel it?

`repeatability.py` finds that this machine's speed moves by tens of percent, unseen from
inside. This benchmark asks what a measurement can do about it, in one long-lived process (no
process start, no rebuild): each reference model's baseline and tuned configuration is built
once, warmed up, then measured in rounds. Each round, in a shuffled order, every case runs one
window (at least `--window` seconds and 3 steps; rate = samples per step / median step time),
bracketed by two calibration loops of fixed work timed for 0.25 s each, just before and just
after it:
- `matmul`: the repeatability floor's 384x384 matmuls (compute-bound);
- `ops`: 50 tiny tensor additions (dispatch-bound, like a small model's step).

Per case: the windows' spread = (max - min) / median, the correlation of a window's rate with
its calibration (the mean of the two around it), and the spread once each rate is divided by
its calibration: a correction works only if that spread is smaller. The correlation of the
calibration before a window with the one after it says how fast the machine's speed moves.
Per model: the tuned / baseline ratio of the same round, its spread and its 95% interval
(`stats.paired_ratio`), which is what the tuner's confirmation relies on.

Writes benchmarks/results/<name>.json (every window) and <name>.md (the tables it prints).

    python benchmarks/machine_drift.py --rounds 30
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.hardware import describe  # noqa: E402
from autotune.options import MeasureSettings  # noqa: E402
from autotune.stats import paired_ratio  # noqa: E402
from autotune.trial.measure import build_setup, warm_up  # noqa: E402
from autotune.trial.training import TrainingSetup  # noqa: E402
from autotune.trial.workload import load_workload  # noqa: E402
from benchmarks.repeatability import REFERENCES, cases, spread  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CALIBRATION_S = 0.25


def calibration_loops() -> dict[str, Callable[[], None]]:
    """Fixed work per call, timed around each window."""
    a, b = torch.randn(384, 384), torch.randn(384, 384)
    x = torch.randn(64)

    def matmul() -> None:
        for _ in range(4):
            a @ b

    def ops() -> None:
        y = x
        for _ in range(50):
            y = y + 1.0

    return {"matmul": matmul, "ops": ops}


def median_rate(work: Callable[[], Any], seconds: float, min_calls: int = 1) -> tuple[float, Any]:
    """Calls per second from the median call time over at least `seconds` and `min_calls`,
    and the last call's result."""
    times: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < min_calls:
        begun = time.perf_counter()
        result = work()
        times.append(time.perf_counter() - begun)
    return 1 / statistics.median(times), result


def calibrate(loops: dict[str, Callable[[], None]]) -> dict[str, float]:
    return {name: median_rate(loop, CALIBRATION_S)[0] for name, loop in loops.items()}


@dataclass
class Window:
    case: str
    round: int
    samples_per_sec: float
    before: dict[str, float]
    after: dict[str, float]

    def calibration(self, loop: str) -> float:
        return (self.before[loop] + self.after[loop]) / 2


def build(case: str) -> tuple[TrainingSetup, Iterator[Any]]:
    """One case's training set-up and its batches, built and warmed up in this process."""
    reference, config = cases([case.split()[0]])[case]
    workload = load_workload(str(ROOT / reference.path), reference.model_args)
    setup, _, _ = build_setup(workload, workload.train_config(config.to_dict(), "cpu"),
                              torch.device("cpu"), lambda phase: None)
    batches = setup.batches()
    warm_up(setup, batches, MeasureSettings())
    return setup, batches


def correlation(xs: list[float], ys: list[float]) -> float | None:
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def case_rows(windows: list[Window], loops: list[str]) -> list[dict[str, Any]]:
    rows = []
    for case in dict.fromkeys(w.case for w in windows):
        mine = [w for w in windows if w.case == case]
        rates = [w.samples_per_sec for w in mine]
        row: dict[str, Any] = {"case": case, "windows": len(mine),
                               "median": statistics.median(rates), "spread": spread(rates)}
        for loop in loops:
            calibration = [w.calibration(loop) for w in mine]
            row[f"corr_{loop}"] = correlation(rates, calibration)
            row[f"corrected_spread_{loop}"] = spread([r / c for r, c in zip(rates, calibration)])
            row[f"before_after_corr_{loop}"] = correlation([w.before[loop] for w in mine],
                                                           [w.after[loop] for w in mine])
        rows.append(row)
    return rows


def pair_rows(windows: list[Window]) -> list[dict[str, Any]]:
    by = {(w.case, w.round): w.samples_per_sec for w in windows}
    rows = []
    for model in dict.fromkeys(w.case.split()[0] for w in windows):
        rounds = sorted({r for (c, r) in by if c == f"{model} baseline"} &
                        {r for (c, r) in by if c == f"{model} tuned"})
        if len(rounds) < 3:
            continue
        tuned = [by[(f"{model} tuned", r)] for r in rounds]
        baseline = [by[(f"{model} baseline", r)] for r in rounds]
        ratio = paired_ratio(tuned, baseline)
        rows.append({"model": model, "rounds": len(rounds),
                     "ratio_spread": spread([t / b for t, b in zip(tuned, baseline)]),
                     "tuned_spread": spread(tuned), "baseline_spread": spread(baseline),
                     "same_round_corr": correlation(tuned, baseline), "speedup": ratio.value,
                     "low": ratio.low, "high": ratio.high, "half_width": ratio.half_width})
    return rows


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _corr(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def tables(rows: list[dict[str, Any]], pairs: list[dict[str, Any]], loops: list[str]) -> str:
    head = "| case | windows | median samples/s | spread | " + " | ".join(
        f"corr. with {loop} | spread / {loop} | {loop} before-after corr." for loop in loops)
    lines = [head + " |", "|---" * (4 + 3 * len(loops)) + "|"]
    for r in rows:
        cells = " | ".join(f"{_corr(r[f'corr_{loop}'])} | {_pct(r[f'corrected_spread_{loop}'])}"
                           f" | {_corr(r[f'before_after_corr_{loop}'])}" for loop in loops)
        lines.append(f"| {r['case']} | {r['windows']} | {r['median']:,.1f} | "
                     f"{_pct(r['spread'])} | {cells} |")
    lines += ["", "| model | rounds | tuned spread | baseline spread | same-round corr. | "
              "tuned/baseline spread | speedup [95% interval] |", "|---" * 7 + "|"]
    for p in pairs:
        interval = f"[{p['low']:.3f}, {p['high']:.3f}]" if p["low"] is not None else ""
        lines.append(f"| {p['model']} | {p['rounds']} | {_pct(p['tuned_spread'])} | "
                     f"{_pct(p['baseline_spread'])} | {_corr(p['same_round_corr'])} | "
                     f"{_pct(p['ratio_spread'])} | {p['speedup']:.3f}x {interval} "
                     f"(±{_pct(p['half_width'])}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--models", default="mlp,rgat",
                        help=f"comma-separated, of {', '.join(REFERENCES)}")
    parser.add_argument("--window", type=float, default=2.0, metavar="SECONDS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="machine_drift")
    args = parser.parse_args()
    names = [f"{m} {kind}" for m in args.models.split(",") for kind in ("baseline", "tuned")]
    setups = {name: build(name) for name in names}
    loops = calibration_loops()
    rng = random.Random(args.seed)
    windows: list[Window] = []
    started = time.time()
    for number in range(args.rounds):
        for name in rng.sample(names, len(names)):
            setup, batches = setups[name]
            before = calibrate(loops)
            steps_per_sec, result = median_rate(partial(setup.step, batches), args.window, 3)
            windows.append(Window(name, number, steps_per_sec * result.samples, before,
                                  calibrate(loops)))
        print(f"round {number + 1}/{args.rounds}: " + ", ".join(
            f"{w.case} {w.samples_per_sec:,.0f}/s" for w in windows[-len(names):]) +
            f" ({time.time() - started:.0f} s)", flush=True)
    rows, pairs = case_rows(windows, list(loops)), pair_rows(windows)
    text = tables(rows, pairs, list(loops))
    print(text)
    command = "python benchmarks/machine_drift.py " + shlex.join(sys.argv[1:])
    machine = describe(torch.device("cpu")).name
    wall_s = time.time() - started
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({
        "command": command, "machine": machine, "cpus": os.cpu_count(), "wall_s": wall_s,
        "window_s": args.window, "calibration_s": CALIBRATION_S, "cases": rows, "pairs": pairs,
        "windows": [asdict(w) for w in windows]}, indent=1))
    (RESULTS / f"{args.name}.md").write_text(
        f"`{command}` on {machine}, {os.cpu_count()} CPUs, one process, {wall_s:.0f} s\n\n"
        f"{text}\n")


if __name__ == "__main__":
    main()
