"""`stopping`: the search ends when its trials stop finding, on recorded trials."""

from __future__ import annotations

from autotune.search.stopping import NOISE_GAIN, STALE_TRIALS, stopped_finding
from autotune.study.records import Role, TrialRecord
from autotune.trial.protocol import TrialStatus


def _trial(number: int, role: str, value: float | None, status: TrialStatus = TrialStatus.OK,
           duplicate_of: int | None = None) -> TrialRecord:
    return TrialRecord(number, status, value=value, role=role, duplicate_of=duplicate_of)


# The loader-bound model of issue 49: the baseline 354 samples/s, 8 loader workers 1,414 (the
# bottleneck's fix), the fast corner 1,758; then the sampler's trials.
FIRST_MOVES = [_trial(0, Role.BASELINE, 354.0), _trial(1, Role.BOTTLENECK, 1414.0),
               _trial(2, Role.FAST_CORNER, 1758.0)]


def _search(values: list[float | None], start: int = 3) -> list[TrialRecord]:
    return [_trial(start + i, Role.SEARCH, v) for i, v in enumerate(values)]


def test_trials_within_the_noise_of_the_best_end_the_search_and_repeats_do_not_count() -> None:
    """1,790 is within 5% of 1,758: no find. Repeats (as most of that run's 183 trials were),
    a screened trial and an out-of-memory one are no finds either, the repeats not counted."""
    assert STALE_TRIALS == 6 and NOISE_GAIN == 0.05
    stale = _search([1700.0, 1790.0, 1200.0, 900.0])
    stale.append(_trial(7, Role.SEARCH, 400.0, TrialStatus.SCREENED))
    repeats = [_trial(8 + i, Role.SEARCH, 1790.0, duplicate_of=4) for i in range(40)]
    assert stopped_finding(FIRST_MOVES + stale + repeats) is None  # five trials, 40 repeats
    oom = _trial(48, Role.SEARCH, None, TrialStatus.OOM)
    said = stopped_finding(FIRST_MOVES + stale + repeats + [oom])
    assert said == ("the search stopped finding: its last 6 trials came within 5% of the best "
                    "before them, so the rest of the time goes to proving the answer")


def test_a_find_or_an_experts_move_starts_the_count_again() -> None:
    """A trial 5% or more above the best so far is a find; an expert's trial (a follow-up of
    the first moves) is never counted as the sampler's: the count starts again after each."""
    found = _search([1700.0] * 3 + [1900.0] + [1800.0] * (STALE_TRIALS - 1))
    assert stopped_finding(FIRST_MOVES + found) is None
    assert stopped_finding(FIRST_MOVES + found + _search([1800.0], 20)) is not None
    follow_up = _search([1700.0] * 3) + [_trial(6, Role.ONE_CHANGE, 1600.0)] + \
        _search([1700.0] * (STALE_TRIALS - 1), 7)
    assert stopped_finding(FIRST_MOVES + follow_up) is None
    # the first moves alone never end it, however many
    experts = [_trial(3 + i, Role.TAKEN_BACK, 1000.0) for i in range(2 * STALE_TRIALS)]
    assert stopped_finding(FIRST_MOVES + experts) is None
