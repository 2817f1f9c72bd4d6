"""What a trial costs besides its measurement: a new interpreter per trial against a child forked
from the fork server (what the tuner uses), on the tiny reference models and on training scripts
(the server imports the library modules the script's probe recorded, never the script).

For each model, the baseline configuration is measured in rounds: each round runs it once in a
fresh interpreter and once forked, in alternating order, so that the machine's drift falls on
both. A trial's overhead is its wall time outside warm-up and the timed window (process start,
imports, building the model and loader, the first step, screening, the profiler window, writing
the result). Prints each launcher's median overhead in seconds and as a share of the trial's
wall time, and the paired ratio of their overheads with its 95% interval (the timed window's
length varies from run to run with the step times' noise, so wall times are not compared);
writes benchmarks/results/<name>.json and .md. It asserts nothing.

    python benchmarks/trial_overhead.py --rounds 3 --models mlp rgat
    python benchmarks/trial_overhead.py --rounds 5 --models hf_script lightning_script \
        --name trial_overhead_scripts
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.search.forkserver import ForkServer  # noqa: E402
from autotune.search.isolation import run_isolated  # noqa: E402
from autotune.stats import paired_ratio  # noqa: E402
from autotune.target import ModelFile, Script, Target  # noqa: E402
from autotune.trial.protocol import ProbeSettings, TrialRequest, TrialStatus  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODELS = {
    "mlp": ("models/mlp.py", {"feature_dim": 32, "hidden": 64, "layers": 2,
                              "num_samples": 4096}),
    "rgat": ("models/rgat.py", {"hidden": 32, "graph_layers": 2, "max_nodes": 8,
                                "max_text_len": 4, "vocab_size": 256}),
    "gpt": ("models/gpt.py", {"n_layer": 2, "n_embd": 64, "n_head": 2, "block_size": 64,
                              "vocab_size": 512, "num_samples": 512}),
}
# Training scripts and their own arguments (their outputs under the run's scratch folder).
SCRIPTS = {
    "hf_script": ("benchmarks/scripts/bert_classify_argparser.py",
                  ["--output_dir", "{scratch}/bert", "--per_device_train_batch_size", "8",
                   "--num_train_epochs", "50", "--report_to", "none"]),
    "lightning_script": ("benchmarks/scripts/lightning_cnn_datamodule.py",
                         ["--work-dir", "{scratch}/cnn", "--batch-size", "32"]),
}


def trial(target: Target, server: ForkServer | None, log: Path) -> dict[str, Any]:
    request = TrialRequest(target, config={}, device="cpu",
                           inductor_cache_dir=str(log.parent / "inductor"))
    result = run_isolated(request, 600, log, server=server)
    m = result.measurement
    measuring = m.warmup_s + m.window_s if m is not None else 0.0
    return {"status": result.status.value, "wall_s": result.wall_s, "measuring_s": measuring,
            "overhead_s": result.wall_s - measuring,
            "overhead_share": 1 - measuring / result.wall_s if result.wall_s else None}


def server_for(name: str, scratch: Path) -> tuple[Target, ForkServer]:
    """The workload (a model file with its arguments, or a script with its own) and its fork
    server; a script's probe (a fresh interpreter, as the tuner runs it) says which modules the
    server imports."""
    log = scratch / f"{name}-server.log"
    if name in MODELS:
        model, model_args = MODELS[name]
        return ModelFile(str(ROOT / model), model_args), ForkServer(str(ROOT / model), log, 600)
    path, argv = SCRIPTS[name]
    script = Script(str(ROOT / path), tuple(a.format(scratch=scratch) for a in argv))
    probe = run_isolated(TrialRequest(script, config={}, device="cpu",
                                      settings=ProbeSettings(candidates={}),
                                      inductor_cache_dir=str(scratch / "inductor")),
                         600, scratch / f"{name}-probe.log")
    if probe.status != TrialStatus.OK or probe.probe is None:
        raise SystemExit(f"{name}'s probe ended as {probe.status}: {probe.message}")
    modules = scratch / f"{name}-imports.json"
    modules.write_text(json.dumps(probe.probe.script_imports))
    print(name, len(probe.probe.script_imports), "modules to import ahead; environment changed "
          f"first: {probe.probe.script_environment_changed}", flush=True)
    return script, ForkServer(None, log, 600, script_modules=modules)


def arguments(doc: str, name: str) -> argparse.Namespace:
    """The launcher benchmarks' flags: rounds, models and the results' name."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(MODELS),
                        choices=[*MODELS, *SCRIPTS])
    parser.add_argument("--name", default=name)
    return parser.parse_args()


def alternating(name: str, scratch: Path, rounds: int,
                measure: Callable[[Target, ForkServer | None, Path], Any]) -> dict[str, list]:
    """`measure` of model `name` in a new interpreter (its server None) and forked, `rounds`
    times each, the order flipped every round so that the machine's drift falls on both."""
    target, server = server_for(name, scratch)
    runs: dict[str, list] = {"fresh": [], "forked": []}
    with server:
        for round_ in range(rounds):
            order = ("fresh", "forked") if round_ % 2 == 0 else ("forked", "fresh")
            for launcher in order:
                runs[launcher].append(measure(target, server if launcher == "forked" else None,
                                              scratch / f"{name}-{launcher}-{round_}.log"))
                print(name, launcher, round_, runs[launcher][-1], flush=True)
    return runs


def main() -> None:
    args = arguments(__doc__, "trial_overhead")
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            runs = alternating(name, Path(scratch), args.rounds, trial)
            ok = {k: [r for r in v if r["status"] == "ok"] for k, v in runs.items()}
            ratio = paired_ratio([r["overhead_s"] for r in ok["forked"]],
                                 [r["overhead_s"] for r in ok["fresh"]])
            rows[name] = {
                launcher: {"median_wall_s": statistics.median(r["wall_s"] for r in done),
                           "median_measuring_s": statistics.median(
                               r["measuring_s"] for r in done),
                           "median_overhead_s": statistics.median(
                               r["overhead_s"] for r in done),
                           "median_overhead_share": statistics.median(
                               r["overhead_share"] for r in done),
                           "runs": runs[launcher]}
                for launcher, done in ok.items()}
            rows[name]["forked_over_fresh_overhead"] = {"value": ratio.value, "low": ratio.low,
                                                    "high": ratio.high}
    result = {"command": "python benchmarks/trial_overhead.py " + " ".join(sys.argv[1:]),
              "cpus": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(),
              "models": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1))
    lines = [f"`{result['command']}` on {result['cpus']} CPU cores; each model's baseline, "
             f"{args.rounds} rounds, fresh and forked alternating; medians", "",
             "| model | launcher | trial wall | warm-up + window | overhead | overhead share |",
             "|---|---|---|---|---|---|"]
    for name, row in rows.items():
        for launcher in ("fresh", "forked"):
            cell = row[launcher]
            lines.append(f"| {name} | {launcher} | {cell['median_wall_s']:.1f} s | "
                         f"{cell['median_measuring_s']:.1f} s | {cell['median_overhead_s']:.1f} s "
                         f"| {cell['median_overhead_share']:.0%} |")
    lines += ["", "| model | forked / fresh overhead (95% interval) |", "|---|---|"]
    for name, row in rows.items():
        ratio = row["forked_over_fresh_overhead"]
        interval = (f" [{ratio['low']:.2f}-{ratio['high']:.2f}]"
                    if ratio["low"] is not None else "")
        lines.append(f"| {name} | {ratio['value']:.2f}{interval} |")
    table = "\n".join(lines) + "\n"
    (RESULTS / f"{args.name}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
