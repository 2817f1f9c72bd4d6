"""What a trial is in the study: its status, the names of what it stores, and one typed record
of it, built in one place from an Optuna trial, that every reader of a study uses.

A trial's measurement (`Measurement.to_json()`) and bookkeeping are Optuna user attributes; the
names below are the only spelling of those keys, and `TrialRecord.of` the only reader of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import TrainConfig
from autotune.trial.protocol import Measurement, TrialStatus, UnsupportedSetting

S = TrialStatus
# Measured and within memory: the trials the search ranks.
FEASIBLE = frozenset({S.OK, S.SCREENED})
# COMPLETE with a violated constraint, so TPE learns where the wall is.
# A diverged configuration is one too: it must never be proposed again, let alone recommended.
INFEASIBLE = frozenset({S.OOM, S.OVER_MEMORY, S.OOM_PREDICTED, S.UNSUPPORTED, S.DIVERGED})
# Peak memory was measured (a run that fitted, or one over the limit).
MEASURED_PEAK = frozenset({S.OK, S.OVER_MEMORY, S.SCREENED})
RAN_OUT = frozenset({S.OOM, S.OVER_MEMORY})
# Outcomes that send the fast corner down to the next smaller micro-batch.
TOO_BIG = RAN_OUT | {S.OOM_PREDICTED}
# Failures that would happen again with the same configuration: not retried. A compile that
# ran out of time is not one of them: the compile cache keeps what it finished, so the second
# try (`worker` queues it at once) gets further; if that one runs out of time too, it is a
# plain TIMEOUT.
DETERMINISTIC = frozenset({S.ERROR, S.CRASH, S.TIMEOUT})
RAN_A_PROCESS = FEASIBLE | RAN_OUT | DETERMINISTIC | {S.UNSUPPORTED, S.COMPILE_TIMEOUT,
                                                      S.DIVERGED}
# What `--trials` counts: trials that ran a process to its end, failed ones included; one
# that found its configuration unsupported measured nothing and is free.
COUNTS_AGAINST_BUDGET = RAN_A_PROCESS - {S.UNSUPPORTED}
FINISHED = (TrialState.COMPLETE, TrialState.FAIL)


class Role:
    """Why a trial was run."""

    BASELINE = "baseline"        # the model file's BASELINE, always first
    BOTTLENECK = "bottleneck"    # a fix of the dominant share of the step (`search/expert`)
    FAST_CORNER = "fast-corner"  # the configuration an expert tries first
    ONE_CHANGE = "one-change"    # one of the fast corner's changes alone (`search/expert`)
    TAKEN_BACK = "taken-back"    # a winning fast corner with one of its changes undone
    WINNERS = "winners"          # the changes that won alone (or kept), together
    COMPILED_BEST = "compiled-best"  # the best so far, compiled: the move the corner leaves out
    SEARCH = "search"            # proposed by the sampler


class TrialKey:
    """Names of a trial's user attributes."""

    CONFIG = "config"
    MEASUREMENT = "measurement"  # its `Measurement.to_json()`
    ROLE = "role"
    STATUS = "status"
    MESSAGE = "message"
    SCORE = "score"
    CONSTRAINT = "constraint"
    DUPLICATE_OF = "duplicate_of"
    PREDICTED_PEAK = "predicted_peak_bytes"
    LOADER_PLAN = "loader_plan"
    STALL = "stall_fraction"
    TIME_TO_TRAIN = "time_to_train_s"
    LOG_PATH = "log_path"
    WALL_S = "wall_s"
    OWNER = "owner"
    HEARTBEAT = "heartbeat"
    HEARTBEAT_S = "heartbeat_s"
    REQUEUED_FROM = "requeued_from"
    RETRY = "retry"
    UNSUPPORTED_KNOB = "unsupported_knob"    # the setting a trial found it cannot run
    UNSUPPORTED_VALUE = "unsupported_value"
    UNSUPPORTED_TOGETHER = "unsupported_together"  # the settings it cannot run alongside
    CHANGED = "changed"          # the knobs an expert's trial changes from the baseline


# About a trial rather than its configuration's outcome: a repeat does not copy them (a repeat
# of a re-run is not itself a re-run).
BOOKKEEPING = frozenset({TrialKey.CONFIG, TrialKey.ROLE, TrialKey.OWNER, TrialKey.HEARTBEAT,
                         TrialKey.HEARTBEAT_S, TrialKey.REQUEUED_FROM, TrialKey.RETRY,
                         TrialKey.LOADER_PLAN, TrialKey.CHANGED})


class StudyKey:
    """Names of the study's user attributes."""

    IDENTITY = "identity"                  # its target (file, arguments), device type
    DEVICE_NAME = "device_name"            # the machine the study was made on
    DEVICE_NAMES = "device_names"          # every machine that has run it, in order
    BASELINE_CONFIG = "baseline_config"
    CREATED_AT = "created_at"
    SPACE = "space"
    FREE_BATCH = "free_batch"
    MEMORY = "memory"                      # capacity, allowed limit, headroom
    OBJECTIVE = "objective"                # train_steps, plain_tpe
    LOADER_RATES = "loader_rates"          # the DataLoader plan's rates, when it is on
    PROBE = "probe"                        # the capability probe's report and fingerprint
    TUNING_WALL_S = "tuning_wall_s"
    CONFIRMATION = "confirmation"
    CONFIRMATION_CLAIM = "confirmation_claim"
    VERIFICATIONS = "verifications"        # `autotune verify`'s checks of the answer, in order
    LOSS_RUNS = "loss_runs"                # the checks' loss runs made, kept for a resumed run
    # The default budget, grown its most, could not hold an answer with an interval: what it
    # kept, what an answer needs, the --timeout that would answer it (None: it could).
    SHORT_BUDGET = "short_budget"


# Optuna's constraint name (> 0 = violated): fits in memory and runs on this model and device.
MEMORY_CONSTRAINT = "fits"


def study_machines(user_attrs: dict[str, Any]) -> list[str]:
    """Every machine that has run a study, in order (a study from before the list: its first)."""
    first = user_attrs.get(StudyKey.DEVICE_NAME)
    return user_attrs.get(StudyKey.DEVICE_NAMES) or ([first] if first else [])


def config_key(config: TrainConfig) -> str:
    """One string per configuration, for finding repeats."""
    return json.dumps(config.to_dict(), sort_keys=True)


@dataclass(frozen=True)
class TrialRecord:
    """One trial as every reader of a study sees it (`TrialRecord.of`), typed: its
    configuration, its `Measurement` when it measured one, and its bookkeeping."""

    number: int
    status: TrialStatus | None  # how it ended; None while it waits or runs
    state: str = "COMPLETE"
    config: TrainConfig | None = None
    role: str = Role.SEARCH
    message: str = ""
    value: float | None = None
    constraint: float | None = None
    measurement: Measurement | None = None
    predicted_peak_bytes: float | None = None
    duplicate_of: int | None = None
    retry: int = 0
    requeued_from: int | None = None
    owner: str = ""
    start: float | None = None
    end: float | None = None
    wall_s: float | None = None
    log_path: str | None = None
    time_to_train_s: float | None = None
    unsupported: UnsupportedSetting | None = None
    changed: tuple[str, ...] = ()  # the knobs an expert's trial changes (`search/expert`)

    @classmethod
    def of(cls, trial: FrozenTrial) -> TrialRecord:
        a = trial.user_attrs
        status = a.get(TrialKey.STATUS)
        config = a.get(TrialKey.CONFIG)
        knob = a.get(TrialKey.UNSUPPORTED_KNOB)
        return cls(
            number=trial.number, status=TrialStatus(status) if status else None,
            state=trial.state.name,
            config=TrainConfig.from_dict(config) if config else None,
            role=a.get(TrialKey.ROLE, Role.SEARCH), message=a.get(TrialKey.MESSAGE, ""),
            value=trial.value if trial.state == TrialState.COMPLETE else None,
            constraint=a.get(TrialKey.CONSTRAINT), measurement=stored_measurement(a),
            predicted_peak_bytes=a.get(TrialKey.PREDICTED_PEAK),
            duplicate_of=a.get(TrialKey.DUPLICATE_OF), retry=a.get(TrialKey.RETRY, 0),
            requeued_from=a.get(TrialKey.REQUEUED_FROM), owner=a.get(TrialKey.OWNER, ""),
            start=trial.datetime_start.timestamp() if trial.datetime_start else None,
            end=trial.datetime_complete.timestamp() if trial.datetime_complete else None,
            wall_s=a.get(TrialKey.WALL_S), log_path=a.get(TrialKey.LOG_PATH),
            time_to_train_s=a.get(TrialKey.TIME_TO_TRAIN),
            unsupported=UnsupportedSetting(knob, a.get(TrialKey.UNSUPPORTED_VALUE),
                                           a.get(TrialKey.UNSUPPORTED_TOGETHER, {}))
            if knob is not None else None,
            changed=tuple(a.get(TrialKey.CHANGED, ())))

    @property
    def label(self) -> str:
        """Its status, or while it has none `running`, or `queued` (WAITING: it runs when a
        run of the study asks for it, not before)."""
        if self.status is not None:
            return self.status.value
        return "queued" if self.state == TrialState.WAITING.name else self.state.lower()

    @property
    def samples_per_sec(self) -> float | None:
        return self.measurement.samples_per_sec if self.measurement else None

    @property
    def peak_memory_bytes(self) -> float | None:
        return self.measurement.peak_memory_bytes if self.measurement else None

    @property
    def disturbed(self) -> bool:
        """Timed while other processes used its CPUs (or its GPU)."""
        return bool(self.measurement and self.measurement.disturbed)

    @property
    def duplicate(self) -> bool:
        """A repeat of an earlier trial's configuration, its outcome copied, not measured."""
        return self.duplicate_of is not None

    @property
    def feasible(self) -> bool:
        return self.state == TrialState.COMPLETE.name and self.constraint == 0.0

    @property
    def score(self) -> float | None:
        """The objective, for trials that fitted."""
        return self.value if self.feasible else None

    @property
    def finished(self) -> bool:
        return self.state in (TrialState.COMPLETE.name, TrialState.FAIL.name)

    @property
    def under_way(self) -> bool:
        return self.state in (TrialState.WAITING.name, TrialState.RUNNING.name)


def stored_measurement(attrs: Mapping[str, Any]) -> Measurement | None:
    """A trial's measurement from its attributes: the versioned record, or, in a study written
    before it had one, the figures stored as attributes of their own."""
    if TrialKey.MEASUREMENT in attrs:
        return Measurement.from_json(attrs[TrialKey.MEASUREMENT])
    if "samples_per_sec" in attrs:
        return Measurement.from_json(attrs)
    return None


def trial_records(study: optuna.Study) -> list[TrialRecord]:
    """Every trial of the study, in trial order."""
    return [TrialRecord.of(t) for t in study.get_trials(deepcopy=False)]


def rankable(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """The trials a ranking may compare: those that fitted and were measured on a quiet
    machine, or, when other processes disturbed every one of them, all that fitted. A disturbed
    rate is never ranked above a clean one."""
    fitted = [r for r in records if r.score is not None]
    return [r for r in fitted if not r.disturbed] or fitted


def fresh_records(study: optuna.Study) -> list[TrialRecord]:
    """Finished trials that were measured or decided on, not repeats of earlier ones."""
    return [r for r in trial_records(study) if r.state == TrialState.COMPLETE.name
            and not r.duplicate]
