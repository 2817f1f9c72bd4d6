"""`autotune` command line. Bad input: one clear message and exit 2, no traceback unless --debug."""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from autotune.config import ConfigError, TrainConfig, from_baseline, knob_names, parse_assignments
from autotune.hardware import describe, parse_device, unsupported_reason
from autotune.isolation import TrialRequest, run_isolated
from autotune.measure import MeasureSettings
from autotune.report import bench_record, print_bench
from autotune.workload import ContractError, load_workload, parse_model_args

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6,
          "mib": 2**20, "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12,
          "tib": 2**40}


class UsageError(Exception):
    """Bad command-line input."""


def parse_bytes(text: str) -> int:
    """`8GiB`, `512MiB`, `8GB`, `2G` (binary), or plain bytes."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"cannot read {text!r} as a memory size; use e.g. 8GiB, 512MiB, 8GB")
    value = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if value <= 0:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Find the fastest training configuration for a PyTorch model on this "
                    "machine, measured in isolated processes.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    bench = commands.add_parser(
        "bench", help="measure one training configuration in its own process",
        description="Measure one training configuration of a model file in a fresh process: "
                    "warm-up until steady, a timed window with data loading included, then a "
                    "short profiler window. Defaults to the file's BASELINE. Exit 0 when "
                    "measured, 1 when the trial failed (oom, crash, timeout, error), 2 for bad "
                    "input or a configuration this device or model cannot run.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    bench.add_argument("--model", required=True, metavar="FILE",
                       help="model file defining build_model and build_dataset")
    bench.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                       help="keyword argument for build_model/build_dataset (repeatable)")
    bench.add_argument("--config", metavar="FILE",
                       help="YAML/JSON configuration; knobs it leaves out come from BASELINE")
    bench.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                       help=f"set one knob (repeatable); knobs: {', '.join(knob_names())}")
    bench.add_argument("--device", metavar="DEVICE",
                       help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    bench.add_argument("--memory-limit", metavar="SIZE",
                       help="measure as if the device had only this much memory (e.g. 8GiB)")
    bench.add_argument("--trace", metavar="DIR", help="write the profiler's Chrome trace here")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--log", metavar="FILE", help="trial log file (default: a temp file)")
    bench.add_argument("--time-limit", type=float, default=900.0, metavar="SECONDS",
                       help="kill the trial after this long")
    defaults = MeasureSettings()
    bench.add_argument("--window-steps", type=int, default=defaults.window_steps,
                       help="minimum optimizer steps in the timed window")
    bench.add_argument("--window-seconds", type=float, default=defaults.window_seconds,
                       help="minimum seconds in the timed window")
    bench.add_argument("--warmup-max-seconds", type=float,
                       default=defaults.warmup_max_seconds,
                       help="give up waiting for steady step times after this long")
    bench.add_argument("--profile-steps", type=int, default=defaults.profile_steps,
                       help="optimizer steps under the profiler after the window (0: none)")
    bench.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    try:
        device = parse_device(args.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    workload = load_workload(args.model, parse_model_args(args.model_arg))
    try:
        config = from_baseline(workload.baseline, device.type)
    except ConfigError as exc:
        raise ContractError(f"{workload.path}: BASELINE: {exc}") from None
    if args.config:
        config = TrainConfig.load(args.config, base=config)
    config = TrainConfig.from_dict(parse_assignments(args.set), base=config)
    info = describe(device)
    reason = unsupported_reason(config, info)
    if reason:
        raise ConfigError(f"this configuration cannot run on {info}: {reason}")
    for name in ("window_steps", "profile_steps"):
        if getattr(args, name) < (1 if name == "window_steps" else 0):
            raise UsageError(f"--{name.replace('_', '-')} is out of range")
    settings = MeasureSettings(window_steps=args.window_steps,
                               window_seconds=args.window_seconds,
                               warmup_max_seconds=args.warmup_max_seconds,
                               profile_steps=args.profile_steps)
    trace = str(Path(args.trace) / f"{workload.name}-trace.json") if args.trace else None
    request = TrialRequest(
        model_path=str(workload.path), config=config.to_dict(), device=str(device),
        model_args=workload.model_args, settings=vars(settings),
        memory_limit_bytes=parse_bytes(args.memory_limit) if args.memory_limit else None,
        trace_path=trace)
    status = Console(stderr=True)
    with status.status(f"measuring {workload.name} on {device}") as spinner:
        result = run_isolated(request, args.time_limit, args.log, on_phase=lambda phase:
                              spinner.update(f"measuring {workload.name} on {device}: {phase}"))
    record = bench_record(result.to_dict(), str(device), config.to_dict())
    if result.bad_input and not args.json:
        raise ContractError(result.message)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print_bench(record, console, f"{workload.name} on {info}")
    if result.status == "ok":
        return EXIT_OK
    if result.bad_input or result.status == "unsupported":
        return EXIT_BAD_INPUT
    return EXIT_FAILED


COMMANDS = {"bench": cmd_bench}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    try:
        return COMMANDS[args.command](args, console)
    except (UsageError, ContractError, ConfigError) as exc:
        if args.debug:
            raise
        Console(stderr=True).print(Text.assemble(("autotune: error: ", "bold red"), str(exc)))
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
