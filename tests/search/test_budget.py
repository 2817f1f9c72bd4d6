"""`budget`: under the default ten minutes, how the time left is split between search trials
and confirmation rounds, when the budget must grow for an answer, and what is left."""

from __future__ import annotations

import pytest

from autotune.search.budget import answer_budget_s, candidates_that_fit, forecast, plan_time


def test_a_slow_model_grows_the_budget_to_hold_an_answer_and_still_searches() -> None:
    """The full-size rgat on a 2-core CPU: 69 s a trial. Two paired rounds of the best and the
    baseline (276 s) within the confirmation's 30% need a 920 s study, not 600 s; then one
    candidate besides the baseline fits, and search trials run before the confirmation."""
    assert answer_budget_s(69, 0.3) == pytest.approx(920)
    assert candidates_that_fit(960, 69, 0.3, 3) == 1
    plan = plan_time(960, started=0, now=130, trial_s=69, candidates=2, share=0.3,
                     max_rounds=10)
    assert plan.confirm_rounds == 2
    assert plan.search_trials >= 5
    last_search_trial_ends = plan.search_ends_at + plan.trial_s
    assert last_search_trial_ends + 2 * 2 * plan.trial_s <= 960 + 1e-9


def test_with_time_to_spare_the_confirmation_gets_its_share() -> None:
    plan = plan_time(600, started=0, now=20, trial_s=10, candidates=4, share=0.3,
                     max_rounds=10)
    assert plan.search_ends_at == 600 - 180 - 10
    assert plan.confirm_rounds == 1 + (180 - 40) // 20  # a first round of 4, then pairs
    assert plan.search_trials == 40  # starting at 20, 30, ... 410 s
    assert candidates_that_fit(600, 10, 0.3, 3) == 3


def test_when_not_even_one_trial_fits_no_search_trial_is_planned() -> None:
    plan = plan_time(600, started=0, now=500, trial_s=94, candidates=2, share=0.3,
                     max_rounds=10)
    assert plan.search_trials == 0 and plan.confirm_rounds == 1


def test_the_time_left_counts_the_search_and_the_confirmation_within_its_share() -> None:
    left = forecast(now=100, deadline=float("inf"), trials_left=4, trial_s=10, workers=1,
                    candidates=3, rounds=10, share=0.3, searched_s=100)
    assert left.search_s == 40
    # ten rounds of 3 would take 300 s; the share of a 140 s search holds 60 s of them
    assert left.confirm_s == pytest.approx(140 * 0.3 / 0.7)
    assert left.describe().startswith("about 100.00 s left: 4 more search trials (40.00 s)")
    by_time = forecast(now=100, deadline=130, trials_left=None, trial_s=10, workers=1,
                       candidates=2, rounds=3, share=0.3, searched_s=100, ends_by=150)
    assert by_time.search_s == 30 and by_time.confirm_s == 20
