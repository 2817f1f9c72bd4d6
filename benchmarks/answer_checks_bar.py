"""Does the answer hold for the whole run? (issue 42's bar)

Runs a default `autotune run --model MODEL --device cpu` as a new user would (no `--trials`, no
`--timeout`) on the two models written for it, and reads what the bar asks of each:

- `worst` (benchmarks/models/audio_clips.py: clips of 1,000-4,000 samples and one of 24,000,
  padded per batch): the answer exported as the user would (`autotune export`), benched on a
  dataset of the longest clips (`--model-arg long_only=true`); the peak the study reports for
  its answer (`best_peak_memory_bytes`) over that bench's peak: the bar is at least 0.9. Also
  the answer's confirmation rounds' own peak (random batches), to show what a study without
  the check would have reported.
- `loss` (benchmarks/models/orbit_radius.py: targets on Earth's radius, where bf16's step is
  32 km): the search's fastest bf16 and fp32 trials, whether bf16 is in the answer (the bar:
  not), and the reason the study gives.

Writes each run's transcript, its `--json` summary and the figures under
benchmarks/results/<out>/; prints a line per model.

    python benchmarks/answer_checks_bar.py --out issue42_bar
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.study.confirmation import stored_confirmation
from autotune.study.records import StudyKey, trial_records
from autotune.study.results import load_study

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = Path(__file__).resolve().parent / "models"


def cli(*args: str, log: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m autotune ARGS`; its stderr (the run's progress) kept in `log`."""
    done = subprocess.run([sys.executable, "-m", "autotune", *args], capture_output=True,
                          text=True)
    if log is not None:
        log.write_text("$ autotune " + " ".join(args) + "\n" + done.stderr + done.stdout)
    if done.returncode != 0:
        raise SystemExit(f"autotune {args[0]} failed ({done.returncode}):\n{done.stderr}")
    return done


def study_run(model: str, studies: Path, out: Path) -> tuple[dict, float]:
    """A default run of `model`: its --json summary and its wall time."""
    start = time.monotonic()
    done = cli("run", "--model", str(MODELS / f"{model}.py"), "--device", "cpu",
               "--studies-dir", str(studies), "--json", log=out / f"{model}_run.txt")
    summary = json.loads(done.stdout)
    (out / f"{model}_summary.json").write_text(json.dumps(summary, indent=2))
    return summary, time.monotonic() - start


def worst(studies: Path, out: Path) -> dict:
    summary, wall = study_run("audio_clips", studies, out)
    answer = out / "audio_clips_answer.yaml"
    cli("export", "audio_clips", "--studies-dir", str(studies), "-o", str(answer))
    bench = json.loads(cli("bench", "--model", str(MODELS / "audio_clips.py"), "--device", "cpu",
                           "--config", str(answer), "--model-arg", "long_only=true", "--json",
                           log=out / "audio_clips_bench_longest.txt").stdout)
    (out / "audio_clips_bench_longest.json").write_text(json.dumps(bench, indent=2))
    stored = load_study("audio_clips", studies).user_attrs.get(StudyKey.CONFIRMATION)
    winner = stored_confirmation(stored).winner if stored else None
    rounds = [r.peak_memory_bytes for r in winner.ok_runs() if r.peak_memory_bytes] \
        if winner is not None else []
    reported, benched = summary["best_peak_memory_bytes"], bench["peak_memory_bytes"]
    return {"model": "audio_clips", "wall_s": wall, "verdict": summary["verdict"],
            "best_config": summary["best_config"], "reported_peak_bytes": reported,
            "bench_longest_peak_bytes": benched,
            "ratio": reported / benched if reported and benched else None,
            "rounds_peak_bytes": max(rounds) if rounds else None,
            "worst_batch": summary.get("worst_batch"), "checks": summary.get("checks"),
            "ruled_out": summary.get("ruled_out")}


def loss(studies: Path, out: Path) -> dict:
    summary, wall = study_run("orbit_radius", studies, out)
    records = trial_records(load_study("orbit_radius", studies))
    fastest = {p: max((r.samples_per_sec for r in records
                       if r.samples_per_sec and r.config.precision == p), default=None)
               for p in ("fp32", "bf16")}
    return {"model": "orbit_radius", "wall_s": wall, "verdict": summary["verdict"],
            "best_config": summary["best_config"],
            "bf16_in_answer": summary["best_config"].get("precision") == "bf16",
            "fastest_search_trial": fastest, "ruled_out": summary.get("ruled_out"),
            "loss_check": summary.get("loss_check"), "checks": summary.get("checks")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="issue42_bar")
    parser.add_argument("--only", choices=["worst", "loss"], nargs="+",
                        default=["worst", "loss"])
    args = parser.parse_args()
    out = RESULTS / args.out
    out.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        with tempfile.TemporaryDirectory() as studies:
            found = {"worst": worst, "loss": loss}[name](Path(studies), out)
        (out / f"{found['model']}.json").write_text(json.dumps(found, indent=2))
        if name == "worst":
            print(f"audio_clips: reported peak {found['reported_peak_bytes'] / 2**20:.0f} MiB, "
                  f"bench on the longest clips {found['bench_longest_peak_bytes'] / 2**20:.0f} "
                  f"MiB: {found['ratio']:.2f} (bar >= 0.9); the answer's rounds alone "
                  f"{(found['rounds_peak_bytes'] or 0) / 2**20:.0f} MiB; "
                  f"{found['wall_s'] / 60:.1f} min; {found['verdict']}", flush=True)
        else:
            print(f"orbit_radius: bf16 in the answer: {found['bf16_in_answer']} (bar: no); "
                  f"fastest search trials {found['fastest_search_trial']}; "
                  f"{found['wall_s'] / 60:.1f} min; {found['verdict']}", flush=True)


if __name__ == "__main__":
    main()
