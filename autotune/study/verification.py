"""A claim checked again later: `autotune verify` re-measures the study's answer against the
baseline in fresh paired rounds and records here whether the claimed speedup still holds (where
the study kept your settings: whether its closest contender still does not measurably beat
them)."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.formatting import describe_changes
from autotune.study.confirmation import FRESH_ROUNDS, WARM_TURNS


@dataclass(frozen=True)
class Verification:
    """One verification: the configuration re-measured against the baseline, what the study
    claimed for it and what the fresh rounds found."""

    at: float                                  # time.time() when it ended
    machine: str
    subject: TrainConfig                       # the configuration measured against the baseline
    baseline: TrainConfig
    rounds: int
    speedup: float | None                      # subject / baseline, paired by round
    speedup_ci: tuple[float, float] | None
    claimed: float | None
    claimed_ci: tuple[float, float] | None
    measured: str = FRESH_ROUNDS  # WARM_TURNS or FRESH_ROUNDS (a verification from before)
    kept: bool = False  # the study kept your settings: `subject` is its closest contender

    @property
    def holds(self) -> bool | None:
        """The fresh figure and the claim no further apart than both intervals allow (with
        one interval only, the other figure inside it); where the study kept your settings,
        the contender not measurably faster than them in the fresh rounds (its figure may
        move: the verdict is that it does not pay). None when a side it needs has no figure.

        Each figure is a sample: a fresh 1.66x [1.56-1.77] against a claim of 1.73x
        [1.68-1.78] agrees with it, though outside its interval. On the log scale the two
        differ measurably where the difference exceeds the root of the sum of the squares of
        the intervals' half-widths: the 95% test of a difference of two independent estimates."""
        if self.kept:
            return None if self.speedup_ci is None else self.speedup_ci[0] <= 1.0
        if self.speedup is None or self.claimed is None:
            return None
        if self.claimed_ci is not None and self.speedup_ci is not None:
            apart = abs(math.log(self.speedup / self.claimed))
            return apart <= math.hypot(_log_half_width(self.claimed_ci),
                                       _log_half_width(self.speedup_ci))
        if self.claimed_ci is not None:
            return self.claimed_ci[0] <= self.speedup <= self.claimed_ci[1]
        if self.speedup_ci is not None:
            return self.speedup_ci[0] <= self.claimed <= self.speedup_ci[1]
        return None

    def describe(self) -> str:
        """What was found, in one line: the figure, the claim, and whether it holds."""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.at))
        what = describe_changes(self.subject, self.baseline)
        if self.speedup is None:
            return f"{when} on {self.machine}: {what} did not run in every round; nothing to say"
        how = "paired round{} of warm turns" if self.measured == WARM_TURNS else \
            "fresh paired round{}"
        found = f"{what} is {self.speedup:.2f}x{_interval(self.speedup_ci)} in {self.rounds} " \
            f"{how.format('s' if self.rounds != 1 else '')}"
        claim = f"{self.claimed:.2f}x{_interval(self.claimed_ci)}" if self.claimed else "none"
        if self.kept:
            verdict = {None: "whether your settings still win cannot be said (no interval)",
                       True: f"your settings kept still holds: not measurably faster (the "
                             f"study measured {claim})",
                       False: f"your settings kept no longer holds: it is measurably faster "
                              f"now (the study measured {claim})"}[self.holds]
        elif self.holds is None:
            verdict = f"the claim ({claim}) cannot be checked"
        elif self.holds:
            verdict = f"the claim holds ({claim})"
        else:
            verdict = f"the claim ({claim}) moved by {self.speedup / self.claimed - 1:+.0%}"
        return f"{when} on {self.machine}: {found}; {verdict}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "subject": self.subject.to_dict(),
                "baseline": self.baseline.to_dict(), "holds": self.holds,
                "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None,
                "claimed_ci": list(self.claimed_ci) if self.claimed_ci else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verification:
        values = {k: v for k, v in data.items() if k != "holds"}
        for key in ("speedup_ci", "claimed_ci"):
            values[key] = tuple(values[key]) if values.get(key) else None
        for key in ("subject", "baseline"):
            values[key] = TrainConfig.from_dict(values[key])
        return cls(**values)


def _log_half_width(interval: tuple[float, float]) -> float:
    low, high = interval
    return math.log(high / low) / 2


def _interval(interval: tuple[float, float] | None) -> str:
    return f" [{interval[0]:.2f}-{interval[1]:.2f}]" if interval else ""
