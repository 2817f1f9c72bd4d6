"""What crosses a boundary, as typed records with their JSON: the process boundary between the
tuner and a trial, and the storage's between the run that wrote a study and whoever reads it.

The tuner's side (`autotune.search.isolation`) writes a `TrialRequest` (what it runs: a
`target.Target`; and its job's own settings, whose type names the job: `MeasureSettings`,
`ProbeSettings`, `ProfileSettings`, `WorstBatchSettings` or `LossRunSettings`) to a file, the
trial's side (`autotune.trial.child`) runs it and writes a `TrialResult` back; `TrialStatus`
names how a trial ended, in the result and in the study storage alike. A result carries what its
job answered: a `Measurement` (with its `Finding`s, `OperatorStat`s and `WorkKind` shares), the
capability probe's `ProbeReport` (its `LeftOut` values, `LoaderRate`s and `SampleSizes`, which the
study caches), a `ProfileReport`, a `WorstBatch` (a configuration's peak on a micro-batch of the
dataset's largest samples) or a `LossRun` (its loss after N steps from fixed weights and
batches). The study stores its `StudyIdentity` and each trial's `Measurement`. Each record is
turned back into its type the moment it is read (`from_json`), never read by string key. A warm
turn's shape for a configuration with DataLoader workers (`prefetched_steps`,
`loader_round_steps`, `loader_turn_steps`) is here too: the warm process times it and the tuner
prices it. Nothing here imports torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.target import Target, target_from_identity, target_from_json

# The shape of a warm turn of a configuration with DataLoader workers, which the warm process
# times (`trial.window`) and the tuner prices (`search.warm.turn_price_s`). A window that waited
# on its loader this share of its time or more is the loader's rate: its turn goes on to
# `loader_turn_steps`, within `LOADER_TURN_SLACK` x the turn's seconds.
LOADER_BOUND_SHARE = 0.1
LOADER_TURN_SLACK = 4.0
# A warm turn that waits on its loader's workers spans this many batches of each of them.
LOADER_TURN_ROUNDS = 16


def prefetched_steps(config: TrainConfig) -> int:
    """The untimed steps that open a warm turn of a configuration with loader workers: as
    many as the batches its workers prefetched while the other processes took their turns
    (`num_workers` x `prefetch_factor`), so the timed window starts from the queue it keeps
    while training, not from one filled while idle, which made a loader-bound turn look fast
    by as much as it held; and one more, which waits for a batch a worker makes anew where
    those steps took the queue faster than the workers refill it."""
    if not config.num_workers:
        return 0
    queued = config.num_workers * (config.prefetch_factor or 2)
    return math.ceil(queued / config.grad_accum_steps) + 1


def loader_round_steps(config: TrainConfig) -> int:
    """The optimizer steps of a whole round of the loader's workers (each makes the next batch
    in turn, so a batch and the one a round later come from the same worker, one of its
    batches apart): the least steps of whole rounds of micro-batches. A turn that waits on its
    workers and ends mid-round reads the round's batches made so far, which depends on where
    each worker was in its batch (a toy loader, 2 s turns capped mid-round: 0.89 of the
    workers' rate; ended on whole rounds: 0.985-0.988). 1 without workers."""
    if not config.num_workers:
        return 1
    return math.lcm(config.num_workers, config.grad_accum_steps) // config.grad_accum_steps


def loader_turn_steps(config: TrainConfig) -> int:
    """The optimizer steps of `LOADER_TURN_ROUNDS` rounds of the loader's workers, in whole
    rounds (`loader_round_steps`): how long a turn that waits on them lasts. Where a turn spans
    only a few of a worker's batches, how far along each one was when it began moves the
    figure (storage_images, 8 workers: cv 8.5-11% in 0.5 s turns, 3-4 batches a worker;
    2.0-2.8% in 2 s, the baseline's 1.3-2.0%). 0 without workers."""
    if not config.num_workers:
        return 0
    whole = loader_round_steps(config)
    batches = whole * config.grad_accum_steps
    return whole * math.ceil(LOADER_TURN_ROUNDS * config.num_workers / batches)


class TrialStatus(str, Enum):
    """How a trial ended."""

    OK = "ok"                         # measured in full
    SCREENED = "screened"             # stopped after its short screening window: too slow
    OOM = "oom"                       # ran out of memory
    OVER_MEMORY = "over_memory"       # measured, but its peak is above the memory allowed
    OOM_PREDICTED = "oom_predicted"   # not run: the memory model says it cannot fit
    UNSUPPORTED = "unsupported"       # the model or device cannot run this configuration
    ERROR = "error"                   # the user's code raised
    CRASH = "crash"                   # the process died (a signal, or no result)
    TIMEOUT = "timeout"               # killed at its time limit
    COMPILE_TIMEOUT = "compile_timeout"  # killed at its limit while compiling: run once more
    ORPHANED = "orphaned"             # its tuner died while it ran
    INTERRUPTED = "interrupted"       # Ctrl-C
    SKIPPED = "skipped"               # not run: the same configuration failed before
    DIVERGED = "diverged"             # measured, but its loss became NaN or inf

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__
    __hash__ = str.__hash__


# The phase a trial reports while its first step runs: a timeout here in a compiled
# configuration is the compile, which the compile cache makes faster the next time.
FIRST_STEP = "first step (compile and loader start-up included)"
# The phase of a script trial until its training starts (Trainer.train or Trainer.fit, or its
# own loop's first step): a timeout here is a script that never started training.
SCRIPT_STARTUP = "the script's own start-up, until its training starts"


@dataclass(frozen=True)
class ProbeSettings:
    """The capability probe's job: the values the search offers on this device, which the
    probe tries (`trial/probe`), knob by knob, and how long it times each DataLoader setting
    (after its first batches): a second, or the measurement's own shorter window
    (`for_window`), since a loader's rate is a window's figure like any other. A training
    script whose training has not started after `startup_limit_s` is stopped there, and says
    what it did."""

    candidates: dict[str, tuple[Any, ...]]
    loader_seconds: float = 1.0
    startup_limit_s: float | None = None

    @classmethod
    def for_window(cls, candidates: Mapping[str, Sequence[Any]], window_seconds: float,
                   startup_limit_s: float | None = None) -> ProbeSettings:
        """The probe's settings for a study whose timed windows last `window_seconds`."""
        return cls(dict(candidates), loader_seconds=min(cls.loader_seconds, window_seconds),
                   startup_limit_s=startup_limit_s)

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates",
                           {knob: tuple(values) for knob, values in self.candidates.items()})


@dataclass(frozen=True)
class ProfileSettings:
    """`autotune profile`'s job: the folder its files go to, the optimizer steps it profiles,
    the rows of its operator tables, and how long it waits for steady steps first."""

    out: str
    steps: int
    top: int
    warmup_max_seconds: float


@dataclass(frozen=True)
class WorstBatchSettings:
    """The worst batch's job (`trial/worst_batch`): the samples every micro-batch is made of
    (the dataset's largest, by index among its `total`), and how long it trains: at least
    `steps` optimizer steps, then until `steady` steps in a row raise the peak by under 1%, at
    most `max_steps`."""

    indices: tuple[int, ...]
    total: int
    steps: int
    steady: int
    max_steps: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "indices", tuple(int(i) for i in self.indices))


@dataclass(frozen=True)
class LossRunSettings:
    """A loss run's job (`trial/loss_run`): the seed of its initial weights and batches, and its
    optimizer steps."""

    seed: int
    steps: int


# What a request's settings are: a measurement's (`options.MeasureSettings`, the measure job's
# own), the probe's, the profile's, a worst batch's or a loss run's. Their type names the job the
# child runs (`child.JOBS`).
JobSettings = (MeasureSettings | ProbeSettings | ProfileSettings | WorstBatchSettings
               | LossRunSettings)
JOB_SETTINGS: dict[str, type[JobSettings]] = {
    "measure": MeasureSettings, "probe": ProbeSettings, "profile": ProfileSettings,
    "worst_batch": WorstBatchSettings, "loss_run": LossRunSettings}


def job_of(settings: JobSettings) -> str:
    """The job `settings` are for (`child.JOBS`): their type names it."""
    return next(job for job, kind in JOB_SETTINGS.items() if type(settings) is kind)


def _job_settings_from_json(job: str, data: Mapping[str, Any]) -> JobSettings:
    """The settings of a `job` request from their plain data; a job or a field this autotune
    does not know is refused (ValueError), never passed on unread."""
    kind = JOB_SETTINGS.get(job)
    if kind is None:
        raise ValueError(f"a request for the job {job!r}; this autotune runs "
                         f"{', '.join(JOB_SETTINGS)}")
    known = [f.name for f in fields(kind)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"the {job} job's settings have no {', '.join(unknown)} "
                         f"(they are {', '.join(known)})")
    return kind(**data)


@dataclass
class TrialRequest:
    """Everything a child needs for one job; plain JSON data but its `target` and `settings`,
    whose type names the job. Knobs `config` leaves out come from the model file's BASELINE (a
    script's own settings)."""

    target: Target
    config: dict[str, Any]
    device: str
    settings: JobSettings = field(default_factory=MeasureSettings)
    memory_limit_bytes: int | None = None
    trace_path: str | None = None
    threads: int | None = None
    inductor_cache_dir: str | None = None
    # The CPU cores this trial may use (its share when trials run in parallel), or all.
    cpus: list[int] | None = None
    # Ranks of the process group the trial runs as (torchrun's --nproc-per-node); 1: a process.
    nproc_per_node: int = 1
    # The GPUs of the group, one per rank, as the tuner names them (None: the first N it sees).
    group_devices: list[str] | None = None
    # Where a script's run works (its current directory, its library's outputs): a folder the
    # tuner made and removes however the trial ends, so nothing is left in the temp directory.
    scratch_dir: str | None = None
    # A script's own settings as its probe read them (`ProbeReport.script_baseline`: where each
    # is said), which every later run of it is told; None for a model file, or before its probe.
    script_baseline: dict[str, Any] | None = None

    @property
    def job(self) -> str:
        """What the child runs (`child.JOBS`): the job whose settings these are."""
        return job_of(self.settings)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the request file (or the warm process's): its target tagged, its
        settings under the job they are for."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)},
                "target": self.target.to_json(), "job": self.job,
                "settings": asdict(self.settings)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialRequest:
        """From `to_json`'s data: the target and the job's settings typed as they are read."""
        given = {name: value for name, value in data.items() if name != "job"}
        return cls(**{**given, "target": target_from_json(data["target"]),
                      "settings": _job_settings_from_json(data["job"], data["settings"])})


def rank_result_path(result_file: Path, rank: int) -> Path:
    """Where rank `rank` of a process group writes its result."""
    return result_file.with_name(f"{result_file.name}.rank{rank}")


def rank_pid_path(result_file: Path, rank: int) -> Path:
    """Where rank `rank` writes its pid (its process group's id too): what the tuner kills."""
    return result_file.with_name(f"{result_file.name}.rank{rank}.pid")


# How a flag is written on a command line: `--flag VALUE`, `--flag=VALUE`, a switch present or
# absent (store_true/store_false), or `--flag`/`--no-flag` (BooleanOptionalAction).
VALUE, EQUALS, SWITCH, NEGATABLE = "value", "equals", "switch", "negatable"


def flag_words(flag: str, value: Any, form: str = VALUE, const: Any = None) -> list[str]:
    """The words that set `flag` to `value` on a command line written as `form` (a switch is
    present where `value` is its `const`, absent otherwise)."""
    if form == SWITCH:
        return [flag] if value == const else []
    if form == NEGATABLE:
        return [flag] if value else [f"--no-{flag.removeprefix('--')}"]
    return [f"{flag}={value}"] if form == EQUALS else [flag, str(value)]


def without_flag(argv: Sequence[str], flag: str, form: str,
                 aliases: Sequence[str] = ()) -> list[str]:
    """A script's arguments less `flag` and its other spellings (`aliases`: `-b` for
    `--batch-size`), each with its value where it takes one (`-b 32`, `-b32`,
    `--batch-size=32`), and its `--no-` form: what is left to add it anew."""
    names = (flag, *aliases)
    spelt = {*names, *(f"--no-{n.removeprefix('--')}" for n in names if n.startswith("--"))}
    takes_value = form in (VALUE, EQUALS)
    short = tuple(n for n in names if len(n) == 2 and n[0] == "-" and n[1] != "-")
    out: list[str] = []
    skip = False
    for word in argv:
        if skip:
            skip = False
            if not word.startswith("-"):
                continue
        if word in spelt:
            skip = takes_value
            continue
        if word.startswith(tuple(f"{n}=" for n in names)) or \
                (takes_value and word.startswith(short) and len(word) > 2):
            continue
        out.append(word)
    return out


@dataclass(frozen=True)
class ScriptFlag:
    """A command-line flag of a script (or of the launcher it runs under) set to a value."""

    flag: str
    value: Any
    form: str = VALUE
    const: Any = None
    aliases: tuple[str, ...] = ()  # its other spellings (`-b`), taken out of a command line

    def __post_init__(self) -> None:
        object.__setattr__(self, "aliases", tuple(self.aliases))

    def words(self) -> list[str]:
        return flag_words(self.flag, self.value, self.form, self.const)


@dataclass(frozen=True)
class CodeChange:
    """A line of a script's code to change: the keyword arguments of the call there (`call`,
    `values`), or a line to add (`text`); `file` and `line` where the code was found."""

    file: str | None
    line: int | None
    call: str | None = None
    values: dict[str, Any] = field(default_factory=dict)
    text: str | None = None

    def describe(self) -> str:
        """`train.py:71: DataLoader(..., num_workers=4)`, or `train.py:52: <text>`."""
        where = f"{self.file}:{self.line}: " if self.file and self.line else ""
        if self.text is not None:
            return where + self.text
        arguments = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"{where}{self.call}(..., {arguments})" if where else \
            f"{self.call}({arguments})"


@dataclass(frozen=True)
class ScriptAnswer:
    """A configuration in a training script's own terms: what it changes from its own settings
    (`changes`: where it is said, TrainingArguments, Trainer, a DataModule's attribute, an
    Accelerator, a DataLoader, a torch line, to its fields and values), and how its
    TrainingArguments are given (`parsed_by`: an HfArgumentParser method, so the flags on its
    command line; None: in code) and of which class (`arguments_class`: a subclass, such as
    Seq2SeqTrainingArguments, is named as the script names it).

    Where each change is said, as the user applies it (`routed`; a study from before has none,
    its changes are keyword arguments): the script's own flags (`script_flags`, its parser's
    values traced to the calls that use them), the launcher's (`launcher_flags`, under
    `launcher`: accelerate launch's), or the lines of its code (`code`)."""

    library: str
    changes: dict[str, dict[str, Any]]
    parsed_by: str | None = None
    arguments_class: str = "TrainingArguments"
    routed: bool = False
    script_flags: tuple[ScriptFlag, ...] = ()
    launcher: str | None = None
    launcher_flags: tuple[ScriptFlag, ...] = ()
    code: tuple[CodeChange, ...] = ()
    # What messages call a script of its library, and `autotune export`'s format in that
    # library's terms (None: none), as its `Library` says (a study from before: unknown).
    trained_with: str = ""
    export_format: str | None = None

    @property
    def on_command_line(self) -> bool:
        return self.parsed_by == "parse_args_into_dataclasses"

    def flags(self) -> list[str]:
        """The script's own command-line flags to add: HfArgumentParser's spelling where the
        script parses its TrainingArguments from its command line, else its own flags that
        the answer sets."""
        if not self.on_command_line:
            return [word for flag in self.script_flags for word in flag.words()]
        out = []
        for name, value in self.changes.get("TrainingArguments", {}).items():
            if value is True:
                out.append(f"--{name}")
            else:  # HfArgumentParser reads a mapping as JSON, everything else as its text
                out += [f"--{name}", json.dumps(value) if isinstance(value, dict) else str(value)]
        return out

    def launcher_words(self) -> list[str]:
        """The launcher with its flags (`accelerate launch --mixed_precision bf16`), or none."""
        if not self.launcher_flags or self.launcher is None:
            return []
        return [self.launcher, *(w for flag in self.launcher_flags for w in flag.words())]

    def keyword_lines(self) -> list[str]:
        """`Where(name=value, ...)`, one line per place in the code that changes; a place
        that is an assignment, `target = call`, wraps its target:
        `model.forward = torch.compile(model.forward, mode=None)`."""
        named = {"TrainingArguments": self.arguments_class}
        lines = []
        for where, values in self.changes.items():
            arguments = [f"{k}={v!r}" for k, v in values.items()]
            target, assigned, _ = where.partition(" = ")
            lines.append(f"{where}({', '.join([target, *arguments])})" if assigned else
                         f"{named.get(where, where)}({', '.join(arguments)})")
        return lines

    def code_lines(self) -> list[str]:
        """The lines of the code to change or add, each as the user finds it."""
        if not self.routed:
            return [] if self.on_command_line else self.keyword_lines()
        return [change.describe() for change in self.code]

    def lines(self) -> list[str]:
        """The answer as the user applies it: the flags to add to the script's command line,
        the launcher's, then the lines of its code to change."""
        if not self.changes:
            return []
        out = [" ".join(words) for words in (self.flags(), self.launcher_words()) if words]
        return out + self.code_lines()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScriptAnswer:
        return cls(library=data["library"], changes={k: dict(v) for k, v in
                                                     data["changes"].items()},
                   parsed_by=data.get("parsed_by"),
                   arguments_class=data.get("arguments_class", "TrainingArguments"),
                   routed=data.get("routed", False),
                   script_flags=tuple(ScriptFlag(**f) for f in data.get("script_flags", ())),
                   launcher=data.get("launcher"),
                   launcher_flags=tuple(ScriptFlag(**f)
                                        for f in data.get("launcher_flags", ())),
                   code=tuple(CodeChange(**c) for c in data.get("code", ())),
                   trained_with=data.get("trained_with", ""),
                   export_format=data.get("export_format"))


class WorkKind(str, Enum):
    """The kind of work a profiled operator does (`trial/work_kinds` tells them apart by name):
    an MFU short of the roofline is read by where the rest of the step goes."""

    MATMUL = "matmul"
    ATTENTION = "attention"
    OPTIMIZER = "optimizer"
    COPY = "copy"
    COMMUNICATION = "communication"
    GRAPH = "graph"  # a compiled graph's own kernels, where the profile does not name them
    ELEMENTWISE = "elementwise"

    @property
    def words(self) -> str:
        return _WORK_WORDS[self]


_WORK_WORDS = {WorkKind.MATMUL: "matmuls and convolutions", WorkKind.ATTENTION: "attention",
               WorkKind.OPTIMIZER: "the optimizer's kernels", WorkKind.COPY: "copies",
               WorkKind.COMMUNICATION: "collectives",
               WorkKind.GRAPH: "compiled graphs' kernels (not named apart)",
               WorkKind.ELEMENTWISE: "elementwise, norms and the rest"}


@dataclass(frozen=True)
class OperatorStat:
    """One operator's share of a profiled window."""

    name: str
    calls: int
    self_time_s: float
    total_time_s: float
    share: float


@dataclass(frozen=True)
class Finding:
    """One problem: what it costs, what to do, and the user's lines it comes from."""

    kind: str
    share: float
    title: str
    advice: str
    where: tuple[str, ...]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Finding:
        return cls(**{**data, "where": tuple(data["where"])})


# Bumped when a field of `Measurement` changes meaning or goes; a field added is read as its
# default from records written before it.
MEASUREMENT_VERSION = 1
PHASE_TIMES_VERSION = 1


@dataclass(frozen=True)
class PhaseTimes:
    """Where a measurement's wall time went, phase by phase, in seconds: what a run that does
    only some of them (a confirmation run: no re-measures, no profiler) is priced from."""

    build_s: float = 0.0          # model, dataset and loader built (FLOPs counted on CUDA)
    first_step_s: float = 0.0     # the first optimizer step: compile and loader start-up
    warmup_s: float = 0.0         # steps until steady
    screen_s: float = 0.0         # the short screening window
    window_s: float = 0.0         # the first timed window
    remeasure_s: float = 0.0      # disturbed windows measured again: waits, untimed steps
    sync_tracing_s: float = 0.0   # the step traced for the lines that read tensors back
    profile_s: float = 0.0        # the profiler window, its micro-batches fetched before it

    @property
    def total_s(self) -> float:
        return sum(getattr(self, f.name) for f in fields(self))

    def to_json(self) -> dict[str, Any]:
        return {"version": PHASE_TIMES_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PhaseTimes:
        """From `to_json`'s data; phases it lacks take 0."""
        version = data.get("version", PHASE_TIMES_VERSION)
        if version > PHASE_TIMES_VERSION:
            raise ValueError(f"phase times of format {version}, newer than this autotune's "
                             f"{PHASE_TIMES_VERSION}: upgrade autotune to read them")
        known = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in data.items() if k in known})


@dataclass(frozen=True)
class Measurement:
    """Every figure of one measured configuration; None where it cannot be measured here."""

    samples_per_sec: float
    window_s: float = 0.0
    window_steps: int = 0
    window_samples: int = 0
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    step_time_cv: float | None = None
    time_to_first_step_s: float | None = None
    setup_s: float = 0.0
    warmup_steps: int = 0
    steady: bool = False
    peak_memory_bytes: int | None = None
    data_wait_fraction: float | None = None
    host_syncs_per_step: float | None = None
    host_sync_s_per_step: float | None = None
    device_idle_fraction: float | None = None
    # Share of a profiled step (its batches fetched ahead) in the optimizer's step.
    optimizer_fraction: float | None = None
    # MFU (CUDA only): model FLOPs a sample ("given" by the model file or "counted": a model
    # file's model, a script's own step; else "not counted: why") times samples/sec over the
    # precision's peak FLOP/s, which says where it came from.
    flops_per_sample: float | None = None
    flops_source: str | None = None
    peak_flops: float | None = None
    peak_flops_source: str | None = None
    mfu: float | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    device_memory_used_bytes: int | None = None
    final_loss: float | None = None
    # Every step's loss in the timed window was finite (checked on the device, read once).
    loss_finite: bool = True
    top_operators: tuple[OperatorStat, ...] = ()
    # The profiled window's operator time (on CUDA: its kernels') by kind of work, the largest
    # first, and the kernels a step launched (CUDA only).
    work_shares: dict[WorkKind, float] | None = None
    kernels_per_step: float | None = None
    findings: tuple[Finding, ...] = ()
    trace_path: str | None = None
    warmup_s: float = 0.0
    screen_samples_per_sec: float | None = None
    screen_done_s: float | None = None  # from the start of the build to the screen's end
    screened: bool = False
    # torch.compile's work (`compile_events`): in the whole measurement, and inside the windows
    # (screening and timed), where each one distorts the figure.
    graphs_compiled: int | None = None
    graphs_compiled_in_window: int | None = None
    cudagraph_recordings: int | None = None
    cudagraph_recordings_in_window: int | None = None
    device_total_memory_bytes: int | None = None  # as the trial sees it (a MIG slice's own)
    step_time_precision: float | None = None  # the median step time known within ±this
    cpu_threads: int | None = None            # intra-op threads the trial ran
    cpu_affinity: tuple[int, ...] = ()        # CPUs it was allowed to run on
    other_cpu_share: float | None = None      # other processes' share of the trial's CPUs
    disturbed: bool = False                   # the kept window was still above the threshold
    windows_remeasured: int = 0               # windows timed again: contention, a compile
    # The least share other processes took of any window the trial timed (its warm-up and
    # screening included): the load there all along; and whether every window saw one (the
    # machine's state).
    machine_load: float | None = None
    steady_load: bool = False
    device_other_processes: int | None = None
    device_slowdowns: tuple[str, ...] = ()
    # A process group's trial: samples_per_sec is the group's (every rank's samples over the
    # slowest rank's window), peak_memory_bytes the largest rank's; each rank's own below.
    world_size: int = 1
    rank_samples_per_sec: tuple[float, ...] = ()
    rank_peak_memory_bytes: tuple[int | None, ...] = ()
    communication_fraction: float | None = None  # of the profiled steps (rank 0's)
    straggler_rank: int | None = None  # a rank more than 10% slower than the fastest
    measure_wall_s: float | None = None  # the measurement's own wall time in the trial
    # A script trial's configuration in the script's own terms (None: a model file's trial).
    script_answer: ScriptAnswer | None = None
    phases: PhaseTimes | None = None  # None in a study written before phases were recorded

    def time_to_train_s(self, steps: int) -> float:
        """Wall time of `steps` optimizer steps from a fresh start, as a real run would spend
        it: the build, the first step (compile included), the warm-up steps as measured, then
        the rest at the timed window's pace (data loading included)."""
        start = self.setup_s + (self.time_to_first_step_s or 0.0)
        if steps <= 1 + self.warmup_steps:
            return start + self.warmup_s * max(0, steps - 1) / max(1, self.warmup_steps)
        steady = self.window_s / self.window_steps
        return start + self.warmup_s + (steps - 1 - self.warmup_steps) * steady

    def to_json(self) -> dict[str, Any]:
        """Plain data with its format's version."""
        return {"version": MEASUREMENT_VERSION, **asdict(self),
                "phases": self.phases.to_json() if self.phases else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Measurement:
        """From `to_json`'s data, or from a study written before measurements had a version
        (its figures were a trial's attributes among others): keys that are not figures are
        ignored, figures it lacks take their defaults."""
        version = data.get("version", MEASUREMENT_VERSION)
        if version > MEASUREMENT_VERSION:
            raise ValueError(f"a measurement of format {version}, newer than this autotune's "
                             f"{MEASUREMENT_VERSION}: upgrade autotune to read it")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for name in _TUPLES:
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        values["top_operators"] = tuple(OperatorStat(**op)
                                        for op in data.get("top_operators") or ())
        values["findings"] = tuple(Finding.from_json(f) for f in data.get("findings") or ())
        if values.get("work_shares") is not None:
            values["work_shares"] = {WorkKind(k): v for k, v in values["work_shares"].items()}
        if values.get("script_answer") is not None:
            values["script_answer"] = ScriptAnswer.from_json(values["script_answer"])
        phases = data.get("phases")
        values["phases"] = PhaseTimes.from_json(phases) if phases else None
        return cls(**values)


_TUPLES = ("cpu_affinity", "device_slowdowns", "rank_samples_per_sec", "rank_peak_memory_bytes")


@dataclass(frozen=True)
class ProfileReport:
    """What `autotune profile` found for one configuration."""

    config: TrainConfig
    device: str
    steps: int
    samples_per_sec: float
    window_s: float
    self_cpu_total_s: float
    self_device_total_s: float | None
    host_syncs_per_step: float
    device_idle_fraction: float | None
    data_wait_fraction: float
    tables: dict[str, tuple[OperatorStat, ...]]
    findings: tuple[Finding, ...]
    memory_timeline: tuple[list[float], dict[str, list[int]]]
    files: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        """Plain data: what profile.json holds, and the memory timeline with it."""
        return {**asdict(self), "config": self.config.to_dict()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProfileReport:
        times, series = data["memory_timeline"]
        return cls(**{**data, "config": TrainConfig.from_dict(data["config"]),
                      "memory_timeline": (times, series),
                      "tables": {kind: tuple(OperatorStat(**stat) for stat in stats)
                                 for kind, stats in data["tables"].items()},
                      "findings": tuple(Finding.from_json(f) for f in data["findings"])})


@dataclass(frozen=True)
class UnsupportedSetting:
    """The setting a trial found it cannot run, so that no later trial tries it again; with
    `together`, only alongside those other settings (a value pair)."""

    knob: str
    value: Any
    together: dict[str, Any] = field(default_factory=dict)

    def matches(self, config: TrainConfig) -> bool:
        """`config` has the setting (and every setting it cannot run together with)."""
        return all(getattr(config, knob) == value
                   for knob, value in {**self.together, self.knob: self.value}.items())

    def describe(self) -> str:
        return " with ".join(f"{k}={v}" for k, v in {self.knob: self.value,
                                                        **self.together}.items())


@dataclass(frozen=True)
class SampleSizes:
    """How large the dataset's samples are, each by the bytes of the tensors its collate
    function makes of it alone (a padding collate pads it to its own length): every sample
    (`how` is `SCANNED`, where reading them all is cheap) or a random sample of them
    (`SAMPLED`), the largest first (`largest`: their indices, `largest_bytes`: their sizes),
    and the median and smallest seen. The worst batch a run can meet is its micro-batch of the
    largest."""

    how: str
    seen: int
    total: int
    largest: tuple[int, ...]
    largest_bytes: tuple[int, ...]
    median_bytes: int
    smallest_bytes: int
    seconds: float = 0.0

    @property
    def uniform(self) -> bool:
        """Every sample seen is the same size: any batch is the worst."""
        return not self.largest_bytes or self.largest_bytes[0] == self.smallest_bytes

    def worst_indices(self, samples: int) -> list[int]:
        """The `samples` largest samples' indices, the largest repeated where fewer are known
        (a padding collate pads every one to the longest anyway)."""
        known = list(self.largest[:samples])
        return known + [known[0]] * (samples - len(known))

    def describe(self) -> str:
        """How the largest samples were found, in words."""
        if self.how == SCANNED:
            found = f"a scan of all {self.total:,} samples"
        else:
            found = f"a random sample of {self.seen:,} of the {self.total:,} samples"
        if self.uniform:
            return f"every sample is the same size ({found})"
        ratio = self.largest_bytes[0] / max(1, self.median_bytes)
        return f"the largest sample is {ratio:,.1f}x the median ({found})"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SampleSizes:
        return cls(**{**data, "largest": tuple(data["largest"]),
                      "largest_bytes": tuple(data["largest_bytes"])})


# How `SampleSizes` were found: every sample read, or a bounded random sample of them.
SCANNED = "scan"
SAMPLED = "sample"


@dataclass(frozen=True)
class WorstBatch:
    """A configuration trained a few steps on a micro-batch of the dataset's largest samples
    (`samples` of them): the process's peak memory then (on CPU its peak RSS, build included,
    as a trial's), and whether its loss stayed finite."""

    samples: int
    peak_memory_bytes: int
    steps: int
    loss_finite: bool = True
    seconds: float = 0.0


@dataclass(frozen=True)
class LossRun:
    """One short training run from fixed weights (`seed`) on fixed batches: `steps`
    optimizer steps, the loss on a held set of samples (the same for every run) before and
    after them, and the mean training loss of the last steps; `finite` is False where any
    loss went NaN or inf."""

    seed: int
    steps: int
    initial_loss: float
    final_loss: float
    train_loss: float
    finite: bool = True
    seconds: float = 0.0

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LossRun:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


# Bumped when a field of `TrialResult` changes meaning or goes.
RESULT_VERSION = 1


@dataclass(frozen=True)
class TrialResult:
    """What became of one trial: how it ended and what its job answered (a measurement, the
    probe's report, a profile, a worst batch's peak or a loss run). `bad_input` marks a
    contract or config error of the user's."""

    status: TrialStatus
    message: str = ""
    measurement: Measurement | None = None
    probe: ProbeReport | None = None
    profile: ProfileReport | None = None
    worst_batch: WorstBatch | None = None
    loss_run: LossRun | None = None
    unsupported: UnsupportedSetting | None = None
    log_path: str | None = None
    wall_s: float = 0.0
    bad_input: bool = False
    returncode: int | None = None
    config: TrainConfig | None = None  # the configuration the child ran, BASELINE applied
    phase: str = ""  # the last phase the child reported: where a timeout or a crash struck
    rank: int = 0  # of a process group's rank: which, and when it ended
    ended_at: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", TrialStatus(self.status))

    def to_json(self) -> dict[str, Any]:
        """Plain data for the result file, with its format's version."""
        return {"version": RESULT_VERSION, "status": self.status.value,
                "message": self.message,
                "measurement": self.measurement.to_json() if self.measurement else None,
                "probe": self.probe.to_dict() if self.probe else None,
                "profile": self.profile.to_json() if self.profile else None,
                "worst_batch": asdict(self.worst_batch) if self.worst_batch else None,
                "loss_run": asdict(self.loss_run) if self.loss_run else None,
                "unsupported": asdict(self.unsupported) if self.unsupported else None,
                "log_path": self.log_path, "wall_s": self.wall_s, "bad_input": self.bad_input,
                "returncode": self.returncode,
                "config": self.config.to_dict() if self.config else None,
                "phase": self.phase, "rank": self.rank, "ended_at": self.ended_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialResult:
        if data.get("version") != RESULT_VERSION:
            raise ValueError(f"a trial result of format {data.get('version')}; this autotune "
                             f"reads {RESULT_VERSION} (the trial ran another version)")

        def read(key: str, parse: Any) -> Any:
            return parse(data[key]) if data.get(key) is not None else None

        return cls(status=TrialStatus(data["status"]), message=data["message"],
                   measurement=read("measurement", Measurement.from_json),
                   probe=read("probe", ProbeReport.from_dict),
                   profile=read("profile", ProfileReport.from_json),
                   worst_batch=read("worst_batch", lambda w: WorstBatch(**w)),
                   loss_run=read("loss_run", LossRun.from_json),
                   unsupported=read("unsupported", lambda u: UnsupportedSetting(**u)),
                   log_path=data["log_path"], wall_s=data["wall_s"],
                   bad_input=data["bad_input"], returncode=data["returncode"],
                   config=read("config", TrainConfig.from_dict), phase=data["phase"],
                   rank=data["rank"], ended_at=data["ended_at"])


@dataclass(frozen=True)
class WarmTurn:
    """One turn of a warm process (`autotune.trial.warm`): N optimizer steps timed with data
    loading included, the process's peak memory so far, whether another process took a
    share of the cores during it (`load`: that share, where measured), and its MFU (where a
    trial's would have one: CUDA)."""

    samples: int
    seconds: float
    peak_memory_bytes: int | None = None
    disturbed: bool = False
    loss_finite: bool = True
    load: float | None = None
    mfu: float | None = None

    @property
    def samples_per_sec(self) -> float:
        return self.samples / self.seconds

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WarmTurn:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


# In-process loading on the CPU less than this share of its wall time waits rather than
# computes (`LoaderRate.waits`): a sleeping read is on it a few percent of the time, and a
# computing loader on a machine whose other processes take half its cores still about half.
LOADER_WAITS_BELOW = 0.25


@dataclass(frozen=True)
class LoaderRate:
    """Samples/sec one DataLoader setting delivers on its own, after its first batch; for
    loading in the training process, the share of its wall time the process spent on the CPU
    (`cpu_share`): far below 1, the loader waits (on storage, a network) rather than computes."""

    num_workers: int
    prefetch_factor: int | None
    samples_per_sec: float
    cpu_share: float | None = None

    @property
    def waits(self) -> bool:
        """In-process loading that waits rather than computes."""
        return self.cpu_share is not None and self.cpu_share < LOADER_WAITS_BELOW

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LeftOut:
    """A knob value the search will not propose on this model and machine, and why."""

    knob: str
    value: Any
    reason: str

    def describe(self) -> str:
        return f"{self.knob}={self.value}: {self.reason}"


@dataclass
class ProbeReport:
    """The workload's facts and what works here (plain JSON data, cached in the study)."""

    baseline: dict[str, Any]
    dataset_size: int
    state_bytes: int
    parameters: int
    left_out: list[LeftOut] = field(default_factory=list)
    loader_rates: list[LoaderRate] = field(default_factory=list)
    step_s: dict[str, float] = field(default_factory=dict)
    convolutional: bool = False  # the model has 2-D or 3-D convolutions (memory formats)
    attention: bool = False  # it calls scaled_dot_product_attention (attention kernels)
    # A training script's library modules, which its trials' fork server imports ahead
    # (`trial/script/preload`), and the variables it changed in os.environ before its
    # training (imports after the first change are its own).
    script_imports: list[str] = field(default_factory=list)
    script_environment_changed: list[str] = field(default_factory=list)
    # The optimizer steps of the script's own run at its own settings, where its library says.
    script_run_steps: int | None = None
    # The samples' sizes, the largest first (None: not measured, as for a training script).
    sizes: SampleSizes | None = None
    # The script's own settings as its trials need them (`trial/script/session.ScriptBaseline`:
    # where each is said, so a trial sets the script's own flags as the answer would), and the
    # knobs the search keeps at the script's value, with why (a hand-written loop's micro-batch
    # and accumulation, which only its own flags can change).
    script_baseline: dict[str, Any] | None = None
    kept: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeReport:
        sizes = data.get("sizes")
        return cls(**{**data, "left_out": [LeftOut(**x) for x in data["left_out"]],
                      "loader_rates": [LoaderRate(**r) for r in data["loader_rates"]],
                      "sizes": SampleSizes.from_json(sizes) if sizes else None})

    def timed_workers(self) -> list[int]:
        """The DataLoader worker counts the probe timed (beyond the cores for a loader that
        waits): the search's `num_workers` values."""
        return sorted({r.num_workers for r in self.loader_rates})

    def left_out_values(self) -> dict[str, dict[Any, str]]:
        """knob -> {value: reason}."""
        out: dict[str, dict[Any, str]] = {}
        for item in self.left_out:
            out.setdefault(item.knob, {})[item.value] = item.reason
        return out


@dataclass(frozen=True)
class StudyIdentity:
    """What a study measures and where: one model file with its arguments (or one training
    script with its arguments and the flags named for its knobs), one kind of device, the ranks
    of each trial. A study is never resumed for another."""

    target: Target
    device_type: str
    nproc_per_node: int = 1

    def to_json(self) -> dict[str, Any]:
        """Plain data, as studies have always stored it: the target's fields
        (`Target.identity_fields`), the device type, the ranks only where a trial has
        several."""
        data: dict[str, Any] = {**self.target.identity_fields(), "device_type": self.device_type}
        if self.nproc_per_node > 1:
            data["nproc_per_node"] = self.nproc_per_node
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StudyIdentity:
        return cls(target=target_from_identity(data), device_type=data["device_type"],
                   nproc_per_node=data.get("nproc_per_node", 1))

    def describe(self) -> str:
        return f"{self.target.describe()} on {self.device_type}"
