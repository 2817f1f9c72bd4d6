"""How fast each search strategy gets to the optimum of a CPU-sized space, against the grid.

1. Grid (ground truth): every configuration of the space measured twice, each run in its own
   process with the trial protocol, plus the DataLoader's own rates. Saved as raw results
   (`--grid FILE` reuses them instead of measuring again).
2. Strategies, replayed over the measured grid for each seed: a trial of configuration c
   returns one of c's two measured runs (which one is drawn per seed) and costs that run's
   measured wall time; a screened trial costs its wall time up to the end of its screening
   window. The search code is the product's own (`Tuner`, handed a runner that answers the
   trials from the grid and the probe from one real probe of the model, with the grid's
   DataLoader rates):
   - autotune: memory model, DataLoader plan, screening, budget K trials;
   - plain TPE: `--plain-tpe`, the same budget over the same space;
   - largest micro-batch that fits, everything else the user's (Lightning's batch-size finder,
     Accelerate's find_executable_batch_size): double from the smallest until it does not fit;
   - micro-batch sweep around a memory estimate, other knobs fixed (DeepSpeed's fast mode):
     two runs fit peak memory against the micro-batch, then every micro-batch the estimate
     says fits is measured.
3. For each: median regret (the grid's optimum over the true rate of the configuration the
   strategy ends with, both as the mean of the two measured runs), median trials and wall time
   until the configuration it would pick is within 97% of the optimum, median OOM trials.

The memory limit is applied to the grid's measured peaks (a run above it is `over_memory`, as
the tuner classifies it) and set per bench so that part of the space does not fit.
Prints figures, writes benchmarks/results/<name>.json and .md; asserts nothing.

    python benchmarks/search_efficiency.py --seeds 10               # mlp
    python benchmarks/search_efficiency.py --bench rgat --seeds 10  # tiny rgat
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import MeasureSettings, TuneOptions  # noqa: E402
from autotune.search.isolation import run_isolated  # noqa: E402
from autotune.search.runner import MeasureJob  # noqa: E402
from autotune.search.tuner import Tuner  # noqa: E402
from autotune.study.records import (  # noqa: E402
    COUNTS_AGAINST_BUDGET,
    RAN_OUT,
    config_key,
    trial_records,
)
from autotune.target import ModelFile  # noqa: E402
from autotune.trial.protocol import (  # noqa: E402
    LoaderRate,
    Measurement,
    ProbeReport,
    TrialRequest,
    TrialResult,
    TrialStatus,
)

RESULTS = ROOT / "benchmarks" / "results"
SETTINGS = MeasureSettings(window_steps=3, window_seconds=0.5, warmup_max_seconds=4,
                           profile_steps=1)
TARGET = 0.97


@dataclass(frozen=True)
class Bench:
    """A CPU-sized space on one tiny reference model, and the memory limit applied to it."""

    model: str
    model_args: dict[str, Any]
    space: dict[str, list[Any]]
    global_batch: int
    memory_limit_mib: int


BENCHES = {
    # The process's peak RSS is about 0.37 GiB with loader workers and 0.74-0.85 GiB with
    # in-process loading, highest at the small micro-batches (more accumulation steps). The
    # limit sits between those plateaus: part of the in-process configurations do not fit.
    "mlp": Bench("models/mlp.py",
                 {"feature_dim": 256, "hidden": 512, "layers": 4, "num_samples": 16384},
                 {"micro_batch_size": [128, 256, 512, 1024], "precision": ["fp32", "bf16"],
                  "activation_checkpointing": ["none", "full"],
                  "optimizer_impl": ["for_loop", "fused"], "num_workers": [0, 2],
                  "prefetch_factor": [2], "persistent_workers": [True], "pin_memory": [False],
                  "compile_mode": ["none"]}, 1024, 775),
    # The README's tiny rgat: graph batches, where bf16 does not pay. Peaks are 0.36-0.99 GiB,
    # the highest at micro-batch 4 with checkpointing; 16 of the 64 do not fit 600 MiB.
    "rgat": Bench("models/rgat.py",
                  {"hidden": 32, "graph_layers": 2, "max_nodes": 8, "max_text_len": 4,
                   "vocab_size": 256},
                  {"micro_batch_size": [4, 8, 16, 32], "precision": ["fp32", "bf16"],
                   "activation_checkpointing": ["none", "full"],
                   "optimizer_impl": ["for_loop", "fused"], "num_workers": [0, 1],
                   "prefetch_factor": [2], "persistent_workers": [True], "pin_memory": [False],
                   "compile_mode": ["none"]}, 32, 600),
}


def options(bench: Bench, studies: str, space_file: str, trials: int, seed: int,
            limit: int | None, plain: bool = False, corner: bool = True) -> TuneOptions:
    return TuneOptions(model_path=str(ROOT / bench.model), model_args=bench.model_args,
                       device="cpu", studies_dir=studies, trials=trials, seed=seed,
                       settings=SETTINGS, space_file=space_file,
                       global_batch=bench.global_batch, memory_limit_bytes=limit,
                       memory_headroom=0.0, stall_penalty=0.0, confirm_repeats=0,
                       plain_tpe=plain, fast_corner_first=corner)


# -- the grid ---------------------------------------------------------------------------------

def measure_grid(bench: Bench, space_file: str, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as studies:
        tuner = Tuner(options(bench, studies, space_file, 1, 0, None))
        tuner.close()
        configs = tuner.space.grid()
        loader = tuner.probe.loader_rates
    runs: dict[str, dict[str, Any]] = {config_key(c): {"config": c.to_dict(), "runs": []}
                                       for c in configs}
    started = time.monotonic()
    for repeat in range(repeats):  # passes, so that drift spreads over every configuration
        for index, config in enumerate(configs):
            result = run_isolated(TrialRequest(
                ModelFile(str(ROOT / bench.model), bench.model_args), config=config.to_dict(),
                device="cpu", settings=SETTINGS), 600)
            m = result.measurement
            figures = m.to_json() if m is not None else {}
            runs[config_key(config)]["runs"].append(
                {"status": result.status.value, "wall_s": result.wall_s, "metrics": {
                    k: v for k, v in figures.items()
                    if k not in ("top_operators", "findings", "trace_path")}})
            print(f"grid pass {repeat + 1}/{repeats}, {index + 1}/{len(configs)}: "
                  f"{result.status} {m.samples_per_sec if m else 0:,.0f}/s "
                  f"({time.monotonic() - started:.0f} s)", flush=True)
    return {"model": bench.model, "model_args": bench.model_args, "space": bench.space,
            "settings": vars(SETTINGS), "loader_rates": [r.to_dict() for r in loader],
            "configs": list(runs.values())}


def grid_key(entry: dict[str, Any]) -> str:
    """A grid configuration's `config_key` (knobs added since the grid was measured take their
    defaults)."""
    return config_key(TrainConfig.from_dict(entry["config"]))


def observed(run: dict[str, Any]) -> TrialResult:
    """One measured run of the grid as the trial's result ("metrics": its measurement)."""
    return TrialResult(run["status"], "replayed", wall_s=run["wall_s"],
                       measurement=Measurement.from_json(run["metrics"])
                       if run["metrics"] else None)


def truth(entry: dict[str, Any], limit: int) -> float:
    """The configuration's rate (mean of its runs); 0 when it does not fit."""
    runs = [observed(r) for r in entry["runs"]]
    if any(r.status != TrialStatus.OK or r.measurement is None or
           (r.measurement.peak_memory_bytes or 0) > limit for r in runs):
        return 0.0
    return statistics.mean(r.measurement.samples_per_sec for r in runs)


# -- replay -----------------------------------------------------------------------------------

class Replay:
    """One seed's view of the grid: which measured run each configuration returns."""

    def __init__(self, grid: dict[str, Any], seed: int, limit: int) -> None:
        self.table = {grid_key(c): c for c in grid["configs"]}
        self.seed, self.limit = seed, limit
        # (config key, wall s, status)
        self.spent: list[tuple[str, float, TrialStatus]] = []

    def run(self, config: TrainConfig, screen_below: float | None = None) -> TrialResult:
        key = config_key(config)
        entry = self.table[key]
        digest = hashlib.sha256(f"{self.seed}:{key}".encode()).digest()
        result = observed(entry["runs"][digest[0] % len(entry["runs"])])
        m, wall, status = result.measurement, result.wall_s, result.status
        if m is not None and screen_below is not None and \
                m.screen_samples_per_sec is not None and m.screen_samples_per_sec < screen_below:
            wall += m.screen_done_s - m.measure_wall_s
            m = replace(m, samples_per_sec=m.screen_samples_per_sec, screened=True)
        if status == TrialStatus.OK and m is not None and \
                (m.peak_memory_bytes or 0) > self.limit:
            status = TrialStatus.OVER_MEMORY
        self.spent.append((key, wall, TrialStatus.SCREENED if m and m.screened else status))
        return replace(result, measurement=m, wall_s=wall, config=config)


class ReplayRunner:
    """The tuner's runner, its trials answered from the grid and its probe from one real
    probe of the model (with the grid's own DataLoader rates)."""

    def __init__(self, report: ProbeReport, replay: Replay) -> None:
        self.report, self.replay = report, replay

    def probe(self, device: str, time_limit_s: float) -> ProbeReport:
        return self.report

    def measure(self, config: TrainConfig, job: MeasureJob) -> TrialResult:
        return self.replay.run(config, job.screen_below)

    def preload(self, probe: ProbeReport) -> str | None:
        """Nothing is imported: no trial runs."""
        return None

    def close(self) -> None:
        """Nothing runs."""


def run_tuner(bench: Bench, grid: dict[str, Any], report: ProbeReport, space_file: str,
              seed: int, budget: int, limit: int, plain: bool = False, corner: bool = True
              ) -> list[tuple[str, float, str, str | None]]:
    """(config key, wall s, status, key the tuner would pick now) per trial it ran."""
    runner = ReplayRunner(report, Replay(grid, seed, limit))
    with tempfile.TemporaryDirectory() as studies:
        tuner = Tuner(options(bench, studies, space_file, budget, seed, limit, plain, corner),
                      runner=runner)
        tuner.run()
        records = trial_records(tuner.study)
    steps, best, best_score = [], None, -math.inf
    for r in records:
        if r.duplicate or r.status not in COUNTS_AGAINST_BUDGET:
            continue
        if r.score is not None and r.score > best_score:
            best, best_score = config_key(r.config), r.score
        steps.append((config_key(r.config), r.wall_s, r.status, best))
    return steps


def run_largest_fit(bench: Bench, grid: dict[str, Any], baseline: TrainConfig, seed: int,
                    limit: int) -> list[tuple[str, float, str, str | None]]:
    replay = Replay(grid, seed, limit)
    steps, best = [], None
    for micro in bench.space["micro_batch_size"]:
        config = baseline.replace(micro_batch_size=micro,
                                  grad_accum_steps=bench.global_batch // micro)
        replay.run(config)
        key, wall, status = replay.spent[-1]
        if status == TrialStatus.OK:
            best = key
        steps.append((key, wall, status, best))
        if status != TrialStatus.OK:
            break
    return steps


def run_memory_sweep(bench: Bench, grid: dict[str, Any], baseline: TrainConfig, seed: int,
                     limit: int) -> list[tuple[str, float, str, str | None]]:
    replay = Replay(grid, seed, limit)
    micros = bench.space["micro_batch_size"]
    steps, best, best_rate, peaks = [], None, -math.inf, {}

    def measure(micro: int) -> None:
        nonlocal best, best_rate
        config = baseline.replace(micro_batch_size=micro,
                                  grad_accum_steps=bench.global_batch // micro)
        m = replay.run(config).measurement
        key, wall, status = replay.spent[-1]
        peaks[micro] = m.peak_memory_bytes if m else None
        if status == TrialStatus.OK and m.samples_per_sec > best_rate:
            best, best_rate = key, m.samples_per_sec
        steps.append((key, wall, status, best))

    measure(micros[0])
    measure(micros[1])
    slope = (peaks[micros[1]] - peaks[micros[0]]) / (micros[1] - micros[0])
    fits = [m for m in micros[2:] if peaks[micros[0]] + slope * (m - micros[0]) <= limit]
    for micro in fits:
        measure(micro)
    return steps


def summarise(runs: list[list[tuple]], optimum: float, truths: dict[str, float]
              ) -> dict[str, Any]:
    regrets, trials_to, wall_to, ooms = [], [], [], []
    for steps in runs:
        final = steps[-1][3] if steps else None
        regrets.append(1 - truths.get(final, 0.0) / optimum)
        wall, reached = 0.0, None
        for index, (_, spent, _, pick) in enumerate(steps, start=1):
            wall += spent
            if pick and truths[pick] >= TARGET * optimum:
                reached = (index, wall)
                break
        trials_to.append(reached[0] if reached else math.inf)
        wall_to.append(reached[1] if reached else math.inf)
        ooms.append(sum(1 for _, _, status, _ in steps if status in RAN_OUT))
    return {"regret_median": statistics.median(regrets),
            "trials_to_97_median": _finite(statistics.median(trials_to)),
            "wall_s_to_97_median": _finite(statistics.median(wall_to)),
            "oom_trials_median": statistics.median(ooms),
            "reached_97": sum(1 for t in trials_to if math.isfinite(t)),
            "trials_median": statistics.median(len(s) for s in runs),
            "wall_s_median": statistics.median(sum(w for _, w, _, _ in s) for s in runs)}


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def markdown(result: dict[str, Any]) -> str:
    lines = [f"Space: {result['grid_size']} configurations of `{result['model']}` "
             f"{json.dumps(result['model_args'])} on CPU; memory limit "
             f"{result['memory_limit_bytes'] / 2**20:,.0f} MiB ({result['fitting']} fit); "
             f"optimum {result['optimum_samples_per_sec']:,.0f} samples/s; budget "
             f"{result['budget']} trials; {result['seeds']} seeds; medians over seeds.", "",
             "| strategy | regret | trials to 97% | wall s to 97% | OOM trials | reached 97% |"
             " trials run | wall s |", "|---|---|---|---|---|---|---|---|"]
    for name, row in result["strategies"].items():
        def show(v: Any, fmt: str) -> str:
            return "never" if v is None else format(v, fmt)
        lines.append(f"| {name} | {row['regret_median']:.1%} | "
                     f"{show(row['trials_to_97_median'], '.1f')} | "
                     f"{show(row['wall_s_to_97_median'], '.0f')} | "
                     f"{row['oom_trials_median']:.1f} | {row['reached_97']}/{result['seeds']} | "
                     f"{row['trials_median']:.1f} | {row['wall_s_median']:.0f} |")
    lines.append(f"| exhaustive grid | 0.0% | {result['grid_size']} | "
                 f"{result['grid_wall_s']:.0f} | {result['grid_oom']} | all | "
                 f"{result['grid_size']} | {result['grid_wall_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", choices=sorted(BENCHES), default="mlp",
                        help="which tiny reference model's space")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, help="trials per search (default: grid / 4)")
    parser.add_argument("--repeats", type=int, default=2, help="grid runs per configuration")
    parser.add_argument("--grid", help="reuse a grid file written by an earlier run")
    parser.add_argument("--memory-limit-mib", type=int,
                        help="memory allowed (default: the bench's own limit)")
    parser.add_argument("--name", help="output name (default: search_efficiency, with _rgat "
                                       "for the rgat bench)")
    args = parser.parse_args()
    bench = BENCHES[args.bench]
    name = args.name or "search_efficiency" + ("" if args.bench == "mlp" else f"_{args.bench}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(bench.space, handle)
        space_file = handle.name
    grid_file = Path(args.grid) if args.grid else RESULTS / f"{name}_grid.json"
    if args.grid:
        grid = json.loads(grid_file.read_text())
    else:
        grid = measure_grid(bench, space_file, args.repeats)
        grid_file.write_text(json.dumps(grid, indent=1))
    limit = (args.memory_limit_mib or bench.memory_limit_mib) * 2**20
    truths = {grid_key(c): truth(c, limit) for c in grid["configs"]}
    optimum = max(truths.values())
    budget = args.budget or len(truths) // 4
    with tempfile.TemporaryDirectory() as studies:
        tuner = Tuner(options(bench, studies, space_file, 1, 0, None))  # the real probe, once
        tuner.close()
    report = tuner.probe
    report.loader_rates = [LoaderRate(**r) for r in grid["loader_rates"]]
    baseline = tuner.baseline
    strategies: dict[str, Callable[[int], list]] = {
        "autotune": lambda s: run_tuner(bench, grid, report, space_file, s, budget, limit),
        "autotune without the fast corner (ablation)":
            lambda s: run_tuner(bench, grid, report, space_file, s, budget, limit,
                                corner=False),
        "plain TPE (ablation)": lambda s: run_tuner(bench, grid, report, space_file, s, budget,
                                                    limit, plain=True),
        "largest micro-batch that fits (Lightning, Accelerate)":
            lambda s: run_largest_fit(bench, grid, baseline, s, limit),
        "micro-batch sweep around a memory estimate (DeepSpeed fast)":
            lambda s: run_memory_sweep(bench, grid, baseline, s, limit),
    }
    rows = {}
    for label, strategy in strategies.items():
        runs = [strategy(seed) for seed in range(args.seeds)]
        rows[label] = summarise(runs, optimum, truths)
        print(f"{label}: {rows[label]}", flush=True)
    grid_runs = [r for c in grid["configs"] for r in c["runs"]]
    result = {
        "model": bench.model, "model_args": bench.model_args, "grid_size": len(truths),
        "budget": budget, "seeds": args.seeds,
        "memory_limit_bytes": limit, "fitting": sum(1 for v in truths.values() if v > 0),
        "optimum_samples_per_sec": optimum,
        "optimum_config": next(c["config"] for c in grid["configs"]
                               if truths[grid_key(c)] == optimum),
        "grid_wall_s": sum(r["wall_s"] for r in grid_runs) / len(grid_runs) * len(truths),
        "grid_oom": sum(1 for v in truths.values() if v == 0),
        "strategies": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1))
    table = markdown(result)
    (RESULTS / f"{name}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
