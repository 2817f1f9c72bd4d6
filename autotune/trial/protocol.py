"""What crosses the process boundary: what a trial process is asked and what it answers, as
plain JSON data both ways.

The tuner's side (`autotune.search.isolation`) writes a `TrialRequest` to a file, the trial's
side (`autotune.trial.child`) runs it and writes a `TrialResult` back; `TrialStatus` names how a
trial ended, in the result and in the study storage alike. The capability probe's answer is a
`ProbeReport` (its `LeftOut` values and `LoaderRate`s), which the study caches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any


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


@dataclass
class TrialRequest:
    """Everything a child needs for one job; plain JSON data. Knobs `config` leaves out come
    from the model file's BASELINE."""

    model_path: str
    config: dict[str, Any]
    device: str
    model_args: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    memory_limit_bytes: int | None = None
    trace_path: str | None = None
    threads: int | None = None
    inductor_cache_dir: str | None = None
    job: str = "measure"
    # The CPU cores this trial may use (its share when trials run in parallel), or all.
    cpus: list[int] | None = None
    # Ranks of the process group the trial runs as (torchrun's --nproc-per-node); 1: a process.
    nproc_per_node: int = 1
    # The GPUs of the group, one per rank, as the tuner names them (None: the first N it sees).
    group_devices: list[str] | None = None


def rank_result_path(result_file: Path, rank: int) -> Path:
    """Where rank `rank` of a process group writes its result."""
    return result_file.with_name(f"{result_file.name}.rank{rank}")


def rank_pid_path(result_file: Path, rank: int) -> Path:
    """Where rank `rank` writes its pid (its process group's id too): what the tuner kills."""
    return result_file.with_name(f"{result_file.name}.rank{rank}.pid")


@dataclass
class TrialResult:
    """What became of one trial. `bad_input` marks a contract or config error of the user's."""

    status: TrialStatus
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)
    log_path: str | None = None
    wall_s: float = 0.0
    bad_input: bool = False
    returncode: int | None = None
    config: dict[str, Any] | None = None  # the configuration the child ran, BASELINE applied
    phase: str = ""  # the last phase the child reported: where a timeout or a crash struck

    def __post_init__(self) -> None:
        self.status = TrialStatus(self.status)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LoaderRate:
    """Samples/sec one DataLoader setting delivers on its own, after its first batch."""

    num_workers: int
    prefetch_factor: int | None
    samples_per_sec: float

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeReport:
        return cls(**{**data, "left_out": [LeftOut(**x) for x in data["left_out"]],
                      "loader_rates": [LoaderRate(**r) for r in data["loader_rates"]]})

    def left_out_values(self) -> dict[str, dict[Any, str]]:
        """knob -> {value: reason}."""
        out: dict[str, dict[Any, str]] = {}
        for item in self.left_out:
            out.setdefault(item.knob, {})[item.value] = item.reason
        return out
