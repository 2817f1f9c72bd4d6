"""What the confirmation checked of each configuration it may recommend, beyond its speed, as the
study stores it and readers get it: that it fits its worst batch (`WorstBatchCheck`), and that
it learns as the user's settings do (`LossCheck`); and, for the whole confirmation, how they
were made or why they were not (`CheckSummary`).

A study measures a few hundred steps; the user trains for days. A micro-batch whose random
windows fit can run out of memory on the batch of the longest samples hours in, and a change of
the numerics (bf16, another optimizer, compile) can step faster and learn worse without ever
going NaN. `autotune.search.checks` runs both checks and rules out what fails them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

import optuna

from autotune.config import TrainConfig
from autotune.formatting import format_bytes
from autotune.study.records import StudyKey, config_key
from autotune.trial.protocol import LossRun

# How a configuration's worst batch went (`WorstBatchCheck.outcome`).
FITS = "fits"                  # its peak within the memory allowed
OVER = "over memory"           # it ran, its peak above the memory allowed
OOM = "out of memory"          # it ran out of memory
FAILED = "failed"              # it raised or crashed (`why`)
WORST_OUTCOMES = (FITS, OVER, OOM, FAILED)
# The status of a configuration a check ruled out (`ruled_out_status`).
LEARNS_WORSE = "learns_worse"
WORST_BATCH_FAILS = "worst_batch_fails"
# Why a check was not made where the time budget's end left no room for its run; how a note
# starts where none was needed.
NO_TIME = "no time was left for it"
NOT_NEEDED = "not needed"


def largest_samples(samples: int) -> str:
    """A worst batch in words: "the 8 largest samples", "the largest sample"."""
    return f"the {samples} largest samples" if samples != 1 else "the largest sample"


@dataclass(frozen=True)
class WorstBatchCheck:
    """A configuration trained a few steps on a micro-batch of the dataset's `samples`
    largest samples: its peak memory (a trial's kind of peak), against the memory a trial is
    allowed (`limit_bytes`: the capacity less the headroom), and what is left of the
    `capacity_bytes` (the `--memory-limit`, or the device's memory) at that peak."""

    samples: int
    outcome: str
    peak_memory_bytes: float | None = None
    limit_bytes: float | None = None
    capacity_bytes: float | None = None
    why: str = ""

    @property
    def fits(self) -> bool:
        return self.outcome == FITS

    @property
    def headroom_bytes(self) -> float | None:
        """The capacity left at the worst batch's peak."""
        if self.peak_memory_bytes is None or not self.capacity_bytes:
            return None
        return self.capacity_bytes - self.peak_memory_bytes

    def batch(self) -> str:
        return largest_samples(self.samples)

    def describe(self, owner: str = "its") -> str:
        """In words, of `owner`'s worst batch: "its worst batch (the 8 largest samples) peaks
        at 494.00 MiB, 206.00 MiB (29%) below the 700.00 MiB memory"."""
        subject = f"{owner} worst batch ({self.batch()})"
        if self.outcome == OOM:
            return f"{subject} runs out of memory"
        if self.outcome == FAILED:
            return f"{subject} fails: {self.why}"
        peak = format_bytes(self.peak_memory_bytes)
        if self.outcome == OVER:
            return (f"{subject} peaks at {peak}, above the {format_bytes(self.limit_bytes)} a "
                    "trial may use")
        headroom = self.headroom_bytes
        if headroom is None:
            return f"{subject} peaks at {peak}"
        return (f"{subject} peaks at {peak}, {format_bytes(headroom)} "
                f"({headroom / self.capacity_bytes:.0%}) below the "
                f"{format_bytes(self.capacity_bytes)} memory")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorstBatchCheck:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class LossCheck:
    """A configuration that changes the numerics (`changes`, in words) against the user's
    settings: each trained `steps` optimizer steps from the same weights on the same batches,
    and the loss then on the same samples (`loss`, `baseline_loss`; None where it went NaN or
    inf). Worse (`worse`) where it is above the user's by more than `tolerance` (relative: the
    larger of their own seed-to-seed `spread` and a floor; None: their second seed was not
    run, a loss inside the floor needing none), or where its run did not train to its end
    (`failed`: how it ended)."""

    changes: str
    steps: int
    loss: float | None
    baseline_loss: float
    spread: float | None
    tolerance: float
    worse: bool
    failed: str = ""

    @property
    def delta(self) -> float | None:
        """The loss above the user's settings', relative to theirs (negative: below)."""
        if self.loss is None:
            return None
        return (self.loss - self.baseline_loss) / (abs(self.baseline_loss) or 1.0)

    def describe(self, owner: str = "its") -> str:
        """In words, of `owner`'s loss: "its loss after 300 steps is within 0.4% of your
        settings', inside their seed-to-seed spread of 0.9%"."""
        delta = self.delta
        after = f"{owner} loss after {self.steps:,} steps"
        if self.failed:
            return f"{owner} loss run did not train {self.steps:,} steps: it {self.failed}"
        if delta is None:
            return f"{owner} loss went NaN or inf within {self.steps:,} steps"
        beside = f"{abs(delta):.1%} {'above' if delta > 0 else 'below'} your settings'"
        floor = f"the {self.tolerance:.0%} floor"
        if self.spread is None:
            bound = f"{floor} (their seed-to-seed spread not measured)" if self.worse else floor
        elif self.worse:
            bound = f"their seed-to-seed spread of {self.spread:.1%}" + \
                (f" and {floor}" if self.tolerance > self.spread else "")
        else:
            bound = f"their seed-to-seed spread of {self.spread:.1%}" \
                if self.spread >= self.tolerance else \
                f"{floor} (their seed-to-seed spread is {self.spread:.1%})"
        if self.worse:
            return f"{after} is {beside}, beyond {bound}"
        if delta <= 0:
            return f"{after} is {beside}, inside {bound}"
        return f"{after} is within {delta:.1%} of your settings', inside {bound}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LossCheck:
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class CheckSummary:
    """How the confirmation's checks were made: the samples' sizes as the probe found them (in
    words), the user's settings' loss after `loss_steps` for each seed run (the second, for
    their spread, only where a loss was beyond the floor), and for each check why it was not
    made, where it was not (empty: made)."""

    sizes: str = ""
    worst_batch_note: str = ""
    loss_note: str = ""
    loss_steps: int | None = None
    baseline_losses: tuple[float, ...] = ()

    def worst_batch_missing(self) -> str:
        """Why a configuration has no worst-batch check: the note, else the time."""
        return self.worst_batch_note or NO_TIME

    def loss_missing(self) -> str:
        """Why a configuration that changes the numerics has no loss check."""
        return self.loss_note or NO_TIME

    @property
    def spread(self) -> float | None:
        """The user's settings' seed-to-seed spread of the loss, relative."""
        if len(self.baseline_losses) < 2:
            return None
        first, second = self.baseline_losses[:2]
        return abs(second - first) / (abs(first) or 1.0)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "baseline_losses": list(self.baseline_losses)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckSummary:
        return cls(**{**{f.name: data[f.name] for f in fields(cls) if f.name in data},
                      "baseline_losses": tuple(data.get("baseline_losses") or ())})


def answer_lines(worst: WorstBatchCheck | None, loss: LossCheck | None,
                 checks: CheckSummary, numerics: bool, owner: str = "its") -> list[str]:
    """What the checks found of one answer, a clause each: its worst batch (or why it was not
    checked, where a check was needed), its loss (or why not, where it changes the numerics:
    `numerics`)."""
    lines = []
    if worst is not None:
        lines.append(worst.describe(owner))
    elif not checks.worst_batch_note.startswith(NOT_NEEDED):
        lines.append(f"{owner} worst batch was not checked: {checks.worst_batch_missing()}")
    if loss is not None:
        lines.append(loss.describe(owner))
    elif numerics:
        lines.append(f"{owner} loss was not checked: {checks.loss_missing()}")
    return lines


def ruled_out_status(worst: WorstBatchCheck | None, loss: LossCheck | None) -> str:
    """The status of a configuration its checks ruled out: it learns worse (its loss, or its
    loss run, failed the check), else its worst batch does not fit or fails."""
    return LEARNS_WORSE if loss is not None and loss.worse else WORST_BATCH_FAILS


class StoredLossRuns:
    """The loss runs a study has made (`LossRun`, by configuration, seed and steps), kept in
    the study as each ends, so that a resumed run does not train them again: on the H200 the
    user's fp32 runs of GPT-2 small took 104 s of a resumed 200 s call."""

    def __init__(self, study: optuna.Study) -> None:
        self.study = study

    @staticmethod
    def key(config: TrainConfig, seed: int, steps: int) -> str:
        return f"{config_key(config)}|{seed}|{steps}"

    def get(self, key: str) -> LossRun | None:
        found = (self.study.user_attrs.get(StudyKey.LOSS_RUNS) or {}).get(key)
        return LossRun.from_json(found) if found is not None else None

    def put(self, key: str, run: LossRun) -> None:
        runs = dict(self.study.user_attrs.get(StudyKey.LOSS_RUNS) or {})
        runs[key] = asdict(run)
        self.study.set_user_attr(StudyKey.LOSS_RUNS, runs)
