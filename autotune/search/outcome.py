"""From a trial's result to what the study records: its status, its score and its constraint.

Objective: score = samples/sec x (1 - stall_penalty x stall fraction); with `--train-steps S`
the samples/sec is over a whole run of S steps, build, compile and warm-up included
(`Measurement.time_to_train_s`). Out-of-memory (or peak memory above the capacity less the
headroom) and configurations the model or device cannot run are COMPLETE trials with score 0
and a violated constraint, so TPE learns where the wall is; a trial that crashed, raised or
timed out is FAIL.
"""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from autotune.config import TrainConfig
from autotune.errors import ContractError
from autotune.search.memory_model import MemoryVerdict
from autotune.search.shortcuts import SCREEN_FRACTION
from autotune.study.records import (
    BOOKKEEPING,
    FEASIBLE,
    INFEASIBLE,
    MEMORY_CONSTRAINT,
    TrialKey,
    TrialRecord,
)
from autotune.trial.protocol import (
    FIRST_STEP,
    Measurement,
    TrialResult,
    TrialStatus,
    UnsupportedSetting,
)


@dataclass(frozen=True)
class Scoring:
    """How a measurement becomes a status and a score in this study."""

    device_type: str
    memory_limit_bytes: int | None
    memory_headroom: float
    stall_penalty: float
    train_steps: int | None = None
    # The user's settings: a diverged trial names the knobs it changed from them.
    baseline: TrainConfig | None = None

    def classify(self, result: TrialResult) -> tuple[TrialStatus, str]:
        """The trial's status and message: a loss that became NaN or inf is `diverged`, a
        measured peak above the allowed memory `over_memory`, a run stopped after its screening
        window `screened`."""
        limit = self.memory_limit_bytes
        m = result.measurement
        if result.status != TrialStatus.OK or m is None:
            return result.status, result.message
        if not m.loss_finite:
            return TrialStatus.DIVERGED, (
                f"the loss became {m.final_loss} in the timed window, "
                f"{changed_knobs(result.config, self.baseline)}: never ranked nor recommended")
        if limit and m.peak_memory_bytes and m.peak_memory_bytes > limit:
            return TrialStatus.OVER_MEMORY, (
                f"peak memory {m.peak_memory_bytes / 2**30:.2f} GiB is above the "
                f"{limit / 2**30:.2f} GiB allowed (capacity less {self.memory_headroom:.0%} "
                "headroom)")
        if m.screened:
            return TrialStatus.SCREENED, (
                f"stopped after screening: {m.samples_per_sec:,.0f} samples/sec is below "
                f"{SCREEN_FRACTION:.0%} of the best so far")
        return result.status, result.message

    def objective_rate(self, m: Measurement) -> float:
        """Samples/sec in the timed window, or over a whole run of --train-steps steps."""
        if not self.train_steps:
            return float(m.samples_per_sec)
        per_step = m.window_samples / m.window_steps
        return self.train_steps * per_step / m.time_to_train_s(self.train_steps)

    def score(self, m: Measurement) -> float:
        return self.objective_rate(m) * (1 - self.stall_penalty * stall_fraction(
            m, self.device_type))


def changed_knobs(config: TrainConfig | None, baseline: TrainConfig | None) -> str:
    """The knob values of `config` that differ from the baseline's, in words."""
    values = config.to_dict() if config else {}
    if baseline is None:
        return "with " + ", ".join(f"{k}={v}" for k, v in values.items())
    base = baseline.to_dict()
    changed = [f"{k}={v}" for k, v in values.items() if base[k] != v]
    return "with " + ", ".join(changed) if changed else "with your own settings (the baseline's)"


def stall_fraction(m: Measurement, device_type: str) -> float:
    """The step's own stalls plus the loader's waits in the timed window: device idle on CUDA,
    host syncs (per step time) on CPU. The profiler window that measures the first runs on
    prefetched micro-batches, so the loader's waits are counted once."""
    loader = m.data_wait_fraction or 0.0
    if device_type == "cuda" and m.device_idle_fraction is not None:
        return min(1.0, m.device_idle_fraction + loader)
    step = m.step_time_median_s or 0.0
    sync = m.host_sync_s_per_step or 0.0
    return min(1.0, (sync / step if step else 0.0) + loader)


def record_measurement(study: optuna.Study, trial: Trial, result: TrialResult,
                       scoring: Scoring) -> None:
    """The measurement and how the trial ran as user attributes, then the state, score and
    constraint. A result that says the user's input is bad raises ContractError after it is
    recorded."""
    if result.measurement is not None:
        trial.set_user_attr(TrialKey.MEASUREMENT, result.measurement.to_json())
    if result.unsupported is not None:
        _record_unsupported_setting(trial, result.unsupported)
    trial.set_user_attr(TrialKey.LOG_PATH, result.log_path)
    trial.set_user_attr(TrialKey.WALL_S, result.wall_s)
    status, message = scoring.classify(result)
    if status == TrialStatus.TIMEOUT and compile_ran_out_of_time(trial, result):
        status = TrialStatus.COMPILE_TIMEOUT
        message += ("; it was compiling, which the compile cache makes faster the next time: "
                    "it runs once more")
    trial.set_user_attr(TrialKey.STATUS, str(status))
    trial.set_user_attr(TrialKey.MESSAGE, message)
    if status in INFEASIBLE:
        tell_complete(study, trial, 0.0, feasible=False)
    elif status in FEASIBLE and result.measurement is not None:
        m = result.measurement
        if scoring.train_steps:
            trial.set_user_attr(TrialKey.TIME_TO_TRAIN, m.time_to_train_s(scoring.train_steps))
        trial.set_user_attr(TrialKey.STALL, stall_fraction(m, scoring.device_type))
        tell_complete(study, trial, scoring.score(m), feasible=True)
    else:
        study.tell(trial, state=TrialState.FAIL)
        if result.bad_input:
            raise ContractError(result.message)


def compile_ran_out_of_time(trial: Trial, result: TrialResult) -> bool:
    """A compiled configuration killed at its limit in its first step, and not yet retried."""
    stored = trial.user_attrs.get(TrialKey.CONFIG)
    compiled = stored is not None and TrainConfig.from_dict(stored).compile_mode != "none"
    # a script's first step is named after its loop: "first step (...) of the script's ..."
    first_step = (result.phase or "").startswith(FIRST_STEP)
    return compiled and first_step and not trial.user_attrs.get(TrialKey.RETRY)


def tell_complete(study: optuna.Study, trial: Trial, score: float, feasible: bool) -> None:
    """A COMPLETE trial: its score, and the constraint TPE learns the memory wall from."""
    constraint = 0.0 if feasible else 1.0
    trial.set_user_attr(TrialKey.CONSTRAINT, constraint)
    trial.set_user_attr(TrialKey.SCORE, score)
    trial.set_constraint(MEMORY_CONSTRAINT, constraint)
    study.tell(trial, score)


def record_repeat(study: optuna.Study, trial: Trial, previous: FrozenTrial) -> None:
    """A configuration measured before: its outcome copied, its bookkeeping not."""
    for name, value in previous.user_attrs.items():
        if name not in BOOKKEEPING:
            trial.set_user_attr(name, value)
    trial.set_user_attr(TrialKey.DUPLICATE_OF, previous.number)
    trial.set_constraint(MEMORY_CONSTRAINT, previous.user_attrs[TrialKey.CONSTRAINT])
    study.tell(trial, previous.value)


def record_skipped(study: optuna.Study, trial: Trial, previous: FrozenTrial) -> None:
    """A configuration that crashed, raised or timed out before is not run again."""
    trial.set_user_attr(TrialKey.STATUS, str(TrialStatus.SKIPPED))
    trial.set_user_attr(TrialKey.MESSAGE, f"failed before as trial {previous.number}: "
                                          f"{previous.user_attrs.get(TrialKey.MESSAGE, '')}")
    study.tell(trial, state=TrialState.FAIL)


def record_predicted_oom(study: optuna.Study, trial: Trial, verdict: MemoryVerdict) -> None:
    """Not run: the memory model says it cannot fit."""
    trial.set_user_attr(TrialKey.STATUS, str(TrialStatus.OOM_PREDICTED))
    trial.set_user_attr(TrialKey.MESSAGE, f"not run: {verdict.message}")
    if verdict.predicted_peak_bytes:
        trial.set_user_attr(TrialKey.PREDICTED_PEAK, verdict.predicted_peak_bytes)
    tell_complete(study, trial, 0.0, feasible=False)


def record_unsupported(study: optuna.Study, trial: Trial, known: TrialRecord) -> None:
    """Not run: an earlier trial found one of its settings (or a pair of them) unsupported on
    this model."""
    setting = known.unsupported
    trial.set_user_attr(TrialKey.STATUS, str(TrialStatus.UNSUPPORTED))
    trial.set_user_attr(TrialKey.MESSAGE, f"not run: {setting.describe()} is unsupported on "
                                          f"this model (trial {known.number}: {known.message})")
    _record_unsupported_setting(trial, setting)
    tell_complete(study, trial, 0.0, feasible=False)


def _record_unsupported_setting(trial: Trial, setting: UnsupportedSetting) -> None:
    trial.set_user_attr(TrialKey.UNSUPPORTED_KNOB, setting.knob)
    trial.set_user_attr(TrialKey.UNSUPPORTED_VALUE, setting.value)
    if setting.together:
        trial.set_user_attr(TrialKey.UNSUPPORTED_TOGETHER, setting.together)


def record_interrupted(study: optuna.Study, trial: Trial) -> None:
    trial.set_user_attr(TrialKey.STATUS, str(TrialStatus.INTERRUPTED))
    trial.set_user_attr(TrialKey.MESSAGE, "interrupted (Ctrl-C or SIGTERM); re-queued")
    study.tell(trial, state=TrialState.FAIL)
