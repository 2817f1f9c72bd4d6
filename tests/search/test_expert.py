"""What an expert queues after a fast corner that did not win clearly: each of its changes
alone from the point it was measured from, cheapest and likeliest first, then the winners
together; and a knob whose every value lost alone is kept at the baseline's value. After one
that won clearly: each change taken back from it, then the corner without those that lost in
it."""

from __future__ import annotations

from optuna.trial import FixedTrial

from autotune.config import TrainConfig
from autotune.hardware import DeviceInfo
from autotune.search.expert import (
    clearly_faster,
    kept_at_baseline,
    next_bottleneck_trial,
    next_expert_trial,
    one_change_order,
)
from autotune.search.space import build_space
from autotune.study.bottleneck import Diagnosis, Share
from autotune.study.records import Role, TrialRecord
from autotune.trial.protocol import Measurement, TrialStatus

CPU = DeviceInfo(type="cpu", index=None, name="test CPU", total_memory_bytes=2**34, cpu_count=2,
                 bf16=True, tf32=False, fused_adamw=True, cuda_graphs=False)
# The file's settings: micro-batches of 256, four of them a step, the for-loop AdamW.
BASELINE = TrainConfig(micro_batch_size=256, grad_accum_steps=4)
SPACE = build_space(BASELINE, CPU, 4096, fixes={"compile_mode": "none"})
CORNER = SPACE.fast_corner(1024)  # bf16, fused AdamW, micro-batches of 1024


def record(number: int, config: TrainConfig | None, rate: float | None, role: str = Role.SEARCH,
           changed: tuple[str, ...] = (), status: str = "ok", state: str = "COMPLETE",
           precision: float | None = None) -> TrialRecord:
    waiting = state in ("WAITING", "RUNNING")
    return TrialRecord(
        number=number, status=None if waiting else TrialStatus(status), state=state,
        config=config, role=role, changed=changed,
        value=None if waiting else rate or 0.0,
        constraint=None if waiting else 0.0 if rate else 1.0,
        measurement=Measurement(samples_per_sec=rate, step_time_precision=precision)
        if rate else None)


def started(rate: float = 100.0, corner: float = 95.0) -> list[TrialRecord]:
    return [record(0, BASELINE, rate, Role.BASELINE), record(1, CORNER, corner, Role.FAST_CORNER)]


def run_singles(trials: list[TrialRecord], rates: dict[str, float | None]) -> list[str]:
    """Queue and 'measure' the expert's one-change trials until it queues none; the knobs in
    the order queued."""
    order = []
    while (queued := next_expert_trial(trials, SPACE)) and queued.role == Role.ONE_CHANGE:
        (knob,) = queued.changed
        config = SPACE.with_changes({knob: getattr(CORNER, knob)})
        assert SPACE.params_for(config) == queued.params
        trials.append(record(len(trials), config, rates[knob], Role.ONE_CHANGE, queued.changed,
                             status="ok" if rates[knob] else "oom"))
        order.append(knob)
    return order


def test_the_corners_changes_are_ordered_cheap_and_likely_first_compile_last() -> None:
    corner = BASELINE.replace(compile_mode="default", micro_batch_size=1024, grad_accum_steps=1,
                              precision="bf16", optimizer_impl="fused", num_workers=2,
                              memory_format="channels_last", pin_memory=True)
    assert one_change_order(BASELINE, corner) == [
        "optimizer_impl", "num_workers", "precision", "memory_format", "micro_batch_size",
        "compile_mode", "pin_memory"]
    assert one_change_order(BASELINE, BASELINE) == []


def _take_back(trials: list[TrialRecord], rates: dict[str, float]) -> list[str]:
    """Queue and 'measure' the corner with each change taken back until none is queued."""
    order = []
    while (queued := next_expert_trial(trials, SPACE)) and queued.role == Role.TAKEN_BACK:
        (knob,) = queued.changed
        back = {k: getattr(CORNER, k) for k in ("optimizer_impl", "precision",
                                                "micro_batch_size") if k != knob}
        assert SPACE.suggest(FixedTrial(queued.params)) == SPACE.with_changes(back)
        trials.append(record(len(trials), None, rates[knob], Role.TAKEN_BACK, queued.changed))
        order.append(knob)
    return order


def test_a_corner_that_wins_clearly_has_each_change_taken_back_then_its_losers_left_out() -> None:
    """The corner (fused AdamW, bf16, micro-batches of 1024) at 300 against the baseline's 100:
    each change is taken back from it in turn, in the same order. Without fused AdamW it runs
    at 250 and without the micro-batch at 110 (they carry it), without bf16 at 400: one loser
    alone, which its own trial already measured. Where bf16 and fused AdamW both lose in it,
    the corner without both follows."""
    trials = started(corner=300.0)
    rates = {"optimizer_impl": 250.0, "precision": 400.0, "micro_batch_size": 110.0}
    assert _take_back(trials, rates) == ["optimizer_impl", "precision", "micro_batch_size"]
    assert next_expert_trial(trials, SPACE) is None
    trials = started(corner=300.0)
    _take_back(trials, {**rates, "optimizer_impl": 350.0})
    together = next_expert_trial(trials, SPACE)
    assert (together.role, together.changed) == (Role.WINNERS, ("micro_batch_size",))
    assert SPACE.suggest(FixedTrial(together.params)) == \
        SPACE.with_changes({"micro_batch_size": 1024})
    trials.append(record(len(trials), None, 420.0, Role.WINNERS, together.changed))
    assert next_expert_trial(trials, SPACE) is None


def test_nothing_is_queued_before_the_baseline_and_corner_have_run() -> None:
    baseline = record(0, BASELINE, 100.0, Role.BASELINE)
    assert next_expert_trial([], SPACE) is None
    assert next_expert_trial([baseline], SPACE) is None
    running = record(1, None, None, Role.FAST_CORNER, state="RUNNING")
    assert next_expert_trial([baseline, running], SPACE) is None


def test_a_losing_corner_is_split_into_each_change_alone_from_the_baseline() -> None:
    trials = started(corner=95.0)
    # One queued at a time, each once: a waiting one-change trial sends the next knob.
    first = next_expert_trial(trials, SPACE)
    assert (first.role, first.changed) == (Role.ONE_CHANGE, ("optimizer_impl",))
    waiting = [*trials, record(2, None, None, Role.ONE_CHANGE, ("optimizer_impl",),
                               state="WAITING")]
    assert next_expert_trial(waiting, SPACE).changed == ("precision",)
    order = run_singles(trials, {"optimizer_impl": 160.0, "precision": 70.0,
                                 "micro_batch_size": 99.0})
    assert order == ["optimizer_impl", "precision", "micro_batch_size"]
    for single in trials[2:]:  # one knob changed, the rest the baseline's
        changed = {k for k, v in single.config.to_dict().items()
                   if v != getattr(BASELINE, k) and k != "grad_accum_steps"}
        assert changed == set(single.changed)
    assert trials[4].config.grad_accum_steps == 1  # the effective batch kept
    # Only fused AdamW won alone: nothing to combine, the sampler roams.
    assert next_expert_trial(trials, SPACE) is None


def test_the_changes_that_won_alone_are_measured_together_once() -> None:
    trials = started(corner=100.0)
    run_singles(trials, {"optimizer_impl": 160.0, "precision": 60.0, "micro_batch_size": 130.0})
    together = next_expert_trial(trials, SPACE)
    assert (together.role, together.changed) == (Role.WINNERS,
                                                  ("optimizer_impl", "micro_batch_size"))
    config = SPACE.with_changes({"optimizer_impl": "fused", "micro_batch_size": 1024})
    assert together.params == SPACE.params_for(config) and config.precision == "fp32"
    trials.append(record(5, config, 200.0, Role.WINNERS, together.changed))
    assert next_expert_trial(trials, SPACE) is None


def test_the_winners_wait_for_every_single_to_settle() -> None:
    trials = started()
    run_singles(trials, {"optimizer_impl": 160.0, "precision": 60.0, "micro_batch_size": 130.0})
    last = trials[-1]
    trials[-1] = record(last.number, None, None, Role.ONE_CHANGE, last.changed, state="RUNNING")
    assert next_expert_trial(trials, SPACE) is None


def test_a_corner_is_judged_against_the_bottleneck_fix_it_was_measured_from() -> None:
    """Fused AdamW alone, the bottleneck's fix, runs at 500 against the baseline's 100; the
    corner (which bundles it) at 130 beats the baseline but loses to the fix: its changes are
    split, not taken back from a corner that lost, each alone from the fix (one_pays at
    96d7a3f: from the baseline, each was screened out beside a micro-batch 3x faster), the
    fix's own change not again, and the winners go together with the fix."""
    fused = SPACE.with_changes({"optimizer_impl": "fused"})
    trials = [record(0, BASELINE, 100.0, Role.BASELINE),
              record(1, fused, 500.0, Role.BOTTLENECK, ("optimizer_impl",)),
              record(2, CORNER, 130.0, Role.FAST_CORNER)]
    order = []
    while (queued := next_expert_trial(trials, SPACE)).role == Role.ONE_CHANGE:
        (knob,) = queued.changed
        config = SPACE.with_changes({"optimizer_impl": "fused", knob: getattr(CORNER, knob)})
        assert SPACE.params_for(config) == queued.params
        trials.append(record(len(trials), config, 600.0, Role.ONE_CHANGE, queued.changed))
        order.append(knob)
    assert order == ["precision", "micro_batch_size"]
    assert queued.role == Role.WINNERS and SPACE.params_for(SPACE.with_changes(
        {"optimizer_impl": "fused", "precision": "bf16", "micro_batch_size": 1024})) == \
        queued.params
    trials = trials[:3]
    trials[1] = record(1, fused, 120.0, Role.BOTTLENECK, ("optimizer_impl",))
    assert next_expert_trial(trials, SPACE).role == Role.TAKEN_BACK


def test_a_change_far_slower_beside_the_same_trial_without_it_is_not_measured_again() -> None:
    """A trial of fused AdamW and micro-batches of 1024 runs within the noise of the baseline;
    the corner, that and bf16, at a tenth of it: bf16 was measured alone there. Its one-change
    trial is the corner again (a repeat, no process), and bf16 lost alone: fp32 is kept. Where
    the trial without bf16 beat the baseline beyond the noise, or the corner lost only 30% to
    it, bf16 is measured alone from the baseline."""
    beside = SPACE.with_changes({"optimizer_impl": "fused", "micro_batch_size": 1024})
    trials = [record(0, BASELINE, 100.0, Role.BASELINE), record(1, beside, 102.0),
              record(2, CORNER, 10.0, Role.FAST_CORNER)]
    alone = {"optimizer_impl": SPACE.with_changes({"optimizer_impl": "fused"}),
             "micro_batch_size": SPACE.with_changes({"micro_batch_size": 1024})}
    order = []
    while (queued := next_expert_trial(trials, SPACE)) and queued.role == Role.ONE_CHANGE:
        (knob,) = queued.changed
        config = SPACE.suggest(FixedTrial(queued.params))
        assert config == alone.get(knob, CORNER)
        trials.append(record(len(trials), config, 10.0 if knob == "precision" else 101.0,
                             Role.ONE_CHANGE, queued.changed))
        order.append(knob)
    assert order == ["optimizer_impl", "precision", "micro_batch_size"]
    assert kept_at_baseline(trials, SPACE) == {"precision": "fp32"}
    for faster_beside, corner in ((130.0, 10.0), (102.0, 70.0)):
        trials = [record(0, BASELINE, 100.0, Role.BASELINE), record(1, beside, faster_beside),
                  record(2, CORNER, corner, Role.FAST_CORNER),
                  record(3, alone["optimizer_impl"], 101.0, Role.ONE_CHANGE,
                         ("optimizer_impl",))]
        queued = next_expert_trial(trials, SPACE)
        assert queued.changed == ("precision",) and SPACE.suggest(FixedTrial(
            queued.params)) == SPACE.with_changes({"precision": "bf16"})


def test_a_corner_inside_the_noise_is_split() -> None:
    assert next_expert_trial(started(corner=104.0), SPACE) is not None
    # Medians known within ±4% each: 8% apart is still noise.
    noisy = [record(0, BASELINE, 100.0, Role.BASELINE, precision=0.04),
             record(1, CORNER, 107.0, Role.FAST_CORNER, precision=0.04)]
    assert not clearly_faster(noisy[1], noisy[0])
    assert next_expert_trial(noisy, SPACE) is not None


def test_a_corner_of_one_change_is_not_split() -> None:
    corner = SPACE.with_changes({"optimizer_impl": "fused"})
    trials = [record(0, BASELINE, 100.0, Role.BASELINE), record(1, corner, 90.0,
                                                                Role.FAST_CORNER)]
    one_knob = build_space(BASELINE, CPU, 4096, fixes={
        "compile_mode": "none", "precision": "fp32", "micro_batch_size": 256})
    assert one_knob.fast_corner(256) == corner
    assert next_expert_trial(trials, one_knob) is None


def test_a_knob_whose_every_value_lost_alone_is_kept_at_the_baselines() -> None:
    trials = started()
    assert kept_at_baseline(trials, SPACE) == {}
    run_singles(trials, {"optimizer_impl": 80.0, "precision": 60.0, "micro_batch_size": None})
    # bf16 was this space's one other precision: kept at fp32. Fused AdamW lost too, but
    # foreach was never tried alone; and one micro-batch that did not fit says nothing of
    # the others.
    assert kept_at_baseline(trials, SPACE) == {"precision": "fp32"}
    # A trial stopped by the user says nothing either.
    interrupted = [*started(), record(2, SPACE.with_changes({"precision": "bf16"}), None,
                                      Role.ONE_CHANGE, ("precision",), status="interrupted",
                                      state="FAIL")]
    assert kept_at_baseline(interrupted, SPACE) == {}


COMPILING = build_space(BASELINE, CPU, 4096)


def test_the_best_so_far_is_compiled_once_after_the_corners_changes_are_split() -> None:
    """Compiling, the move the corner leaves out: after the corner's changes alone (fused AdamW
    won, bf16 and the micro-batch lost), the best so far with torch.compile's default mode,
    once; not while one of those trials is under way, nor where a compiled trial has run."""
    corner = COMPILING.fast_corner(1024)
    trials = [record(0, BASELINE, 100.0, Role.BASELINE), record(1, corner, 95.0,
                                                                Role.FAST_CORNER)]
    rates = {"optimizer_impl": 160.0, "precision": 80.0, "micro_batch_size": 90.0}
    while (queued := next_expert_trial(trials, COMPILING)).role == Role.ONE_CHANGE:
        (knob,) = queued.changed
        config = COMPILING.suggest(FixedTrial(queued.params))
        trials.append(record(len(trials), config, rates[knob], Role.ONE_CHANGE, queued.changed))
    assert (queued.role, queued.changed) == (Role.COMPILED_BEST, ("compile_mode",))
    fused = BASELINE.replace(optimizer_impl="fused")
    assert COMPILING.suggest(FixedTrial(queued.params)) == fused.replace(compile_mode="default")
    last = trials[-1]
    running = record(last.number, None, None, Role.ONE_CHANGE, last.changed, state="RUNNING")
    assert next_expert_trial([*trials[:-1], running], COMPILING) is None
    trials.append(record(len(trials), fused.replace(compile_mode="default"), 250.0,
                         Role.COMPILED_BEST, queued.changed))
    assert next_expert_trial(trials, COMPILING) is None
    compiled = [*trials[:2], record(2, BASELINE.replace(compile_mode="default"), 90.0)]
    assert next_expert_trial(compiled, COMPILING) is None or \
        next_expert_trial(compiled, COMPILING).role != Role.COMPILED_BEST


def test_the_bottleneck_is_fixed_first_and_a_moved_bottleneck_sets_the_next_move() -> None:
    """The baseline waits on its loader: its first move is workers, alone from the baseline.
    That wins, and its own diagnosis says the optimizer now dominates: the next move is a fused
    AdamW on top of the workers. That loses: the optimizer's knob is tried once, and with no
    other knob for the dominant share the moves end (the fast corner comes next)."""
    shares = {0: {"data_wait": 0.7, "optimizer": 0.1},
              1: {"data_wait": 0.05, "optimizer": 0.5}}

    def diagnose(r: TrialRecord) -> Diagnosis | None:
        got = shares.get(r.number)
        return None if got is None else Diagnosis(tuple(
            Share(k, v) for k, v in sorted(got.items(), key=lambda kv: -kv[1])))

    def fix(knob: str, current: TrialRecord) -> dict | None:
        return {"num_workers": {"num_workers": 2, "prefetch_factor": 2},
                "optimizer_impl": {"optimizer_impl": "fused"}}.get(knob)

    trials = [record(0, BASELINE, 100.0, Role.BASELINE)]
    first = next_bottleneck_trial(trials, SPACE, diagnose, fix)
    assert first.role == Role.BOTTLENECK and first.changed == ("num_workers",)
    loader = SPACE.with_changes({"num_workers": 2, "prefetch_factor": 2})
    assert first.params == SPACE.params_for(loader)
    trials.append(record(1, loader, 300.0, Role.BOTTLENECK, ("num_workers",)))
    second = next_bottleneck_trial(trials, SPACE, diagnose, fix)
    assert second.changed == ("optimizer_impl",)
    both = SPACE.with_changes({"num_workers": 2, "prefetch_factor": 2,
                               "optimizer_impl": "fused"})
    assert second.params == SPACE.params_for(both)
    trials.append(record(2, both, 290.0, Role.BOTTLENECK, ("optimizer_impl",)))
    assert next_bottleneck_trial(trials, SPACE, diagnose, fix) is None
    # while a move is under way nothing else is queued; with no dominant share, no move
    running = trials[:1] + [record(1, loader, None, Role.BOTTLENECK, ("num_workers",),
                                   state="RUNNING")]
    assert next_bottleneck_trial(running, SPACE, diagnose, fix) is None
    shares[0] = {"compute": 0.9, "data_wait": 0.05}
    assert next_bottleneck_trial(trials[:1], SPACE, diagnose, fix) is None


def test_the_diagnosis_puts_its_knobs_first_among_the_corners_changes() -> None:
    corner = BASELINE.replace(micro_batch_size=1024, grad_accum_steps=1, precision="bf16",
                              optimizer_impl="fused", num_workers=2)
    assert one_change_order(BASELINE, corner, first=("num_workers",)) == [
        "num_workers", "optimizer_impl", "precision", "micro_batch_size"]
