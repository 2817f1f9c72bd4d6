"""The search's shortcuts, as plain functions of the trials so far: the fast corner first, the
DataLoader plan, and the screening threshold (`--plain-tpe` turns them off).

- Fast corner: right after the baseline, the configuration an expert tries first
  (`SearchSpace.fast_corner`) at the largest micro-batch the baseline's peak says fits, one
  size smaller after each that does not fit, so that TPE starts from a strong configuration.
- DataLoader plan: while some loader setting outruns the fastest model measured so far, every
  trial gets the cheapest such setting, else the fastest one (`loader_plan`).
- Screening: a trial whose short screening window is below a share of the best full
  measurement stops there (`measure`).
- Bottleneck fixes: the knob values that address one share of a trial's step from its
  configuration (`bottleneck_fix`), for `search/expert`'s first moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from autotune.search.loader_plan import (
    apply_loader,
    choose_loader,
    consumption_rate,
    workers_share_cores,
)
from autotune.search.memory_model import largest_fitting_micro
from autotune.search.space import SearchSpace
from autotune.study.records import MEASURED_PEAK, RAN_A_PROCESS, TOO_BIG, Role, TrialRecord
from autotune.trial.protocol import LoaderRate, TrialStatus

# Multi-fidelity: a trial whose screening rate is below this share of the best full
# measurement so far stops after its screening window.
SCREEN_FRACTION = 0.75
# The expert's first moves: the bottleneck's fixes and the fast corner.
FIRST_MOVES = (Role.BOTTLENECK, Role.FAST_CORNER)


def next_corner(records: Sequence[TrialRecord], space: SearchSpace, memory_limit: int | None,
                state_bytes: Callable[[], int]) -> dict[str, Any] | None:
    """The parameters of the next fast-corner trial, or None: before the baseline has run,
    once a corner ran within memory (or failed, or is under way), or with no smaller
    micro-batch left. The first corner takes the largest micro-batch the baseline's peak says
    fits (`micro_cap`); each that does not fit sends the next one size down."""
    cap = micro_cap(records, space, memory_limit, state_bytes)
    if cap is None:
        return None
    tried = []
    for r in records:
        if r.role != Role.FAST_CORNER:
            continue
        settled = r.state == "COMPLETE" or r.status in RAN_A_PROCESS
        if r.under_way or (settled and r.status not in TOO_BIG):
            return None
        if r.config:
            tried.append(r.config.micro_batch_size)
    micros = space.domains["micro_batch_size"]
    smaller = [m for m in micros if m <= cap and m < min(tried, default=math.inf)]
    return space.params_for(space.fast_corner(max(smaller))) if smaller else None


def micro_cap(records: Sequence[TrialRecord], space: SearchSpace, memory_limit: int | None,
              state_bytes: Callable[[], int]) -> int | None:
    """The largest micro-batch the baseline's measured peak says fits (`state_bytes()`, the
    model's training state, is asked for only then); the largest offered where no peak or
    limit is known; one size below the baseline's where it ran out of memory. None while the
    baseline has not run."""
    micros = space.domains["micro_batch_size"]
    baseline = next((r for r in records if r.role == Role.BASELINE), None)
    if baseline is None or baseline.under_way:
        return None
    own = baseline.config.micro_batch_size if baseline.config else max(micros)
    if baseline.peak_memory_bytes and memory_limit and baseline.status in MEASURED_PEAK:
        return largest_fitting_micro(micros, baseline.peak_memory_bytes, own, state_bytes(),
                                     memory_limit)
    if baseline.status == TrialStatus.OOM:
        return max((m for m in micros if m < own), default=min(micros))
    return max(micros)


def screen_below(records: Sequence[TrialRecord]) -> float | None:
    """The screening threshold: a share of the best-scoring full measurement's rate."""
    best = _screening_best(records)
    return SCREEN_FRACTION * best.samples_per_sec if best is not None else None


def screen_load(records: Sequence[TrialRecord], role: str = Role.SEARCH) -> float:
    """The load the screening threshold was measured beside: other processes' share of the
    CPUs in the best full measurement's window where another process disturbed it, else 0. 0
    for an expert's first move (`FIRST_MOVES`): a disturbed window never screens it out, since
    a burst of the load can slow it 8x (per_feature_towers at 063ac43: fused AdamW, the
    bottleneck's fix, screened at 237 samples/s beside a baseline of 1,943 at the same load)."""
    if role in FIRST_MOVES:
        return 0.0
    best = _screening_best(records)
    figures = best.measurement if best is not None else None
    if figures is None or not figures.disturbed:
        return 0.0
    return figures.other_cpu_share or 0.0


def _screening_best(records: Sequence[TrialRecord]) -> TrialRecord | None:
    """The best-scoring full measurement: the screening's reference."""
    full = [r for r in records if r.status == TrialStatus.OK and r.score]
    return max(full, key=lambda r: r.score) if full else None


def planned_loader(records: Sequence[TrialRecord], rates: Sequence[LoaderRate],
                   workers_share_cores: bool) -> tuple[LoaderRate, float] | None:
    """The cheapest DataLoader setting that feeds the fastest model measured so far (the
    fastest setting where none does), with that model's consumption (samples/sec without its
    data waits); None where no setting is planned (`choose_loader`) and the proposal should
    be measured as it is."""
    consumption = max((rate for r in records if r.status == TrialStatus.OK
                       and (rate := consumption_rate(r.samples_per_sec,
                                                     r.measurement.data_wait_fraction))),
                      default=0.0)
    chosen = choose_loader(rates, consumption, workers_share_cores=workers_share_cores)
    return (chosen, consumption) if chosen is not None else None


def bottleneck_fix(knob: str, current: TrialRecord, records: Sequence[TrialRecord],
                   space: SearchSpace, loader_rates: Sequence[LoaderRate], device_type: str,
                   memory_limit: int | None, state_bytes: Callable[[], int],
                   ) -> dict[str, Any] | None:
    """The values of `knob` (and those it brings along) that address its share of `current`'s
    step, or None where the space has nothing better than what `current` runs: the DataLoader
    the plan gives for its consumption, a fused (else foreach) AdamW, the largest micro-batch
    the memory says fits, torch.compile's default mode."""
    config, domain = current.config, space.domains.get(knob, ())
    if config is None:
        return None
    if knob == "num_workers":
        plan = planned_loader([current], loader_rates,
                              workers_share_cores(device_type, loader_rates))
        if plan is None or plan[0].num_workers == config.num_workers:
            return None
        fixed = apply_loader(config, plan[0])
        return {k: getattr(fixed, k) for k in ("num_workers", "prefetch_factor",
                                               "persistent_workers")}
    if knob == "optimizer_impl":
        value = next((v for v in ("fused", "foreach") if v in domain), None)
        return {knob: value} if value not in (None, config.optimizer_impl) else None
    if knob == "micro_batch_size":
        cap = micro_cap(records, space, memory_limit, state_bytes) or 0
        larger = [m for m in domain if config.micro_batch_size < m <= cap]
        return {knob: max(larger)} if larger else None
    if knob == "compile_mode":
        return {knob: "default"} if "default" in domain and config.compile_mode == "none" \
            else None
    return None
