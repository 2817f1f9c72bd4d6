"""A study's answer as every reader gets it (`show`, the report, `--json`, best.json's sibling
summary.md): one typed record, built from the storage alone by `results.study_summary`.

`to_json()` is what `--json` prints; the keys about the confirmation appear only once one ran,
`process_group` for trials of several ranks, `verifications` once `autotune verify` has run, and
`files` only when the run wrote them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autotune.config import TrainConfig, numerics_changes
from autotune.study.bottleneck import Diagnosis
from autotune.study.checks import CheckSummary, LossCheck, WorstBatchCheck, answer_lines
from autotune.study.confirmation import FRESH_ROUNDS, TakenBack
from autotune.study.verification import Verification
from autotune.target import ModelFile, Script, Target
from autotune.trial.protocol import LeftOut, LoaderRate, PhaseTimes, ScriptAnswer


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
class CompileRow:
    """One compiled trial against its uncompiled reference: the report's compile table."""

    label: str
    trial: int
    config: str
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
class TrialTimes:
    """Where one measured trial's wall time went: the process's start (imports, the model
    file loaded) and the measurement's phases, so that a price can be checked against them."""

    trial: int
    wall_s: float | None
    process_start_s: float | None
    phases: PhaseTimes


@dataclass(frozen=True)
class RuledOut:
    """A configuration the confirmation's checks ruled out before it raced: its status
    (`study.checks`: `learns_worse` or `worst_batch_fails`), why, and the checks' figures."""

    config: TrainConfig
    status: str
    why: str
    worst_batch: WorstBatchCheck | None = None
    loss_check: LossCheck | None = None


@dataclass(frozen=True)
class ConfirmedFigures:
    """What only the confirmation's paired rounds tell."""

    best_runs: tuple[float, ...]
    baseline_spread: float | None
    speedup_ci: tuple[float, float] | None
    no_measurable_difference: bool | None
    confirmation_repeats: int
    best_search_samples_per_sec: float | None
    fastest_config: TrainConfig | None
    fastest_speedup: float | None
    fastest_speedup_ci: tuple[float, float] | None
    best_time_to_train_s: float | None
    baseline_time_to_train_s: float | None
    confirmation_measured: str = FRESH_ROUNDS  # or WARM_TURNS (`study.confirmation`)
    # Each change of the race's recommendation taken back, and that recommendation where the
    # answer drops some of its changes (`study.confirmation.TakenBack`).
    taken_back: tuple[TakenBack, ...] = ()
    taken_from_config: TrainConfig | None = None
    # What the checks found of the answer beyond its speed (`study.checks`): its worst batch,
    # its loss against the user's settings' (None: not checked, or nothing to check), how they
    # were made, and what they ruled out.
    worst_batch: WorstBatchCheck | None = None
    loss_check: LossCheck | None = None
    checks: CheckSummary | None = None
    ruled_out: tuple[RuledOut, ...] = ()


@dataclass(frozen=True)
class StudySummary:
    """Everything `show` prints: the recommendation beside the baseline, how the study went,
    and what a reader must not miss (`warnings`)."""

    study: str
    target: Target | None  # None: a study whose first run has not recorded it
    device: str | None
    devices: tuple[str, ...]
    nproc_per_node: int  # ranks of each trial's process group (1: a process of its own)
    best_config: TrainConfig | None
    best_samples_per_sec: float | None
    best_spread: float | None
    best_trial: int | None
    # the larger of its rounds' peaks and, where it was checked, its worst batch's
    best_peak_memory_bytes: float | None
    best_mfu: float | None
    baseline_config: TrainConfig | None
    # The knobs that apply to this study (searched, or changed), in `TrainConfig`'s order.
    knobs: tuple[str, ...]
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
    # Trials queued for the next run of the same command (interrupted, or left when the
    # budget ended): no run's pending work.
    queued_trials: tuple[int, ...]
    disturbed_trials: tuple[int, ...]
    best_disturbed: bool
    compile_payoff: CompilePayoff | None
    confirmation: ConfirmedFigures | None = None
    process_group: ProcessGroupFigures | None = None  # of the best trial's search run
    verifications: tuple[Verification, ...] = ()
    trial_times: tuple[TrialTimes, ...] = ()  # of the measured trials that recorded phases
    probe_s: float | None = None  # the capability probe's wall time, once per study
    # The kind of device the trials ran on ("cuda", "cpu"; None: a study from before its
    # identity), and what the best's MFU divided by what (on CUDA: `formatting.mfu_basis`).
    device_type: str | None = None
    best_mfu_basis: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    # A script's study: the answer in its own terms (None: a model file's study, or no
    # measured trial of the answer says it).
    script_answer: ScriptAnswer | None = None
    # Where the step's time goes (`study/bottleneck`): the baseline's, and the answer's where
    # a trial of it was profiled.
    diagnosis: Diagnosis | None = None
    answer_diagnosis: Diagnosis | None = None
    # The answer's peak on a micro-batch of the dataset's largest samples, and the memory it
    # leaves there of the --memory-limit (or the device's) (None: not checked).
    best_worst_batch_peak_bytes: float | None = None
    best_worst_batch_headroom_bytes: float | None = None

    def script_lines(self) -> list[str]:
        """The answer as the script's user applies it: the flags to add to its command line,
        or the keyword arguments to change in its code; none for a model file's study."""
        if self.script_answer is None:
            return []
        return self.script_answer.lines() or ["keep the script's own settings: nothing to "
                                              "change"]

    @property
    def confirmed(self) -> bool:
        return self.confirmation is not None

    def check_lines(self) -> list[str]:
        """What the confirmation checked of the answer beyond its speed, a line each (its
        worst batch, its loss), for the exported files; none where nothing was checked."""
        c = self.confirmation
        if c is None or c.checks is None or self.best_config is None:
            return []
        numerics = self.baseline_config is not None and \
            bool(numerics_changes(self.best_config, self.baseline_config))
        return answer_lines(c.worst_batch, c.loss_check, c.checks, numerics)

    @property
    def difference_unknown(self) -> bool:
        """Confirmed, with a faster candidate than the one kept, but too few paired rounds to
        tell them apart."""
        c = self.confirmation
        return bool(c and c.no_measurable_difference is None and c.fastest_config
                    and c.fastest_config != self.best_config)

    def to_json(self) -> dict[str, Any]:
        """Plain data, the keys `autotune show --json` has always printed (the target as
        `model`, `model_args` and, for a script, `script_args`)."""
        data = _target_json(self.target)
        data |= {f.name: _plain(getattr(self, f.name)) for f in fields(self)
                 if f.name not in ("target", "confirmation", "process_group", "verifications",
                                   "files", "script_answer", "diagnosis", "answer_diagnosis")}
        for name in ("diagnosis", "answer_diagnosis"):
            diagnosis = getattr(self, name)
            data[name] = diagnosis.to_json() if diagnosis is not None else None
        data["confirmed"] = self.confirmed
        if self.confirmation is not None:
            data.update(_plain(self.confirmation))
        if self.process_group is not None:
            data["process_group"] = _plain(self.process_group)
        if self.verifications:
            data["verifications"] = [v.to_json() for v in self.verifications]
        if self.files:
            data["files"] = dict(self.files)
        match self.target:
            case Script():
                data["script_answer"] = _plain(self.script_answer)
                data["answer_in_script_terms"] = self.script_lines()
                data["script_flags"] = self.script_answer.flags() if self.script_answer else []
        return data


def _target_json(target: Target | None) -> dict[str, Any]:
    """The target as `show --json` has always printed it: the file as `model` with its
    `model_args` (a script's none), and a script's own arguments."""
    match target:
        case ModelFile(path, args):
            return {"model": path, "model_args": dict(args)}
        case Script(path, args):
            return {"model": path, "model_args": {}, "script_args": list(args)}
    return {"model": None, "model_args": None}


def _plain(value: Any) -> Any:
    """JSON-ready: dataclasses as dicts, tuples as lists."""
    if hasattr(value, "__dataclass_fields__"):
        return _plain(asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
