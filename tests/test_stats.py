"""Intervals: the median's from order statistics, a paired speedup's from log ratios."""

from __future__ import annotations

import math
import random

import pytest

from autotune.stats import (
    lag1_correlation,
    load_adjusted_ratio,
    median_interval,
    median_precision,
    paired_ratio,
    rounds_for,
    t975,
)


def test_t_quantiles_match_the_table_and_the_normal_limit() -> None:
    assert t975(1) == 12.706 and t975(10) == 2.228
    assert t975(40) == pytest.approx(2.021, abs=1e-3)
    assert t975(10_000) == pytest.approx(1.96, abs=1e-3)


def test_median_interval_needs_six_values_and_covers_the_median() -> None:
    assert median_interval([1, 2, 3, 4, 5]) is None
    assert median_interval([5, 1, 4, 2, 6, 3]) == (1, 6)  # 1 - 2/64 = 96.9% coverage
    values = list(range(1, 101))
    low, high = median_interval(values)
    assert (low, high) == (40, 61)  # the textbook ranks for n = 100
    rng = random.Random(0)
    covered = 0
    for _ in range(400):
        sample = [rng.gauss(10.0, 1.0) for _ in range(20)]
        low, high = median_interval(sample)
        covered += low <= 10.0 <= high
    assert covered / 400 >= 0.93


def test_median_precision_shrinks_with_more_steps() -> None:
    rng = random.Random(1)
    few = [rng.gauss(0.1, 0.005) for _ in range(10)]
    many = few + [rng.gauss(0.1, 0.005) for _ in range(190)]
    assert median_precision(many) < median_precision(few) < 0.1


def test_a_paired_speedup_and_whether_it_is_a_difference_at_all() -> None:
    faster = paired_ratio([110, 121, 105, 116], [100, 110, 95, 105])
    assert faster.value == pytest.approx(1.1, rel=0.01) and not faster.includes_one
    assert faster.low < faster.value < faster.high
    noise = paired_ratio([100, 97, 104, 99], [99, 101, 100, 102])
    assert noise.includes_one
    one = paired_ratio([120], [100])
    assert one.value == pytest.approx(1.2) and one.low is None and one.includes_one
    # Symmetric on the log scale: swapping the two inverts the interval.
    swapped = paired_ratio([100, 110, 95, 105], [110, 121, 105, 116])
    assert swapped.high == pytest.approx(1 / faster.low) and math.isclose(
        swapped.value * faster.value, 1.0)


def test_a_ratio_that_drifts_over_the_rounds_gets_a_wider_interval() -> None:
    """The same ten round ratios, once drifting from 1.10 to 1.30 over time and once shuffled:
    the drift's consecutive rounds agree more than chance, so they count as fewer rounds."""
    drifting = [1.10 + 0.02 * i for i in range(10)]
    shuffled = [drifting[i] for i in (3, 8, 0, 6, 2, 9, 4, 1, 7, 5)]
    base = [100.0] * 10
    trend = paired_ratio([100 * r for r in drifting], base)
    scattered = paired_ratio([100 * r for r in shuffled], base)
    assert trend.value == pytest.approx(scattered.value)
    assert trend.half_width > 1.5 * scattered.half_width
    assert lag1_correlation(drifting) > 0.5 and lag1_correlation(shuffled) == 0.0
    assert lag1_correlation([1.0, 2.0, 3.0]) == 0.0  # too few rounds to tell


def _steady_load_rounds(rng: random.Random, rounds: int, effect: float,
                        ) -> tuple[list[float], list[float], list[float]]:
    """A 1.5x speedup measured beside a load that stays: each run sees its own share of it
    (0.3 to 0.7 of the cores), and a run's speed falls by `effect` times the share it saw."""
    numerators, denominators, differences = [], [], []
    for _ in range(rounds):
        mine, theirs = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7)
        numerators.append(150 * math.exp(-effect * mine + rng.gauss(0, 0.01)))
        denominators.append(100 * math.exp(-effect * theirs + rng.gauss(0, 0.01)))
        differences.append(mine - theirs)
    return numerators, denominators, differences


def test_a_speedup_beside_a_load_that_stays_is_read_at_equal_load() -> None:
    """Where the load each run saw moves its speed, reading the ratios at equal load takes
    that out: the interval narrows several times and still holds the true 1.5x. Where the load
    moves nothing measurable, it is not read at equal load (that would only widen it)."""
    rng = random.Random(3)
    loaded = _steady_load_rounds(rng, 12, effect=0.8)
    plain, adjusted = paired_ratio(*loaded[:2]), load_adjusted_ratio(*loaded)
    assert adjusted.load_adjusted and not plain.load_adjusted and adjusted.rounds == 12
    assert adjusted.low < 1.5 < adjusted.high
    assert adjusted.half_width < plain.half_width / 3
    inert = [_steady_load_rounds(rng, 12, effect=0.0) for _ in range(100)]
    # the slope's 95% test: about one in twenty inert loads still reads as one
    assert sum(load_adjusted_ratio(*rounds) is not None for rounds in inert) <= 10


def test_too_few_rounds_or_an_even_load_leave_nothing_to_read_at_equal_load() -> None:
    numerators, denominators, differences = _steady_load_rounds(random.Random(4), 4, 0.8)
    assert load_adjusted_ratio(numerators, denominators, differences) is None
    assert load_adjusted_ratio([150.0] * 6, [100.0] * 6, [0.1] * 6) is None
    with pytest.raises(ValueError, match="one load difference per round"):
        load_adjusted_ratio([150.0] * 6, [100.0] * 6, [0.1] * 5)


def test_the_rounds_a_margin_needs_are_foretold_from_the_first_rounds() -> None:
    """Log ratios of spread 4% a round: eight rounds foretell about (1.96 * 4% / 1%)^2 = 61
    rounds for an interval within 1% of the value, and the rounds really drawn that far reach
    about it; a margin twice as wide needs a quarter of them; one round foretells nothing."""
    draw = random.Random(3)
    logs = [draw.gauss(0.05, 0.04) for _ in range(200)]
    ones = [1.0] * len(logs)

    def ratio(n: int):
        return paired_ratio([math.exp(v) for v in logs[:n]], ones[:n])

    foretold = rounds_for(ratio(8), 0.01)
    assert 30 < foretold < 125
    reached = ratio(math.ceil(foretold))
    assert math.log(reached.high / reached.value) < 0.015
    assert foretold / 4 <= rounds_for(ratio(8), 0.02) < foretold / 3  # t's quantile grows
    assert rounds_for(ratio(1), 0.01) == math.inf and rounds_for(ratio(8), 0.0) == math.inf
    assert rounds_for(ratio(8), 1.0) == 8  # reached already: no fewer than measured
