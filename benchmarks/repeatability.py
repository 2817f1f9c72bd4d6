"""How repeatable is a trial's samples/sec across fresh processes, beside the machine's floor?

Each reference model's baseline and one tuned configuration, at a tiny CPU size, is measured
`--repeats` times in fresh trial processes (`isolation.run_isolated`, as the tuner does) under
each protocol, round by round in a shuffled order, on a quiet machine (each quiet run waits for
a quiet moment first, bounded) and with one CPU-burning process beside it. The machine's own
floor is measured in the same rounds: a fixed matmul loop timed in fresh processes. Per case:
spread = (max - min) / median of the runs, and how many windows were flagged as disturbed.

Protocols, so that before and after come from one run, interleaved:
- before: the protocol as it was (a fixed 3 s window of at least 10 steps, contention measured
  but never re-measured);
- after: the current defaults (a window from 3 s until the median step time is known within
  ±2% or 15 s, a disturbed window measured again twice, then flagged);
- one process: the after protocol in one long-lived process per case, measured at the same
  moments as the others: the spread that is left when process start, build and memory layout
  are the same every time.

Writes benchmarks/results/<name>.json (every run, with the load it ran under) and <name>.md
(the table it prints).

    python benchmarks/repeatability.py --repeats 10
    python benchmarks/repeatability.py --repeats 10 --models mlp,rgat \\
        --protocols 'after,one process' --conditions quiet --name repeatability_one_process

What the spread is made of, on the 2-core virtual machine these figures come from (three runs
of 10 rounds on a quiet machine, mlp and rgat):
- The machine's own speed moves over minutes, unseen by /proc/stat (others' CPU share 0%):
  the matmul floor spread 31%, 7% and 51% in three runs hours apart.
- A fresh process adds nothing to that: one process measuring the same case at the same
  moments spreads as much (fresh/one-process spread 0.8-1.1x), and in one round the two
  figures move together (correlation +0.50 to +0.76 in three cases of four; +0.22 for the
  bf16 mlp, whose 16 s windows average the moves out). Each window knows its own median step
  time within ±0.7-4%; windows minutes apart in one process differ by 15-40%.
- The floor's speed does not predict a model's (correlation -0.37 to +0.18). Nor does a
  calibration loop timed just before and after each window in the same process
  (`machine_drift.py`): it follows a model's speed loosely, and dividing by it widens the
  spread more often than it narrows it.
- So no single trial here can be ranked closer than that; the tuner ranks its answer on
  confirmation in paired rounds (every candidate and the baseline back to back), whose
  speedup interval says how close is known.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.config import TrainConfig, from_baseline
from autotune.options import MeasureSettings
from autotune.search.isolation import run_isolated
from autotune.target import ModelFile
from autotune.trial.contention import cpu_ticks, other_share
from autotune.trial.protocol import Measurement, TrialRequest, TrialResult, TrialStatus
from autotune.trial.workload import load_workload

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
QUIET_SHARE = 0.02  # a quiet moment: other processes under 2% of the CPUs for a second
FLOOR = "floor"


@dataclass(frozen=True)
class Reference:
    """A reference model at a tiny CPU size, and the knobs of its tuned configuration."""

    path: str
    model_args: dict[str, Any]
    tuned: dict[str, Any]


REFERENCES = {
    # The search-efficiency benchmark's mlp; bf16 was its grid's fastest.
    "mlp": Reference("models/mlp.py", {"feature_dim": 256, "hidden": 512, "layers": 4,
                                       "num_samples": 16384}, {"precision": "bf16"}),
    # The README's tiny rgat; the tuned one loads in a worker process beside the model.
    "rgat": Reference("models/rgat.py", {"hidden": 32, "graph_layers": 2, "max_nodes": 8,
                                         "max_text_len": 4, "vocab_size": 256},
                      {"optimizer_impl": "fused", "num_workers": 1, "prefetch_factor": 2,
                       "persistent_workers": True}),
    "gpt": Reference("models/gpt.py", {"n_layer": 2, "n_embd": 64, "n_head": 2,
                                       "block_size": 64, "vocab_size": 256,
                                       "num_samples": 512},
                     {"micro_batch_size": 32, "grad_accum_steps": 1, "precision": "bf16",
                      "optimizer_impl": "fused"}),
}

PROTOCOLS = {
    "before": MeasureSettings(window_steps=10, window_seconds=3.0, window_max_steps=10,
                              window_max_seconds=3.0, contention_retries=0, profile_steps=0),
    "after": MeasureSettings(profile_steps=0),
}
# The after protocol again and again in one long-lived process per case: what is left of the
# spread once process start, build and memory layout are the same every time.
ONE_PROCESS = "one process"

# The floor: a fixed amount of matmul work per iteration, timed in a fresh process for 3 s.
FLOOR_CHILD = """
import json, statistics, sys, time
import torch
from autotune.trial.contention import ContentionProbe
a, b = torch.randn(384, 384), torch.randn(384, 384)
def work():
    for _ in range(16):
        a @ b
end = time.perf_counter() + 1.0
while time.perf_counter() < end:
    work()
probe = ContentionProbe(float(sys.argv[1]))
probe.start()
times, start = [], time.perf_counter()
while time.perf_counter() - start < 3.0:
    begun = time.perf_counter()
    work()
    times.append(time.perf_counter() - begun)
contention = probe.stop()
print(json.dumps({"rate": 1 / statistics.median(times), "steps": len(times),
                  "other_cpu_share": contention.other_cpu_share,
                  "disturbed": contention.disturbed}))
"""


# A long-lived process that builds one case once, then measures it (first step, warm-up,
# screening, window) each time it reads a line, answering with the figures as JSON.
ONE_PROCESS_CHILD = """
import json, sys
import torch
from autotune.hardware import describe
from autotune.trial.measure import MeasureSettings, build_setup, measure_setup
from autotune.trial.workload import load_workload
path, model_args, config, settings = json.loads(sys.argv[1])
workload = load_workload(path, model_args)
device = torch.device("cpu")
setup, _, _ = build_setup(workload, workload.train_config(config, "cpu"), device,
                          lambda phase: None)
for _ in sys.stdin:
    figures = measure_setup(setup, MeasureSettings(**settings), describe(device)).to_json()
    print(json.dumps(figures), flush=True)
"""


class OneProcess:
    """One case measured again and again in the same process (started on first use)."""

    def __init__(self, reference: Reference, config: TrainConfig,
                 settings: MeasureSettings) -> None:
        self.argument = json.dumps([str(ROOT / reference.path), reference.model_args,
                                    config.to_dict(), asdict(settings)])
        self.process: subprocess.Popen | None = None

    def measure(self) -> TrialResult:
        if self.process is None:
            self.process = subprocess.Popen(
                [sys.executable, "-c", ONE_PROCESS_CHILD, self.argument], cwd=ROOT,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                text=True)
        started = time.monotonic()
        self.process.stdin.write("measure\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            return TrialResult(TrialStatus.ERROR, f"exited with {self.process.wait()}",
                               wall_s=time.monotonic() - started)
        return TrialResult(TrialStatus.OK, "measured",
                           measurement=Measurement.from_json(json.loads(line)),
                           wall_s=time.monotonic() - started)

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


@dataclass
class Run:
    case: str
    protocol: str
    condition: str
    repeat: int
    status: str
    samples_per_sec: float | None = None
    other_cpu_share: float | None = None
    disturbed: bool = False
    windows_remeasured: int = 0
    window_s: float | None = None
    window_steps: int | None = None
    step_time_precision: float | None = None
    wall_s: float = 0.0
    load_before: float = 0.0
    quiet_wait_s: float | None = None
    share_before: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def machine_share(seconds: float = 1.0) -> float:
    """Other processes' share of all CPUs over `seconds` (this process idles meanwhile)."""
    cpus = range(os.cpu_count() or 1)
    start = cpu_ticks(cpus, os.getpid())
    time.sleep(seconds)
    return other_share(start, cpu_ticks(cpus, os.getpid()), 0) or 0.0


def wait_for_quiet(limit_s: float) -> tuple[float, float]:
    """Seconds waited for a quiet second (at most `limit_s`) and the last share seen."""
    started = time.monotonic()
    share = machine_share()
    while share > QUIET_SHARE and time.monotonic() - started < limit_s:
        share = machine_share()
    return time.monotonic() - started, share


def start_burner() -> subprocess.Popen:
    """One busy loop in its own session: a stranger to every trial."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                              start_new_session=True)
    time.sleep(0.5)
    return burner


def measure_floor(threshold: float) -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", FLOOR_CHILD, str(threshold)], cwd=ROOT,
                          capture_output=True, text=True)
    if done.returncode:
        return {"status": "error", "message": done.stderr[-500:]}
    return {"status": "ok", **json.loads(done.stdout), "wall_s": time.monotonic() - started}


def measure_case(reference: Reference, config: TrainConfig,
                 settings: MeasureSettings) -> TrialResult:
    request = TrialRequest(ModelFile(str(ROOT / reference.path), reference.model_args),
                           config=config.to_dict(), device="cpu", settings=settings)
    return run_isolated(request, 600)


def cases(models: list[str]) -> dict[str, tuple[Reference, TrainConfig]]:
    """'<model> baseline' and '<model> tuned' for each model."""
    out = {}
    for name in models:
        reference = REFERENCES[name]
        workload = load_workload(str(ROOT / reference.path), reference.model_args)
        baseline = from_baseline(workload.baseline, "cpu")
        out[f"{name} baseline"] = (reference, baseline)
        out[f"{name} tuned"] = (reference, baseline.replace(**reference.tuned))
    return out


def one_run(key: str, protocol: str, condition: str, repeat: int,
            chosen: dict[str, tuple[Reference, TrainConfig]], quiet_wait_s: float,
            resident: dict[str, OneProcess]) -> Run:
    waited = share = None
    if condition == "quiet":
        waited, share = wait_for_quiet(quiet_wait_s)
    load = os.getloadavg()[0]
    if key == FLOOR:
        m = measure_floor(MeasureSettings().contention_threshold)
        return Run(key, protocol, condition, repeat, m["status"], m.get("rate"),
                   m.get("other_cpu_share"), bool(m.get("disturbed")), 0, 3.0, m.get("steps"),
                   None, m.get("wall_s", 0.0), load, waited, share)
    reference, config = chosen[key]
    if protocol == ONE_PROCESS:
        result = resident[key].measure()
    else:
        result = measure_case(reference, config, PROTOCOLS[protocol])
    m = result.measurement
    if m is None:
        return Run(key, protocol, condition, repeat, result.status.value, wall_s=result.wall_s,
                   load_before=load, quiet_wait_s=waited, share_before=share,
                   extra={**dict.fromkeys(("cpu_threads", "warmup_steps", "step_time_cv",
                                           "measure_wall_s")), "message": result.message})
    return Run(key, protocol, condition, repeat, result.status.value, m.samples_per_sec,
               m.other_cpu_share, m.disturbed, m.windows_remeasured, m.window_s,
               m.window_steps, m.step_time_precision, result.wall_s, load, waited, share,
               {"cpu_threads": m.cpu_threads, "warmup_steps": m.warmup_steps,
                "step_time_cv": m.step_time_cv, "measure_wall_s": m.measure_wall_s,
                "message": result.message})


def spread(values: list[float]) -> float | None:
    """(max - min) / median, None under two values."""
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def summarise(runs: list[Run]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.case, run.protocol, run.condition), []).append(run)
    rows = []
    for (case, protocol, condition), group in groups.items():
        ok = [r for r in group if r.status == "ok" and r.samples_per_sec]
        rates = [r.samples_per_sec for r in ok]
        clean = [r.samples_per_sec for r in ok if not r.disturbed]
        rows.append({
            "case": case, "protocol": protocol, "condition": condition, "runs": len(group),
            "ok": len(ok), "clean": len(clean), "disturbed": len(ok) - len(clean),
            "median": statistics.median(rates) if rates else None, "spread": spread(rates),
            "clean_spread": spread(clean),
            "median_window_s": _median([r.window_s for r in ok]),
            "median_wall_s": _median([r.wall_s for r in ok]),
            "median_precision": _median([r.step_time_precision for r in ok]),
            "median_other_share": _median([r.other_cpu_share for r in ok])})
    return rows


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _corr(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.2f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def table(rows: list[dict[str, Any]]) -> str:
    floors = {r["condition"]: r["spread"] for r in rows if r["case"] == FLOOR}
    lines = ["| case | protocol | condition | runs (ok, disturbed) | median samples/s | "
             "spread | spread of clean runs | x floor | median ± | window | trial wall | "
             "others' CPU share (median) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["condition"], r["case"], r["protocol"])):
        floor = floors.get(r["condition"])
        ratio = f"{r['spread'] / floor:.1f}x" if r["spread"] is not None and floor else "n/a"
        median = f"{r['median']:,.1f}" if r["median"] is not None else "n/a"
        window = f"{r['median_window_s']:.1f} s" if r["median_window_s"] else "n/a"
        wall = f"{r['median_wall_s']:.1f} s" if r["median_wall_s"] else "n/a"
        lines.append(f"| {r['case']} | {r['protocol']} | {r['condition']} | {r['runs']} "
                     f"({r['ok']}, {r['disturbed']}) | {median} | {_pct(r['spread'])} | "
                     f"{_pct(r['clean_spread'])} | {ratio} | {_pct(r['median_precision'])} | "
                     f"{window} | {wall} | {_pct(r['median_other_share'])} |")
    return "\n".join(lines)


def same_round_correlation(runs: list[Run], case: str, protocol: str, other: str,
                           other_protocol: str, condition: str) -> float | None:
    """Pearson correlation, over the rounds, of two cases' rates measured in the same round:
    near 1 when both follow the machine's speed at that moment."""
    def rates(name: str, proto: str) -> dict[int, float]:
        return {r.repeat: r.samples_per_sec for r in runs if r.case == name and
                r.protocol == proto and r.condition == condition and r.samples_per_sec}
    mine, theirs = rates(case, protocol), rates(other, other_protocol)
    rounds = sorted(mine.keys() & theirs.keys())
    if len(rounds) < 3:
        return None
    try:
        return statistics.correlation([mine[k] for k in rounds], [theirs[k] for k in rounds])
    except statistics.StatisticsError:  # one of them constant
        return None


def verdicts(rows: list[dict[str, Any]], runs: list[Run]) -> list[str]:
    """The goals: quiet spread <= 5% (or <= 1.5x the floor's where that is higher), and every
    window beside the burner flagged; where one process measured the same cases, how much of
    the spread is the process's and how much the machine's."""
    floors = {r["condition"]: r["spread"] for r in rows if r["case"] == FLOOR}
    out = []
    for r in rows:
        if r["case"] == FLOOR or r["spread"] is None or r["protocol"] == ONE_PROCESS:
            continue
        if r["condition"] == "quiet":
            floor = floors.get("quiet") or 0.0
            bar = max(0.05, 1.5 * floor)
            out.append(f"{r['case']} ({r['protocol']}, quiet): spread {_pct(r['spread'])} vs "
                       f"bar {_pct(bar)}: {'met' if r['spread'] <= bar else 'NOT met'}")
        else:
            out.append(f"{r['case']} ({r['protocol']}, burner): {r['disturbed']} of "
                       f"{r['ok']} windows flagged as disturbed")
    spreads = {(r["case"], r["protocol"], r["condition"]): r["spread"] for r in rows}
    for (case, protocol, condition), alone in spreads.items():
        fresh = spreads.get((case, "after", condition))
        if protocol == ONE_PROCESS and alone and fresh is not None:
            together = same_round_correlation(runs, case, "after", case, ONE_PROCESS,
                                              condition)
            floor = same_round_correlation(runs, case, "after", FLOOR, "fixed", condition)
            out.append(f"{case} ({condition}): fresh processes spread {_pct(fresh)}, one "
                       f"process measured in the same rounds {_pct(alone)} "
                       f"({fresh / alone:.1f}x); same-round correlation with it "
                       f"{_corr(together)}, with the floor {_corr(floor)}")
    return out


def measure_rounds(args: argparse.Namespace, chosen: dict[str, tuple[Reference, TrainConfig]],
                   keys: list[tuple[str, str]], rng: random.Random,
                   resident: dict[str, OneProcess], runs: list[Run], started: float) -> None:
    """Every case once per round and condition, in a shuffled order; appends to `runs`."""
    for repeat in range(args.repeats):
        for condition in args.conditions.split(","):
            order = rng.sample(keys, len(keys))
            burner = start_burner() if condition == "burner" else None
            try:
                for key, protocol in order:
                    run = one_run(key, protocol, condition, repeat, chosen, args.quiet_wait,
                                  resident)
                    runs.append(run)
                    print(f"round {repeat + 1}/{args.repeats} {condition}: {key} ({protocol}): "
                          f"{run.status} {run.samples_per_sec or 0:,.1f}/s, others "
                          f"{_pct(run.other_cpu_share)}{' DISTURBED' if run.disturbed else ''}"
                          f", load {run.load_before:.2f} ({time.time() - started:.0f} s)",
                          flush=True)
            finally:
                if burner is not None:
                    burner.kill()
                    burner.wait()


def main() -> None:
    # A kill ends the run through `finally`, so no burner outlives it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--models", default=",".join(REFERENCES),
                        help=f"comma-separated, of {', '.join(REFERENCES)}")
    parser.add_argument("--protocols", default=",".join([*PROTOCOLS, ONE_PROCESS]),
                        help="comma-separated, of the default")
    parser.add_argument("--conditions", default="quiet,burner")
    parser.add_argument("--quiet-wait", type=float, default=300.0, metavar="SECONDS",
                        help="longest wait for a quiet moment before a quiet run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="repeatability")
    args = parser.parse_args()
    chosen = cases(args.models.split(","))
    protocols = args.protocols.split(",")
    keys = [(FLOOR, "fixed")] + [(k, p) for k in chosen for p in protocols]
    rng = random.Random(args.seed)
    resident = {key: OneProcess(*chosen[key], PROTOCOLS["after"]) for key in chosen}
    runs: list[Run] = []
    started = time.time()
    load_at_start = os.getloadavg()
    try:
        measure_rounds(args, chosen, keys, rng, resident, runs, started)
    finally:
        for process in resident.values():
            process.close()
    rows = summarise(runs)
    text = table(rows)
    notes = verdicts(rows, runs)
    print(text + "\n\n" + "\n".join(notes))
    command = "python benchmarks/repeatability.py " + shlex.join(sys.argv[1:])
    loads = [r.load_before for r in runs]
    header = (f"`{command}` on {os.cpu_count()} CPUs, {args.repeats} rounds, "
              f"{time.time() - started:.0f} s; 1-minute load average before the runs: "
              f"median {statistics.median(loads):.2f}, max {max(loads):.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({
        "command": command, "cpus": os.cpu_count(), "load_at_start": load_at_start,
        "wall_s": time.time() - started, "quiet_share": QUIET_SHARE,
        "protocols": {p: asdict(PROTOCOLS["after" if p == ONE_PROCESS else p])
                      for p in protocols},
        "references": {n: asdict(REFERENCES[n]) for n in args.models.split(",")},
        "summary": rows, "verdicts": notes, "runs": [asdict(r) for r in runs]}, indent=1))
    (RESULTS / f"{args.name}.md").write_text(f"{header}\n\n{text}\n\n" +
                                             "\n".join(f"- {n}" for n in notes) + "\n")


if __name__ == "__main__":
    main()
