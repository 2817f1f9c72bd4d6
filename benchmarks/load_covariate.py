"""Speedup intervals with and without the load each turn saw as a covariate (issue 39, item 3).

For each reference model and side load (run_end.py's, started as a stranger's process: the
contention probe counts the warm processes' tuner's own descendants as its own), one run: the
baseline and one change kept warm (`autotune.search.warm`), taking turns in pairs in a random
order for `--seconds`, each pair kept or taken again as the confirmation does (`PairJudge`).
From the same kept pairs it prints the plain paired interval (`stats.paired_ratio`) and the
interval read at equal load (`stats.load_adjusted_ratio`: none where the load explains nothing
measurable), which the confirmation gives where it is not none (`search.confirm.paired`). With
`--out`, every kept pair's rates, loads and flags as JSON, to be read again.

    python benchmarks/load_covariate.py --out benchmarks/results/load_covariate.json
    python benchmarks/load_covariate.py --models rgat --loads steady --seconds 60
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from run_end import LOADS  # noqa: E402

from autotune.config import TrainConfig  # noqa: E402
from autotune.options import MeasureSettings  # noqa: E402
from autotune.search.runner import MeasureJob, ProcessRunner  # noqa: E402
from autotune.search.warm import PairJudge, WarmRounds  # noqa: E402
from autotune.stats import Ratio, load_adjusted_ratio, paired_ratio  # noqa: E402
from autotune.study.confirmation import Run  # noqa: E402
from autotune.target import ModelFile  # noqa: E402

SETTINGS = MeasureSettings(warmup_max_seconds=5.0, profile_steps=0)


@dataclass(frozen=True)
class Reference:
    """A reference model, small enough for a 2-core CPU, with its baseline and one change."""

    path: str
    args: dict
    baseline: dict
    change: dict


REFERENCES = {
    "rgat": Reference("models/rgat.py", {"hidden": 64, "heads": 2, "text_layers": 1,
                                         "graph_layers": 2, "vocab_size": 256, "max_nodes": 16,
                                         "max_text_len": 8, "num_samples": 2048},
                      {"micro_batch_size": 32}, {"optimizer_impl": "fused"}),
    "hf_gpt2": Reference("models/hf_gpt2.py", {"n_layer": 2, "n_embd": 64, "n_head": 2,
                                               "block_size": 64, "vocab_size": 512,
                                               "num_samples": 2048},
                         {"micro_batch_size": 8, "grad_accum_steps": 4}, {"precision": "bf16"}),
    "mlp": Reference("models/mlp.py", {"feature_dim": 32, "hidden": 64, "layers": 2,
                                       "num_samples": 4096},
                     {"micro_batch_size": 256}, {"optimizer_impl": "foreach"}),
}


@contextlib.contextmanager
def strangers_load(load: str) -> Iterator[None]:
    """run_end.py's side load in a process this one did not start (its shell parent exits at
    once), as a compile or an install beside a run is; killed after the block."""
    code = (f"import sys, multiprocessing; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
            "from run_end import side_load; side_load(sys.argv[1], multiprocessing.Event())")
    started = subprocess.run(["sh", "-c", '"$0" -c "$1" "$2" >/dev/null 2>&1 & echo $!',
                              sys.executable, code, load], capture_output=True, text=True,
                             check=True)
    pid = int(started.stdout)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def kept_pairs(reference: Reference, seconds: float) -> list[tuple[Run, Run]]:
    """Paired turns of the change and the baseline for `seconds` after both are warm, each
    pair kept or taken again as the confirmation judges it: (change's run, baseline's run)."""
    directory = Path(tempfile.mkdtemp(prefix="autotune-load-covariate-"))
    runner = ProcessRunner(ModelFile(str(ROOT / reference.path), reference.args), directory,
                           SETTINGS, memory_limit_bytes=None, core_shares=None,
                           on_phase=lambda text, number: None)
    baseline = TrainConfig.from_dict(reference.baseline)
    configs = [baseline.replace(**reference.change), baseline]
    jobs = [MeasureJob(f"warm-{i}", 300.0, "cpu", profile=False) for i in range(2)]
    turns = WarmRounds([runner.request(c, j) for c, j in zip(configs, jobs)],
                       [directory / "logs" / f"{j.name}.log" for j in jobs], 300.0)
    order, judge, pairs = random.Random(0), PairJudge(), []
    try:
        ends = time.monotonic() + seconds
        while time.monotonic() < ends:
            runs = {i: turns.turn(i) for i in order.sample(range(2), 2)}
            if judge.keeps(list(runs.values())):
                pairs.append((runs[0], runs[1]))
    finally:
        turns.close()
        runner.close()
    return pairs


def _interval(ratio: Ratio | None) -> str:
    if ratio is None:
        return "none (the load explains nothing measurable)"
    if ratio.half_width is None:
        return f"{ratio.value:.3f}x (one pair)"
    return f"{ratio.value:.3f}x ±{ratio.half_width:.1%} [{ratio.low:.3f}-{ratio.high:.3f}]"


def one_run(name: str, load: str, seconds: float) -> dict:
    reference = REFERENCES[name]
    with strangers_load(load):
        pairs = kept_pairs(reference, seconds)
    rates = [(a.samples_per_sec, b.samples_per_sec) for a, b in pairs]
    plain = paired_ratio([a for a, _ in rates], [b for _, b in rates]) if pairs else None
    measured = [(a, b) for a, b in pairs if a.load is not None and b.load is not None]
    adjusted = load_adjusted_ratio([a.samples_per_sec for a, _ in measured],
                                   [b.samples_per_sec for _, b in measured],
                                   [a.load - b.load for a, b in measured]) \
        if len(measured) == len(pairs) else None
    loaded = sum(a.disturbed and b.disturbed for a, b in pairs)
    change = ", ".join(f"{k}={v}" for k, v in reference.change.items())
    print(f"{name} ({change}), {load}: {len(pairs)} pairs kept ({loaded} under load); "
          f"plain {_interval(plain)}; at equal load {_interval(adjusted)}", flush=True)
    return {"model": name, "load": load, "seconds": seconds, "reference": asdict(reference),
            "pairs": [{"change": asdict(a), "baseline": asdict(b)} for a, b in pairs],
            "plain": asdict(plain) if plain else None,
            "adjusted": asdict(adjusted) if adjusted else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(REFERENCES),
                        default=list(REFERENCES))
    parser.add_argument("--loads", nargs="+", choices=list(LOADS), default=list(LOADS))
    parser.add_argument("--seconds", type=float, default=45.0,
                        help="paired turns for this long once both processes are warm")
    parser.add_argument("--out", type=Path, help="write every run's pairs and intervals here")
    args = parser.parse_args()
    runs = [one_run(name, load, args.seconds) for name in args.models for load in args.loads]
    if args.out:
        args.out.write_text(json.dumps({
            "at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
