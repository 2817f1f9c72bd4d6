"""The minimal answer's parts: each change of a configuration taken back within the search
space, a change judged on its paired ratio, and the changes a time plan prices (the space's
before a best is measured, the best's own after)."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.search.minimal import (
    DROP_BOUND,
    JUDGE_ROUNDS,
    OUTSIDE,
    PRICED_CHANGES,
    best_changes_priced,
    decided,
    judge,
    priced_changes,
    rounds_to_judge,
    take_backs,
    without_all,
)
from autotune.search.space import build_space
from autotune.stats import Ratio
from autotune.study.confirmation import (
    FAILS,
    HURTS,
    NO_ROUNDS,
    NOISE,
    NOT_SHOWN,
    PAYS,
    UNJUDGED,
)

from .test_space import CPU6

BASE = TrainConfig(micro_batch_size=8, grad_accum_steps=4)  # effective batch 32


def test_each_change_is_taken_back_within_the_space_and_the_batch_keeps_its_size() -> None:
    """Under --global-batch-size 64 the baseline's micro-batch runs with accumulation 8, not
    its own 4: taking the micro-batch back keeps the study's batch. A knob the user fixed
    cannot be taken back, and says why."""
    space = build_space(BASE, CPU6, 1024, global_batch=64, fixes={"precision": "bf16"})
    best = TrainConfig(micro_batch_size=32, grad_accum_steps=2, precision="bf16",
                       optimizer_impl="fused", num_workers=2, prefetch_factor=2)
    backs = {b.change: b for b in take_backs(best, BASE, space)}
    assert list(backs) == ["micro-batch 32 x 2", "bf16", "fused AdamW",
                           "2 loader workers, prefetch 2"]
    assert backs["micro-batch 32 x 2"].config == best.replace(micro_batch_size=8,
                                                              grad_accum_steps=8)
    assert backs["bf16"].config is None and backs["bf16"].why == OUTSIDE
    assert backs["2 loader workers, prefetch 2"].config == \
        best.replace(num_workers=0, prefetch_factor=None)
    assert without_all(best, [backs["fused AdamW"], backs["2 loader workers, prefetch 2"]],
                       BASE, space) == best.replace(optimizer_impl="for_loop", num_workers=0,
                                                    prefetch_factor=None)
    assert priced_changes(space) == PRICED_CHANGES  # the batch, loader, AdamW, compile...
    assert priced_changes(build_space(BASE, CPU6, 1024, fixes={
        "precision": "fp32", "optimizer_impl": "for_loop", "num_workers": 0,
        "compile_mode": "none", "micro_batch_size": 8})) == 0
    # once a best is measured, its own changes are priced: three the space takes back (not
    # the fixed bf16), none of a best of one change (the race takes it back)
    assert best_changes_priced(best, BASE, space) == 3
    assert best_changes_priced(BASE.replace(optimizer_impl="fused"), BASE, space) == 0


def test_a_change_is_kept_only_when_it_is_shown_to_pay() -> None:
    """Measurably slower without it, on any rounds: it pays. Inside the noise or faster
    without it: dropped as such, on `JUDGE_ROUNDS` rounds at least and where it costs
    `DROP_BOUND` at most for sure; measured, but on fewer rounds or a wider interval: left out
    as not shown to pay, with its measured effect. Never measured: kept unjudged."""
    back = take_backs(BASE.replace(precision="bf16", optimizer_impl="fused"), BASE, None)[1]
    assert back.change == "fused AdamW"
    assert judge(back, Ratio(0.7, 0.5, 0.9, 2), True).outcome == PAYS
    noise = judge(back, Ratio(0.996, 0.98, 1.012, JUDGE_ROUNDS), True)
    assert noise.outcome == NOISE and not noise.kept and noise.rounds == JUDGE_ROUNDS
    assert judge(back, Ratio(1.05, 1.02, 1.08, 12), True).outcome == HURTS
    early = judge(back, Ratio(1.0, 0.6, 1.6, 2), True)
    assert early.outcome == NOT_SHOWN and not early.kept and early.ratio == 1.0
    # issue 49's bf16: 12.5% slower without it [-6.6%, +28.1%] in 15 rounds: not shown to pay
    bf16 = judge(back, Ratio(0.875, 0.719, 1.066, 15), True, NO_ROUNDS)
    assert bf16.outcome == NOT_SHOWN and bf16.why == "" and not bf16.kept
    assert bf16.describe() == ("taking back fused AdamW cost 12.5% [-6.6%, +28.1%], not shown "
                               "to pay here: left out")
    assert judge(back, Ratio(0.97, 1 - DROP_BOUND, 1.01, 12), True).outcome == NOISE
    assert judge(back, None, True).outcome == UNJUDGED
    assert judge(back, Ratio(1.0, 0.9, 1.1, 4), False).outcome == FAILS


def test_a_change_is_decided_once_more_rounds_could_not_change_its_judgement() -> None:
    """Recorded rounds of three changes: one that pays 10% (slower without it, within ±3%),
    one inside the noise within the drop bound, and one of 10% still measured ±12%: the first
    two are decided; the third is foretold to be judged within about (12/10)^2 times its
    rounds, far sooner than a change at 2% as wide; one round decides
    nothing."""
    pays = Ratio(0.90, 0.873, 0.927, 6)
    noise = Ratio(1.00, 0.97, 1.03, 6)
    open_ten = Ratio(0.90, 0.79, 1.01, 6)
    open_two = Ratio(0.98, 0.87, 1.10, 6)
    assert decided(pays) and decided(noise)
    assert not decided(open_ten) and not decided(open_two) and not decided(None)
    assert rounds_to_judge(pays) == 6
    assert 6 < rounds_to_judge(open_ten) < 12
    assert rounds_to_judge(open_two) > 5 * rounds_to_judge(open_ten)
    assert rounds_to_judge(Ratio(0.9, None, None, 1)) == float("inf")
    # fewer than JUDGE_ROUNDS never drops, however narrow
    assert not decided(Ratio(1.0, 0.99, 1.01, JUDGE_ROUNDS - 1))
