"""An exhaustive one-knob sweep of a model, measured: every configuration one knob away from the
model's BASELINE in the space `autotune run` would search on this machine (the probe's left-out
values gone), each run in its own process the way a search trial is (forked from the fork
server, warm-up, a timed window, no profiler), in rounds: the baseline and every change once a
round, in a shuffled order, each change's speed taken as a ratio to its round's baseline.

Writes JSON that `expert_search.py --sweep FILE` replays searches over, with what the search's
first moves read: the baseline measured once more with its profile (where its step goes), the
probe's DataLoader rates and the model's training state, and the memory limit. Any `autotune
run` flag goes after the script's own (`--model`, `--model-arg`, `--fix`, `--window-seconds`,
...); `--baseline-only` adds those to an existing sweep file without sweeping again.

    python benchmarks/one_knob_sweep.py --rounds 3 --out benchmarks/results/sweep_mlp.json \\
        -- --model models/mlp.py --device cpu --model-arg num_samples=4096
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.flags import add_flags, from_args  # noqa: E402
from autotune.hardware import describe  # noqa: E402
from autotune.options import TuneOptions  # noqa: E402
from autotune.search.runner import MeasureJob  # noqa: E402
from autotune.search.space import SearchSpace  # noqa: E402
from autotune.search.tuner import Tuner  # noqa: E402
from autotune.trial.protocol import TrialStatus  # noqa: E402


def one_knob_changes(space: SearchSpace) -> list[dict[str, Any]]:
    """Every change of one knob from the baseline the space offers, that makes another
    configuration (a value a switched-off knob ignores makes none)."""
    changes, seen = [], {json.dumps(space.baseline.to_dict(), sort_keys=True)}
    for knob, values in space.domains.items():
        for value in values:
            config = space.with_changes({knob: value})
            key = json.dumps(config.to_dict(), sort_keys=True)
            if key not in seen:
                seen.add(key)
                changes.append({knob: value})
    return changes


def space_json(space: SearchSpace) -> dict[str, Any]:
    """What `expert_search` needs to rebuild the space."""
    return {"domains": {k: list(v) for k, v in space.domains.items()},
            "baseline": space.baseline.to_dict(), "global_batch": space.global_batch,
            "batch_range": list(space.batch_range) if space.batch_range else None,
            "fixed_grad_accum": space.fixed_grad_accum, "max_grad_accum": space.max_grad_accum}


def first_moves(tuner: Tuner, options: TuneOptions) -> dict[str, Any]:
    """What the search's first moves read: the baseline's profiled measurement, the probe's
    DataLoader rates and training state, the memory limit."""
    job = MeasureJob("sweep-baseline-profiled", options.trial_time_limit_s, str(tuner.device),
                     profile=True)
    result = tuner.runner.measure(tuner.space.baseline, job)
    if result.measurement is None:
        raise SystemExit(f"the baseline's profiled run failed: {result.message}")
    return {"baseline_measurement": result.measurement.to_json(),
            "loader_rates": [r.to_dict() for r in tuner.probe.loader_rates],
            "state_bytes": tuner.probe.state_bytes, "memory_limit_bytes": tuner.memory_limit()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", action="append", default=[],
                        help="sweep only these knobs (repeatable)")
    parser.add_argument("--baseline-only", action="store_true",
                        help="add the profiled baseline, loader rates and memory to --out, an "
                             "existing sweep of the same model, without sweeping")
    ours, theirs = parser.parse_known_args()
    run_parser = argparse.ArgumentParser()
    add_flags(run_parser, TuneOptions)
    studies = tempfile.mkdtemp(prefix="autotune-sweep-")
    options = from_args(run_parser.parse_args(
        [a for a in theirs if a != "--"] + ["--studies-dir", studies]), TuneOptions)
    began = time.monotonic()
    tuner = Tuner(options)
    if ours.baseline_only:
        try:
            stored = json.loads(Path(ours.out).read_text())
            stored.update(first_moves(tuner, options))
            Path(ours.out).write_text(json.dumps(stored, indent=1))
        finally:
            tuner.close()
        return
    try:
        space = tuner.space
        changes = [c for c in one_knob_changes(space) if not ours.only or set(c) <= set(ours.only)]
        print(f"{len(changes)} one-knob changes of {Path(options.target.path).name}, "
              f"{ours.rounds} rounds (the probe took {time.monotonic() - began:.0f} s)",
              file=sys.stderr)
        configs = [space.baseline] + [space.with_changes(c) for c in changes]
        rates: list[list[float | None]] = [[] for _ in configs]
        statuses: list[list[str]] = [[] for _ in configs]
        shuffle = random.Random(ours.seed)
        for round_ in range(ours.rounds):
            order = list(range(len(configs)))
            shuffle.shuffle(order)
            for i in order:
                job = MeasureJob(f"sweep-{i}-{round_}", options.trial_time_limit_s,
                                 str(tuner.device), profile=False)
                result = tuner.runner.measure(configs[i], job)
                status, _ = tuner.scoring.classify(result)
                ok = status == TrialStatus.OK and result.measurement is not None
                rates[i].append(result.measurement.samples_per_sec if ok else None)
                statuses[i].append(status.value)
                print(f"round {round_ + 1}/{ours.rounds}, {i}/{len(configs) - 1}: "
                      f"{changes[i - 1] if i else 'baseline'}: {status.value} "
                      f"{rates[i][-1] or 0:.1f} samples/s", file=sys.stderr)
        moves = first_moves(tuner, options)
    finally:
        tuner.close()
    base = rates[0]
    entries = []
    for change, config, own, status in zip([{}] + changes, configs, rates, statuses):
        ratios = [r / b for r, b in zip(own, base) if r and b]
        entries.append({"change": change, "config": config.to_dict(), "rates": own,
                        "statuses": status, "ratios": ratios,
                        "ratio": statistics.median(ratios) if ratios else None})
    out = {"model": options.target.path, "model_args": options.model_args,
           "machine": str(describe(tuner.device)), "rounds": ours.rounds,
           "wall_s": round(time.monotonic() - began, 1),
           "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "space": space_json(space), "sweep": entries, **moves}
    Path(ours.out).write_text(json.dumps(out, indent=1))
    print("| change | ratio to the baseline (median, min-max of rounds) |\n|---|---|")
    for e in sorted(entries[1:], key=lambda e: -(e["ratio"] or 0)):
        spread = f"{min(e['ratios']):.2f}-{max(e['ratios']):.2f}" if e["ratios"] else "-"
        ratio = f"{e['ratio']:.2f}x" if e["ratio"] else "/".join(set(e["statuses"]))
        print(f"| {e['change']} | {ratio} ({spread}) |")


if __name__ == "__main__":
    main()
