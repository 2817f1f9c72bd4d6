"""After how many trials the search first measures the best one-knob change (or something as
fast, within `REACHED`), how far its final answer falls short, and how often that answer
carries a change that does not pay, replayed over measured one-knob sweeps
(`one_knob_sweep.py`): an exhaustive one-knob sweep, the search as it was (baseline, fast
corner, then TPE), the search with `search/expert`'s trials after the corner (each of its
changes alone where it did not win clearly, or taken back from it where it did, the best so far
compiled, then TPE with the knobs that lost alone kept at the baseline's value), and today's
search, which first fixes the bottleneck the baseline's profile names (`next_bottleneck_trial`,
from the sweep's profiled baseline; a moved point's shares are modelled: the time a change
saves comes off the shares it addresses).

A change of the final answer does not pay where taking it back costs less than `PAYS` of its
true rate; the minimal answer (the confirmation's taking back) is modelled as each change taken
back in paired rounds with the sweep's noise, and dropped where that measured cost is inside
twice the rounds' noise.

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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.config import TrainConfig, loader_settings  # noqa: E402
from autotune.search.expert import (  # noqa: E402
    kept_at_baseline,
    next_bottleneck_trial,
    next_expert_trial,
)
from autotune.search.shortcuts import bottleneck_fix  # noqa: E402
from autotune.search.space import SearchSpace  # noqa: E402
from autotune.study.bottleneck import (  # noqa: E402
    COMPUTE,
    DATA_WAIT,
    OPTIMIZER,
    OVERHEAD,
    Diagnosis,
    Share,
    diagnose,
)
from autotune.study.records import Role, TrialRecord, config_key  # noqa: E402
from autotune.trial.protocol import LoaderRate, Measurement, TrialStatus  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
MAX_ASKS = 200
# A configuration within this share of the best one-knob change counts as reaching it: two
# compile modes 0.4% apart are one answer on a machine whose figures move 2-5%.
REACHED = 0.02
# A change of the answer pays where taking it back costs at least this share of its rate.
PAYS = 0.02
# Paired rounds the minimal answer's taking back is modelled with.
TAKE_BACK_ROUNDS = 3
# The share of the step each knob addresses, for a moved point's modelled diagnosis.
ADDRESSES = {"num_workers": DATA_WAIT, "prefetch_factor": DATA_WAIT,
             "persistent_workers": DATA_WAIT, "pin_memory": DATA_WAIT,
             "optimizer_impl": OPTIMIZER, "micro_batch_size": OVERHEAD,
             "compile_mode": OVERHEAD}
MODES = ("corner", "expert", "bottleneck")


@dataclass(frozen=True)
class Bench:
    name: str
    source: str
    space: SearchSpace
    base_rate: float
    alone: Mapping[tuple[str, Any], float]  # (knob, value) -> rate with that change alone
    noise: float                            # a single figure's log-normal sigma
    baseline: Measurement | None = None     # profiled, where the sweep recorded it
    loader_rates: tuple[LoaderRate, ...] = ()
    state_bytes: int = 0
    memory_limit: int | None = None

    def diagnosis(self, config: TrainConfig) -> Diagnosis | None:
        """Where `config`'s step goes: the baseline's as profiled; another's modelled from it,
        the time its changes save taken off the shares they address (forward and backward
        for a change that addresses none)."""
        if self.baseline is None:
            return None
        first = diagnose(self.baseline, self.memory_limit)
        if first is None or config == self.space.baseline:
            return first
        before, now = 1 / self.base_rate, 1 / self.rate(config)
        times = {s.kind: s.fraction * before for s in first.shares}
        addressed = {ADDRESSES.get(k, COMPUTE) for k, v in config.to_dict().items()
                     if v != getattr(self.space.baseline, k) and k != "grad_accum_steps"}
        held = sum(times[k] for k in addressed) or 1e-12
        for kind in addressed:
            times[kind] = max(0.0, times[kind] - (before - now) * times[kind] / held)
        total = sum(times.values()) or 1e-12
        return Diagnosis(tuple(sorted((Share(k, t / total) for k, t in times.items()),
                                      key=lambda x: -x.fraction)), None, first.memory_free)

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
    measured = data.get("baseline_measurement")
    # the plan's rates are the space's settings' (the tuner's `_planned_loader_rates`)
    settings = set(loader_settings(space.domains))
    return Bench(name, source, space, base_rate, alone,
                 statistics.median(spreads) if spreads else 0.0,
                 Measurement.from_json(measured) if measured else None,
                 tuple(rate for r in data.get("loader_rates", ())
                       if ((rate := LoaderRate(**r)).num_workers, rate.prefetch_factor)
                       in settings),
                 data.get("state_bytes", 0), data.get("memory_limit_bytes"))


def sweep_trials(bench: Bench, target: float) -> int:
    """Trials of the sweep (the baseline first, the knobs in field order) until one reaches
    `target`."""
    rates = [bench.base_rate] + list(bench.alone.values())
    return next(i + 1 for i, r in enumerate(rates) if r >= target * (1 - REACHED))


@dataclass(frozen=True)
class Replay:
    reached: int | None   # trials until one reached the target (None: not within the budget)
    regret: float         # 1 - the final answer's true rate / the oracle's
    idle_changes: int     # changes of the final answer that do not pay (`PAYS`)
    idle_after: int       # ... left after the minimal answer's taking back


def replay(bench: Bench, target: float, seed: int, mode: str, budget: int) -> Replay:
    """`budget` measured trials: the baseline, (`bottleneck`) the fixes of its step's dominant
    share, the fast corner (at the largest micro-batch the sweep ran, as the tuner's memory
    check would pick), then (`expert`, `bottleneck`) the expert's trials, and TPE as the tuner
    sets it up, each trial's figure with the sweep's noise."""
    space = bench.space
    micro = max(m for m in space.domains["micro_batch_size"]
                if bench.alone.get(("micro_batch_size", m), 1.0) > 0)
    noise = random.Random(seed)
    sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                         n_startup_trials=min(10, max(3, budget // 3)))
    study = optuna.create_study(direction="maximize", sampler=sampler)
    corner = (space.params_for(space.fast_corner(micro)), Role.FAST_CORNER, ())
    queue = [(space.params_for(space.baseline), Role.BASELINE, ())]
    records: list[TrialRecord] = []
    truths: dict[str, float] = {}   # each configuration measured: its true rate
    seen: dict[str, int] = {}       # ... and its record's number
    reached, cornered = None, False
    first = bench.diagnosis(space.baseline)

    def fix(knob: str, current: TrialRecord) -> dict[str, Any] | None:
        return bottleneck_fix(knob, current, records, space, bench.loader_rates, "cpu",
                              bench.memory_limit, lambda: bench.state_bytes)

    for _ in range(MAX_ASKS):
        if records and not queue and mode == "bottleneck" and not cornered and \
                (move := next_bottleneck_trial(records, space,
                                               lambda r: bench.diagnosis(r.config), fix)):
            queue.append((move.params, move.role, move.changed))
        if records and not queue and not cornered:
            queue.append(corner)
            cornered = True
        if mode != "corner" and not queue and (queued := next_expert_trial(
                records, space, first.first_knobs() if first and mode == "bottleneck"
                else ())):
            queue.append((queued.params, queued.role, queued.changed))
        if mode != "corner" and (kept := kept_at_baseline(records, space)):
            study.sampler = optuna.samplers.PartialFixedSampler(kept, sampler)
        params, role, changed = queue.pop(0) if queue else (None, Role.SEARCH, ())
        if params is not None:
            study.enqueue_trial(params)
        trial = study.ask()
        config = space.suggest(trial)
        truth = bench.rate(config)
        measured = truth * noise.lognormvariate(0, bench.noise)
        study.tell(trial, measured)
        key = config_key(config)
        if key in seen:
            # a repeat costs no trial; an expert's is recorded, as the tuner records it, so
            # that the expert sees it done
            if role != Role.SEARCH:
                records.append(replace(_record(bench, len(records), config, role, changed,
                                               truth, measured), duplicate_of=seen[key]))
            continue
        seen[key] = len(records)
        records.append(_record(bench, len(records), config, role, changed, truth, measured))
        truths[key] = truth
        if reached is None and truth >= target * (1 - REACHED):
            reached = len(truths)
        if len(truths) >= budget:
            break
    measured_records = [r for r in records if not r.duplicate]
    answer = max(measured_records, key=lambda r: r.value or 0.0).config
    minimal = _minimal(bench, answer, noise)
    return Replay(reached, 1 - truths[config_key(answer)] / bench.oracle(),
                  len(_idle_changes(bench, answer)), len(_idle_changes(bench, minimal)))


def _record(bench: Bench, number: int, config: TrainConfig, role: str,
            changed: tuple[str, ...], truth: float, measured: float) -> TrialRecord:
    """A replayed trial as the search reads it: its figure, and for the moves, the data wait and
    peak memory its diagnosis and the memory check read."""
    ok = truth > 0
    figures = Measurement(samples_per_sec=measured)
    if bench.baseline is not None and ok:
        wait = bench.diagnosis(config)
        figures = Measurement(samples_per_sec=measured,
                              data_wait_fraction=wait.share(DATA_WAIT) if wait else None,
                              peak_memory_bytes=bench.baseline.peak_memory_bytes)
    return TrialRecord(number=number, status=TrialStatus.OK if ok else TrialStatus.OOM,
                       config=config, role=role, changed=changed,
                       value=measured if ok else None, constraint=0.0 if ok else 1.0,
                       measurement=figures)


def _changes(bench: Bench, config: TrainConfig) -> list[tuple[str, ...]]:
    """The answer's changes as a user makes them: the DataLoader's knobs together, the
    micro-batch with its accumulation, every other knob alone."""
    base = bench.space.baseline
    changed = [k for k, v in config.to_dict().items() if v != getattr(base, k)]
    loader = tuple(k for k in changed if ADDRESSES.get(k) == DATA_WAIT)
    batch = tuple(k for k in changed if k in ("micro_batch_size", "grad_accum_steps"))
    rest = [(k,) for k in changed if k not in loader and k not in batch]
    return [g for g in (loader, batch, *rest) if g]


def _taken_back(bench: Bench, config: TrainConfig, group: tuple[str, ...]) -> TrainConfig:
    base = bench.space.baseline
    return bench.space.with_changes({k: v for k, v in config.to_dict().items()
                                     if v != getattr(base, k) and k not in group
                                     and k != "grad_accum_steps"})


def _idle_changes(bench: Bench, config: TrainConfig) -> list[tuple[str, ...]]:
    """The changes of `config` whose taking back costs less than `PAYS` of its true rate."""
    rate = bench.rate(config)
    return [g for g in _changes(bench, config)
            if bench.rate(_taken_back(bench, config, g)) >= rate * (1 - PAYS)]


def _minimal(bench: Bench, config: TrainConfig, noise: random.Random) -> TrainConfig:
    """The answer less every change whose taking back, measured in paired rounds with the
    sweep's noise, costs less than twice the rounds' own noise."""
    sigma = bench.noise * math.sqrt(2 / TAKE_BACK_ROUNDS)
    rate, kept = bench.rate(config), config
    for group in _changes(bench, config):
        back = bench.rate(_taken_back(bench, config, group))
        if back / rate * noise.lognormvariate(0, sigma) >= 1 - 2 * max(sigma, 0.01):
            kept = _taken_back(bench, kept, group)
    return kept


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
          "regret of the final answer: median, worst; answers carrying a change that does "
          f"not pay (taking it back costs under {PAYS:.0%}): as searched, after the minimal "
          "answer's taking back\n")
    print("| model | the baseline's dominant share | best one-knob change | oracle | noise | "
          "sweep | corner then TPE | with the expert's trials | bottleneck first | regret | "
          "answers with a change that does not pay |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for bench in benches:
        change, target = bench.best_single()
        columns = []
        for mode in MODES:
            runs = [replay(bench, target, seed, mode, args.budget)
                    for seed in range(args.seeds)]
            reached = [r.reached for r in runs if r.reached is not None]
            worst = "never" if len(reached) < len(runs) else max(reached)
            median = statistics.median(reached) if reached else "never"
            columns.append(f"{median}, {worst} ({len(reached)}/{len(runs)})")
        regrets = [r.regret for r in runs]
        idle = sum(r.idle_changes > 0 for r in runs)
        after = sum(r.idle_after > 0 for r in runs)
        columns += [f"{statistics.median(regrets):.0%}, {max(regrets):.0%}",
                    f"{idle}/{len(runs)} -> {after}/{len(runs)}"]
        diagnosis = bench.diagnosis(bench.space.baseline)
        dominant = "not profiled" if diagnosis is None else (
            f"{diagnosis.dominant} {diagnosis.share(diagnosis.dominant):.0%}"
            if diagnosis.dominant and diagnosis.share(diagnosis.dominant) is not None
            else diagnosis.dominant or "none")
        said = ", ".join(f"{k}={v}" for k, v in change.items())
        print(f"| {bench.name} | {dominant} | {said} ({target / bench.base_rate:.2f}x) | "
              f"{bench.oracle() / bench.base_rate:.2f}x | {bench.noise:.0%} | "
              f"{sweep_trials(bench, target)} | " + " | ".join(columns) + " |")
    print()
    for bench in benches:
        print(f"- {bench.name}: {bench.source}")


if __name__ == "__main__":
    main()
