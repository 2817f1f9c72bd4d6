"""`autotune` command line: each command's flags generated from its options dataclass
(`options`), and the error families mapped to exit codes in one place (`exit_code`): 0 ok,
1 failed, 2 bad input, 130 interrupted (143 by a SIGTERM). Bad input is one message, no
traceback of autotune's unless --debug."""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import logging
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from autotune.config import (
    TrainConfig,
    from_baseline,
    knob_names,
    knobs_in,
    parse_assignments,
    read_yaml,
    value_problems,
)
from autotune.errors import (
    AutotuneError,
    BadInput,
    ConfigError,
    ContractError,
    Interrupted,
    RunFailed,
    UsageError,
)
from autotune.flags import add_flags, from_args
from autotune.formatting import short_config
from autotune.hardware import BUS_ORDER, DeviceInfo, describe, parse_device, usable_cpus
from autotune.options import (
    LIBRARY_FORMATS,
    BenchOptions,
    ExportOptions,
    OneConfigOptions,
    ProfileOptions,
    ReportOptions,
    ShowOptions,
    StorageOptions,
    TuneOptions,
    VerifyOptions,
)
from autotune.search.isolation import run_isolated
from autotune.search.tuner import Tuner
from autotune.search.verify import verify_study
from autotune.show.export import export_config
from autotune.show.report import (
    bench_json,
    device_line,
    print_bench,
    print_profile,
    studies_table,
    summary_tables,
    write_study_files,
)
from autotune.show.views import LiveView, PlainView
from autotune.study.records import DETERMINISTIC
from autotune.study.results import list_studies, load_study, study_summary
from autotune.study.storage import redact, study_dir
from autotune.study.summary import StudySummary
from autotune.target import ModelFile, Script
from autotune.trial.protocol import (
    ProbeSettings,
    ProfileSettings,
    TrialRequest,
    TrialResult,
    TrialStatus,
)

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
# Ended by a SIGTERM: 128 + its number, as a shell reports a process that signal ended.
EXIT_TERMINATED = 128 + signal.SIGTERM


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


def _device_and_knobs(options: OneConfigOptions) -> tuple[DeviceInfo, dict[str, Any]]:
    """The device of `bench`/`profile`, and the knobs --config and --set give (the trial puts
    them over the file's BASELINE: the file is only ever imported there)."""
    try:
        device = parse_device(options.device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    target = options.target
    if not Path(target.path).is_file():
        raise ContractError(f"{target.noun} not found: {target.path}")
    knobs: dict[str, Any] = {}
    if options.config_file:
        data = knobs_in(read_yaml(options.config_file, "config") or {})
        if not isinstance(data, Mapping):
            raise ConfigError(f"config file {options.config_file} must be a mapping of knob: "
                              "value")
        knobs.update(data)
    knobs.update(parse_assignments(options.knobs))
    unknown = sorted(map(str, set(knobs) - set(knob_names())))
    problems = ([f"unknown knob(s) {', '.join(unknown)}; the knobs are: "
                 f"{', '.join(knob_names())}"] if unknown else []) + value_problems(knobs)
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))
    info = describe(device)
    match target:
        case Script() if knobs:
            knobs = _over_the_scripts_own(options, target, info, knobs)
    return info, knobs


def _over_the_scripts_own(options: OneConfigOptions, script: Script, info: DeviceInfo,
                          knobs: dict[str, Any]) -> dict[str, Any]:
    """--set and --config over a training script's own settings, which only the script knows:
    it is run once to its trainer (as the probe runs it) to read them, then the knobs go over
    them, so the measured run changes only what was asked (through the script's own flags,
    where its settings come from them)."""
    request = TrialRequest(script, config={}, device=str(info.torch_device),
                           nproc_per_node=options.nproc_per_node,
                           settings=ProbeSettings(candidates={}),
                           script_baseline=options.script_baseline)
    result = _isolated(request, "reading the settings of", Path(script.path).name,
                       options.time_limit_s, options.log)
    if result.bad_input:
        raise ContractError(result.message)
    if result.probe is None:
        raise RunFailed(f"reading the script's own settings failed: {result.message}")
    own = from_baseline(result.probe.baseline, info.type, options.nproc_per_node)
    options.script_baseline = result.probe.script_baseline
    try:
        return TrainConfig.from_dict(knobs, own).to_dict()
    except ValueError as exc:
        raise ConfigError(f"invalid configuration over the script's own settings: {exc}") \
            from None


def _refused(result: TrialResult, info: DeviceInfo) -> BadInput | None:
    """Bad input or a configuration this device cannot run, as the error to exit 2 with."""
    if result.bad_input:
        return ContractError(result.message)
    if result.status == TrialStatus.UNSUPPORTED:
        return ConfigError(f"this configuration cannot run on {info}: {result.message}")
    return None


def _isolated(request: TrialRequest, what: str, name: str, time_limit_s: float,
              log: str | Path | None) -> TrialResult:
    """One job in its own process (no fork server: a single run pays its imports once anyway),
    with a spinner naming its phase."""
    status = Console(stderr=True)
    with status.status(f"{what} {name} on {request.device}") as spinner:
        return run_isolated(request, time_limit_s, log, on_phase=lambda phase: spinner.update(
            f"{what} {name} on {request.device}: {phase}"))


def cmd_bench(options: BenchOptions, console: Console) -> int:
    info, knobs = _device_and_knobs(options)
    name = Path(options.target.path).stem
    trace = str(Path(options.trace_dir) / f"{name}-trace.json") if options.trace_dir else None
    request = TrialRequest(
        options.target, config=knobs, device=str(info.torch_device),
        settings=options.settings, script_baseline=options.script_baseline,
        memory_limit_bytes=options.memory_limit_bytes, trace_path=trace,
        nproc_per_node=options.nproc_per_node)
    result = _isolated(request, "measuring", name, options.time_limit_s, options.log)
    refused = _refused(result, info)
    if refused is not None and not options.json:
        raise refused
    if options.json:
        print(json.dumps(bench_json(result, str(info.torch_device), knobs), indent=2))
    else:
        print_bench(result, str(info.torch_device), console, f"{name} on {info}")
    if result.status == TrialStatus.OK:
        return EXIT_OK
    return EXIT_BAD_INPUT if refused is not None else EXIT_FAILED


def cmd_run(options: TuneOptions, console: Console) -> int:
    view_console = Console(stderr=True) if options.json else console
    plain = PlainView(view_console)
    plain.note(device_line(describe(parse_device(options.devices[0] if options.devices
                                                 else options.device))))
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
                         lambda: options.timeout_s or tuner.time_budget_s,
                         tuner.measured_trials)
                if view_console.is_terminal else plain)
        tuner.view = view
        with view:
            summary = tuner.run()
    except ContractError:
        tuner.discard_if_new()
        raise
    except Interrupted:
        view_console.print("interrupted: the running trial was stopped and re-queued; run the "
                           "same command to continue. Best so far (not confirmed):")
        view_console.print(summary_tables(study_summary(tuner.study)))
        return EXIT_INTERRUPTED
    finally:
        tuner.close()
    summary = write_study_files(summary, tuner.directory)
    if options.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        console.print(summary_tables(summary))
        for name, path in summary.files.items():
            console.print(Text(f"{name}: {path}", style="dim"))
    failure = run_failure(summary)
    if failure:
        _error(failure)
        return EXIT_FAILED
    return EXIT_OK


def run_failure(summary: StudySummary) -> str | None:
    """Why a finished study has no answer, in one line, or None when it has one: the baseline
    failed (nothing can be compared), or no trial measured anything."""
    baseline = summary.baseline_trial
    if baseline is not None and baseline.status in DETERMINISTIC:
        return (f"the baseline ({(summary.target or ModelFile).baseline_name}) failed as "
                f"{baseline.status}: "
                f"{baseline.message.splitlines()[0] if baseline.message else ''}; "
                "nothing can be compared")
    if not summary.best_config:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(summary.statuses.items()))
        return f"no trial measured anything ({outcomes})"
    return None


def cmd_profile(options: ProfileOptions, console: Console) -> int:
    info, knobs = _device_and_knobs(options)
    name = Path(options.target.path).stem
    out = writable_folder(Path(options.out or Path("studies") / name / "profile").absolute())
    request = TrialRequest(
        options.target, config=knobs, device=str(info.torch_device),
        memory_limit_bytes=options.memory_limit_bytes,
        settings=ProfileSettings(out=str(out), steps=options.steps, top=options.top,
                                 warmup_max_seconds=options.warmup_max_seconds),
        script_baseline=options.script_baseline)
    result = _isolated(request, "profiling", name, options.time_limit_s, out / "profile.log")
    refused = _refused(result, info)
    if refused is not None:
        raise refused
    if result.status == TrialStatus.OOM:
        _error(f"out of memory: {short_config(result.config)} does not fit on {info}; try a "
               "smaller micro_batch_size or activation_checkpointing")
        return EXIT_FAILED
    if result.status != TrialStatus.OK:
        _error(f"the profiled run ended as {result.status}: "
               f"{result.message.splitlines()[0] if result.message else ''} "
               f"(log: {result.log_path})")
        return EXIT_FAILED
    from autotune.show import plots  # matplotlib: only the commands that draw pay its import

    report = result.profile
    image = out / "memory.png"
    write_output(image, plots.memory_timeline(*report.memory_timeline,
                                              title=f"Memory timeline: {name}"))
    report.files.update(memory_image=str(image), json=str(out / "profile.json"),
                        text=str(out / "profile.txt"))
    saved = report.to_json()
    del saved["memory_timeline"]
    write_output(out / "profile.json", json.dumps(saved, indent=2))
    recorder = Console(record=True, width=max(console.width, 120), file=io.StringIO())
    print_profile(report, recorder, f"{name} on {info}")
    write_output(out / "profile.txt", recorder.export_text())
    print_profile(report, console, f"{name} on {info}")
    return EXIT_OK


def _error(message: str) -> None:
    """The message on stderr, never wrapped (scripts and logs read it whole): its first line
    after `autotune: error:`, the lines that follow (a script's traceback, its last lines) as
    they are."""
    first, _, rest = message.strip().partition("\n")
    Console(stderr=True, soft_wrap=True).print(
        Text.assemble(("autotune: error: ", "bold red"), " ".join(first.split()),
                      "\n" + rest.rstrip() if rest.strip() else ""))


def cmd_report(options: ReportOptions, console: Console) -> int:
    study = load_study(options.study, options.studies_dir, options.storage)
    if not study.trials:
        raise ConfigError(f"study {options.study!r} has no trials yet")
    path = Path(options.output) if options.output else \
        study_dir(options.studies_dir, study.study_name) / "report.html"
    with Console(stderr=True).status(f"writing the report of {study.study_name}"):
        from autotune.show.report_page import build_report  # matplotlib, scikit-learn: ~2 s

        page = build_report(study)
    write_output(path, page)
    console.print(str(path), soft_wrap=True)  # a path a shell can open, however long
    return EXIT_OK


def cmd_studies(options: StorageOptions, console: Console) -> int:
    rows = list_studies(options.studies_dir, options.storage)
    if not rows:
        where = "that storage" if options.storage else options.studies_dir
        console.print(f"no studies in {where}")
        return EXIT_OK
    console.print(studies_table(rows))
    return EXIT_OK


def cmd_show(options: ShowOptions, console: Console) -> int:
    summary = study_summary(load_study(options.study, options.studies_dir, options.storage))
    if options.json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        console.print(summary_tables(summary))
    return EXIT_OK


def cmd_export(options: ExportOptions, console: Console) -> int:
    summary = study_summary(load_study(options.study, options.studies_dir, options.storage))
    if not summary.best_config:
        raise ConfigError(f"study {options.study!r} has no feasible trial to export yet")
    other = _other_library(summary, options.format)
    if other:
        raise ConfigError(f"study {options.study!r} tuned a {other}: --format "
                          f"{options.format} writes another library's code; --format args "
                          "gives its answer in the script's own terms")
    device = "cuda" if summary.device and "cpu" not in str(summary.device).lower() else "cpu"
    text = export_config(summary.best_config, options.format, target=summary.target,
                         device=device, nproc_per_node=summary.nproc_per_node,
                         convolutional=summary.convolutional,
                         script_answer=summary.script_answer,
                         checks=summary.check_lines())
    if options.output:
        write_output(Path(options.output), text)
        Console(stderr=True).print(f"wrote {options.output}")
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _other_library(summary: StudySummary, fmt: str) -> str | None:
    """What a script study tuned, where `fmt` is the other library's format (None where it
    is not)."""
    answer = summary.script_answer
    if answer is None or not answer.trained_with:
        return None
    return answer.trained_with if fmt in LIBRARY_FORMATS and fmt != answer.export_format \
        else None


def cmd_verify(options: VerifyOptions, console: Console) -> int:
    study = load_study(options.study, options.studies_dir, options.storage)
    with PlainView(Console(stderr=True)) as view:
        verification = verify_study(study, options,
                                    study_dir(options.studies_dir, study.study_name), view)
    console.print(f"verified {verification.describe()}", markup=False, highlight=False,
                  soft_wrap=True)
    return EXIT_FAILED if verification.holds is False else EXIT_OK


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


@dataclass(frozen=True)
class Command:
    """One subcommand: its options (and so its flags), what runs it, and its help."""

    options: type
    run: Callable[[Any, Console], int]
    help: str
    description: str


COMMANDS = {
    "bench": Command(
        BenchOptions, cmd_bench, "measure one training configuration in its own process",
        "Measure one training configuration of a model file in a fresh process: warm-up until "
        "steady, a timed window with data loading included, then a short profiler window. "
        "Defaults to the file's BASELINE. Exit 0 when measured, 1 when the trial failed (oom, "
        "crash, timeout, error), 2 for bad input or a configuration this device or model "
        "cannot run."),
    "run": Command(
        TuneOptions, cmd_run, "search for the fastest configuration with an Optuna study",
        "Run (or continue) an Optuna study over the training knobs. A probe first finds which "
        "knob values this model and machine can run (the others are left out, each with its "
        "reason); the baseline (the file's BASELINE) is the first trial; every trial is "
        "measured in its own process; out-of-memory configurations are infeasible results "
        "the sampler learns from. When the budget ends (10 min for the whole run unless "
        "--trials or --timeout), the best configurations and the baseline are re-measured in "
        "paired rounds until the speedup's 95% interval is known; a winner no measurably "
        "faster than a simpler one gives way to it. Kill it at any moment and run the same "
        "command again: it continues. Exit codes: 0 an answer, 1 the run failed (the "
        "baseline failed, nothing measured), 2 bad input, 130 interrupted (143 by SIGTERM)."),
    "profile": Command(
        ProfileOptions, cmd_profile,
        "profile one configuration and say in words what to fix first",
        "Run one configuration (default: the file's BASELINE) in its own process: warm-up, "
        "then a profiler window with Python stacks and memory. Prints throughput during the "
        "window, self CPU/device totals, the top operators by device time, CPU time and input "
        "shape, and findings naming the lines of your code they come from. Writes the trace "
        "(open it in ui.perfetto.dev, or `tensorboard --logdir OUT` with torch-tb-profiler), "
        "a memory timeline image, profile.json and profile.txt to OUT."),
    "report": Command(
        ReportOptions, cmd_report, "write a study's HTML report with plots",
        "Write studies/<study>/report.html: samples/sec and peak memory vs micro-batch size "
        "(OOMs marked), best so far, parameter importance, best vs baseline, the best "
        "configuration's top operators and findings, and what compiling costs and gains. One "
        "self-contained file: images inline, no network needed to view it."),
    "studies": Command(StorageOptions, cmd_studies, "list the studies in the storage",
                       "List the studies in the storage: trials, creation time, whether "
                       "confirmed, model file."),
    "show": Command(ShowOptions, cmd_show, "print a study's summary from its storage",
                    "Print a study's summary (the recommendation beside the baseline, how the "
                    "study went, what to watch out for) from its storage alone."),
    "verify": Command(
        VerifyOptions, cmd_verify, "measure a study's answer against your settings again, now",
        "Re-measure the study's answer (its recommendation, or the closest contender where "
        "your settings were kept) against your settings in paired rounds, which of the "
        "two runs first alternating (warm turns, each kept warm in its own process, where "
        "memory holds both; else fresh processes), and say whether the claimed speedup still "
        "holds: the fresh figure and the claim no further apart than both intervals allow, "
        "or by how much it moved. "
        "Recorded in the study; `show` and the report list it. Run it before you change "
        "your training, and on the target machine when the study ran elsewhere. Exit 0 when "
        "the claim holds (or cannot be checked), 1 when it moved, 2 for bad input."),
    "export": Command(
        ExportOptions, cmd_export, "write a study's recommended configuration for your trainer",
        "Formats: yaml/json (TrainConfig, loadable with --config and TrainConfig.load), hf "
        "(transformers.TrainingArguments keyword arguments), lightning (Trainer arguments plus "
        "the code for what Trainer has no argument for), torch (a runnable script using "
        "autotune's training set-up), args (a --script study's answer in the script's own terms: "
        "the flags to add to its command line, or the keyword arguments to change in its "
        "code)."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Find the fastest training configuration for a PyTorch model on this "
                    "machine, measured in isolated processes.")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.description,
                                    formatter_class=HelpWithDefaults)
        add_flags(sub, command.options)
    return parser


def _takes_script(options: type) -> bool:
    return any(f.name == "script_args" for f in dataclasses.fields(options))


def exit_code(error: AutotuneError) -> int:
    """The exit code of each family of errors."""
    if isinstance(error, BadInput):
        return EXIT_BAD_INPUT
    if isinstance(error, Interrupted):
        return EXIT_INTERRUPTED
    return EXIT_FAILED


def split_script_args(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """autotune's own arguments, and the training script's: everything after the first `--`."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


# The signal that interrupted this command, if one did (SIGTERM exits 143, Ctrl-C 130).
_signalled: list[int] = []


def _interrupt(signum: int, frame: Any) -> None:
    _signalled.append(signum)
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """The command's exit code: 130 when interrupted, 143 when that was a SIGTERM."""
    _signalled.clear()
    code = _main(argv)
    return EXIT_TERMINATED if code == EXIT_INTERRUPTED and signal.SIGTERM in _signalled \
        else code


def _parse(own: list[str]) -> argparse.Namespace:
    """autotune's own arguments; a script's arguments given without `--` before them are
    refused with the command that would pass them."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(own)
    if unknown:
        hint = ""
        if getattr(args, "script_path", None):
            hint = (f" (a script's own arguments go after --: autotune {args.command} --script "
                    f"{args.script_path} [autotune's flags] -- {' '.join(unknown)})")
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return args


def _main(argv: Sequence[str] | None) -> int:
    own, script_args = split_script_args(sys.argv[1:] if argv is None else argv)
    args = _parse(own)
    console = Console()
    if _WARNINGS not in logging.getLogger("autotune").handlers:
        logging.getLogger("autotune").addHandler(_WARNINGS)
    # `cuda:N` numbers GPUs as NVML and nvidia-smi do (and as the trials do), unless the user
    # chose an order: set before anything here makes CUDA read it.
    os.environ.setdefault("CUDA_DEVICE_ORDER", BUS_ORDER)
    command = COMMANDS[args.command]
    # A SIGTERM (a scheduler's or `kill`'s stop) ends a command as Ctrl-C does: the trial in
    # flight recorded as interrupted and queued again, never left "running".
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        given = {"script_args": script_args} if script_args else {}
        if script_args and not _takes_script(command.options):
            raise UsageError(f"autotune {args.command} takes no script arguments (after --)")
        return command.run(from_args(args, command.options, **given), console)
    except AutotuneError as exc:
        if args.debug and isinstance(exc, BadInput):
            raise
        _error(str(exc) or type(exc).__name__)
        return exit_code(exc)
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
