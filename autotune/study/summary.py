"""A study's answer as every reader gets it (`show`, the report, `--json`, best.json's sibling
summary.md): one typed record, built from the storage alone by `results.study_summary`.

`to_json()` is what `--json` prints; the keys about the confirmation appear only once one ran,
`process_group` for trials of several ranks, `verifications` once `autotune verify` has run, and
`files` only when the run wrote them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autotune.study.verification import Verification
from autotune.trial.protocol import LeftOut, LoaderRate


@dataclass(frozen=True)
class BaselineTrial:
    """How the baseline's own search trial ended."""

    number: int
    status: str
    message: str


@dataclass(frozen=True)
class MemoryPredictions:
    """How far the memory model's predictions were from the peaks the trials then measured."""

    checked: int
    median_abs_error: float
    max_abs_error: float
    median_error: float


@dataclass(frozen=True)
class CompilePayoff:
    """What compiling cost at start-up, what it gained per step, and when it paid for itself."""

    trial: int
    reference: str
    compile_s: float
    gain: float
    break_even_steps: float | None


@dataclass(frozen=True)
class ProcessGroupFigures:
    """How the best trial's ranks went, when trials are process groups: each rank's own rate and
    peak memory, the share of the step with a collective in flight, and the rank that held
    the others back (more than 10% slower at its own work), if one did."""

    world_size: int
    rank_samples_per_sec: tuple[float, ...]
    rank_peak_memory_bytes: tuple[int | None, ...]
    communication_fraction: float | None
    straggler_rank: int | None


@dataclass(frozen=True)
class ConfirmedFigures:
    """What only the confirmation's paired rounds tell."""

    best_runs: tuple[float, ...]
    baseline_spread: float | None
    speedup_ci: tuple[float, float] | None
    no_measurable_difference: bool | None
    confirmation_repeats: int
    best_search_samples_per_sec: float | None
    fastest_config: dict[str, Any] | None
    fastest_speedup: float | None
    fastest_speedup_ci: tuple[float, float] | None
    best_time_to_train_s: float | None
    baseline_time_to_train_s: float | None


@dataclass(frozen=True)
class StudySummary:
    """Everything `show` prints: the recommendation beside the baseline, how the study went,
    and what a reader must not miss (`warnings`)."""

    study: str
    model: str | None
    model_args: dict[str, Any] | None
    device: str | None
    devices: tuple[str, ...]
    nproc_per_node: int  # ranks of each trial's process group (1: a process of its own)
    best_config: dict[str, Any] | None
    best_samples_per_sec: float | None
    best_spread: float | None
    best_trial: int | None
    best_peak_memory_bytes: float | None
    best_mfu: float | None
    baseline_config: dict[str, Any] | None
    baseline_samples_per_sec: float | None
    speedup: float | None
    # The answer in one sentence (`verdict`): what to change and by how much, or why not.
    verdict: str
    trials: dict[str, int]
    statuses: dict[str, int]
    oom_trials: int
    retried_trials: int
    tuning_wall_s: float | None
    free_batch: bool
    train_steps: int | None
    memory_predictions: MemoryPredictions | None
    loader_rates: tuple[LoaderRate, ...] | None
    baseline_trial: BaselineTrial | None
    left_out: tuple[LeftOut, ...]
    convolutional: bool  # the model has 2-D or 3-D convolutions (the probe's finding)
    warnings: tuple[str, ...]
    disturbed_trials: tuple[int, ...]
    best_disturbed: bool
    compile_payoff: CompilePayoff | None
    confirmation: ConfirmedFigures | None = None
    process_group: ProcessGroupFigures | None = None  # of the best trial's search run
    verifications: tuple[Verification, ...] = ()
    files: dict[str, str] = field(default_factory=dict)

    @property
    def confirmed(self) -> bool:
        return self.confirmation is not None

    @property
    def difference_unknown(self) -> bool:
        """Confirmed, with a faster candidate than the one kept, but too few paired rounds to
        tell them apart."""
        c = self.confirmation
        return bool(c and c.no_measurable_difference is None and c.fastest_config
                    and c.fastest_config != self.best_config)

    def to_json(self) -> dict[str, Any]:
        """Plain data, the keys `autotune show --json` has always printed."""
        data = {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                if f.name not in ("confirmation", "process_group", "verifications", "files")}
        data["confirmed"] = self.confirmed
        if self.confirmation is not None:
            data.update(_plain(self.confirmation))
        if self.process_group is not None:
            data["process_group"] = _plain(self.process_group)
        if self.verifications:
            data["verifications"] = [v.to_json() for v in self.verifications]
        if self.files:
            data["files"] = dict(self.files)
        return data


def _plain(value: Any) -> Any:
    """JSON-ready: dataclasses as dicts, tuples as lists."""
    if hasattr(value, "__dataclass_fields__"):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
