"""After how many trials the search first measures the best one-knob change (or something as
fast, within `REACHED`), and how far its final answer falls short, replayed over measured
one-knob sweeps (`one_knob_sweep.py`): an exhaustive one-knob sweep, the search as it was
(baseline, fast corner, then TPE), and the search with `search/expert`'s trials (baseline, fast
corner, each of its changes alone where it did not win clearly, or taken back from it where it
did, the best so far compiled, then TPE with the knobs that lost alone kept at the baseline's
value).

A configuration's rate is the baseline's times the ratio each of its changes made alone in the
sweep (the changes taken as independent: an assumption; for many_small_params it predicted the
corner at 104 samples/s where 88.5 was measured). Each replayed trial's figure carries the
sweep's own noise (a log-normal factor of the spread its rounds showed), so the search can be
fooled as a real one is; whether a trial reached the target is judged on its true rate. The
final answer is the trial measured fastest after `--budget` trials; its regret is how far its
true rate falls short of the best configuration the space holds under the same rates (each
knob's best change together). Not replayed: the DataLoader plan, which in a real run sets
workers from the probe's loader rates. No process runs: seconds for every seed.

    python benchmarks/expert_search.py --seeds 10 --sweep benchmarks/results/sweeps/*.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.config import TrainConfig  # noqa: E402
from autotune.search.expert import kept_at_baseline, next_expert_trial  # noqa: E402
from autotune.search.space import SearchSpace  # noqa: E402
from autotune.study.records import Role, TrialRecord, config_key  # noqa: E402
from autotune.trial.protocol import Measurement, TrialStatus  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
MAX_ASKS = 200
# A configuration within this share of the best one-knob change counts as reaching it: two
# compile modes 0.4% apart are one answer on a machine whose figures move 2-5%.
REACHED = 0.02


@dataclass(frozen=True)
class Bench:
    name: str
    source: str
    space: SearchSpace
    base_rate: float
    alone: Mapping[tuple[str, Any], float]  # (knob, value) -> rate with that change alone
    noise: float                            # a single figure's log-normal sigma

    def rate(self, config: TrainConfig) -> float:
        rate = self.base_rate
        for (knob, value), alone in self.alone.items():
            if getattr(config, knob) == value:
                rate *= alone / self.base_rate
        return rate

    def best_single(self) -> tuple[dict[str, Any], float]:
        """The fastest one-knob change and its rate."""
        (knob, value), rate = max(self.alone.items(), key=lambda kv: kv[1])
        return {knob: value}, rate

    def oracle(self) -> float:
        """The space's best under these rates: each knob's best change, together where they
        go together, else the best single one."""
        best: dict[str, tuple[Any, float]] = {}
        for (knob, value), rate in self.alone.items():
            if rate > best.get(knob, (None, self.base_rate))[1]:
                best[knob] = (value, rate)
        together = self.rate(self.space.with_changes({k: v for k, (v, _) in best.items()}))
        return max(together, self.best_single()[1])


def load_sweep(path: Path) -> Bench:
    data = json.loads(path.read_text())
    stored = data["space"]
    baseline = TrainConfig.from_dict(stored["baseline"])
    space = SearchSpace(
        domains={k: tuple(v) for k, v in stored["domains"].items()}, baseline=baseline,
        global_batch=stored["global_batch"],
        batch_range=tuple(stored["batch_range"]) if stored["batch_range"] else None,
        fixed_grad_accum=stored["fixed_grad_accum"], max_grad_accum=stored["max_grad_accum"])
    sweep = data["sweep"]
    base_rate = statistics.median(r for r in sweep[0]["rates"] if r)
    alone = {}
    for entry in sweep[1:]:
        (knob, value), = entry["change"].items()
        alone[(knob, value)] = base_rate * entry["ratio"] if entry["ratio"] else 0.0
    # a ratio's spread over rounds is two figures' noise: one figure's is 1/sqrt(2) of it
    spreads = [statistics.stdev(map(math.log, e["ratios"])) / math.sqrt(2)
               for e in sweep[1:] if len(e["ratios"]) > 1]
    name = Path(data["model"]).stem
    args = ", ".join(f"{k}={v}" for k, v in data["model_args"].items())
    source = (f"`{data['model']}`{f' ({args})' if args else ''}: {len(sweep) - 1} one-knob "
              f"changes, {data['rounds']} rounds, {data['at']}, {data['machine']}")
    return Bench(name, source, space, base_rate, alone,
                 statistics.median(spreads) if spreads else 0.0)


def sweep_trials(bench: Bench, target: float) -> int:
    """Trials of the sweep (the baseline first, the knobs in field order) until one reaches
    `target`."""
    rates = [bench.base_rate] + list(bench.alone.values())
    return next(i + 1 for i, r in enumerate(rates) if r >= target * (1 - REACHED))


@dataclass(frozen=True)
class Replay:
    reached: int | None   # trials until one reached the target (None: not within the budget)
    regret: float         # 1 - the final answer's true rate / the oracle's


def replay(bench: Bench, target: float, seed: int, expert: bool, budget: int) -> Replay:
    """`budget` measured trials: the baseline, the fast corner (at the largest micro-batch the
    sweep ran, as the tuner's memory check would pick), then (with `expert`) the expert's
    trials, and TPE as the tuner sets it up, each trial's figure with the sweep's noise."""
    space = bench.space
    micro = max(m for m in space.domains["micro_batch_size"]
                if bench.alone.get(("micro_batch_size", m), 1.0) > 0)
    noise = random.Random(seed)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                         n_startup_trials=min(10, max(3, budget // 3)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    queue = [(space.params_for(space.baseline), Role.BASELINE, ()),
             (space.params_for(space.fast_corner(micro)),
              Role.FAST_CORNER, ())]
    records: list[TrialRecord] = []
    truths: list[float] = []
    seen: set[str] = set()
    reached = None
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
        truth = bench.rate(config)
        measured = truth * noise.lognormvariate(0, bench.noise)
        study.tell(trial, measured)
        if config_key(config) in seen:
            continue
        seen.add(config_key(config))
        status = TrialStatus.OK if truth > 0 else TrialStatus.OOM
        records.append(TrialRecord(number=len(records), status=status, config=config,
                                   role=role, changed=changed,
                                   value=measured if truth > 0 else None,
                                   constraint=0.0 if truth > 0 else 1.0,
                                   measurement=Measurement(samples_per_sec=measured)))
        truths.append(truth)
        if reached is None and truth >= target * (1 - REACHED):
            reached = len(records)
        if len(records) >= budget:
            break
    answer = max(range(len(records)), key=lambda i: records[i].value or 0.0)
    return Replay(reached, 1 - truths[answer] / bench.oracle())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=13,
                        help="measured trials, the baseline's included (a default run of the "
                             "issue's model measured 13)")
    parser.add_argument("--sweep", action="append", required=True, help="one_knob_sweep JSON")
    args = parser.parse_args()
    benches = [load_sweep(Path(p)) for p in args.sweep]
    print(f"{args.seeds} seeds, {args.budget} trials each; trials until the best one-knob "
          "change (or as fast) is measured: median, worst (never: not within the budget); "
          "regret of the final answer: median, worst\n")
    print("| model | best one-knob change | oracle | noise | sweep | corner then TPE | regret "
          "| with the expert's trials | regret |")
    print("|---|---|---|---|---|---|---|---|---|")
    for bench in benches:
        change, target = bench.best_single()
        columns = []
        for expert in (False, True):
            runs = [replay(bench, target, seed, expert, args.budget)
                    for seed in range(args.seeds)]
            reached = [r.reached for r in runs if r.reached is not None]
            worst = "never" if len(reached) < len(runs) else max(reached)
            median = statistics.median(reached) if reached else "never"
            regrets = [r.regret for r in runs]
            columns += [f"{median}, {worst} ({len(reached)}/{len(runs)})",
                        f"{statistics.median(regrets):.0%}, {max(regrets):.0%}"]
        said = ", ".join(f"{k}={v}" for k, v in change.items())
        print(f"| {bench.name} | {said} ({target / bench.base_rate:.2f}x) | "
              f"{bench.oracle() / bench.base_rate:.2f}x | {bench.noise:.0%} | "
              f"{sweep_trials(bench, target)} | " + " | ".join(columns) + " |")
    print()
    for bench in benches:
        print(f"- {bench.name}: {bench.source}")


if __name__ == "__main__":
    main()
