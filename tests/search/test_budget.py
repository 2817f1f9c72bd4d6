"""`budget`: under the default ten minutes, how the time left is split between search trials
and confirmation rounds."""

from __future__ import annotations

from autotune.search.budget import plan_time


def test_a_slow_model_still_gets_a_search_trial_within_the_budget() -> None:
    """The full-size rgat on a 2-core CPU: 94 s a trial, 460 s left after the probe and the
    baseline. Keeping 2 confirmation rounds of 2 runs left no search trial, so the run
    confirmed the baseline against itself and ended with 5 minutes unused."""
    plan = plan_time(600, started=0, now=140, trial_s=94, candidates=2, min_rounds=3,
                     max_rounds=10)
    assert plan.search_trials >= 1
    assert plan.confirm_rounds == 1
    last_search_trial_ends = plan.search_ends_at + plan.trial_s
    assert last_search_trial_ends + plan.confirm_rounds * 2 * plan.trial_s <= 600


def test_with_time_to_spare_the_minimum_rounds_are_kept_for_confirmation() -> None:
    plan = plan_time(600, started=0, now=20, trial_s=10, candidates=2, min_rounds=3,
                     max_rounds=10)
    assert plan.confirm_rounds == 3
    assert plan.search_ends_at == 600 - 3 * 2 * 10 - 10
    assert plan.search_trials == 52  # starting at 20, 30, ... 530 s


def test_when_not_even_one_trial_and_one_round_fit_one_round_is_still_planned() -> None:
    plan = plan_time(600, started=0, now=500, trial_s=94, candidates=2, min_rounds=3,
                     max_rounds=10)
    assert plan.confirm_rounds == 1
    assert plan.search_trials == 0
