"""Every setting a command can be given, with its flag, help, default and checks: one dataclass
per command, built from shared parts, from which `flags` generates the command line.

The defaults live here and nowhere else: the engine imports them, and this module imports
nothing from the engine. Each dataclass checks itself when built (`problems`), every problem
in one `UsageError`, so a program that builds one directly gets the same checks as the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.config import knob_names, parse_assignments
from autotune.errors import UsageError
from autotune.flags import flag_of, group, option, parse_bytes, parse_duration
from autotune.hardware import parse_device
from autotune.target import ModelFile, Script, Target

# A whole run's time budget when neither --trials nor --timeout is given.
DEFAULT_TIME_BUDGET_S = 600.0
DEFAULT_TRIAL_TIME_LIMIT_S = 900.0
# How long a training script's probe waits for the script to reach its Trainer.train/fit.
DEFAULT_STARTUP_LIMIT_S = 120.0
DEFAULT_HEARTBEAT_S = 10.0
# How long to keep retrying while the storage is unreachable, backing off from half a second.
DEFAULT_STORAGE_RETRY_S = 60.0
DEFAULT_MAX_GRAD_ACCUM = 16
# Confirmation: paired rounds at least, at most, and the half-width they aim for.
DEFAULT_CONFIRM_ROUNDS = 3
DEFAULT_CONFIRM_MAX_ROUNDS = 10
DEFAULT_CONFIRM_TARGET = 0.03
# ... and the share of the study's wall time it may take.
DEFAULT_CONFIRM_SHARE = 0.3
DEFAULT_VERIFY_ROUNDS = 5
EXPORT_FORMATS = ("yaml", "json", "hf", "lightning", "torch")
# The formats that write a training library's code (a script of another library refuses them).
LIBRARY_FORMATS = ("hf", "lightning")
# The formats of a study of a training script (`--script`): its answer in its own terms.
SCRIPT_EXPORT_FORMATS = ("args",)


# The knobs a script's own flag can be named for (`--arg KNOB=FLAG`): a loop's batch arithmetic.
SCRIPT_FLAG_KNOBS = ("micro_batch_size", "grad_accum_steps")


def parse_script_flags(items: list[str]) -> dict[str, str]:
    """`--arg micro_batch_size=--batch_size` items to knob -> the script's flag."""
    out: dict[str, str] = {}
    for item in items:
        knob, sep, flag = (part.strip() for part in item.partition("="))
        if not sep or knob not in SCRIPT_FLAG_KNOBS or not flag.startswith("-") or \
                len(flag.lstrip("-")) == 0:
            raise UsageError(f"--arg expects KNOB=FLAG, a knob of {' or '.join(SCRIPT_FLAG_KNOBS)} "
                             f"and the script's own flag that sets it (--arg micro_batch_size="
                             f"--batch_size), got {item!r}")
        out[knob] = flag
    return out


def parse_model_args(items: list[str]) -> dict[str, Any]:
    """`key=value` strings to keyword arguments: ints, floats, bools, else strings."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key.isidentifier():
            raise UsageError(f"--model-arg expects key=value with a Python name as key, "
                             f"got {item!r}")
        out[key] = _scalar(text.strip())
    return out


def parse_batch_range(text: str) -> tuple[int, int]:
    """`--free-batch-size MIN:MAX` -> (MIN, MAX)."""
    low, sep, high = str(text).partition(":")
    try:
        if not sep:
            raise ValueError
        bounds = int(low), int(high)
    except ValueError:
        raise UsageError(f"--free-batch-size expects MIN:MAX (two integers, e.g. 16:64), "
                         f"got {text!r}") from None
    if min(bounds) < 1:
        raise UsageError(f"--free-batch-size bounds must be positive integers, got {text}")
    if bounds[0] > bounds[1]:
        raise UsageError(f"--free-batch-size {text}: MIN is larger than MAX")
    return bounds


def _scalar(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _device_list(text: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in text.split(","))


def _at_least(options: Any, limits: dict[str, float]) -> list[str]:
    """A problem for each field below its limit (None passes: not given)."""
    out = []
    for name, low in limits.items():
        value = getattr(options, name)
        if value is not None and value < low:
            out.append(f"{flag_of(type(options), name)} must be >= {low:g}, got {value}")
    return out


@dataclass(kw_only=True)
class MeasureSettings:
    """How long to warm up and time. The defaults favour a trustworthy figure over speed."""

    window_steps: int = option("--window-steps", "minimum optimizer steps in the timed window",
                               default=10, kind=int)
    window_seconds: float = option("--window-seconds", "minimum seconds in the timed window",
                                   default=3.0, kind=float)
    window_precision: float = option(
        "--window-precision", "after the minimum, time on until the median step time is known "
        "within ± this (95%% interval), or a cap is hit", default=0.02, metavar="FRACTION",
        kind=float)
    window_max_steps: int = option("--window-max-steps",
                                   "cap of the timed window in optimizer steps", default=2000,
                                   kind=int)
    window_max_seconds: float = option("--window-max-seconds",
                                       "cap of the timed window in seconds", default=15.0,
                                       kind=float)
    warmup_max_steps: int = 50
    warmup_max_seconds: float = option(
        "--warmup-max-seconds", "give up waiting for steady step times after this long",
        default=60.0, kind=float)
    steady_steps: int = 3
    steady_tolerance: float = 0.10
    profile_steps: int = option(
        "--profile-steps", "optimizer steps under the profiler after the window, in search "
        "trials and each candidate's first confirmation run (0: none; each step costs torch "
        "about 0.1 ms per recorded operator to read back)", default=1, kind=int)
    # Multi-fidelity: a short window right after warm-up; a configuration whose rate there is
    # below `screen_below` samples/sec stops (status `screened`) without the full window. The
    # bar's own load (`screen_load`: other processes' share of the CPUs in its window, 0 where
    # it was quiet): a disturbed screening window is compared with it only at about that load.
    screen_steps: int = 3
    screen_below: float | None = None
    screen_load: float = 0.0
    # A window that waited on its loader for `protocol.LOADER_BOUND_SHARE` of its time goes on to
    # this many steps, within its cap (a warm turn with DataLoader workers: many rounds of them,
    # `trial.protocol.loader_turn_steps`), and ends on a multiple of `window_loader_round` steps.
    window_loader_steps: int = 0
    window_loader_round: int = 1
    # A window in which other processes took more than this share of the trial's CPUs is
    # measured again, up to `contention_retries` times, after 1, 2, 4... x the back-off.
    contention_threshold: float = option(
        "--contention-threshold", "a window in which other processes used more than this "
        "share of the trial's CPUs is disturbed: measured again, else flagged", default=0.05,
        metavar="FRACTION", kind=float)
    contention_retries: int = option(
        "--contention-retries", "chances a disturbed window gets to be measured again: each "
        "waits for a quiet moment (up to 1, 2, 4... s)", default=2, kind=int)
    contention_backoff_s: float = 1.0
    # Windows measured again at most, per trial: a load that comes and goes gets one more
    # chance, never a trial's time many times over.
    contention_remeasures: int = 1

    def problems(self) -> list[str]:
        out = _at_least(self, {"window_steps": 1, "profile_steps": 0, "window_seconds": 0,
                               "contention_retries": 0})
        if self.window_max_steps < self.window_steps or \
                self.window_max_seconds < self.window_seconds:
            out.append("--window-max-steps and --window-max-seconds must be at least "
                       "--window-steps and --window-seconds")
        if not 0 <= self.window_precision < 1:
            out.append("--window-precision must be in [0, 1)")
        if not 0 <= self.contention_threshold <= 1:
            out.append("--contention-threshold must be in [0, 1]")
        return out


@dataclass(kw_only=True)
class CommandOptions:
    """What every command takes; building one runs every check of its fields."""

    debug: bool = option("--debug", "show tracebacks", default=False, switch=True)

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise UsageError("; ".join(problems))

    def problems(self) -> list[str]:
        """Every reason these settings are invalid (empty when valid)."""
        return []


@dataclass(kw_only=True)
class WorkloadOptions(CommandOptions):
    """A model file, or the user's own training script, on a device: what `bench`, `profile`
    and `run` all need."""

    model_path: str | None = option("--model", "model file defining build_model and "
                                    "build_dataset", metavar="FILE")
    script_path: str | None = option(
        "--script", "your own training script instead of a model file (a Hugging Face Trainer, "
        "Lightning, Accelerate or hand-written torch.optim loop), run in every trial as "
        "`python FILE ARGS` with the arguments after `--`",
        metavar="FILE")
    # The script's own arguments: everything after `--` on the command line (not a flag).
    script_args: list[str] = field(default_factory=list)
    model_args: dict[str, Any] = option(
        "--model-arg", "keyword argument for build_model/build_dataset (repeatable)",
        metavar="KEY=VALUE", repeat=True, parse=parse_model_args)
    device: str | None = option("--device", "cpu, cuda or cuda:N (default: cuda when present, "
                                "else cpu)", metavar="DEVICE")
    memory_limit_bytes: int | None = option(
        "--memory-limit", "measure as if the device had only this much memory (e.g. 8GiB)",
        metavar="SIZE", parse=parse_bytes)
    nproc_per_node: int = option(
        "--nproc-per-node", "run every trial as a process group of N ranks started by "
        "torchrun (one GPU each with NCCL; on CPU gloo, the cores shared out), and search DDP "
        "and FSDP and their knobs", default=1, metavar="N", kind=int)
    script_flags: dict[str, str] = option(
        "--arg", "with --script: the script's own flag that sets a knob autotune may then tune "
        "(its micro-batch or accumulation; repeatable), as DeepSpeed's arg_mappings: "
        "--arg micro_batch_size=--batch_size --arg grad_accum_steps=--accum",
        metavar="KNOB=FLAG", repeat=True, parse=parse_script_flags)

    def problems(self) -> list[str]:
        out = _at_least(self, {"nproc_per_node": 1}) + self._workload_problems()
        if self.script_flags and not self.script_path:
            out.append("--arg names a flag of a training script: give --script FILE")
        if self.model_args and self.script_path:
            out.append("--model-arg is a model file's keyword argument: a training script "
                       "takes its own arguments after --")
        return out

    def _workload_problems(self) -> list[str]:
        if self.model_path and self.script_path:
            return ["--model and --script are alternatives: give a model file or your training "
                    "script, not both"]
        if not self.model_path and not self.script_path:
            return ["give --model FILE (a model file) or --script FILE (your training script)"]
        if self.script_args and not self.script_path:
            return [f"the arguments after -- ({' '.join(self.script_args)}) are a training "
                    "script's: give --script FILE"]
        return []

    @property
    def target(self) -> Target:
        """What every trial runs: the script with its arguments and the flags named for its
        knobs, or the model file with its arguments."""
        if self.script_path:
            return Script(self.script_path, tuple(self.script_args), dict(self.script_flags))
        return ModelFile(self.model_path or "", dict(self.model_args))


@dataclass(kw_only=True)
class StorageOptions(CommandOptions):
    """Where studies live: what every command that reads or writes a study needs."""

    studies_dir: str = option("--studies-dir", "where embedded studies live: "
                              "DIR/<study>/journal.log", default="studies", metavar="DIR")
    storage: str | None = option(
        "--storage", "an Optuna storage URL (e.g. sqlite:///x.db, postgresql://...) instead of "
        "the embedded journal file", metavar="URL")


@dataclass(kw_only=True)
class OneConfigOptions(WorkloadOptions):
    """One configuration of a model file: `bench` and `profile`."""

    # A script's own settings, as a run to its trainer read them for `--set` (not a flag).
    script_baseline: dict[str, Any] | None = None

    config_file: str | None = option(
        "--config", "YAML/JSON configuration; knobs it leaves out come from BASELINE",
        metavar="FILE")
    knobs: list[str] = option("--set", "set one knob (repeatable); knobs: "
                              f"{', '.join(knob_names())}", metavar="KNOB=VALUE", repeat=True,
                              default=[])


@dataclass(kw_only=True)
class BenchOptions(OneConfigOptions):
    """`autotune bench`: measure one configuration."""

    trace_dir: str | None = option("--trace", "write the profiler's Chrome trace here",
                                   metavar="DIR")
    json: bool = option("--json", "print one JSON object", default=False, switch=True)
    log: str | None = option("--log", "trial log file (default: a temp file)", metavar="FILE")
    time_limit_s: float = option("--time-limit", "kill the trial after this long",
                                 default=DEFAULT_TRIAL_TIME_LIMIT_S, metavar="SECONDS",
                                 kind=float)
    settings: MeasureSettings = group(MeasureSettings)

    def problems(self) -> list[str]:
        return super().problems() + self.settings.problems() + \
            _at_least(self, {"time_limit_s": 1})


@dataclass(kw_only=True)
class ProfileOptions(OneConfigOptions):
    """`autotune profile`: the deeper look at one configuration."""

    steps: int = option("--steps", "optimizer steps under the profiler", default=5, kind=int)
    top: int = option("--top", "rows per operator table", default=15, kind=int)
    out: str | None = option("--out", "output folder (default: studies/<model>/profile)",
                             metavar="DIR")
    warmup_max_seconds: float = option(
        "--warmup-max-seconds", "give up waiting for steady step times after this long",
        default=MeasureSettings().warmup_max_seconds, kind=float)
    time_limit_s: float = option("--time-limit", "kill the profiled run after this long",
                                 default=DEFAULT_TRIAL_TIME_LIMIT_S, metavar="SECONDS",
                                 kind=float)

    def problems(self) -> list[str]:
        alone = ["autotune profile looks at one process; drop --nproc-per-node (autotune bench "
                 "measures a process group)"] if self.nproc_per_node > 1 else []
        return alone + self._workload_problems() + \
            _at_least(self, {"steps": 1, "top": 1, "time_limit_s": 1})


@dataclass(kw_only=True)
class TuneOptions(StorageOptions, WorkloadOptions):
    """Everything `autotune run` can be asked to do."""

    study: str | None = option("--study", "study name (default: the model file's stem)",
                               metavar="NAME")
    trials: int | None = option(
        "--trials", "measured trials the study should have in all (default: as many as fit "
        f"in a {DEFAULT_TIME_BUDGET_S / 60:g} min budget for the whole run, confirmation "
        "included, unless --timeout is given)", metavar="N", kind=int)
    timeout_s: float | None = option("--timeout", "stop starting trials after this long, e.g. "
                                     "30m, 1h, 90s (confirmation follows)",
                                     metavar="DURATION", parse=parse_duration)
    budget_s: float | None = option(
        "--budget", "the whole run's time, confirmation included, e.g. 5m (default: "
        f"{DEFAULT_TIME_BUDGET_S / 60:g}m, which grows for slow trials; a given budget does not "
        "grow)", metavar="DURATION", parse=parse_duration)
    global_batch: int | None = option(
        "--global-batch-size", "keep micro_batch_size x grad_accum_steps x ranks = G "
        "(default: the baseline's)", metavar="G", kind=int)
    free_batch: tuple[int, int] | None = option(
        "--free-batch-size", "let the effective batch vary in [MIN, MAX] (the learning rate "
        "may then need rescaling)", metavar="MIN:MAX", parse=parse_batch_range)
    fixes: dict[str, Any] = option("--fix", "hold one knob at a value (repeatable)",
                                   metavar="KNOB=VALUE", repeat=True, parse=parse_assignments)
    space_file: str | None = option(
        "--space", "YAML mapping knob -> list of values to try, narrowing the space",
        metavar="FILE")
    allow_optimizer_change: bool = option(
        "--allow-optimizer-change", "also try optimizers that keep less state than AdamW "
        "(torch's Adafactor, bitsandbytes' 8-bit AdamW) to fit a larger micro-batch: another "
        "update rule, so the model learns differently; the report says so", default=False,
        switch=True)
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
        "--confirm-repeats", "paired rounds at least (each round: every confirmed "
        "configuration and the baseline once, in a shuffled order; 4x as many in warm turns, "
        "where each is kept warm in its own process; 0 skips confirmation)",
        default=DEFAULT_CONFIRM_ROUNDS, metavar="R", kind=int)
    confirm_max_rounds: int = option(
        "--confirm-max-rounds", "paired rounds at most: rounds are added until the leader's "
        "speedup is known within --confirm-target (in warm turns, time caps them instead; "
        "2 or fewer: fresh rounds, no warm processes)", default=DEFAULT_CONFIRM_MAX_ROUNDS,
        metavar="N", kind=int)
    confirm_target: float = option(
        "--confirm-target", "stop adding rounds once the leader's speedup over the baseline "
        "is known within this share (95%% interval half-width)",
        default=DEFAULT_CONFIRM_TARGET, metavar="SHARE", kind=float)
    confirm_share: float = option(
        "--confirm-share", "rounds beyond --confirm-repeats take at most this share of the "
        "study's wall time: none starts that would end past it (the least rounds always run, "
        "within a time budget)",
        default=DEFAULT_CONFIRM_SHARE,
        metavar="SHARE", kind=float)
    no_loss_check: bool = option(
        "--no-loss-check", "skip the loss check of answers that change the numerics (precision, "
        "optimizer, attention kernel, compile): short paired runs of each and of your settings "
        "from the same weights and batches, where one that learns worse is never recommended; "
        "for speed alone", default=False, switch=True)
    trial_time_limit_s: float = option("--trial-time-limit", "kill a trial after this long "
                                       "(a timeout)", default=DEFAULT_TRIAL_TIME_LIMIT_S,
                                       metavar="SECONDS", kind=float)
    startup_limit_s: float = option(
        "--startup-limit", "a training script's probe stops a script that has not started its "
        "training (Trainer.train, Trainer.fit, its loop's first optimizer step) after this "
        "long (its imports, data and model), e.g. 10m",
        default=DEFAULT_STARTUP_LIMIT_S, metavar="DURATION", parse=parse_duration)
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
        "--plain-tpe", "search every knob with plain TPE: no fast corner (nor its changes "
        "alone) first, no memory model, no DataLoader plan, no screening (for comparison; "
        "slower to the optimum)",
        default=False, switch=True)
    storage_retry_s: float = option(
        "--storage-retry-seconds", "keep retrying (with back-off) this long while the storage "
        "is unreachable, then stop with an error; finished trials stay safe",
        default=DEFAULT_STORAGE_RETRY_S, metavar="SECONDS", kind=float)
    heartbeat_s: float = option(
        "--heartbeat-interval", "how often running trials are marked alive; a trial silent "
        "for 3 intervals lost its tuner and is re-run (once) by another",
        default=DEFAULT_HEARTBEAT_S, metavar="SECONDS", kind=float)
    json: bool = option("--json", "print the final summary as one JSON object", default=False,
                        switch=True)
    settings: MeasureSettings = group(MeasureSettings)
    # The ablation of the search-efficiency benchmark: no fast corner (nor its changes alone,
    # `search/expert`), the rest unchanged.
    fast_corner_first: bool = True

    def problems(self) -> list[str]:
        out = self.settings.problems() + _at_least(self, {
            "trials": 1, "train_steps": 1, "global_batch": 1, "workers": 1, "confirm_top": 1,
            "confirm_repeats": 0, "confirm_max_rounds": 1, "max_grad_accum": 1,
            "storage_retry_s": 0})
        if self.confirm_max_rounds < self.confirm_repeats:
            out.append("--confirm-max-rounds must be >= --confirm-repeats")
        for name in ("heartbeat_s", "trial_time_limit_s", "startup_limit_s", "confirm_target"):
            if getattr(self, name) <= 0:
                out.append(f"{flag_of(TuneOptions, name)} must be > 0")
        for name in ("stall_penalty", "memory_headroom"):
            if not 0 <= getattr(self, name) < 1:
                out.append(f"{flag_of(TuneOptions, name)} must be in [0, 1)")
        if not 0 < self.confirm_share < 1:
            out.append("--confirm-share must be in (0, 1)")
        if self.budget_s is not None and self.timeout_s is not None:
            out.append("--budget and --timeout contradict each other: the first is the whole "
                       "run's time, the second the search's before the confirmation")
        if self.global_batch is not None and self.free_batch is not None:
            out.append("--global-batch-size and --free-batch-size contradict each other: the "
                       "first keeps the effective batch at one value, the second lets it vary")
        if self.global_batch and self.global_batch % self.nproc_per_node:
            out.append(f"--global-batch-size {self.global_batch} does not split evenly over "
                       f"--nproc-per-node {self.nproc_per_node} ranks")
        if self.free_batch is not None and self.nproc_per_node > 1:
            out.append("--free-batch-size is for one process; under --nproc-per-node keep the "
                       "global batch (--global-batch-size)")
        if self.devices and len(self.devices) % self.nproc_per_node:
            out.append(f"--devices names {len(self.devices)} devices, which do not make whole "
                       f"process groups of --nproc-per-node {self.nproc_per_node}")
        return out + super().problems() + self._device_problems()

    def _device_problems(self) -> list[str]:
        """One worker per device: distinct devices of one kind, and one trial per GPU."""
        if self.devices and self.device:
            return ["give either --device or --devices"]
        if self.devices and self.workers != 1:
            return ["give either --workers or --devices (one worker per device)"]
        one_per_gpu = [f"--workers {self.workers} would run {self.workers} trials on one GPU at "
                       "once: they would share its memory and compute and time each other's "
                       "work; give several GPUs with --devices cuda:0,cuda:1 (one trial each)"]
        if self.workers > 1 and (self.device or "").startswith("cuda"):
            return one_per_gpu
        try:
            devices = [parse_device(name) for name in self.devices or (self.device,)]
        except ValueError as exc:
            return [str(exc)]
        if len({d.type for d in devices}) > 1 or len(set(devices)) < len(devices):
            return [f"--devices must be distinct devices of one kind, got "
                    f"{', '.join(self.devices)}"]
        return one_per_gpu if devices[0].type == "cuda" and self.workers > 1 else []


@dataclass(kw_only=True)
class StudyOptions(StorageOptions):
    """One study of the storage, by name."""

    study: str = option("study", "the study's name (see `autotune studies`)", metavar="STUDY",
                        required=True)


@dataclass(kw_only=True)
class ShowOptions(StudyOptions):
    """`autotune show`."""

    json: bool = option("--json", "print one JSON object", default=False, switch=True)


@dataclass(kw_only=True)
class ReportOptions(StudyOptions):
    """`autotune report`."""

    output: str | None = option(("-o", "--output"), "write here (default: the study folder's "
                                "report.html)", metavar="FILE")


@dataclass(kw_only=True)
class VerifyOptions(StudyOptions):
    """`autotune verify`: the study's answer measured again against the baseline."""

    rounds: int = option("--rounds", "paired rounds of the answer and your settings (4x as "
                         "many in warm turns where memory holds both)",
                         default=DEFAULT_VERIFY_ROUNDS, metavar="N", kind=int)
    device: str | None = option("--device", "where to measure: cpu, cuda or cuda:N (default: "
                                "the study's kind of device)", metavar="DEVICE")
    time_limit_s: float = option("--time-limit", "kill a run after this long",
                                 default=DEFAULT_TRIAL_TIME_LIMIT_S, metavar="SECONDS",
                                 kind=float)
    settings: MeasureSettings = group(MeasureSettings)

    def problems(self) -> list[str]:
        return self.settings.problems() + _at_least(self, {"rounds": 2, "time_limit_s": 1})


@dataclass(kw_only=True)
class ExportOptions(StudyOptions):
    """`autotune export`."""

    format: str = option("--format", "what to write (see above)", default="yaml",
                         choices=EXPORT_FORMATS + SCRIPT_EXPORT_FORMATS)
    output: str | None = option(("-o", "--output"), "write here instead of stdout",
                                metavar="FILE")

