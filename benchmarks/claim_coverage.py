"""Does a study's claim hold afterwards? Studies as a new user runs them, each followed at once by
`autotune verify`: independent fresh paired rounds of the answer against the baseline.

For each repeat (a seed) and each model, interleaved: `autotune run` with `--trials N` (the
default confirmation: a race within 30% of the study), then `autotune verify --rounds R`.
Reported per study: its wall time and the confirmation's share of it, the verdict, the claimed
speedup and interval, the verified one, whether the verified figure lies in the claimed interval
(`holds`) and whether it lies within 10% of it. Prints figures, writes
benchmarks/results/<name>.json and .md; asserts nothing.

    python benchmarks/claim_coverage.py --models mlp,rgat --studies 3 --trials 5 --rounds 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.study.confirmation import Confirmation  # noqa: E402
from autotune.study.records import StudyKey  # noqa: E402
from autotune.study.results import load_study, study_summary  # noqa: E402
from benchmarks.confirmation_race import MODELS  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FAST = ["--window-steps", "3", "--window-seconds", "0.5", "--window-max-seconds", "3",
        "--warmup-max-seconds", "5"]


def study_and_verify(model: str, seed: int, trials: int, rounds: int) -> dict[str, Any]:
    """One study of `model`, then its verification, each as the command line runs them."""
    name = Path(MODELS[model][1]).stem
    with tempfile.TemporaryDirectory() as studies:
        began = time.monotonic()
        subprocess.run(
            [sys.executable, "-m", "autotune", "run", *MODELS[model], "--device", "cpu",
             "--fix", "compile_mode=none", "--trials", str(trials), "--seed", str(seed),
             *FAST, "--studies-dir", studies],
            cwd=ROOT, capture_output=True, text=True, check=True)
        wall = time.monotonic() - began
        verdict = study_summary(load_study(name, studies)).verdict
        checked = subprocess.run(
            [sys.executable, "-m", "autotune", "verify", name, "--rounds", str(rounds), *FAST,
             "--studies-dir", studies], cwd=ROOT, capture_output=True, text=True)
        study = load_study(name, studies)
        verifications = study_summary(study).verifications
        stored = study.user_attrs.get(StudyKey.CONFIRMATION)
        confirmation = Confirmation.from_json(stored).wall_s if stored else None
    row = {"model": model, "seed": seed, "wall_s": wall, "confirmation_s": confirmation,
           "verdict": verdict, "verify_exit": checked.returncode,
           "verify_output": checked.stdout.strip() or checked.stderr.strip()}
    if verifications:
        v = verifications[-1]
        row.update(claimed=v.claimed, claimed_ci=v.claimed_ci, verified=v.speedup,
                   verified_ci=v.speedup_ci, holds=v.holds,
                   within_10=bool(v.claimed_ci and v.speedup and
                                  v.claimed_ci[0] * 0.9 <= v.speedup <= v.claimed_ci[1] * 1.1))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,rgat")
    parser.add_argument("--studies", type=int, default=3, help="studies per model (seeds)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=8, help="verify's fresh paired rounds")
    parser.add_argument("--name", default="claim_coverage")
    args = parser.parse_args()
    rows = []
    for seed in range(args.studies):
        for model in args.models.split(","):
            rows.append(study_and_verify(model, seed, args.trials, args.rounds))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "verify_output"}),
                  flush=True)
    command = (f"python benchmarks/claim_coverage.py --models {args.models} --studies "
               f"{args.studies} --trials {args.trials} --rounds {args.rounds}")
    lines = [f"`{command}`", "",
             "| model | seed | study wall | confirmation | verdict | claimed | verified "
             "afterwards | holds | within 10% |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        share = (f"{row['confirmation_s']:.0f} s ({row['confirmation_s'] / row['wall_s']:.0%})"
                 if row.get("confirmation_s") else "none")
        lines.append(
            f"| {row['model']} | {row['seed']} | {row['wall_s']:.0f} s | {share} | "
            f"{row['verdict']} | {_ratio(row.get('claimed'), row.get('claimed_ci'))} | "
            f"{_ratio(row.get('verified'), row.get('verified_ci'))} | {row.get('holds')} | "
            f"{row.get('within_10')} |")
    checked = [r for r in rows if r.get("holds") is not None]
    lines += ["", f"holds: {sum(r['holds'] for r in checked)}/{len(checked)}; within 10%: "
              f"{sum(r['within_10'] for r in checked)}/{len(checked)}"]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.md").write_text(text)
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"command": command, "rows": rows},
                                                          indent=1))


def _ratio(value: float | None, interval: Sequence[float] | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f}x" + (f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else "")


if __name__ == "__main__":
    main()
