"""The checks of every configuration the confirmation may recommend, beyond its speed: that the
answer holds for the whole training run, not only for the few hundred steps a study measures.

- The worst batch: a trial's window draws random batches, so a rare long sample (text padded
  per batch, a large graph, a big image) may never be in one, and a micro-batch that fitted
  every window runs out of memory hours into the user's run. Each configuration is trained a
  few steps on a micro-batch of the dataset's largest samples (the probe's `SampleSizes`) in
  a fresh interpreter of its own, as the user's run is one (`trial.worst_batch`); one that
  runs out of memory there, or peaks above the memory a trial may use, is ruled out, and the
  answer's peak is the larger of its rounds' and its worst batch's.
- The loss: a change of the numerics (`config.NUMERICS`: precision, optimizer, attention
  kernel, compile) can step faster and learn worse without going NaN. The user's settings with the
  configuration's numerics (`loss_config`: the micro-batch and loader do not change what is
  computed, so the steps align) is trained `steps` optimizer steps from the weights and
  batches of one seed (`trial.loss_run`; a training script from its seed, at the baseline's
  split, `trial.script.loss_run`), the user's settings from the same seed; its loss after
  them more than the larger of their seed-to-seed spread and `LOSS_FLOOR` above theirs
  (`judge_loss`) rules it out. Their second seed runs only where a loss is beyond the floor,
  the one case its spread can change the judgement (on a GPU their fp32 run can cost more
  than the proof's rounds).

Each run is cached by configuration (the loss by its `loss_config`), so a configuration in two
races is checked once. Where the time budget's end leaves no room for a run, it is skipped and
the summary says so (`CheckSummary`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import NUMERICS, TrainConfig, numerics_changes
from autotune.formatting import describe_changes
from autotune.search.events import StudyView
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob
from autotune.study.checks import (
    FAILED,
    FITS,
    NO_TIME,
    NOT_NEEDED,
    OOM,
    OVER,
    CheckSummary,
    LossCheck,
    StoredLossRuns,
    WorstBatchCheck,
    largest_samples,
)
from autotune.study.records import config_key
from autotune.trial.protocol import (
    LossRun,
    LossRunSettings,
    SampleSizes,
    TrialResult,
    TrialStatus,
    WorstBatchSettings,
    job_of,
)

# Optimizer steps of a worst-batch run: at least 2 (the first allocates the optimizer's state,
# the second holds it beside the activations, as every later step of a run does), then until
# `WORST_STEADY` steps in a row leave its peak where it was (on CPU a fragmented heap raises it
# for a few steps), at most `WORST_MAX_STEPS`; priced at `WORST_PRICED_STEPS`.
WORST_LEAST_STEPS = 2
WORST_STEADY = 3
WORST_MAX_STEPS = 12
WORST_PRICED_STEPS = 6
# A loss this much above the user's settings' (relative) is worse even where their own
# seed-to-seed spread is smaller.
LOSS_FLOOR = 0.01
# The user's settings run with the first seed, as a configuration does; with the second only
# where a loss is beyond `LOSS_FLOOR`, for their seed-to-seed spread.
LOSS_SEEDS = (0, 1)
# A loss run takes about this long at the user's settings' step time, in steps between these.
LOSS_RUN_S = 3.0
MIN_LOSS_STEPS = 50
MAX_LOSS_STEPS = 300

Measure = Callable[[TrainConfig, MeasureJob], TrialResult]


def loss_config(config: TrainConfig, baseline: TrainConfig,
                with_split: bool = True) -> TrainConfig | None:
    """What a loss run of `config` trains: the baseline with `config`'s numerics and, where its
    optimizer step takes as many samples (and `with_split`), its micro-batch and accumulation (a
    model file's loss run takes the same samples however a step is split: the answer is checked
    as it will run; a script's training loss is summed by its own loop, comparable at one split
    only); not its loader, which changes nothing a step computes. None where it changes no
    numerics."""
    changed = numerics_changes(config, baseline)
    if not changed:
        return None
    out = baseline
    if with_split and config.effective_batch_size == baseline.effective_batch_size:
        out = out.replace(micro_batch_size=config.micro_batch_size,
                          grad_accum_steps=config.grad_accum_steps)
    for knob in changed:
        out = out.setting(knob, getattr(config, knob))
    return out


def numerics_offered(domains: Mapping[str, Sequence[Any]]) -> int:
    """How many `NUMERICS` knobs a space offers another value of: the numerics changes its
    answer can make (each a loss run, at most)."""
    return sum(len(domains.get(knob, ())) > 1 for knob in NUMERICS)


def numerics_changed(configs: Iterable[TrainConfig], baseline: TrainConfig) -> int:
    """How many `NUMERICS` knobs `configs` (the candidates measured so far) change from the
    baseline: the loss runs a time plan prices, none before a candidate that needs one."""
    return len({knob for config in configs for knob in numerics_changes(config, baseline)})


def loss_steps(step_s: float | None) -> int:
    """Optimizer steps of a loss run: about `LOSS_RUN_S` at a step of `step_s`, within
    `MIN_LOSS_STEPS` and `MAX_LOSS_STEPS`."""
    if not step_s:
        return MIN_LOSS_STEPS
    return max(MIN_LOSS_STEPS, min(MAX_LOSS_STEPS, round(LOSS_RUN_S / step_s)))


def judge_loss(run: LossRun, first: LossRun, second: LossRun | None, changes: str,
               floor: float = LOSS_FLOOR) -> LossCheck:
    """`run` (the configuration, from `first`'s seed) against the user's settings' `first`:
    worse where its loss after the steps is above theirs by more than the larger of their
    seed-to-seed spread (`first` against `second`; None: not run, `floor` alone) and `floor`,
    relative to their loss; or where it went NaN or inf."""
    base = first.final_loss
    scale = abs(base) or 1.0
    spread = abs(second.final_loss - base) / scale if second is not None else None
    tolerance = max(spread or 0.0, floor)
    if not run.finite:
        return LossCheck(changes, run.steps, None, base, spread, tolerance, worse=True)
    return LossCheck(changes, run.steps, run.final_loss, base, spread, tolerance,
                     worse=(run.final_loss - base) / scale > tolerance)


def worst_batch_check(result: TrialResult, samples: int, limit_bytes: int | None,
                      capacity_bytes: int | None) -> WorstBatchCheck:
    """What a worst-batch run's result says: it fits (its peak within `limit_bytes`), is over
    memory, ran out of memory, or failed (with the result's message)."""
    found = WorstBatchCheck(samples, FITS, limit_bytes=limit_bytes,
                            capacity_bytes=capacity_bytes)
    if result.status == TrialStatus.OOM or result.status == TrialStatus.OVER_MEMORY:
        return WorstBatchCheck(samples, OOM, limit_bytes=limit_bytes,
                               capacity_bytes=capacity_bytes)
    if result.status != TrialStatus.OK or result.worst_batch is None:
        message = result.message.strip().splitlines()[-1] if result.message.strip() else ""
        return WorstBatchCheck(samples, FAILED, limit_bytes=limit_bytes,
                               capacity_bytes=capacity_bytes,
                               why=f"{result.status}: {message}"[:300])
    peak = result.worst_batch.peak_memory_bytes
    outcome = OVER if limit_bytes and peak > limit_bytes else FITS
    return WorstBatchCheck(samples, outcome, peak, found.limit_bytes, found.capacity_bytes)


@dataclass(frozen=True)
class CheckPrices:
    """What one run of each check takes here, priced at the baseline's trial (its process
    start, build and first step, then the steps it runs): a worst batch's, a loss run's."""

    worst_s: float
    loss_s: float
    loss_steps: int


@dataclass(frozen=True)
class Checked:
    """What the checks found of one configuration (None where a check was not made), and why
    it is ruled out, where it is (empty: it may race)."""

    worst: WorstBatchCheck | None = None
    loss: LossCheck | None = None
    why_out: str = ""


class AnswerChecks:
    """The checks of the configurations one confirmation may recommend: run on demand
    (`check`), each run once per configuration (the loss's once per `loss_config`), the user's
    settings' first loss run before the first that needs it, their second where a loss is
    beyond the floor."""

    def __init__(self, measure: Measure, baseline: TrainConfig, scoring: Scoring, *,
                 sizes: SampleSizes | None, capacity_bytes: int | None, loss_check: bool,
                 prices: CheckPrices, time_limit_s: float, device: str, view: StudyView,
                 loss_with_split: bool = True, stored: StoredLossRuns | None = None) -> None:
        self.measure, self.baseline, self.scoring = measure, baseline, scoring
        self.sizes, self.capacity_bytes = sizes, capacity_bytes
        self.prices, self.time_limit_s, self.device, self.view = \
            prices, time_limit_s, device, view
        self.loss_with_split = loss_with_split  # `loss_config`'s: False for a script
        self.stored = stored  # the loss runs of the study's earlier runs, and where new ones go
        self._worst: dict[str, WorstBatchCheck | None] = {}
        self._loss: dict[str, LossCheck | None] = {}
        self._base: list[LossRun] = []  # the user's settings' loss runs, by seed
        self.worst_note = self._sizes_note(sizes)
        self.loss_note = "off (--no-loss-check)" if not loss_check else ""
        self._worst_skipped = self._loss_skipped = False
        self._said: set[str] = set()  # the configurations whose ruling out was said
        # Numerics that learned worse (at one split of the effective batch): at another split
        # they are ruled out without a run of their own.
        self._worse: dict[tuple[Any, ...], LossCheck] = {}
        self._runs = 0

    @staticmethod
    def _sizes_note(sizes: SampleSizes | None) -> str:
        if sizes is None:
            return ("the probe did not size the samples (a study probed before it did, a "
                    "dataset that cannot be read by index, or a collate function that cannot "
                    "take one sample alone)")
        if sizes.uniform:
            return f"{NOT_NEEDED}: {sizes.describe()}, so any batch is the worst"
        return ""

    def check(self, config: TrainConfig, reference: bool = False,
              deadline: float | None = None) -> Checked:
        """The worst batch of `config`, then (unless that rules it out, or it is the user's
        settings, `reference`) its loss against theirs; what rules it out, in words (said
        once a configuration, however many races it is asked for)."""
        found = self._checked(config, reference, deadline)
        key = config_key(config)
        if found.why_out and key not in self._said:
            self._said.add(key)
            self.view.note(f"confirmation: {self._named(config)} is ruled out: "
                           f"{found.why_out}")
        return found

    def _checked(self, config: TrainConfig, reference: bool,
                 deadline: float | None) -> Checked:
        worst = self._worst_batch(config, deadline)
        if reference:
            return Checked(worst)
        if worst is not None and not worst.fits and not self._same_failure(worst):
            return Checked(worst, None, worst.describe("its"))
        loss = self._loss_check(config, deadline)
        if loss is not None and loss.worse:
            why = loss.describe("its") if loss.failed else \
                f"it learns worse: {loss.describe('its')}"
            return Checked(worst, loss, why)
        return Checked(worst, loss)

    def loss_unchecked(self, config: TrainConfig) -> bool:
        """Whether `config` changes the numerics and its loss was never run (the time budget
        left no room; not where the check is off or the user's settings did not train, which
        the summary says)."""
        target = loss_config(config, self.baseline, self.loss_with_split)
        if target is None or self.loss_note:
            return False
        return config_key(target) not in self._loss and _numerics(target) not in self._worse

    @property
    def runs(self) -> int:
        """The check runs made so far (a check whose findings were known makes none)."""
        return self._runs

    def _same_failure(self, worst: WorstBatchCheck) -> bool:
        """A worst batch that fails as the user's settings' own does: the data's failure (a
        sample longer than the model takes), not the configuration's."""
        own = self._worst.get(config_key(self.baseline))
        return worst.outcome == FAILED and own is not None and own.outcome == FAILED

    def summary(self) -> CheckSummary:
        """How the checks were made, for the stored confirmation."""
        worst = self.worst_note or (NO_TIME if self._worst_skipped and not self._worst else "")
        loss = self.loss_note
        if not loss and not self._base:
            loss = (NO_TIME if self._loss_skipped else
                    f"{NOT_NEEDED}: nothing it may recommend changes the numerics")
        return CheckSummary(
            sizes=self.sizes.describe() if self.sizes is not None else "",
            worst_batch_note=worst, loss_note=loss,
            loss_steps=self.prices.loss_steps if self._base else None,
            baseline_losses=tuple(r.final_loss for r in self._base) if self._base else ())

    def _in_time(self, price_s: float, deadline: float | None) -> bool:
        return deadline is None or time.monotonic() + price_s <= deadline

    def _job(self, config: TrainConfig, settings: WorstBatchSettings | LossRunSettings,
             fresh: bool = False) -> TrialResult:
        self._runs += 1
        job = MeasureJob(f"check-{job_of(settings)}-{self._runs}", self.time_limit_s, self.device,
                         profile=False, settings=settings, fresh=fresh)
        return self.measure(config, job)

    def _worst_batch(self, config: TrainConfig, deadline: float | None
                     ) -> WorstBatchCheck | None:
        key = config_key(config)
        if self.worst_note or key in self._worst:
            return self._worst.get(key)
        if not self._in_time(self.prices.worst_s, deadline):
            self._worst_skipped = True
            return None
        samples = config.micro_batch_size
        self.view.note(f"checking {self._named(config)} on the worst batch: "
                       f"{largest_samples(samples)}")
        result = self._job(config, WorstBatchSettings(
            self.sizes.worst_indices(samples), self.sizes.total, steps=WORST_LEAST_STEPS,
            steady=WORST_STEADY, max_steps=WORST_MAX_STEPS), fresh=True)
        found = worst_batch_check(result, samples, self.scoring.memory_limit_bytes,
                                  self.capacity_bytes)
        self._worst[key] = found
        return found

    def _loss_check(self, config: TrainConfig, deadline: float | None) -> LossCheck | None:
        target = loss_config(config, self.baseline, self.loss_with_split)
        if target is None or self.loss_note:
            return None
        key = config_key(target)
        if key in self._loss:
            return self._loss[key]
        numerics = _numerics(target)
        if numerics in self._worse:  # the same numerics learned worse at another split
            return self._worse[numerics]
        runs = 1 if self._base else 2
        if not self._in_time(runs * self.prices.loss_s, deadline):
            self._loss_skipped = True
            return None
        changes = describe_changes(target, self.baseline)
        if not self._base:
            first = self._loss_run(self.baseline, LOSS_SEEDS[0], "checking the loss: your "
                                   f"settings for {self.prices.loss_steps} steps from seed "
                                   f"{LOSS_SEEDS[0]}")
            if not isinstance(first, LossRun) or not first.finite:
                why = first if isinstance(first, str) else "its loss went NaN or inf"
                self.loss_note = f"your settings did not train to the end: {why}"
                return None
            self._base = [first]
        run = self._loss_run(target, LOSS_SEEDS[0], f"checking the loss of {changes} for "
                             f"{self.prices.loss_steps} steps from seed {LOSS_SEEDS[0]}")
        if not isinstance(run, LossRun):
            found = LossCheck(changes, self.prices.loss_steps, None, self._base[0].final_loss,
                              None, LOSS_FLOOR, worse=True, failed=run)
        else:
            found = self._judged(run, changes, deadline)
        self._loss[key] = found
        if found.worse and not found.failed:
            self._worse[numerics] = found
        return found

    def _judged(self, run: LossRun, changes: str, deadline: float | None) -> LossCheck:
        """`run` against the user's settings' first seed; where it is beyond the floor, their
        second seed is run (where the time holds it), for the spread that may excuse it."""
        found = judge_loss(run, self._base[0], self._second(), changes)
        if not found.worse or found.spread is not None or found.loss is None or \
                not self._in_time(self.prices.loss_s, deadline):
            return found
        second = self._loss_run(self.baseline, LOSS_SEEDS[1], "checking the loss: your "
                                f"settings from seed {LOSS_SEEDS[1]} too, for their own spread "
                                f"({changes} is {found.delta:.1%} above seed {LOSS_SEEDS[0]}'s)")
        if isinstance(second, LossRun) and second.finite:
            self._base.append(second)
        return judge_loss(run, self._base[0], self._second(), changes)

    def _second(self) -> LossRun | None:
        return self._base[1] if len(self._base) > 1 else None

    def _loss_run(self, config: TrainConfig, seed: int, note: str) -> LossRun | str:
        """The run's losses (one the study made before, where it has it), or how it failed,
        in words; `note` says it."""
        key = StoredLossRuns.key(config, seed, self.prices.loss_steps)
        known = self.stored.get(key) if self.stored is not None else None
        if known is not None:
            self.view.note(f"{note}: kept from an earlier run of this study")
            return known
        self.view.note(note)
        result = self._job(config, LossRunSettings(seed, self.prices.loss_steps))
        if result.status == TrialStatus.OK and result.loss_run is not None:
            if self.stored is not None:
                self.stored.put(key, result.loss_run)
            return result.loss_run
        message = result.message.strip().splitlines()[-1] if result.message.strip() else ""
        return f"ended as {result.status}: {message}"[:300]

    def _named(self, config: TrainConfig) -> str:
        return describe_changes(config, self.baseline)


def _numerics(config: TrainConfig) -> tuple[Any, ...]:
    """What `config` trains in (its `NUMERICS`), the key of numerics that learned worse."""
    return tuple(getattr(config, knob) for knob in NUMERICS)
