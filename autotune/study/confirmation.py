"""What the confirmation's paired rounds concluded, as the study stores it and readers get it.

`autotune.search.confirm` measures the rounds and builds a `Confirmation`; the study keeps its
`to_json()` under `StudyKey.CONFIRMATION`, and the read side gets it back with `from_json`, so
`show`, the report and `--json` need nothing but the storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from autotune.config import TrainConfig

FAILED = "failed"
# How the rounds were measured: each candidate kept warm in its own process taking turns of a
# fraction of a second (`autotune.search.warm`), or a fresh process for every run.
WARM_TURNS = "warm paired turns"
FRESH_ROUNDS = "fresh rounds"


@dataclass(frozen=True)
class Run:
    """One fresh run of a candidate in one round; a run that did not fit or failed has only its
    status."""

    status: str
    samples_per_sec: float | None = None
    objective: float | None = None
    peak_memory_bytes: float | None = None
    mfu: float | None = None
    step_time_median_s: float | None = None
    time_to_train_s: float | None = None
    disturbed: bool = False
    trace: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != FAILED

    def to_json(self) -> dict[str, Any]:
        return asdict(self) if self.ok else {"status": FAILED}


@dataclass(frozen=True)
class CandidateSummary:
    """One confirmed configuration: its runs, their median and its speedup over the baseline
    paired by round (the baseline's own is 1.0)."""

    config: TrainConfig
    trial: int | None
    feasible: bool
    ok: bool
    runs: tuple[Run, ...]
    median: float | None
    spread: float | None
    objective: float | None
    time_to_train_s: float | None
    search_samples_per_sec: float | None
    speedup: float
    speedup_ci: tuple[float, float] | None
    trace: str | None

    def ok_runs(self) -> list[Run]:
        return [run for run in self.runs if run.ok]

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "config": self.config.to_dict(),
                "runs": [run.to_json() for run in self.runs],
                "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateSummary:
        ci = data.get("speedup_ci")
        return cls(**{**{f.name: data.get(f.name) for f in fields(cls)},
                      "config": TrainConfig.from_dict(data["config"]),
                      "runs": tuple(_run(r) for r in data["runs"]),
                      "speedup_ci": tuple(ci) if ci else None})


@dataclass(frozen=True)
class Drift:
    """The baseline at the start of the search against the confirmation rounds at the end."""

    start_samples_per_sec: float
    end_samples_per_sec: float
    end_range: tuple[float, float]
    beyond_noise: bool

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "end_range": list(self.end_range)}


@dataclass(frozen=True)
class Confirmation:
    """The outcome of the paired rounds: the recommendation (`winner`: the simplest candidate
    as fast as the fastest), the fastest, the baseline, and the speedup with its interval.

    `no_measurable_difference` is True when the recommendation's interval holds 1.0, False when
    it does not, and None when too few rounds ran for an interval at all. `contender` is the
    candidate whose interval against the baseline `speedup_ci` is: the recommendation, or, when
    the baseline is kept, the fastest other (the closest, when the baseline is the fastest)."""

    candidates: tuple[CandidateSummary, ...]
    winner: CandidateSummary | None
    fastest: CandidateSummary | None
    baseline: CandidateSummary
    contender: CandidateSummary | None
    speedup: float | None
    speedup_ci: tuple[float, float] | None
    no_measurable_difference: bool | None
    # The search's own ratio of the contender to the baseline (trials at other moments), and
    # whether `speedup_ci` was widened to hold it: the machine moved between search and rounds.
    search_speedup: float | None
    widened: bool
    rounds: int
    wall_s: float
    at: float
    target: float
    drift: Drift | None
    disturbed_rounds: int
    measured: str = FRESH_ROUNDS  # WARM_TURNS or FRESH_ROUNDS (a study from before: fresh)

    @property
    def in_rounds(self) -> str:
        """How many rounds, and how they were measured, in words."""
        plural = "s" if self.rounds != 1 else ""
        warm = " of warm turns" if self.measured == WARM_TURNS else ""
        return f"{self.rounds} paired round{plural}{warm}"

    @property
    def difference_unknown(self) -> bool:
        """A faster candidate than the one kept, but too few rounds to tell them apart."""
        return (self.no_measurable_difference is None and self.fastest is not None
                and self.winner is not None and self.fastest.config != self.winner.config)

    def to_json(self) -> dict[str, Any]:
        """Plain data for the study's attributes (`repeats` is the old name of `rounds`)."""
        def one(candidate: CandidateSummary | None) -> dict[str, Any] | None:
            return candidate.to_json() if candidate is not None else None

        return {"candidates": [c.to_json() for c in self.candidates],
                "winner": one(self.winner), "fastest": one(self.fastest),
                "baseline": one(self.baseline), "contender": one(self.contender),
                "speedup": self.speedup,
                "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None,
                "no_measurable_difference": self.no_measurable_difference,
                "search_speedup": self.search_speedup, "widened": self.widened,
                "rounds": self.rounds, "repeats": self.rounds, "wall_s": self.wall_s,
                "at": self.at, "target": self.target,
                "drift": self.drift.to_json() if self.drift else None,
                "disturbed_rounds": self.disturbed_rounds, "measured": self.measured}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Confirmation:
        def one(raw: Mapping[str, Any] | None) -> CandidateSummary | None:
            return CandidateSummary.from_json(raw) if raw else None

        drift, ci = data.get("drift"), data.get("speedup_ci")
        return cls(candidates=tuple(CandidateSummary.from_json(c) for c in data["candidates"]),
                   winner=one(data.get("winner")), fastest=one(data.get("fastest")),
                   baseline=CandidateSummary.from_json(data["baseline"]),
                   contender=one(data.get("contender")),
                   speedup=data.get("speedup"), speedup_ci=tuple(ci) if ci else None,
                   no_measurable_difference=data.get("no_measurable_difference"),
                   search_speedup=data.get("search_speedup"),
                   widened=data.get("widened", False),
                   rounds=data.get("rounds", data.get("repeats", 0)),
                   wall_s=data.get("wall_s", 0.0), at=data.get("at", 0.0),
                   target=data.get("target", 0.0),
                   drift=Drift(**{**drift, "end_range": tuple(drift["end_range"])})
                   if drift else None,
                   disturbed_rounds=data.get("disturbed_rounds", 0),
                   measured=data.get("measured", FRESH_ROUNDS))


def stored_confirmation(stored: Mapping[str, Any] | None) -> Confirmation | None:
    """The confirmation a study stored (`StudyKey.CONFIRMATION`), or None: none ran, or it
    found nothing to recommend."""
    return Confirmation.from_json(stored) if stored and stored.get("winner") else None


def _run(data: Mapping[str, Any]) -> Run:
    return Run(**{f.name: data[f.name] for f in fields(Run) if f.name in data})
