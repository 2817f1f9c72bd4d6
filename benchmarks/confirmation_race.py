"""Confirmation as a race against confirmation in full rounds: the same winner, for how many runs.

1. Record: for each model, a short search (`autotune run --confirm-repeats 0`) chooses the
   candidates the confirmation would take (its top 3 measured in full, and the baseline); then
   `--rounds` full rounds measure every candidate once per round, each run in its own process
   forked from the model's fork server (the trial protocol, no profiler window), in a shuffled
   order each round. The runs are saved (`--recorded FILE` replays them instead).
2. Replay, for each seed: the rounds are drawn with replacement, in a new order, and
   - full rounds (before the race): every candidate in every round, `confirm.conclusion`;
   - the race: the product's own `confirm.confirm`, its measurements answered from the same
     drawn rounds, with the default minimum of rounds and target, and no time cap;
   both over the same rounds. Reported: how often the race's recommendation is the full
   rounds', the runs each spent (a run's recorded wall time summed: the wall time of the same
   confirmation before and after), and the rounds the race took.

Prints figures, writes benchmarks/results/<name>.json and .md; asserts nothing.

    python benchmarks/confirmation_race.py --models mlp,rgat,hf_gpt2 --rounds 10 --seeds 50
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import optuna

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import (  # noqa: E402
    DEFAULT_CONFIRM_ROUNDS,
    DEFAULT_CONFIRM_TARGET,
    MeasureSettings,
)
from autotune.search.conclusion import conclusion  # noqa: E402
from autotune.search.confirm import ConfirmRequest, confirm  # noqa: E402
from autotune.search.contenders import Candidate, Measuring, Plan, candidates  # noqa: E402
from autotune.search.events import SilentView  # noqa: E402
from autotune.search.outcome import Scoring, record_measurement  # noqa: E402
from autotune.search.runner import MeasureJob, ProcessRunner  # noqa: E402
from autotune.study.confirmation import Run  # noqa: E402
from autotune.study.records import Role, StudyKey, TrialKey, config_key  # noqa: E402
from autotune.study.results import load_study, study_identity, study_summary  # noqa: E402
from autotune.study.storage import open_storage  # noqa: E402
from autotune.trial.protocol import Measurement, TrialResult, TrialStatus  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODELS = {
    "mlp": ["--model", "models/mlp.py", "--model-arg", "feature_dim=32", "--model-arg",
            "hidden=64", "--model-arg", "layers=2", "--model-arg", "num_samples=4096",
            "--global-batch-size", "256"],
    "rgat": ["--model", "models/rgat.py", "--model-arg", "hidden=32", "--model-arg", "heads=2",
             "--model-arg", "text_layers=1", "--model-arg", "graph_layers=2", "--model-arg",
             "vocab_size=64", "--model-arg", "max_nodes=8", "--model-arg", "max_text_len=4",
             "--model-arg", "num_samples=512"],
    "hf_gpt2": ["--model", "models/hf_gpt2.py", "--model-arg", "n_layer=2", "--model-arg",
                "n_embd=32", "--model-arg", "n_head=2", "--model-arg", "block_size=32",
                "--model-arg", "vocab_size=128"],
}
SEARCH = ["--device", "cpu", "--fix", "compile_mode=none", "--trials", "8", "--seed", "0",
          "--confirm-repeats", "0", "--window-steps", "3", "--window-seconds", "0.5",
          "--window-max-seconds", "3", "--warmup-max-seconds", "5", "--profile-steps", "0"]
SETTINGS = MeasureSettings(window_steps=3, window_seconds=0.5, window_max_seconds=3,
                           warmup_max_seconds=5, profile_steps=0)
TOP = 3


def record(model: str, rounds: int) -> dict[str, Any]:
    """A short search of `model`, then `rounds` full rounds of its confirmation candidates."""
    with tempfile.TemporaryDirectory() as studies:
        subprocess.run([sys.executable, "-m", "autotune", "run", *MODELS[model], *SEARCH,
                        "--studies-dir", studies], cwd=ROOT, check=True, capture_output=True)
        name = Path(MODELS[model][1]).stem
        study = load_study(name, studies)
        identity = study_identity(study)
        baseline = study_summary(study).baseline_config
        entries = candidates(study, baseline, TOP)
        runner = ProcessRunner(identity.target, Path(studies) / name, SETTINGS,
                               memory_limit_bytes=None, core_shares=None,
                               on_phase=lambda text, number: None)
        runs: list[list[dict[str, Any]]] = [[] for _ in entries]
        shuffle = random.Random(0)
        try:
            for round_ in range(rounds):
                order = list(range(len(entries)))
                shuffle.shuffle(order)
                for i in order:
                    result = runner.measure(entries[i].config,
                                            MeasureJob(f"race-{i}-{round_}", 600, "cpu",
                                                       profile=False))
                    m = result.measurement
                    runs[i].append({"status": str(result.status), "wall_s": result.wall_s,
                                    "samples_per_sec": m.samples_per_sec if m else None})
                print(f"{model}: round {round_ + 1}/{rounds}", flush=True)
        finally:
            runner.close()
    return {"model": model, "candidates": [{"config": e.config.to_dict(), "trial": e.trial,
                                            "search_samples_per_sec": e.search_samples_per_sec,
                                            "runs": r} for e, r in zip(entries, runs)]}


def replay(recorded: dict[str, Any], seed: int) -> dict[str, Any]:
    """Full rounds and the race over the same rounds, drawn with replacement for `seed`."""
    count = len(recorded["candidates"][0]["runs"])
    draw = random.Random(seed)
    picked = [draw.randrange(count) for _ in range(count)]

    def run_of(entry: dict[str, Any], round_: int) -> Run | None:
        measured = entry["runs"][round_]
        rate = measured["samples_per_sec"]
        return Run("ok", samples_per_sec=rate, objective=rate) if rate else None

    entries = recorded["candidates"]
    configs = [TrainConfig.from_dict(e["config"]) for e in entries]
    full = [Candidate(config, e["trial"], True, e["search_samples_per_sec"],
                      [run_of(e, r) for r in picked]) for config, e in zip(configs, entries)]
    full_walls = sum(e["runs"][r]["wall_s"] for e in entries for r in picked)
    before = conclusion(full, full[-1])

    spent: list[float] = []
    by_config = {config_key(config): e for config, e in zip(configs, entries)}

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        round_ = int(job.name.split("-")[-1])  # confirm's job names end with the round
        measured = by_config[config_key(config)]["runs"][picked[round_]]
        spent.append(measured["wall_s"])
        rate = measured["samples_per_sec"]
        return TrialResult(measured["status"], measurement=Measurement(rate) if rate else None,
                           wall_s=measured["wall_s"])

    with tempfile.TemporaryDirectory() as folder:
        # the race reads its candidates from a study: one that holds them as trials
        study = optuna.create_study(storage=open_storage(None, Path(folder)),
                                    study_name="replay", direction="maximize")
        scoring = Scoring("cpu", None, 0.1, 0.0)
        _told(study, configs, entries, scoring)
        plan = Plan(top=len(entries) - 1, rounds=DEFAULT_CONFIRM_ROUNDS, max_rounds=count,
                    target=DEFAULT_CONFIRM_TARGET)
        measuring = Measuring(scoring, measure, SilentView(), 600, "cpu", Path(folder))
        after = confirm(study, plan, ConfirmRequest(configs[-1], measuring))
    return {"seed": seed, "same_winner": before.winner.config == after.winner.config,
            "full_wall_s": full_walls, "race_wall_s": sum(spent), "full_runs": count *
            len(entries), "race_runs": len(spent), "race_rounds": after.rounds,
            "full_verdict_speedup": before.speedup, "race_speedup": after.speedup}


def _told(study: Any, configs: list[TrainConfig], entries: list[dict[str, Any]],
          scoring: Scoring) -> None:
    """The candidates as finished trials (the baseline first), so `confirm` chooses them."""
    for number, i in enumerate([len(entries) - 1, *range(len(entries) - 1)]):
        trial = study.ask()
        trial.set_user_attr(TrialKey.CONFIG, configs[i].to_dict())
        trial.set_user_attr(TrialKey.ROLE, Role.BASELINE if number == 0 else Role.SEARCH)
        rate = entries[i]["search_samples_per_sec"] or 1.0
        record_measurement(study, trial, TrialResult(
            TrialStatus.OK, measurement=Measurement(rate), config=configs[i]), scoring)
    study.set_user_attr(StudyKey.BASELINE_CONFIG, configs[-1].to_dict())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,rgat,hf_gpt2")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--recorded", help="replay these recorded rounds instead of measuring")
    parser.add_argument("--name", default="confirmation_race")
    args = parser.parse_args()
    if args.recorded:
        recorded = json.loads(Path(args.recorded).read_text())["recorded"]
    else:
        recorded = [record(model, args.rounds) for model in args.models.split(",")]
    rows = []
    for entry in recorded:
        replays = [replay(entry, seed) for seed in range(args.seeds)]
        same = sum(r["same_winner"] for r in replays)
        ratio = [r["race_wall_s"] / r["full_wall_s"] for r in replays]
        rows.append({"model": entry["model"], "seeds": args.seeds, "same_winner": same,
                     "race_over_full_wall": statistics.median(ratio),
                     "race_over_full_wall_range": [min(ratio), max(ratio)],
                     "full_wall_s": statistics.median(r["full_wall_s"] for r in replays),
                     "race_wall_s": statistics.median(r["race_wall_s"] for r in replays),
                     "race_rounds": statistics.median(r["race_rounds"] for r in replays),
                     "replays": replays})
    lines = [f"`python benchmarks/confirmation_race.py --models {args.models} --rounds "
             f"{args.rounds} --seeds {args.seeds}`", "",
             "| model | candidates | same winner as full rounds | confirmation wall: full rounds"
             " | the race | race / full (median, range) | race rounds (median) |",
             "|---|---|---|---|---|---|---|"]
    for entry, row in zip(recorded, rows):
        low, high = row["race_over_full_wall_range"]
        lines.append(f"| {row['model']} | {len(entry['candidates'])} | {row['same_winner']}/"
                     f"{row['seeds']} | {row['full_wall_s']:.0f} s | {row['race_wall_s']:.0f} s "
                     f"| {row['race_over_full_wall']:.2f} ({low:.2f}-{high:.2f}) | "
                     f"{row['race_rounds']:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text(text)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(
        {"command": lines[0].strip("`"), "recorded": recorded, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
