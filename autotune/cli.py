"""`autotune` command line. Bad input: one clear message and exit 2, no traceback unless --debug."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from autotune.config import (
    ConfigError,
    TrainConfig,
    knob_names,
    parse_assignments,
    read_yaml,
    value_problems,
)
from autotune.deep_profile import ProfileReport
from autotune.export import EXPORT_FORMATS, export_config
from autotune.formatting import short_config
from autotune.hardware import BUS_ORDER, DeviceInfo, describe, parse_device, usable_cpus
from autotune.isolation import TrialRequest, TrialResult, run_isolated
from autotune.measure import MeasureSettings
from autotune.options import (
    StorageOptions,
    TuneOptions,
    UsageError,
    WorkloadOptions,
    add_measure_arguments,
    add_options,
    measure_settings,
    options_from_args,
)
from autotune.report import (
    bench_record,
    device_line,
    print_bench,
    print_profile,
    studies_table,
    summary_tables,
)
from autotune.results import list_studies, load_study, study_summary
from autotune.storage import StorageUnavailable, redact, study_dir
from autotune.trials import DETERMINISTIC
from autotune.tuner import RunFailed, Tuner
from autotune.views import LiveView, PlainView
from autotune.worker import Interrupted
from autotune.workload import ContractError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _WarningLines(logging.Handler):
    """What autotune's modules warn about (a repaired journal, say): one line on stderr."""

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(f"autotune: warning: {record.getMessage()}\n")


_WARNINGS = _WarningLines(logging.WARNING)


class HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default where it says something: not when there is none, nor when the
    help text already tells it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default in (None, [], (), {}, False) or "default" in text:
            return text
        return super()._get_help_string(action)


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
        formatter_class=HelpWithDefaults)
    add_options(bench, WorkloadOptions)
    _add_config_args(bench)
    bench.add_argument("--trace", metavar="DIR", help="write the profiler's Chrome trace here")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--log", metavar="FILE", help="trial log file (default: a temp file)")
    bench.add_argument("--time-limit", type=float, default=900.0, metavar="SECONDS",
                       help="kill the trial after this long")
    add_measure_arguments(bench)
    _add_debug(bench)

    run = commands.add_parser(
        "run", help="search for the fastest configuration with an Optuna study",
        description="Run (or continue) an Optuna study over the training knobs. A probe first "
                    "finds which knob values this model and machine can run (the others are "
                    "left out, each with its reason); the baseline (the file's BASELINE) is the "
                    "first trial; every trial is measured in its own process; out-of-memory "
                    "configurations are infeasible results the sampler learns from. When the "
                    "budget ends (10 min for the whole run unless --trials or --timeout), the "
                    "best configurations and the baseline are re-measured in paired rounds "
                    "until the speedup's 95% interval is known; a winner no measurably faster "
                    "than a simpler one gives way to it. Kill it at any moment and run the same "
                    "command again: it continues. Exit codes: 0 an answer, 1 the run failed "
                    "(the baseline failed, nothing measured), 2 bad input, 130 interrupted.",
        formatter_class=HelpWithDefaults)
    add_options(run, TuneOptions)
    run.add_argument("--json", action="store_true",
                     help="print the final summary as one JSON object")
    add_measure_arguments(run)
    _add_debug(run)

    profile = commands.add_parser(
        "profile", help="profile one configuration and say in words what to fix first",
        description="Run one configuration (default: the file's BASELINE) in this process: "
                    "warm-up, then a profiler window with Python stacks and memory. Prints "
                    "throughput during the window, self CPU/device totals, the top operators by "
                    "device time, CPU time and input shape, and findings naming the lines of "
                    "your code they come from. Writes the trace (open it in ui.perfetto.dev, or "
                    "`tensorboard --logdir OUT` with torch-tb-profiler), a memory timeline "
                    "image, profile.json and profile.txt to OUT.",
        formatter_class=HelpWithDefaults)
    add_options(profile, WorkloadOptions)
    _add_config_args(profile)
    profile.add_argument("--steps", type=int, default=5,
                         help="optimizer steps under the profiler")
    profile.add_argument("--top", type=int, default=15, help="rows per operator table")
    profile.add_argument("--out", metavar="DIR",
                         help="output folder (default: studies/<model>/profile)")
    profile.add_argument("--warmup-max-seconds", type=float,
                         default=MeasureSettings().warmup_max_seconds,
                         help="give up waiting for steady step times after this long")
    profile.add_argument("--time-limit", type=float, default=900.0, metavar="SECONDS",
                         help="kill the profiled run after this long")
    _add_debug(profile)

    report = commands.add_parser(
        "report", help="write a study's HTML report with plots",
        description="Write studies/<study>/report.html: samples/sec and peak memory vs "
                    "micro-batch size (OOMs marked), best so far, parameter importance, best vs "
                    "baseline, the best configuration's top operators and findings, and what "
                    "compiling costs and gains. One self-contained file: images inline, no "
                    "network needed to view it.")
    report.add_argument("study", metavar="STUDY")
    report.add_argument("-o", "--output", metavar="FILE",
                        help="write here (default: the study folder's report.html)")
    add_options(report, StorageOptions)
    _add_debug(report)

    studies = commands.add_parser("studies", help="list the studies in the storage")
    add_options(studies, StorageOptions)
    _add_debug(studies)

    show = commands.add_parser("show", help="print a study's summary from its storage")
    show.add_argument("study", metavar="STUDY")
    add_options(show, StorageOptions)
    show.add_argument("--json", action="store_true", help="print one JSON object")
    _add_debug(show)

    export = commands.add_parser(
        "export", help="write a study's recommended configuration for your trainer",
        description="Formats: yaml/json (TrainConfig, loadable with --config and "
                    "TrainConfig.load), hf (transformers.TrainingArguments keyword arguments), "
                    "lightning (Trainer arguments plus the code for what Trainer has no "
                    "argument for), torch (a runnable script using autotune.training).")
    export.add_argument("study", metavar="STUDY")
    export.add_argument("--format", choices=EXPORT_FORMATS, default="yaml")
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    add_options(export, StorageOptions)
    _add_debug(export)
    return parser


def _add_debug(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="YAML/JSON configuration; knobs it leaves out come from BASELINE")
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                        help=f"set one knob (repeatable); knobs: {', '.join(knob_names())}")


def _target(args: argparse.Namespace) -> tuple[WorkloadOptions, DeviceInfo, dict[str, Any]]:
    """The model file and device of `bench`/`profile`, and the knobs --config and --set give
    (the trial puts them over the file's BASELINE: the file is only ever imported there)."""
    options = options_from_args(args, WorkloadOptions)
    try:
        device = parse_device(options.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not Path(options.model_path).is_file():
        raise ContractError(f"model file not found: {options.model_path}")
    knobs: dict[str, Any] = {}
    if args.config:
        data = read_yaml(args.config, "config") or {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {args.config} must be a mapping of knob: value")
        knobs.update(data)
    knobs.update(parse_assignments(args.set))
    unknown = sorted(map(str, set(knobs) - set(knob_names())))
    problems = ([f"unknown knob(s) {', '.join(unknown)}; the knobs are: "
                 f"{', '.join(knob_names())}"] if unknown else []) + value_problems(knobs)
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    return options, describe(device), knobs


def _refused(result: TrialResult, info: DeviceInfo) -> Exception | None:
    """Bad input or a configuration this device cannot run, as the error to exit 2 with."""
    if result.bad_input:
        return ContractError(result.message)
    if result.status == "unsupported":
        return ConfigError(f"this configuration cannot run on {info}: {result.message}")
    return None


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    options, info, knobs = _target(args)
    device, name = info.torch_device, Path(options.model_path).stem
    trace = str(Path(args.trace) / f"{name}-trace.json") if args.trace else None
    request = TrialRequest(
        model_path=options.model_path, config=knobs, device=str(device),
        model_args=options.model_args, settings=vars(measure_settings(args)),
        memory_limit_bytes=options.memory_limit_bytes, trace_path=trace)
    status = Console(stderr=True)
    with status.status(f"measuring {name} on {device}") as spinner:
        result = run_isolated(request, args.time_limit, args.log, on_phase=lambda phase:
                              spinner.update(f"measuring {name} on {device}: {phase}"))
    refused = _refused(result, info)
    if refused is not None and not args.json:
        raise refused
    record = bench_record(result.to_dict(), str(device), result.config or knobs)
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        print_bench(record, console, f"{name} on {info}")
    if result.status == "ok":
        return EXIT_OK
    return EXIT_BAD_INPUT if refused is not None else EXIT_FAILED


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    options = options_from_args(args, TuneOptions, settings=measure_settings(args))
    view_console = Console(stderr=True) if args.json else console
    plain = PlainView(view_console)
    try:
        first = parse_device(options.devices[0] if options.devices else options.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    plain.note(device_line(describe(first)))
    tuner = Tuner(options, plain)
    try:
        if tuner.core_shares:
            kind = "CPU trials" if tuner.device.type == "cpu" else "trials on their GPUs"
            plain.note(f"{len(tuner.devices)} {kind} at once share {usable_cpus()} CPU cores, "
                       f"{min(map(len, tuner.core_shares))} or more each (threads and DataLoader "
                       "workers alike); the confirmation runs alone, on every core" +
                       ("; CPU trials disturb each other's timings" if tuner.device.type == "cpu"
                        else ""))
        view = (LiveView(view_console, tuner.study, options.trials,
                         options.timeout_s or tuner.time_budget_s, tuner.measured_trials)
                if view_console.is_terminal else plain)
        tuner.view = view
        with view:
            summary = tuner.run()
    except ContractError:
        tuner.discard_if_new()
        raise
    except Interrupted:
        summary = study_summary(tuner.study)
        view_console.print("interrupted: the running trial was stopped and re-queued; run the "
                           "same command to continue. Best so far (not confirmed):")
        view_console.print(summary_tables(summary))
        return EXIT_INTERRUPTED
    finally:
        tuner.close()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        console.print(summary_tables(summary))
        for name, path in summary["files"].items():
            console.print(Text(f"{name}: {path}", style="dim"))
    failure = run_failure(summary)
    if failure:
        _error(failure)
        return EXIT_FAILED
    return EXIT_OK


def run_failure(summary: Mapping[str, Any]) -> str | None:
    """Why a finished study has no answer, in one line, or None when it has one: the baseline
    failed (nothing can be compared), or no trial measured anything."""
    baseline = summary.get("baseline_trial") or {}
    if baseline.get("status") in DETERMINISTIC:
        return (f"the baseline (the model file's BASELINE) failed as {baseline['status']}: "
                f"{baseline['message'].splitlines()[0] if baseline['message'] else ''}; "
                "nothing can be compared")
    if not summary["best_config"]:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items()))
        return f"no trial measured anything ({outcomes})"
    return None


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    if args.steps < 1 or args.top < 1:
        raise UsageError("--steps and --top must be >= 1")
    options, info, knobs = _target(args)
    device, name = info.torch_device, Path(options.model_path).stem
    out = writable_folder(Path(args.out or Path("studies") / name / "profile"))
    request = TrialRequest(
        model_path=options.model_path, config=knobs, device=str(device),
        model_args=options.model_args, memory_limit_bytes=options.memory_limit_bytes,
        job="profile", settings={"out": str(out), "steps": args.steps, "top": args.top,
                                 "warmup_max_seconds": args.warmup_max_seconds})
    status = Console(stderr=True)
    with status.status(f"profiling {name} on {device}") as spinner:
        result = run_isolated(request, args.time_limit, out / "profile.log",
                              on_phase=lambda phase: spinner.update(
                                  f"profiling {name} on {device}: {phase}"))
    refused = _refused(result, info)
    if refused is not None:
        raise refused
    if result.status == "oom":
        _error(f"out of memory: {short_config(result.config)} does not fit on {info}; try a "
               "smaller micro_batch_size or activation_checkpointing")
        return EXIT_FAILED
    if result.status != "ok":
        _error(f"the profiled run ended as {result.status}: "
               f"{result.message.splitlines()[0] if result.message else ''} "
               f"(log: {result.log_path})")
        return EXIT_FAILED
    report = ProfileReport.from_dict(result.metrics)
    recorder = Console(record=True, width=max(console.width, 120), file=io.StringIO())
    print_profile(report, recorder, f"{name} on {info}")
    write_output(Path(report.files["text"]), recorder.export_text())
    print_profile(report, console, f"{name} on {info}")
    return EXIT_OK


def _error(message: str) -> None:
    """One line on stderr, never wrapped (scripts and logs read it whole)."""
    Console(stderr=True, soft_wrap=True).print(
        Text.assemble(("autotune: error: ", "bold red"), " ".join(message.split())))


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    study = load_study(args.study, args.studies_dir, args.storage)
    if not study.trials:
        raise ConfigError(f"study {args.study!r} has no trials yet")
    path = Path(args.output) if args.output else \
        study_dir(args.studies_dir, study.study_name) / "report.html"
    with Console(stderr=True).status(f"writing the report of {study.study_name}"):
        from autotune.report_page import build_report  # matplotlib and scikit-learn (fANOVA): ~2 s

        page = build_report(study)
    write_output(path, page)
    console.print(str(path))
    return EXIT_OK


def cmd_studies(args: argparse.Namespace, console: Console) -> int:
    rows = list_studies(args.studies_dir, args.storage)
    if not rows:
        console.print(f"no studies in {args.storage and 'that storage' or args.studies_dir}")
        return EXIT_OK
    console.print(studies_table(rows))
    return EXIT_OK


def cmd_show(args: argparse.Namespace, console: Console) -> int:
    summary = study_summary(load_study(args.study, args.studies_dir, args.storage))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        console.print(summary_tables(summary))
    return EXIT_OK


def cmd_export(args: argparse.Namespace, console: Console) -> int:
    summary = study_summary(load_study(args.study, args.studies_dir, args.storage))
    if not summary["best_config"]:
        raise ConfigError(f"study {args.study!r} has no feasible trial to export yet")
    device = "cuda" if summary.get("device") and "cpu" not in str(summary["device"]).lower() \
        else "cpu"
    text = export_config(TrainConfig.from_dict(summary["best_config"]), args.format,
                         model_path=summary.get("model"), model_args=summary.get("model_args"),
                         device=device)
    if args.output:
        write_output(Path(args.output), text)
        Console(stderr=True).print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def write_output(path: Path, content: str | bytes) -> None:
    """Write a file the user named (its folder made if missing); a path that cannot be written
    is bad input."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


def writable_folder(path: Path) -> Path:
    """`path`, made if missing, once a file can be created in it; else bad input (before any
    work that would have to be thrown away)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write to {path}: {exc.strerror or exc}") from None
    return path


COMMANDS = {"bench": cmd_bench, "run": cmd_run, "profile": cmd_profile, "report": cmd_report,
            "studies": cmd_studies, "show": cmd_show, "export": cmd_export}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    console = Console()
    if _WARNINGS not in logging.getLogger("autotune").handlers:
        logging.getLogger("autotune").addHandler(_WARNINGS)
    # `cuda:N` numbers GPUs as NVML and nvidia-smi do (and as the trials do), unless the user
    # chose an order: set before anything here makes CUDA read it.
    os.environ.setdefault("CUDA_DEVICE_ORDER", BUS_ORDER)
    try:
        return COMMANDS[args.command](args, console)
    except (UsageError, ContractError, ConfigError) as exc:
        if args.debug:
            raise
        _error(str(exc))
        return EXIT_BAD_INPUT
    except (StorageUnavailable, RunFailed) as exc:
        _error(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return EXIT_INTERRUPTED
    except Exception:
        if args.debug:
            raise
        # An unexpected failure still prints its traceback, but never a storage password.
        sys.stderr.write(redact(traceback.format_exc(), getattr(args, "storage", None)))
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
