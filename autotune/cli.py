"""`autotune` command line. Bad input: one clear message and exit 2, no traceback unless --debug."""

from __future__ import annotations

import argparse
import io
import json
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from autotune.config import ConfigError, TrainConfig, from_baseline, knob_names, parse_assignments
from autotune.deep_profile import profile_config
from autotune.export import EXPORT_FORMATS, export_config
from autotune.formatting import short_config
from autotune.hardware import DeviceInfo, describe, parse_device, unsupported_reason, usable_cpus
from autotune.isolation import TrialRequest, is_oom, limit_memory, run_isolated
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
    print_bench,
    print_profile,
    studies_table,
    summary_tables,
)
from autotune.results import list_studies, load_study, study_summary
from autotune.storage import StorageUnavailable, redact, study_dir
from autotune.tuner import Tuner
from autotune.views import LiveView, PlainView
from autotune.worker import Interrupted
from autotune.workload import ContractError, Workload, load_workload

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
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
        description="Run (or continue) an Optuna study over the training knobs. The baseline "
                    "(the file's BASELINE) is always the first trial; every trial is measured in "
                    "its own process; out-of-memory configurations are infeasible results the "
                    "sampler learns from. When the budget ends, the top configurations and the "
                    "baseline are re-measured in fresh processes and the winner is chosen on the "
                    "median. Kill it at any moment and run the same command again: it continues. "
                    "Objective: samples/sec x (1 - stall-penalty x stall fraction), the stall "
                    "fraction being device idle time on CUDA and host syncs plus loader waits on "
                    "CPU.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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


def _configured(args: argparse.Namespace) -> tuple[WorkloadOptions, Workload, TrainConfig,
                                                  DeviceInfo]:
    """The model file, BASELINE with --config and --set on top, checked against the device."""
    options = options_from_args(args, WorkloadOptions)
    try:
        device = parse_device(options.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    workload = load_workload(options.model_path, options.model_args)
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
    return options, workload, config, info


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    options, workload, config, info = _configured(args)
    device = info.torch_device
    trace = str(Path(args.trace) / f"{workload.name}-trace.json") if args.trace else None
    request = TrialRequest(
        model_path=str(workload.path), config=config.to_dict(), device=str(device),
        model_args=workload.model_args, settings=vars(measure_settings(args)),
        memory_limit_bytes=options.memory_limit_bytes, trace_path=trace)
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


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    options = options_from_args(args, TuneOptions, settings=measure_settings(args))
    view_console = Console(stderr=True) if args.json else console
    plain = PlainView(view_console)
    tuner = Tuner(options, plain)
    if len(tuner.devices) > 1 and tuner.device.type == "cpu":
        plain.note(f"warning: {len(tuner.devices)} CPU trials at once share {usable_cpus()} "
                   f"cores ({tuner.trial_threads} threads each, pinned) and disturb each "
                   "other's timings (memory bandwidth, caches, a shared loader core); the "
                   "confirmation runs alone")
    view = (LiveView(view_console, tuner.study, options.trials, options.timeout_s,
                     tuner.measured_trials) if view_console.is_terminal else plain)
    tuner.view = view
    try:
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
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    console.print(summary_tables(summary))
    for name, path in summary["files"].items():
        console.print(Text(f"{name}: {path}", style="dim"))
    return EXIT_OK


def cmd_profile(args: argparse.Namespace, console: Console) -> int:
    if args.steps < 1 or args.top < 1:
        raise UsageError("--steps and --top must be >= 1")
    options, workload, config, info = _configured(args)
    out = Path(args.out or Path("studies") / workload.name / "profile")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror}") from None
    device = info.torch_device
    if options.memory_limit_bytes:
        limit_memory(device, options.memory_limit_bytes)
    settings = MeasureSettings(warmup_max_seconds=args.warmup_max_seconds)
    status = Console(stderr=True)
    try:
        with status.status(f"profiling {workload.name} on {device}") as spinner:
            result = profile_config(workload, config, device, out, steps=args.steps,
                                    settings=settings, top=args.top, progress=lambda phase:
                                    spinner.update(f"profiling {workload.name}: {phase}"))
    except Exception as exc:
        if not is_oom(exc):
            raise
        status.print(f"out of memory: {short_config(config.to_dict())} does not fit on "
                     f"{info}; try a smaller micro_batch_size or activation_checkpointing")
        return EXIT_FAILED
    from autotune import plots  # matplotlib: only the commands that draw pay its import

    image = out / "memory.png"
    image.write_bytes(plots.memory_timeline(*result.memory_timeline,
                                            title=f"Memory timeline: {workload.name}"))
    result.files["memory_image"] = str(image)
    result.files["json"] = str(out / "profile.json")
    result.files["text"] = str(out / "profile.txt")
    Path(result.files["json"]).write_text(json.dumps(result.to_dict(), indent=2))
    recorder = Console(record=True, width=max(console.width, 120), file=io.StringIO())
    print_profile(result, recorder, f"{workload.name} on {info}")
    Path(result.files["text"]).write_text(recorder.export_text())
    print_profile(result, console, f"{workload.name} on {info}")
    return EXIT_OK


def cmd_report(args: argparse.Namespace, console: Console) -> int:
    study = load_study(args.study, args.studies_dir, args.storage)
    if not study.trials:
        raise ConfigError(f"study {args.study!r} has no trials yet")
    path = Path(args.output) if args.output else \
        study_dir(args.studies_dir, study.study_name) / "report.html"
    with Console(stderr=True).status(f"writing the report of {study.study_name}"):
        from autotune.report_page import build_report  # matplotlib and scikit-learn (fANOVA): ~2 s

        page = build_report(study)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
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
        Path(args.output).write_text(text)
        Console(stderr=True).print(f"wrote {args.output}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


COMMANDS = {"bench": cmd_bench, "run": cmd_run, "profile": cmd_profile, "report": cmd_report,
            "studies": cmd_studies, "show": cmd_show, "export": cmd_export}


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
    except StorageUnavailable as exc:
        Console(stderr=True).print(Text.assemble(("autotune: error: ", "bold red"), str(exc)))
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
