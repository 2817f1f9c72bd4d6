"""What starting a confirmation's warm process costs: a new interpreter (torch, autotune and the
model file, or the script's libraries, imported again) against a process forked from the trials'
fork server, as the tuner starts it where one runs.

For each model, rounds alternate the two launchers (the order flipped each round, so that the
machine's drift falls on both); each starts the baseline's warm process, waits until it is
steady and has taken its first turn (not counted), as the confirmation does, then stops it.
Prints each launcher's median start in seconds and the paired ratio forked / fresh with its 95%
interval; writes benchmarks/results/<name>.json. It asserts nothing.

    python benchmarks/warm_start.py --rounds 5 --models mlp rgat hf_script
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from trial_overhead import alternating, arguments  # noqa: E402

from autotune.options import MeasureSettings  # noqa: E402
from autotune.search.forkserver import ForkServer  # noqa: E402
from autotune.search.warm import WarmRounds  # noqa: E402
from autotune.stats import paired_ratio  # noqa: E402
from autotune.target import Target  # noqa: E402
from autotune.trial.protocol import TrialRequest  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def warm_start_s(target: Target, server: ForkServer | None, log: Path) -> float:
    """Seconds from asking for the baseline's warm process to its first turn taken."""
    request = TrialRequest(target, config={}, device="cpu", settings=MeasureSettings(),
                           inductor_cache_dir=str(log.parent / "inductor"))
    began = time.perf_counter()
    rounds = WarmRounds([request], [log], 600, server=server)
    started = time.perf_counter() - began
    rounds.close()
    return started


def main() -> None:
    args = arguments(__doc__, "warm_start")
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            starts = alternating(name, Path(scratch), args.rounds, warm_start_s)
            ratio = paired_ratio(starts["forked"], starts["fresh"])
            rows[name] = {**{f"median_{k}_s": statistics.median(v) for k, v in starts.items()},
                          "starts_s": starts,
                          "forked_over_fresh": {"value": ratio.value, "low": ratio.low,
                                                "high": ratio.high}}
            interval = f" [{ratio.low:.2f}-{ratio.high:.2f}]" if ratio.low is not None else ""
            print(f"{name}: fresh {rows[name]['median_fresh_s']:.2f} s, forked "
                  f"{rows[name]['median_forked_s']:.2f} s (medians of {args.rounds}); forked / "
                  f"fresh {ratio.value:.2f}{interval}", flush=True)
    result = {"command": "python benchmarks/warm_start.py " + " ".join(sys.argv[1:]),
              "cpus": len(os.sched_getaffinity(0)), "load_before": os.getloadavg(),
              "models": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
