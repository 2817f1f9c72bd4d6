"""Peak memory against the micro-batch, fitted from the trials that ran, so that configurations
that cannot fit are skipped without spending a trial on them.

A training step's peak is weights + gradients + optimizer state, which do not depend on the
micro-batch, plus activations, which grow in proportion to it. Within one memory family
(precision, checkpointing, compile, whether batches are made in the training process, whose
memory on CPU is the process's, the attention kernel, and the optimizer, whose state is most
of the fixed part) the peak is close to affine in the micro-batch: peak = fixed + per_sample x
micro. Once a family's fit shows the peak growing with the micro-batch, an out-of-memory trial
says every larger micro-batch of the family fails too. On CPU it need not grow: a small
micro-batch with many accumulation steps can peak higher.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autotune.config import TrainConfig
from autotune.study.records import MEASURED_PEAK, RAN_OUT, TrialRecord, config_key

# A configuration is skipped only when its predicted peak is this far above the limit: the fit
# is a line through a few noisy peaks, and a wrongly skipped optimum costs more than a trial.
MEMORY_MARGIN = 0.05


# What `memory_family` holds, in words.
FAMILY_WORDS = "precision, checkpointing, compile, loader, optimizer and attention kernel"


def memory_family(config: TrainConfig) -> tuple[str, str, str, bool, str, str]:
    """The knobs that change how memory grows with the micro-batch (the attention kernel: the
    math one keeps each head's score matrix), or what it starts from (the optimizer's state)."""
    return (config.precision, config.activation_checkpointing, config.compile_mode,
            config.num_workers == 0, config.optimizer, config.attention_backend)


@dataclass(frozen=True)
class MemoryFit:
    """peak = fixed + per_sample x micro, from `points` measured trials of one family."""

    fixed_bytes: float
    per_sample_bytes: float
    points: int

    def predict(self, micro_batch_size: int) -> float:
        return self.fixed_bytes + self.per_sample_bytes * micro_batch_size


@dataclass(frozen=True)
class MemoryVerdict:
    """Why a configuration will not fit: a predicted peak, or a smaller micro-batch that ran
    out of memory."""

    message: str
    predicted_peak_bytes: float | None = None
    wall_trial: int | None = None


class MemoryModel:
    """Per-family fits and out-of-memory walls from finished trials; a configuration whose worst
    batch was measured (`worst`: by `config_key`, from a confirmation's checks) counts at the
    larger of its trial's peak and its worst batch's: what a whole run of it needs."""

    def __init__(self, trials: Iterable[TrialRecord],
                 worst: Mapping[str, float] | None = None) -> None:
        peaks: dict[tuple, dict[int, list[float]]] = {}
        self._walls: dict[tuple, tuple[int, int]] = {}  # family -> (micro, trial number)
        worst = worst or {}
        for t in trials:
            if not t.config:
                continue
            family, micro = memory_family(t.config), t.config.micro_batch_size
            if t.status in MEASURED_PEAK and t.peak_memory_bytes:
                peak = max(float(t.peak_memory_bytes), worst.get(config_key(t.config), 0.0))
                peaks.setdefault(family, {}).setdefault(micro, []).append(peak)
            if t.status in RAN_OUT:
                wall = self._walls.get(family)
                if wall is None or micro < wall[0]:
                    self._walls[family] = (micro, t.number)
        self.fits = {family: fit for family, by_micro in peaks.items()
                     if (fit := _fit(by_micro)) is not None}

    def predict(self, config: TrainConfig) -> float | None:
        """The predicted peak in bytes, or None until two micro-batches of the family ran."""
        fit = self.fits.get(memory_family(config))
        return fit.predict(config.micro_batch_size) if fit else None

    def verdict(self, config: TrainConfig, limit_bytes: int | None,
                margin: float = MEMORY_MARGIN) -> MemoryVerdict | None:
        """Why `config` would not fit under `limit_bytes`, or None when it may."""
        family, micro = memory_family(config), config.micro_batch_size
        wall, fit = self._walls.get(family), self.fits.get(family)
        if wall is not None and fit is not None and fit.per_sample_bytes > 0 and \
                micro >= wall[0]:
            return MemoryVerdict(f"micro-batch {wall[0]} with the same {FAMILY_WORDS} did not "
                                 f"fit (trial {wall[1]}), and memory grows with the micro-batch",
                                 wall_trial=wall[1])
        predicted = self.predict(config)
        if limit_bytes and predicted is not None and predicted > limit_bytes * (1 + margin):
            fit = self.fits[family]
            return MemoryVerdict(
                f"predicted peak {predicted / 2**30:.2f} GiB is above the "
                f"{limit_bytes / 2**30:.2f} GiB allowed (a line through {fit.points} measured "
                f"trials of the same {FAMILY_WORDS})",
                predicted_peak_bytes=predicted)
        return None


def largest_fitting_micro(micros: Iterable[int], peak_bytes: float, micro: int,
                          state_bytes: int, limit_bytes: int) -> int:
    """From one measured peak at `micro`: the largest of `micros` predicted to fit, taking all
    but the training state to grow in proportion to the micro-batch (the smallest when none
    fits). Pessimistic on purpose, since the runtime's own memory is counted as growing: a first
    guess should fit."""
    per_sample = max(peak_bytes - state_bytes, 0.0) / micro
    sizes = list(micros)
    return max((m for m in sizes if state_bytes + per_sample * m <= limit_bytes),
               default=min(sizes))


def _fit(by_micro: Mapping[int, list[float]]) -> MemoryFit | None:
    """Least squares over the median peak of each micro-batch."""
    if len(by_micro) < 2:
        return None
    xs = sorted(by_micro)
    ys = [statistics.median(by_micro[x]) for x in xs]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / \
        sum((x - mean_x) ** 2 for x in xs)
    return MemoryFit(mean_y - slope * mean_x, slope, sum(len(v) for v in by_micro.values()))
