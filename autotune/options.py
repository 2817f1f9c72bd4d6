"""Run settings: `TuneOptions` is the one source of what `autotune run` can be asked to do.

Each field carries its flag and help text; the command line is generated from the fields
(`add_options`) and read back through them (`options_from_args`), and every range is checked
in one place (`__post_init__`), all problems in one `UsageError`. `WorkloadOptions` is the part
that `bench` and `profile` share with `run`, `StorageOptions` the part every command that reads
a study shares with it.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

from autotune.config import ConfigError, parse_assignments
from autotune.confirm import DEFAULT_MAX_ROUNDS, DEFAULT_ROUNDS, DEFAULT_TARGET
from autotune.heartbeat import DEFAULT_HEARTBEAT_S
from autotune.measure import MeasureSettings
from autotune.space import DEFAULT_MAX_GRAD_ACCUM, parse_batch_range
from autotune.storage import DEFAULT_RETRY_S
from autotune.workload import ContractError, parse_model_args

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


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `1h`, `1h30m` to seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([hms]?)", text.strip().lower())
    if not parts or "".join(n + u for n, u in parts) != re.sub(r"\s+", "", text.lower()):
        raise UsageError(f"cannot read {text!r} as a duration; use e.g. 90s, 30m, 1h30m")
    seconds = sum(float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[u] for n, u in parts)
    if seconds <= 0:
        raise UsageError(f"duration must be positive, got {text!r}")
    return seconds


def _device_list(text: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in text.split(","))


def option(flag: str, help: str, *, default: Any = None, metavar: str | None = None,
           kind: Callable[[str], Any] | None = None, parse: Callable[[Any], Any] | None = None,
           repeat: bool = False, switch: bool = False, required: bool = False) -> Any:
    """A settings field with its command-line flag: `kind` converts each word (argparse's
    `type`), `parse` the whole value once read, `repeat` collects a repeatable flag."""
    meta = {"flag": flag, "help": help, "metavar": metavar, "kind": kind, "parse": parse,
            "repeat": repeat, "switch": switch, "required": required}
    if required:
        return field(metadata=meta)
    if repeat or isinstance(default, (dict, list)):
        empty = type(default) if default is not None else dict
        return field(default_factory=empty, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class WorkloadOptions:
    """A model file on a device: what `bench`, `profile` and `run` all need."""

    model_path: str = option("--model", "model file defining build_model and build_dataset",
                             metavar="FILE", required=True)
    model_args: dict[str, Any] = option(
        "--model-arg", "keyword argument for build_model/build_dataset (repeatable)",
        metavar="KEY=VALUE", repeat=True, parse=parse_model_args)
    device: str | None = option("--device", "cpu, cuda or cuda:N (default: cuda when present, "
                                "else cpu)", metavar="DEVICE")
    memory_limit_bytes: int | None = option(
        "--memory-limit", "measure as if the device had only this much memory (e.g. 8GiB)",
        metavar="SIZE", parse=parse_bytes)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise UsageError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason these settings are invalid (empty when valid)."""
        return []


@dataclass
class StorageOptions:
    """Where studies live: what every command that reads or writes a study needs."""

    studies_dir: str = option("--studies-dir", "where embedded studies live: "
                              "DIR/<study>/journal.log", default="studies", metavar="DIR")
    storage: str | None = option(
        "--storage", "an Optuna storage URL (e.g. sqlite:///x.db, postgresql://...) instead of "
        "the embedded journal file", metavar="URL")


@dataclass
class TuneOptions(StorageOptions, WorkloadOptions):
    """Everything `autotune run` was asked to do."""

    study: str | None = option("--study", "study name (default: the model file's stem)",
                               metavar="NAME")
    trials: int | None = option(
        "--trials", "measured trials the study should have in all (default: as many as fit "
        "in a 10 min budget for the whole run, confirmation included, unless --timeout is "
        "given)", metavar="N", kind=int)
    timeout_s: float | None = option("--timeout", "stop starting trials after this long, e.g. "
                                     "30m, 1h, 90s (confirmation follows)",
                                     metavar="DURATION", parse=parse_duration)
    global_batch: int | None = option(
        "--global-batch-size", "keep micro_batch_size x grad_accum_steps = G (default: the "
        "baseline's effective batch)", metavar="G", kind=int)
    free_batch: tuple[int, int] | None = option(
        "--free-batch-size", "let the effective batch vary in [MIN, MAX] (the learning rate "
        "may then need rescaling)", metavar="MIN:MAX", parse=parse_batch_range)
    fixes: dict[str, Any] = option("--fix", "hold one knob at a value (repeatable)",
                                   metavar="KNOB=VALUE", repeat=True, parse=parse_assignments)
    space_file: str | None = option(
        "--space", "YAML mapping knob -> list of values to try, narrowing the space",
        metavar="FILE")
    max_grad_accum: int = option(
        "--max-grad-accum", "search accumulation only up to N micro-batches per step (the "
        "baseline's own is always tried)", default=DEFAULT_MAX_GRAD_ACCUM, metavar="N",
        kind=int)
    stall_penalty: float = option("--stall-penalty", "weight of the stall fraction in the "
                                  "objective (0 disables)", default=0.1, kind=float)
    memory_headroom: float = option(
        "--memory-headroom", "share of device memory (or --memory-limit) kept free: a trial "
        "whose peak is above the rest is infeasible", default=0.1, kind=float)
    confirm_top: int = option("--confirm-top", "configurations re-measured at the end",
                              default=3, metavar="K", kind=int)
    confirm_repeats: int = option(
        "--confirm-repeats", "paired rounds of fresh runs at least (each round: every "
        "confirmed configuration and the baseline once, in a shuffled order; 0 skips "
        "confirmation)", default=DEFAULT_ROUNDS, metavar="R", kind=int)
    confirm_max_rounds: int = option(
        "--confirm-max-rounds", "paired rounds at most: rounds are added until the leader's "
        "speedup is known within --confirm-target", default=DEFAULT_MAX_ROUNDS, metavar="N",
        kind=int)
    confirm_target: float = option(
        "--confirm-target", "stop adding rounds once the leader's speedup over the baseline "
        "is known within this share (95%% interval half-width)", default=DEFAULT_TARGET,
        metavar="SHARE", kind=float)
    trial_time_limit_s: float = option("--trial-time-limit", "kill a trial after this long "
                                       "(a timeout)", default=900.0, metavar="SECONDS",
                                       kind=float)
    seed: int | None = option("--seed", "sampler seed, for a reproducible search", kind=int)
    workers: int = option(
        "--workers", "trials at once on a CPU --device (parallel trials share the cores and "
        "disturb each other's timings); one GPU runs one trial at a time", default=1,
        metavar="N", kind=int)
    devices: tuple[str, ...] = option(
        "--devices", "one worker per device, e.g. cuda:0,cuda:1,cuda:2,cuda:3", default=(),
        metavar="LIST", parse=_device_list)
    train_steps: int | None = option(
        "--train-steps", "optimize the wall time of a run of S optimizer steps, build, "
        "compile and warm-up included, instead of steady samples/sec: compile wins only when "
        "S steps pay for it (the summary prints the break-even step count)", metavar="S",
        kind=int)
    plain_tpe: bool = option(
        "--plain-tpe", "search every knob with plain TPE: no fast corner first, no memory "
        "model, no DataLoader plan, no screening (for comparison; slower to the optimum)",
        default=False, switch=True)
    storage_retry_s: float = option(
        "--storage-retry-seconds", "keep retrying (with back-off) this long while the storage "
        "is unreachable, then stop with an error; finished trials stay safe",
        default=DEFAULT_RETRY_S, metavar="SECONDS", kind=float)
    heartbeat_s: float = option(
        "--heartbeat-interval", "how often running trials are marked alive; a trial silent "
        "for 3 intervals lost its tuner and is re-run (once) by another",
        default=DEFAULT_HEARTBEAT_S, metavar="SECONDS", kind=float)
    settings: MeasureSettings = field(default_factory=MeasureSettings)
    # The ablation of the search-efficiency benchmark: no fast corner, the rest unchanged.
    fast_corner_first: bool = True

    def problems(self) -> list[str]:
        out = []
        at_least = {"trials": 1, "train_steps": 1, "global_batch": 1, "workers": 1,
                    "confirm_top": 1, "confirm_repeats": 0, "confirm_max_rounds": 1,
                    "max_grad_accum": 1, "storage_retry_s": 0}
        for name, low in at_least.items():
            value = getattr(self, name)
            if value is not None and value < low:
                out.append(f"{flag_of(TuneOptions, name)} must be >= {low}, got {value}")
        if self.confirm_max_rounds < self.confirm_repeats:
            out.append("--confirm-max-rounds must be >= --confirm-repeats")
        for name in ("heartbeat_s", "trial_time_limit_s", "confirm_target"):
            if getattr(self, name) <= 0:
                out.append(f"{flag_of(TuneOptions, name)} must be > 0")
        for name in ("stall_penalty", "memory_headroom"):
            if not 0 <= getattr(self, name) < 1:
                out.append(f"{flag_of(TuneOptions, name)} must be in [0, 1)")
        if self.devices and self.device:
            out.append("give either --device or --devices")
        if self.devices and self.workers != 1:
            out.append("give either --workers or --devices (one worker per device)")
        if self.device and self.device.startswith("cuda"):
            out.extend(filter(None, [one_trial_per_gpu(self.workers)]))
        if len(set(self.devices)) < len(self.devices):
            out.append(f"--devices must be distinct devices of one kind, got "
                       f"{', '.join(self.devices)}")
        if self.global_batch is not None and self.free_batch is not None:
            out.append("--global-batch-size and --free-batch-size contradict each other: the "
                       "first keeps the effective batch at one value, the second lets it vary")
        return out


Options = TypeVar("Options")


def one_trial_per_gpu(workers: int) -> str | None:
    """Why `--workers` above 1 cannot share one GPU, or None for one worker."""
    if workers <= 1:
        return None
    return (f"--workers {workers} would run {workers} trials on one GPU at once: they would "
            "share its memory and compute and time each other's work; give several GPUs "
            "with --devices cuda:0,cuda:1 (one trial each)")


def flag_of(cls: type, name: str) -> str:
    return next(f.metadata["flag"] for f in fields(cls) if f.name == name)


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per field of `cls` that has one, with its help and default."""
    for f in fields(cls):
        meta = f.metadata
        if "flag" not in meta:
            continue
        kwargs: dict[str, Any] = {"dest": f.name, "help": meta["help"]}
        if meta["switch"]:
            kwargs["action"] = "store_true"
        else:
            kwargs["metavar"] = meta["metavar"]
            if meta["kind"]:
                kwargs["type"] = meta["kind"]
            if meta["repeat"]:
                kwargs.update(action="append", default=[])
            elif f.default is not MISSING and f.default not in (None, ()):
                kwargs["default"] = f.default
        if meta["required"]:
            kwargs["required"] = True
        parser.add_argument(meta["flag"], **kwargs)


def add_measure_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = MeasureSettings()
    parser.add_argument("--window-steps", type=int, default=defaults.window_steps,
                        help="minimum optimizer steps in the timed window")
    parser.add_argument("--window-seconds", type=float, default=defaults.window_seconds,
                        help="minimum seconds in the timed window")
    parser.add_argument("--window-precision", type=float, default=defaults.window_precision,
                        metavar="FRACTION",
                        help="after the minimum, time on until the median step time is known "
                        "within ± this (95%% interval), or a cap is hit")
    parser.add_argument("--window-max-steps", type=int, default=defaults.window_max_steps,
                        help="cap of the timed window in optimizer steps")
    parser.add_argument("--window-max-seconds", type=float,
                        default=defaults.window_max_seconds,
                        help="cap of the timed window in seconds")
    parser.add_argument("--warmup-max-seconds", type=float,
                        default=defaults.warmup_max_seconds,
                        help="give up waiting for steady step times after this long")
    parser.add_argument("--profile-steps", type=int, default=defaults.profile_steps,
                        help="optimizer steps under the profiler after the window, in search "
                        "trials and each candidate's first confirmation run (0: none; each "
                        "step costs torch about 0.1 ms per recorded operator to read back)")
    parser.add_argument("--contention-threshold", type=float,
                        default=defaults.contention_threshold, metavar="FRACTION",
                        help="a window in which other processes used more than this share of "
                        "the trial's CPUs is disturbed: measured again, else flagged")
    parser.add_argument("--contention-retries", type=int, default=defaults.contention_retries,
                        help="chances a disturbed window gets to be measured again: each "
                        "waits for a quiet moment (up to 1, 2, 4... s)")


def measure_settings(args: argparse.Namespace) -> MeasureSettings:
    problems = []
    if args.window_steps < 1 or args.profile_steps < 0 or args.window_seconds < 0:
        problems.append("--window-steps must be >= 1, --profile-steps and --window-seconds "
                        ">= 0")
    if args.window_max_steps < args.window_steps or \
            args.window_max_seconds < args.window_seconds:
        problems.append("--window-max-steps and --window-max-seconds must be at least "
                        "--window-steps and --window-seconds")
    if not 0 <= args.window_precision < 1 or not 0 <= args.contention_threshold <= 1:
        problems.append("--window-precision must be in [0, 1) and --contention-threshold in "
                        "[0, 1]")
    if args.contention_retries < 0:
        problems.append("--contention-retries must be >= 0")
    if problems:
        raise UsageError("; ".join(problems))
    return MeasureSettings(window_steps=args.window_steps, window_seconds=args.window_seconds,
                           window_precision=args.window_precision,
                           window_max_steps=args.window_max_steps,
                           window_max_seconds=args.window_max_seconds,
                           warmup_max_seconds=args.warmup_max_seconds,
                           profile_steps=args.profile_steps,
                           contention_threshold=args.contention_threshold,
                           contention_retries=args.contention_retries)


def options_from_args(args: argparse.Namespace, cls: type[Options], **extra: Any) -> Options:
    """The settings the flags of `cls` were given, each read by its field's parser; every
    value that cannot be read is listed in one UsageError."""
    values, problems = dict(extra), []
    for f in fields(cls):
        if "flag" not in f.metadata or not hasattr(args, f.name):
            continue
        raw, parse = getattr(args, f.name), f.metadata["parse"]
        if parse is None or raw is None or raw == []:
            if raw is not None and raw != []:
                values[f.name] = raw
            continue
        try:
            values[f.name] = parse(raw)
        except (UsageError, ConfigError, ContractError) as exc:
            problems.append(str(exc))
    if problems:
        raise UsageError("; ".join(problems))
    return cls(**values)
