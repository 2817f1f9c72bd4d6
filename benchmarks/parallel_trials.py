"""Trials per hour with N local workers against one, and what a trial's process costs.

Runs the same short study with `--workers 1` and `--workers N` (fresh study folders, repeated
and interleaved), then prints trials/hour from each study's tuning wall time, and the share of a
trial's wall time spent before measuring: process start and imports, then building the model and
loader. Writes benchmarks/results/<name>.json and .md. It prints figures; it asserts nothing.

    python benchmarks/parallel_trials.py --workers 2 --trials 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.study.records import trial_records  # noqa: E402
from autotune.study.results import load_study, study_summary  # noqa: E402

MODEL = ["--model", "models/mlp.py", "--device", "cpu", "--model-arg", "feature_dim=32",
         "--model-arg", "hidden=64", "--model-arg", "layers=2", "--model-arg",
         "num_samples=4096", "--global-batch-size", "256", "--fix", "compile_mode=none"]


def run_study(workers: int, trials: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as studies:
        subprocess.run(
            [sys.executable, "-m", "autotune", "run", *MODEL, "--studies-dir", studies,
             "--trials", str(trials), "--workers", str(workers), "--seed", str(seed),
             "--confirm-repeats", "0"],
            cwd=ROOT, capture_output=True, text=True, check=True)
        study = load_study("mlp", studies)
        wall_s = study_summary(study).tuning_wall_s
        measured = [(r.wall_s, r.measurement) for r in trial_records(study)
                    if r.measurement is not None and r.measurement.measure_wall_s is not None
                    and r.wall_s and not r.duplicate]
    shares = [((wall - m.measure_wall_s) / wall, m.setup_s / wall) for wall, m in measured]
    return {"workers": workers, "trials": len(measured),
            "wall_s": wall_s,
            "trials_per_hour": len(measured) / wall_s * 3600,
            "startup_share": statistics.median(s for s, _ in shares),
            "build_share": statistics.median(b for _, b in shares),
            "trial_wall_s": statistics.median(wall for wall, _ in measured)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="cpu_parallel_trials")
    args = parser.parse_args()
    runs: dict[int, list[dict]] = {1: [], args.workers: []}
    for repeat in range(args.repeats):
        for workers in runs:
            result = run_study(workers, args.trials, seed=repeat)
            runs[workers].append(result)
            print(f"repeat {repeat + 1}: {workers} worker(s): {result['trials']} trials in "
                  f"{result['wall_s']:.1f} s = {result['trials_per_hour']:.0f} trials/hour",
                  flush=True)
    table = {w: {key: statistics.median(r[key] for r in rs) for key in
                 ("trials_per_hour", "wall_s", "startup_share", "build_share", "trial_wall_s")}
             for w, rs in runs.items()}
    base = table[1]["trials_per_hour"]
    lines = ["| workers | trials/hour (median) | vs 1 worker | median trial wall time | "
             "process start + imports | model + loader build |", "|---|---|---|---|---|---|"]
    for workers, row in table.items():
        lines.append(f"| {workers} | {row['trials_per_hour']:.0f} | "
                     f"{row['trials_per_hour'] / base:.2f}x | {row['trial_wall_s']:.1f} s | "
                     f"{row['startup_share']:.0%} | {row['build_share']:.0%} |")
    text = "\n".join(lines)
    print(text)
    out = ROOT / "benchmarks" / "results"
    (out / f"{args.name}.json").write_text(json.dumps(
        {"command": " ".join(sys.argv), "runs": runs, "median": table}, indent=2))
    (out / f"{args.name}.md").write_text(
        f"`python {' '.join(sys.argv)}` on 2 CPU cores, {args.repeats} repeats interleaved\n\n"
        f"{text}\n")


if __name__ == "__main__":
    main()
