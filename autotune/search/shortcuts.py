"""The search's shortcuts, as plain functions of the trials so far: the fast corner first, the
DataLoader plan, and the screening threshold (`--plain-tpe` turns them off).

- Fast corner: right after the baseline, the configuration an expert tries first
  (`SearchSpace.fast_corner`) at the largest micro-batch the baseline's peak says fits, one
  size smaller after each that does not fit, so that TPE starts from a strong configuration.
- DataLoader plan: while some loader setting outruns the fastest model measured so far, every
  trial gets the cheapest such setting (`loader_plan`).
- Screening: a trial whose short screening window is below a share of the best full
  measurement stops there (`measure`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from autotune.search.loader_plan import choose_loader, consumption_rate
from autotune.search.memory_model import largest_fitting_micro
from autotune.search.space import SearchSpace
from autotune.study.records import MEASURED_PEAK, RAN_A_PROCESS, TOO_BIG, Role, TrialRecord
from autotune.trial.protocol import LoaderRate, TrialStatus

# Multi-fidelity: a trial whose screening rate is below this share of the best full
# measurement so far stops after its screening window.
SCREEN_FRACTION = 0.75


def next_corner(records: Sequence[TrialRecord], space: SearchSpace, memory_limit: int | None,
                state_bytes: Callable[[], int]) -> dict[str, Any] | None:
    """The parameters of the next fast-corner trial, or None: before the baseline has run,
    once a corner ran within memory (or failed, or is under way), or with no smaller
    micro-batch left. The first corner takes the largest micro-batch the baseline's peak says
    fits (`state_bytes()`, the model's training state, is asked for only then); each that does
    not fit sends the next one size down."""
    micros = space.domains["micro_batch_size"]
    cap, tried = max(micros), []
    for r in records:
        if r.role == Role.BASELINE:
            if r.under_way:
                return None
            own = r.config.micro_batch_size if r.config else cap
            if r.peak_memory_bytes and memory_limit and r.status in MEASURED_PEAK:
                cap = largest_fitting_micro(micros, r.peak_memory_bytes, own, state_bytes(),
                                            memory_limit)
            elif r.status == TrialStatus.OOM:
                cap = max((m for m in micros if m < own), default=min(micros))
        if r.role != Role.FAST_CORNER:
            continue
        settled = r.state == "COMPLETE" or r.status in RAN_A_PROCESS
        if r.under_way or (settled and r.status not in TOO_BIG):
            return None
        if r.config:
            tried.append(r.config.micro_batch_size)
    smaller = [m for m in micros if m <= cap and m < min(tried, default=math.inf)]
    return space.params_for(space.fast_corner(max(smaller))) if smaller else None


def screen_below(records: Sequence[TrialRecord]) -> float | None:
    """The screening threshold: a share of the best-scoring full measurement's rate."""
    full = [r for r in records if r.status == TrialStatus.OK and r.score]
    if not full:
        return None
    return SCREEN_FRACTION * max(full, key=lambda r: r.score).samples_per_sec


def planned_loader(records: Sequence[TrialRecord], rates: Sequence[LoaderRate],
                   workers_share_cores: bool) -> tuple[LoaderRate, float] | None:
    """The cheapest DataLoader setting that feeds the fastest model measured so far, with that
    model's consumption (samples/sec without its data waits); None when the model is
    loader-bound and the proposal should be measured as it is."""
    consumption = max((rate for r in records if r.status == TrialStatus.OK
                       and (rate := consumption_rate(r.samples_per_sec,
                                                     r.measurement.data_wait_fraction))),
                      default=0.0)
    chosen = choose_loader(rates, consumption, workers_share_cores=workers_share_cores)
    return (chosen, consumption) if chosen is not None else None
