"""`autotune` command line. Bad input: one clear message and exit 2, no traceback unless --debug."""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from autotune.config import (
    EXPORT_FORMATS,
    ConfigError,
    TrainConfig,
    export_config,
    from_baseline,
    knob_names,
    parse_assignments,
)
from autotune.hardware import (
    DeviceInfo,
    describe,
    parse_device,
    unsupported_reason,
    usable_cpus,
)
from autotune.isolation import TrialRequest, is_oom, limit_memory, run_isolated
from autotune.measure import MeasureSettings, profile_config
from autotune.report import (
    LiveView,
    PlainView,
    bench_record,
    print_bench,
    print_profile,
    short_config,
    summary_tables,
)
from autotune.space import DEFAULT_MAX_GRAD_ACCUM, parse_batch_range
from autotune.storage import DEFAULT_RETRY_S, StorageUnavailable, redact
from autotune.tuner import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_TRIALS,
    Interrupted,
    TuneOptions,
    Tuner,
    list_studies,
    load_study,
    study_dir,
    study_summary,
)
from autotune.workload import ContractError, Workload, load_workload, parse_model_args

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
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
    _add_workload_args(bench)
    _add_config_args(bench)
    bench.add_argument("--trace", metavar="DIR", help="write the profiler's Chrome trace here")
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.add_argument("--log", metavar="FILE", help="trial log file (default: a temp file)")
    bench.add_argument("--time-limit", type=float, default=900.0, metavar="SECONDS",
                       help="kill the trial after this long")
    _add_measure_args(bench)

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
    _add_workload_args(run)
    _add_study_args(run)
    run.add_argument("--trials", type=int, metavar="N",
                     help=f"measured trials the study should have in all (default "
                          f"{DEFAULT_TRIALS} when --timeout is not given either)")
    run.add_argument("--timeout", metavar="DURATION",
                     help="stop starting trials after this long, e.g. 30m, 1h, 90s")
    batch = run.add_mutually_exclusive_group()
    batch.add_argument("--global-batch-size", type=int, metavar="G",
                       help="keep micro_batch_size x grad_accum_steps = G (default: the "
                            "baseline's effective batch)")
    batch.add_argument("--free-batch-size", metavar="MIN:MAX",
                       help="let the effective batch vary in [MIN, MAX] (the learning rate may "
                            "then need rescaling)")
    run.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                     help="hold one knob at a value (repeatable)")
    run.add_argument("--space", metavar="FILE",
                     help="YAML mapping knob -> list of values to try, narrowing the space")
    run.add_argument("--max-grad-accum", type=int, default=DEFAULT_MAX_GRAD_ACCUM, metavar="N",
                     help="search accumulation only up to N micro-batches per step (the "
                          "baseline's own is always tried)")
    run.add_argument("--stall-penalty", type=float, default=0.1,
                     help="weight of the stall fraction in the objective (0 disables)")
    run.add_argument("--memory-headroom", type=float, default=0.1,
                     help="share of device memory (or --memory-limit) kept free: a trial whose "
                          "peak is above the rest is infeasible")
    run.add_argument("--confirm-top", type=int, default=3, metavar="K",
                     help="configurations re-measured at the end")
    run.add_argument("--confirm-repeats", type=int, default=2, metavar="R",
                     help="fresh runs per confirmed configuration (0 skips confirmation)")
    run.add_argument("--trial-time-limit", type=float, default=900.0, metavar="SECONDS",
                     help="kill a trial after this long (a timeout)")
    run.add_argument("--seed", type=int, help="sampler seed, for a reproducible search")
    parallel = run.add_mutually_exclusive_group()
    parallel.add_argument("--workers", type=int, default=1, metavar="N",
                          help="trials at once on --device (for CPU: parallel trials share the "
                               "cores and disturb each other's timings)")
    parallel.add_argument("--devices", metavar="LIST",
                          help="one worker per device, e.g. cuda:0,cuda:1,cuda:2,cuda:3")
    run.add_argument("--train-steps", type=int, metavar="S",
                     help="optimize the wall time of a run of S optimizer steps, build, "
                          "compile and warm-up included, instead of steady samples/sec: "
                          "compile wins only when S steps pay for it (the summary prints the "
                          "break-even step count)")
    run.add_argument("--plain-tpe", action="store_true",
                     help="search every knob with plain TPE: no fast corner first, no "
                          "memory model, no DataLoader plan, no screening (for comparison; "
                          "slower to the optimum)")
    run.add_argument("--storage-retry-seconds", type=float, default=DEFAULT_RETRY_S,
                     metavar="SECONDS",
                     help="keep retrying (with back-off) this long while the storage is "
                          "unreachable, then stop with an error; finished trials stay safe")
    run.add_argument("--heartbeat-interval", type=float, default=DEFAULT_HEARTBEAT_S,
                     metavar="SECONDS",
                     help="how often running trials are marked alive; a trial silent for 3 "
                          "intervals lost its tuner and is re-run (once) by another")
    _add_measure_args(run)

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
    _add_workload_args(profile)
    _add_config_args(profile)
    profile.add_argument("--steps", type=int, default=5,
                         help="optimizer steps under the profiler")
    profile.add_argument("--top", type=int, default=15, help="rows per operator table")
    profile.add_argument("--out", metavar="DIR",
                         help="output folder (default: studies/<model>/profile)")
    profile.add_argument("--warmup-max-seconds", type=float,
                         default=MeasureSettings().warmup_max_seconds,
                         help="give up waiting for steady step times after this long")

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
    _add_storage_args(report)
    report.add_argument("--debug", action="store_true", help="show tracebacks")

    studies = commands.add_parser("studies", help="list the studies in the storage")
    _add_storage_args(studies)
    studies.add_argument("--debug", action="store_true", help="show tracebacks")

    show = commands.add_parser("show", help="print a study's summary from its storage")
    show.add_argument("study", metavar="STUDY")
    _add_storage_args(show)
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.add_argument("--debug", action="store_true", help="show tracebacks")

    export = commands.add_parser(
        "export", help="write a study's recommended configuration for your trainer",
        description="Formats: yaml/json (TrainConfig, loadable with --config and "
                    "TrainConfig.load), hf (transformers.TrainingArguments keyword arguments), "
                    "lightning (Trainer arguments plus the code for what Trainer has no "
                    "argument for), torch (a runnable script using autotune.training).")
    export.add_argument("study", metavar="STUDY")
    export.add_argument("--format", choices=EXPORT_FORMATS, default="yaml")
    export.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    _add_storage_args(export)
    export.add_argument("--debug", action="store_true", help="show tracebacks")
    return parser


def _add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="FILE",
                        help="model file defining build_model and build_dataset")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="keyword argument for build_model/build_dataset (repeatable)")
    parser.add_argument("--device", metavar="DEVICE",
                        help="cpu, cuda or cuda:N (default: cuda when present, else cpu)")
    parser.add_argument("--memory-limit", metavar="SIZE",
                        help="measure as if the device had only this much memory (e.g. 8GiB)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="YAML/JSON configuration; knobs it leaves out come from BASELINE")
    parser.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                        help=f"set one knob (repeatable); knobs: {', '.join(knob_names())}")


def _add_measure_args(parser: argparse.ArgumentParser) -> None:
    defaults = MeasureSettings()
    parser.add_argument("--window-steps", type=int, default=defaults.window_steps,
                        help="minimum optimizer steps in the timed window")
    parser.add_argument("--window-seconds", type=float, default=defaults.window_seconds,
                        help="minimum seconds in the timed window")
    parser.add_argument("--warmup-max-seconds", type=float,
                        default=defaults.warmup_max_seconds,
                        help="give up waiting for steady step times after this long")
    parser.add_argument("--profile-steps", type=int, default=defaults.profile_steps,
                        help="optimizer steps under the profiler after the window (0: none)")


def _add_storage_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--studies-dir", default="studies", metavar="DIR",
                        help="where embedded studies live: DIR/<study>/journal.log")
    parser.add_argument("--storage", metavar="URL",
                        help="an Optuna storage URL (e.g. sqlite:///x.db, postgresql://...) "
                             "instead of the embedded journal file")


def _add_study_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", metavar="NAME",
                        help="study name (default: the model file's stem)")
    parser.add_argument("--json", action="store_true",
                        help="print the final summary as one JSON object")
    _add_storage_args(parser)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `1h`, `1h30m` to seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", text.lower()):
        raise UsageError(f"cannot read {text!r} as a duration; use e.g. 90s, 30m, 1h30m")
    seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"duration must be positive, got {text!r}")
    return seconds


def _settings(args: argparse.Namespace) -> MeasureSettings:
    if args.window_steps < 1 or args.profile_steps < 0 or args.window_seconds < 0:
        raise UsageError("--window-steps must be >= 1, --profile-steps and --window-seconds "
                         ">= 0")
    return MeasureSettings(window_steps=args.window_steps, window_seconds=args.window_seconds,
                           warmup_max_seconds=args.warmup_max_seconds,
                           profile_steps=args.profile_steps)


def _configured(args: argparse.Namespace) -> tuple[Workload, TrainConfig, DeviceInfo]:
    """The model file, BASELINE with --config and --set on top, checked against the device."""
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
    return workload, config, info


def cmd_bench(args: argparse.Namespace, console: Console) -> int:
    workload, config, info = _configured(args)
    device = info.torch_device
    settings = _settings(args)
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


def cmd_run(args: argparse.Namespace, console: Console) -> int:
    if args.trials is not None and args.trials < 1:
        raise UsageError("--trials must be >= 1")
    if args.train_steps is not None and args.train_steps < 1:
        raise UsageError("--train-steps must be >= 1")
    if args.workers < 1 or args.heartbeat_interval <= 0 or args.storage_retry_seconds < 0:
        raise UsageError("--workers must be >= 1, --heartbeat-interval > 0 and "
                         "--storage-retry-seconds >= 0")
    devices = tuple(d.strip() for d in args.devices.split(",")) if args.devices else ()
    if devices and args.device:
        raise UsageError("give either --device or --devices")
    for name in ("stall_penalty", "memory_headroom"):
        if not 0 <= getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be in [0, 1)")
    options = TuneOptions(
        model_path=args.model, model_args=parse_model_args(args.model_arg), device=args.device,
        study=args.study, studies_dir=args.studies_dir, storage=args.storage,
        trials=args.trials, timeout_s=parse_duration(args.timeout) if args.timeout else None,
        stall_penalty=args.stall_penalty, memory_headroom=args.memory_headroom,
        memory_limit_bytes=parse_bytes(args.memory_limit) if args.memory_limit else None,
        confirm_top=args.confirm_top, confirm_repeats=args.confirm_repeats,
        trial_time_limit_s=args.trial_time_limit, settings=_settings(args), seed=args.seed,
        global_batch=args.global_batch_size,
        free_batch=parse_batch_range(args.free_batch_size) if args.free_batch_size else None,
        fixes=parse_assignments(args.fix), space_file=args.space,
        max_grad_accum=args.max_grad_accum, workers=args.workers, devices=devices,
        heartbeat_s=args.heartbeat_interval, storage_retry_s=args.storage_retry_seconds,
        train_steps=args.train_steps, plain_tpe=args.plain_tpe)
    view_console = Console(stderr=True) if args.json else console
    plain = PlainView(view_console)
    tuner = Tuner(options, plain)
    if len(tuner.devices) > 1 and tuner.device.type == "cpu":
        plain.note(f"warning: {len(tuner.devices)} CPU trials at once share {usable_cpus()} "
                   f"cores ({tuner.trial_threads} threads each) and disturb each other's "
                   "timings; the confirmation runs alone")
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
    workload, config, info = _configured(args)
    out = Path(args.out or Path("studies") / workload.name / "profile")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write to {out}: {exc.strerror}") from None
    device = info.torch_device
    if args.memory_limit:
        limit_memory(device, parse_bytes(args.memory_limit))
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
    table = Table(title="studies", title_justify="left")
    for name in ("study", "trials", "created", "confirmed", "model"):
        table.add_column(name)
    for row in rows:
        table.add_row(*(str(row[k]) for k in ("study", "trials", "created", "confirmed",
                                               "model")))
    console.print(table)
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
