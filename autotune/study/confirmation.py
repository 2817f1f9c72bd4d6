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
from autotune.study.checks import CheckSummary, LossCheck, WorstBatchCheck
from autotune.study.records import config_key
from autotune.trial.protocol import ScriptAnswer

FAILED = "failed"
# How the rounds were measured: each candidate kept warm in its own process taking turns of a
# fraction of a second (`autotune.search.warm`), or a fresh process for every run.
WARM_TURNS = "warm paired turns"
FRESH_ROUNDS = "fresh rounds"

# What taking one change of the race's recommendation back showed (`TakenBack.outcome`).
PAYS = "pays"                      # measurably slower without it: kept
NOISE = "inside the noise"         # no measurable difference without it: dropped
HURTS = "faster without it"        # measurably faster without it: dropped
FAILS = "fails without it"         # without it, it did not run within memory: kept
TOGETHER = "needed together"       # not shown to pay alone, but with the others: kept
NOT_SHOWN = "not shown to pay"     # measured, but not measurably slower without it: dropped
UNJUDGED = "not taken back"        # not measured (`TakenBack.why`): kept
UNCHECKED = "its loss not checked"  # a change of the numerics whose loss run did not fit: dropped
DROPPED = (NOISE, HURTS, NOT_SHOWN, UNCHECKED)
# Why a change never measured without it was kept (UNJUDGED): the confirmation's time, its
# rounds, or the memory for its warm process.
NO_TIME = "too few paired rounds before the confirmation's time ran out"
NO_ROUNDS = "too few paired rounds within --confirm-max-rounds"
NO_MEMORY = "the memory held no warm process of it beside the best's"
# why changes each measured alone and not shown to pay were kept unjudged (UNJUDGED, with a
# ratio): the answer less all of them never ran, or too few rounds for its interval to say
UNMEASURED_TOGETHER = "the answer less all of them was measured in too few paired rounds"
# why a change of the numerics that pays was left out (UNCHECKED)
LOSS_NO_TIME = "the run's time ended before its loss run"
# why a change not shown to pay alone was kept (TOGETHER): its drop left the answer no faster
NOT_BEATEN = "without it the answer did not measurably beat your settings"


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
    load: float | None = None  # other processes' share of the cores during it, where measured
    trace: str | None = None

    @property
    def ok(self) -> bool:
        return self.status != FAILED

    def to_json(self) -> dict[str, Any]:
        return asdict(self) if self.ok else {"status": FAILED}


@dataclass(frozen=True)
class CandidateSummary:
    """One confirmed configuration: its runs, their median and its speedup over the baseline
    paired by round (the baseline's own is 1.0); what its checks found (`study.checks`: its
    worst batch, its loss against the user's settings'), and why it was ruled out before it
    raced where they ruled it out (`excluded`: it then has no runs)."""

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
    worst_batch: WorstBatchCheck | None = None
    loss_check: LossCheck | None = None
    excluded: str = ""
    # a script's configuration in its own terms, where its rounds said it (an answer less
    # some changes has no trial of its own to say it)
    script_answer: ScriptAnswer | None = None

    def ok_runs(self) -> list[Run]:
        return [run for run in self.runs if run.ok]

    @property
    def peak_memory_bytes(self) -> float | None:
        """The larger of its rounds' peaks and its worst batch's: what it needs over a run."""
        peaks = [r.peak_memory_bytes for r in self.ok_runs() if r.peak_memory_bytes]
        if self.worst_batch is not None and self.worst_batch.peak_memory_bytes:
            peaks.append(self.worst_batch.peak_memory_bytes)
        return max(peaks, default=None)

    def to_json(self) -> dict[str, Any]:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**data, "config": self.config.to_dict(),
                "runs": [run.to_json() for run in self.runs],
                "speedup_ci": list(self.speedup_ci) if self.speedup_ci else None,
                "worst_batch": self.worst_batch.to_json() if self.worst_batch else None,
                "loss_check": self.loss_check.to_json() if self.loss_check else None,
                "script_answer": asdict(self.script_answer) if self.script_answer else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateSummary:
        ci, worst, loss = data.get("speedup_ci"), data.get("worst_batch"), data.get("loss_check")
        said = data.get("script_answer")
        return cls(**{**{f.name: data.get(f.name) for f in fields(cls)},
                      "config": TrainConfig.from_dict(data["config"]),
                      "runs": tuple(_run(r) for r in data["runs"]),
                      "speedup_ci": tuple(ci) if ci else None,
                      "worst_batch": WorstBatchCheck.from_json(worst) if worst else None,
                      "loss_check": LossCheck.from_json(loss) if loss else None,
                      "excluded": data.get("excluded") or "",
                      "script_answer": ScriptAnswer.from_json(said) if said else None})


@dataclass(frozen=True)
class TakenBack:
    """One change of the race's recommendation taken back in the same paired rounds: the
    configuration without it against the one with it (`ratio`: its speed over theirs, paired by
    round, with its 95% interval), and whether the answer keeps it (`outcome`)."""

    change: str                        # in words: "torch.compile max-autotune"
    knobs: tuple[str, ...]
    config: TrainConfig | None         # the recommendation without it (None: none measured)
    outcome: str                       # PAYS, NOISE, HURTS, NOT_SHOWN, FAILS, TOGETHER,
    #                                    UNJUDGED, UNCHECKED
    ratio: float | None = None
    ratio_ci: tuple[float, float] | None = None
    rounds: int = 0
    why: str = ""                      # why it was not taken back, or not together

    @property
    def kept(self) -> bool:
        return self.outcome not in DROPPED

    def describe(self) -> str:
        """In words: "taking back torch.compile cost 0.4% [-1.2%, +2.0%], inside the noise:
        dropped"."""
        if self.outcome == UNJUDGED and self.ratio is None:
            return f"{self.change} was not taken back ({self.why}): kept"
        if self.outcome == FAILS:
            return f"without {self.change} {self.failed_text()}: kept"
        if self.outcome == HURTS:
            return f"taking back {self.change} made it {self.gain_text()} faster: dropped"
        return f"taking back {self.change} cost {self.cost_text()}, {self.outcome_text()}"

    def outcome_text(self) -> str:
        """What the taking back says, without its figure: "inside the noise: dropped"."""
        return {PAYS: "it pays: kept", NOISE: "inside the noise: dropped",
                HURTS: "faster without it: dropped",
                NOT_SHOWN: "not shown to pay here: left out",
                UNCHECKED: f"it pays, but its loss was not checked ({self.why}): left out",
                FAILS: f"without it {self.failed_text()}: kept",
                TOGETHER: f"not shown to pay alone, but {self.why}: kept",
                UNJUDGED: f"not taken back ({self.why}): kept" if self.ratio is None
                else f"not shown to pay alone, but {self.why}: kept"}[self.outcome]

    def failed_text(self) -> str:
        """What went wrong without the change: a check that ruled it out (`why`), else its
        rounds."""
        return self.why or "it did not run in every round"

    def cost_text(self) -> str:
        """The speed lost without it, with its interval: "0.4% [-1.2%, +2.0%]" (measured in
        one round: "86.0% [1 round: no interval]")."""
        if self.ratio is None:
            return "unknown"
        text = f"{1 - self.ratio:.1%}"
        if self.ratio_ci:
            low, high = self.ratio_ci
            text += f" [{1 - high:+.1%}, {1 - low:+.1%}]"
        elif self.rounds:
            text += f" [{self.rounds} round{'s' if self.rounds != 1 else ''}: no interval]"
        return text

    def gain_text(self) -> str:
        """The speed gained without it, with its interval: "3.1% [1.2%, 5.0%]"."""
        text = f"{self.ratio - 1:.1%}" if self.ratio is not None else "unknown"
        if self.ratio_ci:
            low, high = self.ratio_ci
            text += f" [{low - 1:+.1%}, {high - 1:+.1%}]"
        return text

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "knobs": list(self.knobs),
                "config": self.config.to_dict() if self.config else None,
                "ratio_ci": list(self.ratio_ci) if self.ratio_ci else None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TakenBack:
        ci, config = data.get("ratio_ci"), data.get("config")
        return cls(**{**{f.name: data[f.name] for f in fields(cls) if f.name in data},
                      "knobs": tuple(data.get("knobs", ())),
                      "config": TrainConfig.from_dict(config) if config else None,
                      "ratio_ci": tuple(ci) if ci else None})


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
    # Each change of the race's recommendation taken back in paired rounds, where it had two
    # or more (a study from before: none), and that recommendation where the answer is it
    # less some of them.
    taken_back: tuple[TakenBack, ...] = ()
    taken_from: CandidateSummary | None = None
    # The paired rounds behind the answer's interval where it was measured in a short race of
    # its own after the race (the recommendation less several changes); else `rounds`.
    answer_rounds: int | None = None
    # Whether the answer's interval was read at equal load: the load its rounds saw explained
    # a measurable part of their spread (`stats.load_adjusted_ratio`).
    load_adjusted: bool = False
    # How the checks of what may be recommended were made (None: a study from before them,
    # or none were asked for).
    checks: CheckSummary | None = None

    @property
    def in_rounds(self) -> str:
        """How many rounds the answer's figure rests on, and how they were measured, in
        words."""
        rounds = self.answer_rounds if self.answer_rounds is not None else self.rounds
        plural = "s" if rounds != 1 else ""
        warm = " of warm turns" if self.measured == WARM_TURNS else ""
        load = ", read at equal load (other processes' load moved them)" \
            if self.load_adjusted else ""
        return f"{rounds} paired round{plural}{warm}{load}"

    @property
    def dropped(self) -> tuple[TakenBack, ...]:
        """The changes of the race's recommendation the answer leaves out."""
        return tuple(t for t in self.taken_back if not t.kept)

    @property
    def unjudged(self) -> tuple[TakenBack, ...]:
        """The changes never measured without them (the time or the rounds ran out); those the
        search space cannot take back (no `config`) are not among them."""
        return tuple(t for t in self.taken_back if t.outcome == UNJUDGED and t.config)

    @property
    def unchecked(self) -> tuple[TakenBack, ...]:
        """The changes of the numerics left out as their loss run never fitted the time."""
        return tuple(t for t in self.taken_back if t.outcome == UNCHECKED)

    @property
    def ruled_out(self) -> tuple[CandidateSummary, ...]:
        """The candidates a check ruled out before they could win."""
        return tuple(c for c in self.candidates if c.excluded)

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
                "disturbed_rounds": self.disturbed_rounds, "measured": self.measured,
                "taken_back": [t.to_json() for t in self.taken_back],
                "taken_from": one(self.taken_from), "answer_rounds": self.answer_rounds,
                "load_adjusted": self.load_adjusted,
                "checks": self.checks.to_json() if self.checks else None}

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
                   measured=data.get("measured", FRESH_ROUNDS),
                   taken_back=tuple(TakenBack.from_json(t)
                                    for t in data.get("taken_back", ())),
                   taken_from=one(data.get("taken_from")),
                   answer_rounds=data.get("answer_rounds"),
                   load_adjusted=data.get("load_adjusted", False),
                   checks=CheckSummary.from_json(data["checks"]) if data.get("checks")
                   else None)


def stored_confirmation(stored: Mapping[str, Any] | None) -> Confirmation | None:
    """The confirmation a study stored (`StudyKey.CONFIRMATION`), or None: none ran, or it
    found nothing to recommend."""
    return Confirmation.from_json(stored) if stored and stored.get("winner") else None


def worst_batch_peaks(stored: Mapping[str, Any] | None) -> dict[str, float]:
    """The worst batches' peaks a study's confirmation measured (`StudyKey.CONFIRMATION`), by
    configuration (`records.config_key`): for the memory model of a study resumed after it."""
    if not stored:
        return {}
    confirmation = Confirmation.from_json(stored)
    return {config_key(c.config): c.worst_batch.peak_memory_bytes
            for c in confirmation.candidates
            if c.worst_batch is not None and c.worst_batch.peak_memory_bytes}


def _run(data: Mapping[str, Any]) -> Run:
    return Run(**{f.name: data[f.name] for f in fields(Run) if f.name in data})
