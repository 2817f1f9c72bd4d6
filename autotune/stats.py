"""Figures as samples with an uncertainty: an interval for a median, and for a speedup measured
in paired rounds.

- The median of step times: a distribution-free interval from order statistics (the binomial
  argument: each sample is below the true median with probability 1/2), so a few slow steps
  neither bias it nor need a model of their shape.
- A speedup from paired rounds (candidate and baseline measured in the same round): the
  t-interval of the mean log ratio, whose centre is the geometric mean of the round ratios.
  Logs make "1.5x faster" and "1.5x slower" symmetric, and pairing removes what drifts between
  rounds alike for both; what moves the ratio itself over time counts the rounds as fewer.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
# Two-sided 97.5% quantiles of Student's t for 1 to 30 degrees of freedom.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964
# The least rounds a load-adjusted ratio is fitted on (two parameters, then a spread), and the
# least spread (sum of squares) of their load differences: below it, nothing to regress on.
MIN_ADJUSTED_ROUNDS = 5
MIN_LOAD_SPREAD = 1e-4


def t975(df: int) -> float:
    """Student's t quantile for a two-sided 95% interval: the table up to 30 degrees of freedom,
    then the Cornish-Fisher expansion (within 0.001 there)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def median_interval(values: Sequence[float],
                    confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The order-statistic interval for the median with at least `confidence` coverage, or None
    when there are too few values for it (fewer than 6 at 95%)."""
    ordered = sorted(values)
    n = len(ordered)
    alpha = 1 - confidence
    # The largest k with P(Binomial(n, 1/2) < k) <= alpha / 2: [x_(k), x_(n+1-k)].
    k, below = 0, 0.0
    while k < n and below + math.comb(n, k) / 2**n <= alpha / 2:
        below += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return None
    return ordered[k - 1], ordered[n - k]


def median_precision(values: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """Half the median's interval over the median: 0.02 means known within ±2%."""
    interval = median_interval(values, confidence)
    if interval is None:
        return None
    median = statistics.median(values)
    return (interval[1] - interval[0]) / 2 / median if median > 0 else None


@dataclass(frozen=True)
class Ratio:
    """A speedup from paired rounds: the geometric mean of the round ratios and its 95%
    interval (None with one round); `load_adjusted` where read at equal load
    (`load_adjusted_ratio`)."""

    value: float
    low: float | None
    high: float | None
    rounds: int
    load_adjusted: bool = False

    @property
    def half_width(self) -> float | None:
        """Half the interval relative to the value: 0.03 means ±3%."""
        if self.low is None or self.high is None:
            return None
        return (self.high - self.low) / 2 / self.value

    @property
    def includes_one(self) -> bool:
        """No measurable difference: the interval holds 1.0 (or there is none)."""
        return self.low is None or self.high is None or self.low <= 1.0 <= self.high


def paired_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> Ratio:
    """numerator / denominator per round (rounds in time order), summarised on the log scale.

    Rounds are not independent when the ratio itself moves over time (the machine's speed drifts
    one way for minutes, and not alike for both): consecutive rounds then agree more than
    chance. Their lag-1 autocorrelation counts them as fewer (n (1 - r) / (1 + r) rounds, the
    effective sample size of a time series' mean), which widens the interval; rounds that move
    independently keep it as it was.
    """
    if len(numerators) != len(denominators) or not numerators:
        raise ValueError("paired_ratio needs as many numerators as denominators, at least one")
    logs = [math.log(a / b) for a, b in zip(numerators, denominators)]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return Ratio(math.exp(centre), None, None, 1)
    rounds = len(logs) * (1 - (drift := lag1_correlation(logs))) / (1 + drift)
    half = t975(max(1, math.floor(rounds) - 1)) * statistics.stdev(logs) / math.sqrt(rounds)
    return Ratio(math.exp(centre), math.exp(centre - half), math.exp(centre + half), len(logs))


def rounds_for(ratio: Ratio, log_margin: float) -> float:
    """The rounds in all after which `ratio`'s interval would lie within `log_margin` of its
    value on the log scale, were the spread of its rounds so far to stay: the half-width falls
    as one over the root of the rounds, its t quantile with them. Infinite where there is no
    interval yet (one round) or no margin to reach (<= 0)."""
    if ratio.low is None or ratio.high is None or log_margin <= 0:
        return math.inf
    n = ratio.rounds
    spread = math.log(ratio.high / ratio.low) / 2 / t975(max(1, n - 1))

    def reaches(rounds: int) -> bool:
        return t975(max(1, rounds - 1)) * spread * math.sqrt(n / rounds) <= log_margin

    low, high = n, n
    while not reaches(high):  # doubling, then halving the gap: the least rounds that reach it
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if reaches(middle) else (middle, high)
    return float(high if not reaches(low) else low)


def load_adjusted_ratio(numerators: Sequence[float], denominators: Sequence[float],
                        load_differences: Sequence[float]) -> Ratio | None:
    """numerator / denominator per round at equal load: the rounds' log ratios regressed on
    their load differences (the share of the cores other processes took during the
    numerator's run less during the denominator's), read where the difference is none.

    Beside a load, each run sees its own share of it (a load that stays, or the part of one
    that comes and goes that a pair's runs saw unequally, below what flags a run disturbed),
    and a pair whose runs saw unequal shares moves its ratio by it: the regression takes that
    part out of the spread, narrowing the interval by as much as the load explains. Drift
    counts the rounds as fewer, as in `paired_ratio`. None with fewer than
    `MIN_ADJUSTED_ROUNDS` rounds, differences that do not vary (nothing to regress on), or a
    load that explains nothing measurable (the slope's own 95% interval holds zero): there the
    plain ratio is as good, and reading at equal load would only widen it (one degree of
    freedom less, and the way from the rounds' mean difference to none)."""
    n = len(numerators)
    if not n == len(denominators) == len(load_differences):
        raise ValueError("load_adjusted_ratio needs one load difference per round")
    if n < MIN_ADJUSTED_ROUNDS:
        return None
    logs = [math.log(a / b) for a, b in zip(numerators, denominators)]
    x_mean, y_mean = statistics.fmean(load_differences), statistics.fmean(logs)
    spread = sum((x - x_mean) ** 2 for x in load_differences)
    if spread < MIN_LOAD_SPREAD:
        return None
    slope = sum((x - x_mean) * (y - y_mean) for x, y in zip(load_differences, logs)) / spread
    centre = y_mean - slope * x_mean
    residuals = [y - centre - slope * x for x, y in zip(load_differences, logs)]
    drift = lag1_correlation(residuals)
    rounds = n * (1 - drift) / (1 + drift)
    variance = sum(r * r for r in residuals) / (n - 2)
    t = t975(max(1, math.floor(rounds) - 2))
    if abs(slope) <= t * math.sqrt(variance / spread * n / rounds):
        return None
    half = t * math.sqrt(variance * (1 / n + x_mean ** 2 / spread) * n / rounds)
    return Ratio(math.exp(centre), math.exp(centre - half), math.exp(centre + half), n,
                 load_adjusted=True)



def lag1_correlation(values: Sequence[float]) -> float:
    """How much each value follows the one before (0 with fewer than 4: too few to tell),
    kept within [0, 0.9]: only a drift may widen an interval, and never without bound."""
    if len(values) < 4:
        return 0.0
    mean = statistics.fmean(values)
    spread = sum((v - mean) ** 2 for v in values)
    if spread == 0:
        return 0.0
    follow = sum((a - mean) * (b - mean) for a, b in zip(values, values[1:])) / spread
    return min(0.9, max(0.0, follow))
