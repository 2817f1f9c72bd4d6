"""The minimal answer: each change of the race's recommendation taken back in turn, in the same
paired rounds, so that the answer carries only the changes shown to pay.

A bundle that wins may carry changes that do nothing here (foreach AdamW, channels-last and
torch.compile riding along with the loader workers that did the work). A change
(`config.changes`: the micro-batch with its accumulation, the DataLoader's settings, each other
knob on its own) is judged by the configuration without it against the one with it, paired by
round (`judge`): measurably slower without it, the change pays and is kept; no measurable
difference, faster without it, or too few rounds to show that it pays, it is dropped.
`search.confirm` measures the configurations without each change and decides what the answer
keeps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autotune.config import CHANGE_GROUPS, TrainConfig, changes, taken_back
from autotune.formatting import describe_changes
from autotune.search.space import SearchSpace
from autotune.stats import Ratio, rounds_for
from autotune.study.confirmation import (
    FAILS,
    HURTS,
    NO_TIME,
    NOISE,
    NOT_SHOWN,
    PAYS,
    UNJUDGED,
    TakenBack,
)

# A change is dropped on at least this many paired rounds, and where taking it back costs at
# most `DROP_BOUND` for sure (its interval's low end): a wider interval (too few rounds, or a
# drifting machine that counts them as fewer) would have every change look inside the noise,
# the one doing the work too. Kept on any rounds that show it pays.
JUDGE_ROUNDS = 3
DROP_BOUND = 0.05
# Why a change was kept unjudged where the space holds none without it.
OUTSIDE = "the search space holds no configuration without it (--fix, --space or the batch)"
# The changes of the best a time plan prices taken back: a winner rarely makes more (where it
# does, the rest are taken back as the time allows).
PRICED_CHANGES = 4


def priced_changes(space: SearchSpace) -> int:
    """How many changes of the best the confirmation's price counts taken back, before a best
    is measured: those the space can make from the baseline (a knob, or a group of
    `CHANGE_GROUPS`, with another value to take), at most `PRICED_CHANGES`; none where it can
    make one only (the race itself takes that one back)."""
    grouped = {knob: group for group in CHANGE_GROUPS for knob in group}
    offered = {grouped.get(knob, (knob,)) for knob, values in space.domains.items()
               if len(values) > 1}
    return min(len(offered), PRICED_CHANGES) if len(offered) > 1 else 0


def best_changes_priced(best: TrainConfig, baseline: TrainConfig, space: SearchSpace) -> int:
    """How many changes of a measured best the confirmation's price counts taken back: those
    the space can take back, at most `PRICED_CHANGES`; none of a best of one change."""
    backs = take_backs(best, baseline, space)
    held = sum(back.config is not None for back in backs) if len(backs) > 1 else 0
    return min(held, PRICED_CHANGES)


@dataclass(frozen=True)
class TakeBack:
    """One change of a configuration (its knobs, in words) and that configuration without it,
    or None where the search space cannot hold it (`why`)."""

    knobs: tuple[str, ...]
    change: str
    config: TrainConfig | None
    why: str = ""


def take_backs(config: TrainConfig, baseline: TrainConfig,
               space: SearchSpace | None) -> list[TakeBack]:
    """Each change of `config` from the baseline, with `config` less it (in the space, where
    one is given)."""
    out = []
    for change in changes(config, baseline):
        without = taken_back(config, change, baseline)
        words = describe_changes(config, without)
        held = in_space(without, space)
        out.append(TakeBack(change, words, held, "" if held else OUTSIDE))
    return out


def without_all(config: TrainConfig, backs: Sequence[TakeBack], baseline: TrainConfig,
                space: SearchSpace | None) -> TrainConfig | None:
    """`config` less every change of `backs` (in the space, where one is given)."""
    for back in backs:
        config = taken_back(config, back.knobs, baseline)
    return in_space(config, space)


def in_space(config: TrainConfig, space: SearchSpace | None) -> TrainConfig | None:
    """`config` where the space holds it; its micro-batch at the accumulation the space pairs
    it with (nearest its own: a --global-batch-size other than the baseline's); else None."""
    if space is None or space.contains(config):
        return config
    if config.micro_batch_size in space.domains["micro_batch_size"]:
        low, high = space.accum_range(config.micro_batch_size)
        nearer = config.replace(grad_accum_steps=min(max(config.grad_accum_steps, low), high))
        if space.contains(nearer):
            return nearer
    return None


def judge(back: TakeBack, ratio: Ratio | None, ran: bool, capped: str = NO_TIME,
          failed: str = "") -> TakenBack:
    """What taking `back` back showed: `ratio` is the configuration without the change over the
    one with it, paired by round (None: not measured); `ran`, whether it ran in every round;
    `failed`, why a check ruled it out (`search.checks`: the change is then kept, as where it
    did not run). Measurably slower without it, on any number of rounds: the change pays and
    is kept; only what pays is. Not, on at least `JUDGE_ROUNDS` and within `DROP_BOUND` for
    sure: it is dropped as inside the noise (or as faster without it); on fewer rounds, or a
    wider interval, it is left out as not shown to pay, its measured effect said. Never
    measured, it is kept unjudged, for what `capped` the rounds (`NO_TIME` or `NO_ROUNDS`)."""
    if back.config is None:
        return TakenBack(back.change, back.knobs, None, UNJUDGED, why=back.why)
    if failed:
        return TakenBack(back.change, back.knobs, back.config, FAILS, why=failed)
    if not ran:
        return TakenBack(back.change, back.knobs, back.config, FAILS)
    if ratio is None or ratio.rounds == 0:
        return TakenBack(back.change, back.knobs, back.config, UNJUDGED, why=capped)
    interval = (ratio.low, ratio.high) if ratio.low is not None and ratio.high is not None \
        else None
    found = TakenBack(back.change, back.knobs, back.config, UNJUDGED, ratio.value, interval,
                      ratio.rounds, capped)
    if interval is not None and interval[1] < 1.0:
        return replace(found, outcome=PAYS, why="")
    if interval is None or ratio.rounds < JUDGE_ROUNDS or interval[0] < 1.0 - DROP_BOUND:
        return replace(found, outcome=NOT_SHOWN, why="")
    return replace(found, outcome=HURTS if interval[0] > 1.0 else NOISE, why="")


def decided(ratio: Ratio | None) -> bool:
    """Whether more rounds could still change what `judge` says of a change measured at
    `ratio`: shown to pay, or shown not to (on `JUDGE_ROUNDS` and within `DROP_BOUND`)."""
    if ratio is None or ratio.low is None or ratio.high is None:
        return False
    return ratio.high < 1.0 or (ratio.rounds >= JUDGE_ROUNDS and ratio.low >= 1.0 - DROP_BOUND)


def rounds_to_judge(ratio: Ratio | None) -> float:
    """The rounds in all after which the change measured at `ratio` would be `decided`, were
    its rounds' spread to stay (`stats.rounds_for`): the sooner of shown to pay (a ratio below
    1) and shown not to (above 1 - `DROP_BOUND`); infinite where neither can be (one round, or
    a ratio at the bound), so the rounds can stop where the time left holds too few."""
    if ratio is None:
        return math.inf
    if decided(ratio):
        return float(ratio.rounds)
    log_value = math.log(ratio.value)
    pays = rounds_for(ratio, -log_value)
    not_pays = rounds_for(ratio, log_value - math.log(1.0 - DROP_BOUND))
    return max(float(JUDGE_ROUNDS), min(pays, not_pays))
