"""Does a run end when it says? (issue 33's bar)

Runs `autotune run --model MODEL --device cpu` (or `--script SCRIPT`) as a new user would,
with no `--trials` or `--timeout`, once per load: `quiet`, or beside a `bursty` side load (one
process alternately busy for 2 s and idle for 2 s, as a package install or a compile beside it
is), or a `steady` one (one process busy all along). From the run's own output it takes the
one announcement made after the baseline ("this run ends by HH:MM (in X)"; with `--trials`,
which bounds the run by its trials, the first "about X left" after the baseline) and compares
the time it announced with the time the run really took from then on: the bar is at most
1.15x, and the whole run within 13 minutes. It also keeps the verdict line (issue 31's bar
reads it).

Writes each transcript (every line with the seconds since the start) and
benchmarks/results/<name>.json with the figures; prints a table.

    python benchmarks/run_end.py --model benchmarks/models/residual_tower.py --loads quiet bursty
    python benchmarks/run_end.py --script train.py --loads bursty -- --trials 5 -- --out out
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ANNOUNCED = re.compile(r"this run ends by \d\d:\d\d \(in ([0-9.]+) (ms|s|min|h)\)"
                       r"|^about ([0-9.]+) (ms|s|min|h) left: ")
UNIT_S = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}
LOADS = ("steady", "bursty")
VERDICT = re.compile(r"(faster than your settings|^not known|slower than your settings|"
                     r"no measurable)")


@dataclass(frozen=True)
class RunEnd:
    """One run: what it announced after the baseline, and what it took."""

    load: str
    announced_s: float | None    # the time left the announcement said
    took_s: float | None         # the time the run really took after the announcement
    ratio: float | None          # took / announced: the bar is <= 1.15
    wall_s: float                # the whole run, probe and baseline included: the bar is 13 min
    returncode: int
    verdict: str


def side_load(kind: str, stop: multiprocessing.Event) -> None:
    """One process busy all along (`steady`) or 2 s busy, 2 s idle (`bursty`)."""
    while not stop.is_set():
        busy_until = time.monotonic() + 2.0
        while time.monotonic() < busy_until:
            sum(i * i for i in range(10_000))
        if kind == "bursty":
            stop.wait(2.0)


@contextlib.contextmanager
def side_loaded(load: str) -> Iterator[None]:
    """`side_load` running beside the block (nothing for `quiet`), stopped after it."""
    if load == "quiet":
        yield
        return
    stop = multiprocessing.Event()
    loader = multiprocessing.Process(target=side_load, args=(load, stop), daemon=True)
    loader.start()
    try:
        yield
    finally:
        stop.set()
        loader.join(5)


def one_run(target: list[str], load: str, transcript: Path, extra: list[str]) -> RunEnd:
    announced_s = announced_at = None
    verdict = ""
    started = time.monotonic()
    with side_loaded(load), tempfile.TemporaryDirectory() as studies, \
            transcript.open("w") as out:
        command = [sys.executable, "-m", "autotune", "run", *target, "--device", "cpu",
                   "--studies-dir", studies, *extra]
        out.write("$ " + " ".join(command[1:]) + f"  # side load: {load}\n")
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, bufsize=1, env={**os.environ, "COLUMNS": "200"})
        for line in child.stdout:
            now = time.monotonic() - started
            out.write(f"[{now:7.1f}s] {line}")
            found = ANNOUNCED.search(line)
            if found and announced_s is None:
                number, unit = (found.group(1), found.group(2)) if found.group(1) else \
                    (found.group(3), found.group(4))
                announced_s = float(number) * UNIT_S[unit]
                announced_at = now
            if VERDICT.search(line) and not verdict:
                verdict = line.strip()
        child.wait()
    wall = time.monotonic() - started
    took = wall - announced_at if announced_at is not None else None
    return RunEnd(load=load, announced_s=announced_s, took_s=took,
                  ratio=took / announced_s if took is not None and announced_s else None,
                  wall_s=wall, returncode=child.returncode, verdict=verdict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--model")
    where.add_argument("--script", help="a training script (its own arguments after a second "
                                        "--, as autotune run takes them)")
    parser.add_argument("--loads", nargs="+", default=["quiet", "bursty"],
                        choices=["quiet", *LOADS])
    parser.add_argument("--name", default="run_end")
    parser.add_argument("extra", nargs="*", help="more flags for autotune run (after --)")
    args = parser.parse_args()
    (RESULTS / args.name).parent.mkdir(parents=True, exist_ok=True)  # a name may hold a folder
    runs = []
    for load in args.loads:
        transcript = RESULTS / f"{args.name}_{load}.txt"
        target = ["--model", args.model] if args.model else ["--script", args.script]
        run = one_run(target, load, transcript, args.extra)
        runs.append(run)
        ratio = f"{run.ratio:.2f}x" if run.ratio else "-"
        announced = f"{run.announced_s / 60:.1f} min" if run.announced_s else "none"
        print(f"{load:7} announced {announced:>9}, took {(run.took_s or 0) / 60:.1f} min "
              f"({ratio}), whole run {run.wall_s / 60:.1f} min, exit {run.returncode}: "
              f"{run.verdict}", flush=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(
        {"model": args.model or args.script, "runs": [asdict(r) for r in runs]}, indent=2))


if __name__ == "__main__":
    main()
