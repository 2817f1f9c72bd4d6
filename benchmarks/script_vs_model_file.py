"""The same model measured three ways, side by side in one run: as a model file (autotune's own
training loop), as a Hugging Face script (the script's own `Trainer` loop, measured by autotune:
`bench --script`), and the script run as its user runs it, read from the
`train_samples_per_second` its Trainer reports.

The model is `models/hf_gpt2.py` at a small size; the script, `benchmarks/scripts/
hf_gpt2_trainer.py`, builds that model and data with the same settings (micro-batch 8,
accumulation 4, fp32, the for-loop AdamW, no loader workers). Each round runs the three in
fresh processes, in an order that rotates round by round, so the machine's drift falls on all.
Prints each one's median rate and the paired ratios with their 95% intervals:

- script trial / model file: what the Trainer's own step costs over autotune's bare loop (its
  gradient clipping, scheduler, logging and callbacks);
- script trial / train_samples_per_second: how the script trial's figure relates to the one the
  user's own run reports. The Trainer's figure is samples over `train()`'s whole wall time
  (its set-up, the first steps, the data loader's start), so it is expected below a steady
  rate; `--max-steps` sets how long that run trains.

Writes benchmarks/results/<name>.json and .md. It asserts nothing.

    python benchmarks/script_vs_model_file.py --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.stats import paired_ratio  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODEL = "models/hf_gpt2.py"
SCRIPT = "benchmarks/scripts/hf_gpt2_trainer.py"
SIZE = {"n_layer": 2, "n_embd": 64, "n_head": 2, "block_size": 64, "vocab_size": 512,
        "num_samples": 8192}
# The model file's BASELINE, in TrainingArguments' terms (adamw_torch on CPU: the for-loop).
SETTINGS = ["--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "4",
            "--optim", "adamw_torch", "--dataloader_num_workers", "0", "--report_to", "none",
            "--save_strategy", "no"]
WAYS = ("model_file", "script_trial", "script_run")


def command(way: str, out: Path, max_steps: int) -> list[str]:
    size = [a for k, v in SIZE.items() for a in (f"--{k}", str(v))]
    script_args = ["--output_dir", str(out), *size, *SETTINGS]
    if way == "model_file":
        return [sys.executable, "-m", "autotune", "bench", "--model", MODEL, "--device", "cpu",
                *[a for k, v in SIZE.items() for a in ("--model-arg", f"{k}={v}")], "--json"]
    if way == "script_trial":
        return [sys.executable, "-m", "autotune", "bench", "--script", SCRIPT, "--device",
                "cpu", "--json", "--", *script_args]
    return [sys.executable, SCRIPT, *script_args, "--max_steps", str(max_steps)]


def measure(way: str, out: Path, max_steps: int) -> dict[str, Any]:
    done = subprocess.run(command(way, out, max_steps), capture_output=True, text=True,
                          cwd=ROOT, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{way} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    if way == "script_run":
        found = re.search(r"train_samples_per_second\s*=\s*([\d.]+)", done.stdout)
        runtime = re.search(r"train_runtime\s*=\s*([\d:.]+)", done.stdout)
        if found is None:
            raise SystemExit(f"no train_samples_per_second in the script's output:\n"
                             f"{done.stdout[-2000:]}")
        return {"samples_per_sec": float(found.group(1)),
                "train_runtime": runtime.group(1) if runtime else None}
    result = json.loads(done.stdout)
    return {"samples_per_sec": result["samples_per_sec"], "config": result["config"],
            "window_s": result["window_s"], "step_time_cv": result["step_time_cv"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=150,
                        help="optimizer steps of the script's own run")
    parser.add_argument("--name", default="script_vs_model_file")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            order = WAYS[round_ % 3:] + WAYS[:round_ % 3]
            for way in order:
                runs[way].append(measure(way, Path(scratch) / f"{way}-{round_}",
                                         args.max_steps))
                print(round_, way, runs[way][-1], flush=True)
    rates = {way: [r["samples_per_sec"] for r in runs[way]] for way in WAYS}
    ratios = {"script_trial/model_file": paired_ratio(rates["script_trial"],
                                                      rates["model_file"]),
              "script_trial/train_samples_per_second": paired_ratio(rates["script_trial"],
                                                                    rates["script_run"])}
    configs = {way: runs[way][0].get("config") for way in ("model_file", "script_trial")}
    result = {"command": "python benchmarks/script_vs_model_file.py " + " ".join(sys.argv[1:]),
              "cpus": len(os.sched_getaffinity(0)), "size": SIZE, "settings": SETTINGS,
              "same_configuration": configs["model_file"] == configs["script_trial"],
              "configs": configs, "runs": runs,
              "medians": {way: statistics.median(rates[way]) for way in WAYS},
              "ratios": {k: {"value": r.value, "low": r.low, "high": r.high}
                         for k, r in ratios.items()}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    names = {"model_file": "model file, autotune's loop (`bench --model`)",
             "script_trial": "HF script, its Trainer's loop (`bench --script`)",
             "script_run": "HF script run by itself: its `train_samples_per_second`"}
    lines = [f"`{result['command']}` on {result['cpus']} CPU cores; {args.rounds} rounds, "
             "each in fresh processes, order rotating; the script's own run trains "
             f"{args.max_steps} optimizer steps; same configuration read by both trials: "
             f"{result['same_configuration']}", "",
             "| measured as | median samples/s | per round |", "|---|---|---|"]
    for way in WAYS:
        lines.append(f"| {names[way]} | {result['medians'][way]:.0f} | "
                     f"{', '.join(f'{r:.0f}' for r in rates[way])} |")
    lines += ["", "| paired ratio | value (95% interval) |", "|---|---|"]
    for key, r in ratios.items():
        interval = f" [{r.low:.2f}-{r.high:.2f}]" if r.low is not None else ""
        lines.append(f"| {key} | {r.value:.2f}{interval} |")
    table = "\n".join(lines) + "\n"
    (RESULTS / f"{args.name}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
