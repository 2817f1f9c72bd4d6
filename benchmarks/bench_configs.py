"""Median samples/sec of a few configurations of one model, each measured in its own process.

Prints a markdown table; ratios are against the first configuration (BASELINE) of the same
run, interleaved round by round so drift on the machine hits every configuration alike.

    python benchmarks/bench_configs.py --model models/mlp.py --device cpu --repeats 3 \
        --model-arg num_samples=50000 --config "" --config "num_workers=2,prefetch_factor=4"
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from autotune.config import parse_assignments
from autotune.hardware import parse_device
from autotune.options import MeasureSettings, parse_model_args
from autotune.search.isolation import run_isolated
from autotune.target import ModelFile
from autotune.trial.protocol import TrialRequest, TrialResult, TrialStatus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--device")
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--config", action="append", default=[],
                        help="comma-separated knob=value changes to BASELINE ('' = BASELINE)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-seconds", type=float, default=3.0)
    parser.add_argument("--json-out", help="also write the raw results here")
    args = parser.parse_args()

    device = parse_device(args.device)
    model_args = parse_model_args(args.model_arg)
    # Changes to BASELINE: the trial process puts them over the model file's BASELINE.
    configs = [parse_assignments(filter(None, spec.split(","))) for spec in (args.config or [""])]
    runs: list[list[TrialResult]] = [[] for _ in configs]
    for _ in range(args.repeats):
        for config, results in zip(configs, runs):
            request = TrialRequest(ModelFile(args.model, model_args), config=config,
                                   device=str(device),
                                   settings=MeasureSettings(
                                       window_seconds=args.window_seconds))
            results.append(run_isolated(request, 900))

    reference = None
    print(f"model {Path(args.model).stem}, device {device}, {args.repeats} runs each, "
          f"args {model_args}\n")
    print("| configuration | status | samples/sec (median) | min..max | vs BASELINE | "
          "data wait | peak memory MiB |")
    print("|---|---|---|---|---|---|---|")
    for spec, results in zip(args.config or [""], runs):
        ok = [r.measurement for r in results
              if r.status == TrialStatus.OK and r.measurement is not None]
        if not ok:
            print(f"| {spec or 'BASELINE'} | {results[0].status} | | | | | |")
            continue
        rates = [m.samples_per_sec for m in ok]
        median = statistics.median(rates)
        reference = reference or median
        waits = [m.data_wait_fraction for m in ok if m.data_wait_fraction is not None]
        peaks = [m.peak_memory_bytes for m in ok if m.peak_memory_bytes is not None]
        wait = f"{statistics.median(waits):.0%}" if waits else "n/a"
        memory = f"{max(peaks) / 2**20:.0f}" if peaks else "n/a"
        print(f"| {spec or 'BASELINE'} | ok x{len(ok)} | {median:.1f} | {min(rates):.1f}.."
              f"{max(rates):.1f} | {median / reference:.2f}x | {wait} | {memory} |")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"model": Path(args.model).stem, "device": str(device), "model_args": model_args,
             "configs": [_applied(config, results) for config, results in zip(configs, runs)],
             "runs": [[r.to_json() for r in results] for results in runs]}, indent=2))


def _applied(changes: dict, results: list[TrialResult]) -> dict:
    """The configuration the runs measured, BASELINE applied (the changes alone when no run
    got as far as applying it)."""
    return next((r.config.to_dict() for r in results if r.config is not None), changes)


if __name__ == "__main__":
    main()
