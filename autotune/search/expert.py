"""Which trials an expert queues first, as plain functions of the trials so far (`worker`
enqueues what they return; `--plain-tpe` turns them off).

First the bottleneck: the baseline's profile says where its step goes (`study/bottleneck`), and
the knobs its dominant share points to are measured first, one at a time (a DataLoader that
keeps the step waiting gets workers, an optimizer-bound step a fused AdamW, a launch-bound one a
larger micro-batch, then compiling; unused memory a larger micro-batch). Each fix that wins
clearly becomes the point the next is measured from, and the diagnosis is read again there: a
bottleneck that moves (the loader fixed, the step now optimizer-bound) sets the next move
(`next_bottleneck_trial`). Then the fast corner.

The fast corner bundles every usually-fast value. Where it does not win clearly (its score is
not above the point it was measured from by more than the noise, `clearly_faster`: the
baseline with the bottleneck fixes that won, which it bundles too), one of its changes may
still be a large win hidden behind another that loses on this machine (fused AdamW behind
bf16 on a CPU). An expert then measures each change alone, from the point the corner was
measured from (a change from the baseline alone would be screened out beside a bottleneck fix
that won several times over: one_pays at 96d7a3f), cheapest and likeliest first
(`ONE_CHANGE_ORDER`: compiling is the dearest trial), and the changes that won alone together.
A change that left some trial far slower than the same trial without it (bf16 on a CPU without
native bf16) was measured alone already: its one-change trial repeats that trial, no process.
A knob whose every value the space offers lost alone (`lost`) is kept at the baseline's value
by the sampler afterwards (`kept_at_baseline`): it is not bundled again without evidence.

Where the corner does win clearly, a loser may still ride along in it (bf16 on a CPU without
native bf16, beside a larger micro-batch that wins several times over). The expert then
takes each change back from the corner, one at a time, in the same order, and the corner
without every change whose taking back made it clearly faster, together.

Last, the usual move the corner leaves out, being the dearest trial: the best configuration
so far, compiled (`_compiled_best`), unless something compiled was measured already."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.search.space import SearchSpace
from autotune.study.bottleneck import KNOBS, Diagnosis
from autotune.study.records import RAN_A_PROCESS, Role, TrialRecord
from autotune.trial.protocol import TrialStatus

# The knobs whose changes are measured alone, in this order: a cheap trial with a likely win
# first, the micro-batch (whose memory the corner already judged) late, compiling last.
ONE_CHANGE_ORDER = ("optimizer_impl", "num_workers", "precision", "memory_format",
                    "activation_checkpointing", "attention_backend", "micro_batch_size",
                    "compile_mode")
# The least relative difference between two scores that counts as more than noise; wider
# where the measurements say their medians are known less well (`step_time_precision`).
MIN_CLEAR_MARGIN = 0.05
# Outcomes that say what a configuration does: a compile that ran out of time is tried again.
SETTLED = RAN_A_PROCESS - {TrialStatus.COMPILE_TIMEOUT}
# The most bottleneck moves before the fast corner.
MAX_BOTTLENECK_MOVES = 4
# A change that left a trial at under this share of the same trial without it was measured
# alone already, from there: no other point makes it pay, so its one-change trial is that
# measurement (bf16 on a CPU without native bf16: a LoRA fine-tune's corner at 1 sample/s
# against 17.9 for its micro-batch alone, then bf16 alone from the baseline ran to its 86 s limit).
FAR_SLOWER = 0.5

# A trial's diagnosis (None without a profile), and the knob values that fix one knob from a
# trial's configuration (None where there is nothing to change: the knob's fix is applied).
Diagnose = Callable[[TrialRecord], "Diagnosis | None"]
Fix = Callable[[str, TrialRecord], "dict[str, Any] | None"]


@dataclass(frozen=True)
class ExpertTrial:
    """The next trial an expert queues: its Optuna parameters, its role, the knobs it
    changes from the baseline."""

    params: dict[str, Any]
    role: str
    changed: tuple[str, ...]


def noise_margin(a: TrialRecord, b: TrialRecord) -> float:
    """The relative difference between two trials' scores that the noise could explain."""
    known = sum(r.measurement.step_time_precision or 0.0 for r in (a, b) if r.measurement)
    return max(MIN_CLEAR_MARGIN, known)


def clearly_faster(trial: TrialRecord, baseline: TrialRecord) -> bool:
    """Its score is above the baseline's by more than the noise."""
    return bool(trial.score and baseline.score and
                trial.score > baseline.score * (1 + noise_margin(trial, baseline)))


def lost(trial: TrialRecord, baseline: TrialRecord) -> bool:
    """It ran and did not fit, failed, or scored below the baseline by more than the noise."""
    if trial.status not in SETTLED or not baseline.score:
        return False
    return not trial.score or trial.score < baseline.score * (1 - noise_margin(trial, baseline))


def one_change_order(baseline: TrainConfig, corner: TrainConfig,
                     first: Sequence[str] = ()) -> list[str]:
    """The knobs the corner changed from the baseline, those the diagnosis points to first
    (`first`), then in `ONE_CHANGE_ORDER` (others after, by name); the accumulation follows
    the micro-batch and is no change of its own."""
    changed = list(changes_from(corner, baseline))
    rank = {knob: i for i, knob in enumerate(dict.fromkeys([*first, *ONE_CHANGE_ORDER]))}
    return sorted(changed, key=lambda k: (rank.get(k, len(rank)), k))


def next_bottleneck_trial(records: Sequence[TrialRecord], space: SearchSpace,
                          diagnose: Diagnose, fix: Fix) -> ExpertTrial | None:
    """The next fix of the step's bottleneck, or None once there is none to try (no share
    large enough, their knobs each tried, `MAX_BOTTLENECK_MOVES` made) or while the baseline or
    a move is under way. Moves are measured from the last one that won clearly (the baseline at
    first), whose own diagnosis decides the next: one knob at a time, each knob once, the
    largest share's first (`Diagnosis.to_fix`)."""
    baseline = next((r for r in records if r.role == Role.BASELINE and r.score), None)
    moves = [r for r in records if r.role == Role.BOTTLENECK]
    if baseline is None or len(moves) >= MAX_BOTTLENECK_MOVES or \
            any(r.under_way for r in moves):
        return None
    current = bottleneck_point(records, baseline)
    diagnosis = diagnose(current)
    if diagnosis is None or current.config is None:
        return None
    tried = {knob for r in moves for knob in r.changed}
    for kind in diagnosis.to_fix():
        for knob in KNOBS[kind]:
            changes = None if knob in tried else fix(knob, current)
            if changes is None:
                continue
            params = _params(space, {**changes_from(current.config, space.baseline),
                                     **changes})
            if params is not None:
                return ExpertTrial(params, Role.BOTTLENECK, (knob,))
    return None


def bottleneck_point(records: Sequence[TrialRecord], baseline: TrialRecord) -> TrialRecord:
    """The last bottleneck move that won clearly over the point it was measured from (the
    baseline at first): where the next move, and the fast corner, are measured from."""
    current = baseline
    for move in (r for r in records if r.role == Role.BOTTLENECK):
        if clearly_faster(move, current):
            current = move
    return current


def changes_from(config: TrainConfig, baseline: TrainConfig) -> dict[str, Any]:
    """The knob values of `config` that differ from the baseline's (the accumulation aside: it
    follows the micro-batch)."""
    return {k: v for k, v in config.to_dict().items()
            if k != "grad_accum_steps" and v != getattr(baseline, k)}


def next_expert_trial(records: Sequence[TrialRecord], space: SearchSpace,
                      first: Sequence[str] = ()) -> ExpertTrial | None:
    """The next trial to queue after the fast corner, one per call, each once: where it did
    not win clearly over the point it was measured from (the baseline with the bottleneck
    fixes that won, `bottleneck_point`), each of its changes alone from that point, in
    `one_change_order`, then, once every one has settled, those that won clearly alone
    together (when two or more did; `_one_changes`); where it won clearly, the corner with
    each change taken back in turn, then the corner without all those whose taking back won
    clearly (`_taken_back`); then the best so far compiled (`_compiled_best`). The knobs the
    baseline's diagnosis points to (`first`) go first. None while the baseline or a corner is
    due or under way, while an expert's trial is, and once all this is done."""
    baseline, corner = _baseline_and_corner(records)
    if baseline is None or corner is None:
        return None
    # The corner as the space builds it: what the DataLoader plan changed is not its own.
    bundle = space.fast_corner(corner.config.micro_batch_size)
    knobs = one_change_order(space.baseline, bundle, first)
    point = bottleneck_point(records, baseline)
    if len(knobs) >= 2:  # else the corner was itself the one change
        queued = (_taken_back(records, space, bundle, corner, knobs)
                  if clearly_faster(corner, point)
                  else _one_changes(records, space, bundle, point, knobs))
        if queued is not None:
            return queued
        if any(r.under_way for r in records if r.role in EXPERT_ROLES):
            return None
    return _compiled_best(records, space)


# The roles of the expert's trials, whose outcomes the next ones wait for.
EXPERT_ROLES = (Role.ONE_CHANGE, Role.TAKEN_BACK, Role.WINNERS, Role.COMPILED_BEST)


def _one_changes(records: Sequence[TrialRecord], space: SearchSpace, bundle: TrainConfig,
                 point: TrialRecord, knobs: Sequence[str]) -> ExpertTrial | None:
    """After a corner that did not win clearly: each of its changes alone from `point` (the
    baseline with the bottleneck fixes that won; a change it already has is not one), or,
    where a trial far slower with it than without it was measured (`_far_slower_with`), that
    trial again (a repeat: no process); then those that won clearly alone, together (when two
    or more did)."""
    singles = [r for r in records if r.role == Role.ONE_CHANGE]
    queued = {r.changed for r in singles}
    fixes = changes_from(point.config, space.baseline) if point.config is not None else {}
    for knob in knobs:
        value = getattr(bundle, knob)
        if (knob,) in queued or fixes.get(knob, getattr(space.baseline, knob)) == value:
            continue
        slower = _far_slower_with(records, point, knob, value)
        params = space.params_for(slower.config) if slower is not None else None
        params = params or _params(space, {**fixes, knob: value})
        if params is not None:
            return ExpertTrial(params, Role.ONE_CHANGE, (knob,))
    if any(r.under_way for r in singles) or \
            any(r.role == Role.WINNERS for r in records):
        return None
    winners = tuple(k for k in knobs if any(r.changed == (k,) and clearly_faster(r, point)
                                            for r in singles))
    if len(winners) < 2:
        return None
    params = _params(space, {**fixes, **{k: getattr(bundle, k) for k in winners}})
    return ExpertTrial(params, Role.WINNERS, winners) if params is not None else None


def _far_slower_with(records: Sequence[TrialRecord], point: TrialRecord, knob: str,
                     value: Any) -> TrialRecord | None:
    """A trial with `knob` at `value` that scored under `FAR_SLOWER` of a trial the same but
    for that knob (the accumulation aside), one no faster than `point` beyond the noise (so it
    lost against the point too); None where none did."""
    for slow in records:
        if slow.config is None or not slow.score or getattr(slow.config, knob) != value:
            continue
        for other in records:
            if other.config is not None and other.score and \
                    slow.score < FAR_SLOWER * other.score and \
                    not clearly_faster(other, point) and \
                    changes_from(slow.config, other.config).keys() == {knob}:
                return slow
    return None


def _taken_back(records: Sequence[TrialRecord], space: SearchSpace, bundle: TrainConfig,
                corner: TrialRecord, knobs: Sequence[str]) -> ExpertTrial | None:
    """After a corner that won clearly: the corner with each of its changes undone in turn
    (`changed` names the knob taken back), then the corner without every change whose
    undoing made it clearly faster, when two or more did (`changed`: the changes kept)."""
    backs = [r for r in records if r.role == Role.TAKEN_BACK]
    queued = {r.changed for r in backs}
    kept = {k: getattr(bundle, k) for k in knobs}
    for knob in knobs:
        if (knob,) in queued:
            continue
        params = _params(space, {k: v for k, v in kept.items() if k != knob})
        if params is not None:
            return ExpertTrial(params, Role.TAKEN_BACK, (knob,))
    if any(r.under_way for r in backs) or any(r.role == Role.WINNERS for r in records):
        return None
    losers = {k for k in knobs if any(r.changed == (k,) and clearly_faster(r, corner)
                                      for r in backs)}
    if len(losers) < 2:
        return None
    params = _params(space, {k: v for k, v in kept.items() if k not in losers})
    return ExpertTrial(params, Role.WINNERS, tuple(k for k in knobs if k not in losers)) \
        if params is not None else None


def _compiled_best(records: Sequence[TrialRecord], space: SearchSpace) -> ExpertTrial | None:
    """The best configuration so far with torch.compile's default mode, once, where the space
    offers compiling and nothing compiled has been measured yet."""
    if "default" not in space.domains.get("compile_mode", ()) or \
            any(r.role == Role.COMPILED_BEST for r in records) or \
            any(r.config is not None and r.config.compile_mode != "none" for r in records):
        return None
    best = max((r for r in records if r.score and r.config is not None),
               key=lambda r: r.score or 0.0, default=None)
    if best is None:
        return None
    params = space.params_for(best.config.replace(compile_mode="default"))
    return ExpertTrial(params, Role.COMPILED_BEST, ("compile_mode",)) if params else None


def kept_at_baseline(records: Sequence[TrialRecord], space: SearchSpace) -> dict[str, Any]:
    """The Optuna parameters the sampler keeps at the baseline's value: knobs whose every
    value the space offers besides the baseline's was measured alone (from the point the
    corner was measured from) and lost."""
    baseline, _ = _baseline_and_corner(records)
    if baseline is None:
        return {}
    point = bottleneck_point(records, baseline)
    losers: dict[str, set[Any]] = {}
    for r in records:
        if r.role == Role.ONE_CHANGE and r.config is not None and len(r.changed) == 1 and \
                lost(r, point):
            knob = r.changed[0]
            losers.setdefault(knob, set()).add(getattr(r.config, knob))
    kept = {}
    for knob, values in losers.items():
        own, domain = getattr(space.baseline, knob), space.domains[knob]
        if own in domain and set(domain) - {own} <= values:
            kept[knob] = own
    return kept


def _baseline_and_corner(records: Sequence[TrialRecord],
                         ) -> tuple[TrialRecord | None, TrialRecord | None]:
    """The baseline that scored, and the fast corner that settled last (the one that fitted,
    else the smallest tried); None for either while it is missing or under way."""
    baseline = next((r for r in records if r.role == Role.BASELINE and r.score), None)
    corners = [r for r in records if r.role == Role.FAST_CORNER]
    if not corners or any(r.under_way for r in corners) or corners[-1].config is None:
        return baseline, None
    return baseline, corners[-1]


def _params(space: SearchSpace, changes: dict[str, Any]) -> dict[str, Any] | None:
    """The Optuna parameters of the baseline with `changes`, or None where the space holds no
    such configuration (or it is the baseline itself)."""
    config = space.with_changes(changes)
    if config == space.baseline or any(getattr(config, k) != v for k, v in changes.items()):
        return None
    return space.params_for(config)
