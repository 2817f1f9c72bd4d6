"""After how many trials the search first measures the best one-knob change (or something at
least as fast), replayed over recorded rates: an exhaustive one-knob sweep, the search as it
was (baseline, fast corner, then TPE), and the search with `search/expert`'s trials (baseline,
fast corner, each of its changes alone where it did not win clearly, then TPE with the knobs
that lost alone kept at the baseline's value).

A configuration's rate is the baseline's times the ratio each of its changes made alone, as
recorded (for many_small_params this predicts the corner at 104 samples/s; 88.5 measured).
Each bench says where its figures come from. No process is run: seconds for every seed.
A repeat of a configuration is free, as in the tuner; at most `MAX_ASKS` proposals per run.

    python benchmarks/expert_search.py --seeds 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.config import TrainConfig  # noqa: E402
from autotune.hardware import DeviceInfo  # noqa: E402
from autotune.search.expert import kept_at_baseline, next_expert_trial  # noqa: E402
from autotune.search.space import SearchSpace, build_space  # noqa: E402
from autotune.study.records import Role, TrialRecord, config_key  # noqa: E402
from autotune.trial.protocol import Measurement, TrialStatus  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
MAX_ASKS = 200
CPU = DeviceInfo(type="cpu", index=None, name="2-core CPU", total_memory_bytes=2**34,
                 cpu_count=2, bf16=True, tf32=False, fused_adamw=True, cuda_graphs=False)
# The knobs without recorded figures are fixed at the baseline's.
FIXES = {"compile_mode": "none", "num_workers": 0, "micro_batch_size": 8,
         "activation_checkpointing": "none"}
MICRO = FIXES["micro_batch_size"]


@dataclass(frozen=True)
class Bench:
    name: str
    source: str
    baseline: TrainConfig
    base_rate: float
    alone: Mapping[tuple[str, Any], float]  # (knob, value) -> rate with that change alone
    fixes: Mapping[str, Any]
    convolutional: bool = False

    def rate(self, config: TrainConfig) -> float:
        rate = self.base_rate
        for (knob, value), alone in self.alone.items():
            if getattr(config, knob) == value:
                rate *= alone / self.base_rate
        return rate

    def space(self) -> SearchSpace:
        return build_space(self.baseline, CPU, 4096, fixes={**FIXES, **self.fixes},
                           convolutional=self.convolutional)


BASELINE = TrainConfig(micro_batch_size=MICRO)  # the for-loop AdamW, fp32
BENCHES = (
    Bench("many_small_params", "tests/models/many_small_params.py, `autotune run --fix "
          "precision=fp32` on the 2 shared CPU cores (11:13 UTC, 26 Nov, load 5.9; the corner "
          "measured 88.5); foreach assumed halfway to fused",
          BASELINE, 147.7, {("optimizer_impl", "fused"): 347.2,
                            ("optimizer_impl", "foreach"): (147.7 + 347.2) / 2,
                            ("memory_format", "channels_last"): 44.4},
          {"precision": "fp32"}, convolutional=True),
    Bench("issue 31's report", "the ratios the issue gives: fused alone 1.6x, the corner "
          "(bf16 + fused) 0.95x; foreach assumed halfway",
          BASELINE, 100.0, {("optimizer_impl", "fused"): 160.0,
                            ("optimizer_impl", "foreach"): 130.0,
                            ("precision", "bf16"): 100 * 0.95 / 1.6}, {}),
    Bench("mlp", "benchmarks/results/cpu_mlp_configs.md (bf16 alone 1.74x); the AdamW "
          "implementations assumed to make no difference", BASELINE, 6257.9,
          {("precision", "bf16"): 10863.1}, {}),
)


def best_single(bench: Bench, space: SearchSpace) -> float:
    return max(bench.rate(c) for c in one_knob_sweep(space))


def one_knob_sweep(space: SearchSpace) -> list[TrainConfig]:
    """Every configuration one knob away from the baseline, in the knobs' field order."""
    return [space.with_changes({knob: value}) for knob, values in space.domains.items()
            for value in values if value != getattr(space.baseline, knob)]


def sweep_trials(bench: Bench, space: SearchSpace, target: float) -> int:
    """Trials of the sweep (the baseline first) until one reaches `target`."""
    rates = [bench.rate(space.baseline)] + [bench.rate(c) for c in one_knob_sweep(space)]
    return next(i + 1 for i, r in enumerate(rates) if r >= target)


def search_trials(bench: Bench, space: SearchSpace, target: float, seed: int,
                  expert: bool, budget: int = 30) -> int | None:
    """Measured trials until one reaches `target` (None within `budget`): the baseline, the
    fast corner, then (with `expert`) the expert's trials, and TPE as the tuner sets it up."""
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                         n_startup_trials=min(10, max(3, budget // 3)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    queue = [(space.params_for(space.baseline), Role.BASELINE, ()),
             (space.params_for(space.fast_corner(MICRO)),
              Role.FAST_CORNER, ())]
    records: list[TrialRecord] = []
    seen: set[str] = set()
    for _ in range(MAX_ASKS):
        if expert and not queue and (queued := next_expert_trial(records, space)):
            queue.append((queued.params, queued.role, queued.changed))
        if expert and (kept := kept_at_baseline(records, space)):
            study.sampler = optuna.samplers.PartialFixedSampler(kept, sampler)
        params, role, changed = queue.pop(0) if queue else (None, Role.SEARCH, ())
        if params is not None:
            study.enqueue_trial(params)
        trial = study.ask()
        config = space.suggest(trial)
        rate = bench.rate(config)
        study.tell(trial, rate)
        if config_key(config) in seen:
            continue
        seen.add(config_key(config))
        records.append(TrialRecord(number=len(records), status=TrialStatus.OK, config=config,
                                   role=role, changed=changed, value=rate, constraint=0.0,
                                   measurement=Measurement(samples_per_sec=rate)))
        if rate >= target * (1 - 1e-9):
            return len(records)
        if len(records) >= budget:
            return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    args = parser.parse_args()
    print("| bench | best one-knob change | sweep | corner then TPE (median, worst) "
          "| with the expert's trials (median, worst) |")
    print("|---|---|---|---|---|")
    for bench in BENCHES:
        space = bench.space()
        target = best_single(bench, space)
        best = max(one_knob_sweep(space), key=bench.rate)
        change = ", ".join(f"{k}={v}" for k, v in best.to_dict().items()
                           if v != getattr(space.baseline, k))
        columns = []
        for expert in (False, True):
            found = [search_trials(bench, space, target, seed, expert)
                     for seed in range(args.seeds)]
            reached = [n for n in found if n is not None]
            worst = "never" if len(reached) < len(found) else max(reached)
            median = statistics.median(reached) if reached else "never"
            columns.append(f"{median}, {worst}")
        print(f"| {bench.name} | {change} ({target / bench.base_rate:.2f}x) | "
              f"{sweep_trials(bench, space, target)} | {columns[0]} | {columns[1]} |")
    print()
    for bench in BENCHES:
        print(f"- {bench.name}: {bench.source}")


if __name__ == "__main__":
    main()
