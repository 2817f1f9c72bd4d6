"""`budget`: under the default ten minutes, how the time left is split between search trials
and confirmation rounds, what a confirmation run costs, when the budget must grow for an
answer, and what is left."""

from __future__ import annotations

from dataclasses import replace

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.options import MeasureSettings
from autotune.search.budget import (
    ANSWER_CHECKED,
    FIRST_COMPILE_PRIOR_S,
    FIRST_MOVE_SLACK,
    FIRST_MOVES,
    MAX_GROWTH,
    ConfirmationPrice,
    answer_budget_s,
    candidates_that_fit,
    check_prices,
    compile_seconds,
    compile_start_s,
    confirmation_price,
    forecast,
    grow_budget,
    plan_time,
    round_run_seconds,
    run_price_s,
    search_compile_s,
    search_trial_seconds,
    startup_note,
)
from autotune.search.confirm import CLAIM_SETTLE_S
from autotune.study.records import TrialKey
from autotune.study.storage import open_storage
from autotune.trial.protocol import SCANNED, Measurement, PhaseTimes, SampleSizes, ScriptAnswer


def test_a_slow_model_grows_the_budget_to_hold_an_answer_and_still_searches() -> None:
    """The full-size rgat on a 2-core CPU without native bf16: 112 s a trial, 75 s a
    confirmation run (a short window, no screening). Three paired rounds of the best and the
    baseline (450 s) within the confirmation's 30% need a 1500 s study, not 600 s; then one
    candidate besides the baseline fits, and search trials run before the confirmation."""
    assert answer_budget_s(ConfirmationPrice(75), 0.3) == pytest.approx(1500)
    assert candidates_that_fit(1500, ConfirmationPrice(75), 0.3, 3) == 1
    plan = plan_time(1500, started=0, now=230, trial_s=112,
                     price=ConfirmationPrice(75), candidates=2,
                     share=0.3, max_rounds=10)
    assert plan.confirm_rounds == 3
    assert plan.search_trials == 7
    assert plan.search_ends_at + plan.trial_s + 6 * 75 <= 1500 + 1e-9


def test_the_default_budget_grows_at_most_three_times_and_says_what_an_answer_needs() -> None:
    """The issue's run: a confirmation run priced at 4.1 min needs an 82 min study for three
    paired rounds within 30%; the 10 min default grows to 30 min, no more, and says once that
    the interval may stay unknown and which --timeout would answer it."""
    growth = grow_budget(600, ConfirmationPrice(246), 0.3)
    assert growth.needed_s == pytest.approx(4920)
    assert growth.budget_s == MAX_GROWTH * 600 == 1800
    assert growth.grew and growth.short
    # the search's share of the 82 min an answer needs, to the minute: 57.4 -> 58 min
    assert growth.answering_flag == "--timeout 58m"
    said = growth.describe(ConfirmationPrice(246))
    assert "grows from 10.0 min to 30.0 min (3x, the most it grows)" in said
    assert "--timeout 58m, the search's time before the confirmation, would answer it" in said
    # README command 1 on a quiet machine: 68 s runs need 23 min, within the cap
    quiet = grow_budget(600, ConfirmationPrice(68.41), 0.3)
    assert quiet.budget_s == 23 * 60 and quiet.grew and not quiet.short
    assert "room for 3 paired rounds" in quiet.describe(ConfirmationPrice(68.41))
    # a fast model keeps the default, and there is nothing to say
    fast = grow_budget(600, ConfirmationPrice(5), 0.3)
    assert fast.budget_s == 600 and not fast.grew and fast.describe(ConfirmationPrice(5)) == ""


def test_a_given_budget_never_grows_and_names_the_budget_that_would_answer() -> None:
    """`--budget 4m` with 68 s runs: an answer needs 23 min; the run keeps its 4 min and says
    that `--budget 23m` (the whole run, not the search's --timeout) would answer it."""
    growth = grow_budget(240, ConfirmationPrice(68.41), 0.3, may_grow=False)
    assert growth.budget_s == 240 and not growth.grew and growth.short
    assert growth.answering_flag == "--budget 23m"
    said = growth.describe(ConfirmationPrice(68.41))
    assert "more than --budget 4.0 min" in said and "(--budget 23m would answer it)" in said
    roomy = grow_budget(1800, ConfirmationPrice(5), 0.3, may_grow=False)
    assert roomy.budget_s == 1800 and not roomy.short and roomy.describe(ConfirmationPrice(5)) == ""


def test_with_time_to_spare_the_confirmation_gets_its_share() -> None:
    plan = plan_time(600, started=0, now=20, trial_s=10,
                     price=ConfirmationPrice(6), candidates=4, share=0.3,
                     max_rounds=10)
    assert plan.search_ends_at == 600 - 180 - 10
    assert plan.confirm_rounds == 10  # a first round of 4 runs, then pairs, to the cap
    assert plan.search_trials == 40  # starting at 20, 30, ... 410 s
    assert candidates_that_fit(600, ConfirmationPrice(6), 0.3, 3) == 3


def test_the_experts_first_moves_come_before_the_proof_and_a_run_always_tries_one() -> None:
    """README command 1 of issue 49: rgat at 110 s a trial, its baseline done 145 s into a 30
    min budget, its proof (rounds, the best less each change, worst batches and loss runs)
    priced above the time left. The first moves still get their three trials, the proof the
    rest, and the last of them may start half a trial late (at 51441a4 the third missed its
    start by 6 s: the tuner's seconds between trials); with room for one trial and not the
    proof's least rounds, one trial is tried (a proof with nothing to prove is no answer);
    with room for none, none."""
    costly = ConfirmationPrice(75, turn_s=5.0, taken_back=4, worst_s=100.0, loss_s=120.0,
                               loss_changes=1)
    assert costly.seconds(2, costly.least_rounds(3)) > 1800 - 145
    plan = plan_time(1800, started=0, now=145, trial_s=110, price=costly, candidates=2,
                     share=0.3, max_rounds=10)
    assert plan.search_trials == FIRST_MOVES == 3
    assert plan.search_ends_at == 145 + (FIRST_MOVES - 1 + FIRST_MOVE_SLACK) * 110
    tight = plan_time(600, started=0, now=500, trial_s=94, price=ConfirmationPrice(60),
                      candidates=2, share=0.3, max_rounds=10)
    assert tight.search_trials == 1 and tight.confirm_rounds == 1
    none = plan_time(600, started=0, now=550, trial_s=94, price=ConfirmationPrice(60),
                     candidates=2, share=0.3, max_rounds=10)
    assert none.search_trials == 0


def test_a_plan_made_anew_keeps_the_first_moves_left_and_prices_only_checks_needed() -> None:
    """The tuner makes the plan anew after each trial: the first moves left keep their start
    (the second of three, made after the first, ends the search where the first plan did),
    none left lets the proof have its share, and a price without the loss runs no candidate
    needs gives the search their time."""
    price = ConfirmationPrice(75, turn_s=5.0, taken_back=2, worst_s=100.0, loss_s=120.0)
    first = plan_time(1800, started=0, now=145, trial_s=110, price=replace(price, loss_changes=1),
                      candidates=2, share=0.3, max_rounds=10)
    again = plan_time(1800, started=0, now=255, trial_s=110, price=replace(price, loss_changes=1),
                      candidates=2, share=0.3, max_rounds=10, first_moves=FIRST_MOVES - 1)
    assert again.search_ends_at == first.search_ends_at
    done = plan_time(1800, started=0, now=475, trial_s=110, price=replace(price, loss_changes=1),
                     candidates=2, share=0.3, max_rounds=10, first_moves=0)
    assert done.search_trials == 0 and done.search_ends_at < 475
    needed = plan_time(3600, started=0, now=475, trial_s=110, price=replace(
        price, loss_changes=1), candidates=2, share=0.3, max_rounds=10, first_moves=0)
    unneeded = plan_time(3600, started=0, now=475, trial_s=110, price=price, candidates=2,
                         share=0.3, max_rounds=10, first_moves=0)
    assert unneeded.search_ends_at - needed.search_ends_at == pytest.approx(
        replace(price, loss_changes=1).checks_s(2) - price.checks_s(2)) == 360.0


def test_the_checks_are_priced_for_the_configurations_that_can_be_the_answer() -> None:
    """Of three candidates and the best less each of four changes, the baseline and
    `ANSWER_CHECKED` more are checked, whatever the race's size: the others are checked only
    where they become the answer."""
    price = ConfirmationPrice(10, taken_back=4, worst_s=100.0, loss_s=10.0, loss_changes=1)
    assert ANSWER_CHECKED == 2
    assert price.checks_s(3) == price.checks_s(2) == 3 * 100.0 + (1 + 2) * 10.0
    assert replace(price, taken_back=0).checks_s(2) == 2 * 100.0 + (1 + 1) * 10.0


def test_the_time_left_counts_the_search_and_the_confirmation_within_its_share() -> None:
    left = forecast(now=100, deadline=float("inf"), trials_left=4, trial_s=10,
                   price=ConfirmationPrice(10),
                    workers=1, candidates=3, rounds=3, max_rounds=10, share=0.3,
                    searched_s=100)
    assert left.search_s == 40
    # the least 3 rounds (3 runs, then the best and the baseline twice: 70 s) are above the
    # share of a 140 s search (60 s), and always run, after the confirmation's claim settles
    assert CLAIM_SETTLE_S == 1.0
    assert left.confirm_s == 71
    assert left.rounds == 3
    assert left.describe() == ("about 111.00 s left: 4 more search trials (40.00 s), then "
                               "about 3 confirmation rounds, the first of 3 runs (71.00 s)")
    longer = forecast(now=100, deadline=float("inf"), trials_left=4, trial_s=10,
                     price=ConfirmationPrice(10),
                      workers=1, candidates=3, rounds=3, max_rounds=10, share=0.3,
                      searched_s=400)
    # the share of a 440 s search (about 189 s) holds more rounds, up to the cap of 10
    assert longer.confirm_s == pytest.approx(440 * 0.3 / 0.7 + 1) and longer.rounds == 8
    by_time = forecast(now=100, deadline=130, trials_left=None, trial_s=10,
                      price=ConfirmationPrice(5),
                       workers=1, candidates=2, rounds=3, max_rounds=3, share=0.3,
                       searched_s=100, ends_by=150)
    assert by_time.search_s == 30 and by_time.confirm_s == 21
    assert forecast(now=100, deadline=100, trials_left=0, trial_s=10,
                    price=ConfirmationPrice(5), workers=1, candidates=2, rounds=3,
                    max_rounds=3, share=0.3, searched_s=100).describe().startswith(
        "about 31.00 s left: the search done, then about 3 confirmation rounds")


def test_a_confirmation_run_is_priced_from_the_baseline_less_its_long_window(tmp_path) -> None:
    """The baseline's trial of 112 s timed a 54 s window of 10 steps (5.4 s each) after
    screening 3 steps: a round run times 3 steps (16.2 s) and screens nothing. A compiled
    search trial's long start-up does not price the rounds."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s")
    for role, wall in (("baseline", 112.0), ("search", 300.0), ("search", 320.0)):
        trial = study.ask()
        figures = Measurement(samples_per_sec=1.0, window_s=54.0, step_time_median_s=5.4)
        for key, value in {TrialKey.STATUS: "ok", TrialKey.ROLE: role, TrialKey.WALL_S: wall,
                           TrialKey.MEASUREMENT: figures.to_json()}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0)
    expected = 112.0 - 54.0 - 3 * 5.4 + 3 * 5.4
    assert round_run_seconds(study, MeasureSettings()) == pytest.approx(expected)
    # a fast model's window keeps its minimum seconds
    fast = round_run_seconds(study, MeasureSettings(window_seconds=20.0))
    assert fast == pytest.approx(112.0 - 54.0 - 3 * 5.4 + 20.0)


def test_a_confirmation_run_is_priced_from_what_it_does_not_the_trials_detours() -> None:
    """The issue's baseline beside a package install: 288 s of trial, of which two windows
    measured again (120 s), sync tracing (20 s) and the profiler (40 s). A round run starts
    the process (8 s), builds (10 s), takes its first step (5 s), warms up (30 s) and times
    one short window (3 steps of 2 s): 59 s, none of the detours."""
    phases = PhaseTimes(build_s=10.0, first_step_s=5.0, warmup_s=30.0, screen_s=6.0,
                        window_s=40.0, remeasure_s=120.0, sync_tracing_s=20.0,
                        profile_s=40.0)
    figures = Measurement(samples_per_sec=1.0, window_s=40.0, step_time_median_s=2.0,
                          measure_wall_s=phases.total_s, phases=phases)
    wall = 8.0 + phases.total_s
    assert run_price_s(wall, figures, MeasureSettings(window_seconds=1.0)) == \
        pytest.approx(8.0 + 10.0 + 5.0 + 30.0 + 3 * 2.0)
    # the same trial stored before phases were recorded: its wall less its windows
    old = Measurement(samples_per_sec=1.0, window_s=40.0, step_time_median_s=2.0)
    assert run_price_s(wall, old, MeasureSettings(window_seconds=1.0)) == \
        pytest.approx(wall - 40.0 - 3 * 2.0 + 3 * 2.0)


def test_phase_times_cross_the_boundary_and_old_measurements_have_none() -> None:
    phases = PhaseTimes(build_s=1.0, remeasure_s=2.5)
    figures = Measurement(samples_per_sec=3.0, phases=phases)
    again = Measurement.from_json(figures.to_json())
    assert again == figures and again.phases.remeasure_s == 2.5
    stored = figures.to_json()
    del stored["phases"]
    assert Measurement.from_json(stored).phases is None


def test_a_search_trial_is_priced_between_a_full_and_a_screened_one(tmp_path) -> None:
    """Before any search trial, half are taken to be screened (their wall less the window);
    then the share screened so far; with screening off, full trials alone."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s")

    def told(status: str, wall: float, role: str = "search") -> None:
        trial = study.ask()
        figures = Measurement(samples_per_sec=1.0, window_s=6.0)
        for key, value in {TrialKey.STATUS: status, TrialKey.WALL_S: wall,
                           TrialKey.MEASUREMENT: figures.to_json(), TrialKey.ROLE: role}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0)

    told("ok", 10.0, role="baseline")
    assert search_trial_seconds(study, screening=True) == pytest.approx(0.5 * 4 + 0.5 * 10)
    assert search_trial_seconds(study, screening=False) == 10.0
    told("screened", 3.0)
    told("screened", 3.0)
    told("ok", 10.0)
    # 2 of 3 search trials screened: (2 + 1) / (3 + 2) of them at 3 s, the rest at 10 s
    assert search_trial_seconds(study, screening=True) == pytest.approx(0.6 * 3 + 0.4 * 10)


def test_warm_turns_price_the_confirmation_at_the_processes_start_not_at_fresh_rounds() -> None:
    """README command 1 on the quiet machine: a confirmation run of 52.9 s. Priced as fresh
    rounds, three of the best and the baseline need an 18 min study, and the default grew to
    it; the confirmation took warm turns (two processes warmed up, then half-second turns), so
    its least 12 warm rounds cost two starts and a few seconds, and the 10 min default holds
    them, with two candidates besides the baseline."""
    fresh, warm = ConfirmationPrice(52.86), ConfirmationPrice(52.86, turn_s=0.5)
    assert grow_budget(600, fresh, 0.3).budget_s == 18 * 60
    assert warm.least_rounds(3) == 12 and warm.most_rounds(10) == 400
    # two starts, a settling turn each, 12 rounds (the first of both), a profiled turn each
    assert warm.seconds(2, 12) == pytest.approx(2 * 52.86 + (2 + 2 + 2 * 11 + 2) * 0.5)
    kept = grow_budget(600, warm, 0.3)
    assert not kept.grew and kept.describe(warm) == ""
    assert candidates_that_fit(600, warm, 0.3, 3) == 2
    plan = plan_time(600, started=0, now=126, trial_s=93.7, price=warm, candidates=3,
                     share=0.3, max_rounds=10)
    # the share's 180 s: three starts (158.6 s), a settling turn each, the first round's two
    # pairs and the two profiled turns (4.5 s) leave 16.9 s for 16 more rounds of the two
    assert plan.confirm_rounds == 17
    assert plan.describe(600, 3).endswith(
        "then up to 17 paired rounds of warm turns, after 3 processes warm up")
    left = forecast(now=100, deadline=float("inf"), trials_left=0, trial_s=10, price=warm,
                    workers=1, candidates=2, rounds=3, max_rounds=10, share=0.3,
                    searched_s=2000)
    # the share of 2000 s (857 s) would hold more than the warm cap of 400 rounds (508 s)
    assert left.rounds == 400
    assert left.confirm_s == pytest.approx(CLAIM_SETTLE_S + warm.seconds(2, 400))
    assert "about 400 paired rounds of warm turns, after 2 processes warm up" in left.describe()


def test_the_confirmation_is_priced_in_warm_turns_only_where_memory_holds_them(tmp_path) -> None:
    """The baseline's peak decides: where the warm processes' memory holds it, warm turns of its
    step time (half a second at least); else fresh runs."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s")
    trial = study.ask()
    figures = Measurement(samples_per_sec=1.0, window_s=6.0, step_time_median_s=2.0,
                          peak_memory_bytes=3 * 2**30)
    for key, value in {TrialKey.STATUS: "ok", TrialKey.ROLE: "baseline", TrialKey.WALL_S: 20.0,
                       TrialKey.MEASUREMENT: figures.to_json()}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 1.0)
    seen: list[float | None] = []

    def holds_up_to(limit: float):
        def holds(peak: float | None) -> bool:
            seen.append(peak)
            return peak is not None and peak <= limit
        return holds

    roomy = confirmation_price(study, MeasureSettings(), 99.0, holds_up_to(4 * 2**30))
    assert roomy.warm and roomy.turn_s == 2.0 and seen == [3 * 2**30]
    # its wall less its window and screening, and a round's window of 3 steps
    assert roomy.run_s == pytest.approx(20.0 - 6.0 - 3 * 2.0 + 3 * 2.0)
    tight = confirmation_price(study, MeasureSettings(), 99.0, holds_up_to(2 * 2**30))
    assert not tight.warm and tight.run_s == roomy.run_s


def test_a_scripts_start_up_that_is_most_of_its_trial_is_said_once(tmp_path) -> None:
    """A training script whose imports, data and model took 12 s of its 20 s baseline trial:
    one line says every trial pays it; 2 s of 20, or a model file's build, say nothing."""
    def baseline_of(setup_s: float, script: bool) -> optuna.Study:
        study = optuna.create_study(storage=open_storage(None, tmp_path),
                                    study_name=f"s{setup_s}{script}")
        trial = study.ask()
        figures = Measurement(samples_per_sec=1.0, setup_s=setup_s, script_answer=ScriptAnswer(
            "transformers", {}) if script else None)
        for key, value in {TrialKey.STATUS: "ok", TrialKey.ROLE: "baseline",
                           TrialKey.WALL_S: 20.0,
                           TrialKey.MEASUREMENT: figures.to_json()}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0)
        return study

    assert startup_note(baseline_of(12.0, script=True)) == (
        "the script's own start-up (imports, data, model) took 12.00 s of the baseline "
        "trial's 20.00 s: every trial and every fresh confirmation run starts the script "
        "again and pays it")
    assert startup_note(baseline_of(2.0, script=True)) is None
    assert startup_note(baseline_of(12.0, script=False)) is None


def test_the_price_counts_the_best_less_each_change_and_the_short_race_after() -> None:
    """Four changes of the best taken back: in fresh runs the first round runs them too (3 + 4
    runs), every later round the best, the baseline and the four (6 runs), then a short race
    of three configurations for three rounds (9 runs); in warm turns, four more processes
    and their turns, then one more process and the short race's turns. The plan leaves the
    search less time for them, and says they race; the confirmation takes fewer candidates
    where they crowd it; an answer's least budget does not grow for them."""
    bare, backs = ConfirmationPrice(10), ConfirmationPrice(10, taken_back=4)
    assert bare.seconds(3, 3) == (3 + 2 * 2) * 10
    assert backs.seconds(3, 3) == (7 + 6 * 2) * 10 + 9 * 10
    assert backs.rounds_in(backs.seconds(3, 5), 3) == 5
    warm = ConfirmationPrice(10, turn_s=0.5, taken_back=4)
    # six processes: a settling turn each, then 12 rounds of five pairs of turns, two
    # profiled; the short race's process, its three settling turns and 12 rounds of two pairs
    assert warm.seconds(2, 12) == 6 * 10 + (6 + 10 * 12 + 2) * 0.5 + 10 + (3 + 4 * 12) * 0.5
    assert ConfirmationPrice(10, taken_back=1).short_race_s() == 0.0  # nothing to drop twice
    plain = plan_time(600, started=0, now=20, trial_s=10, price=bare, candidates=2,
                      share=0.3, max_rounds=10)
    taking = plan_time(600, started=0, now=20, trial_s=10, price=backs, candidates=2,
                       share=0.3, max_rounds=10)
    # the least rounds with them (270 s) need more than the share (180 s): the search ends
    # sooner, so that the run still ends within its budget
    assert taking.search_ends_at == 600 - 270 - 10 < plain.search_ends_at
    assert taking.confirm_rounds == 3 < plain.confirm_rounds
    assert "the first of 6 runs, the best less each of its changes among them" in \
        taking.describe(600, 2)
    assert answer_budget_s(backs, 0.3) == answer_budget_s(bare, 0.3)
    slow = ConfirmationPrice(60, taken_back=4)
    assert candidates_that_fit(3000, slow, 0.3, 3) == 1
    assert candidates_that_fit(3000, ConfirmationPrice(60), 0.3, 3) == 3


def test_a_first_compile_still_to_come_is_priced_in_the_search(tmp_path) -> None:
    """The RoBERTa script study (results/issue39_accum_rerun) said "about 3.0 min left" after
    its baseline and ended 4.9 min later: its last search trial, the best so far compiled, took
    109 s where 14 s was priced. Where the space offers compiling and nothing compiled has run,
    one search trial left pays a first compile; once one has run, or with no trial left,
    nothing more."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s",
                                direction="maximize")
    base = TrainConfig(micro_batch_size=2, grad_accum_steps=8)
    assert search_compile_s(study, offers_compile=True) == FIRST_COMPILE_PRIOR_S
    assert search_compile_s(study, offers_compile=False) == 0.0
    left = forecast(now=100, deadline=float("inf"), trials_left=4, trial_s=14,
                    price=ConfirmationPrice(10), workers=1, candidates=2, rounds=3,
                    max_rounds=3, share=0.3, searched_s=100,
                    compile_s=FIRST_COMPILE_PRIOR_S)
    assert left.search_s == 4 * 14 + FIRST_COMPILE_PRIOR_S
    assert left.describe().startswith(
        "about 3.0 min left: 4 more search trials (116.00 s, a first compile priced at "
        "60.00 s among them), then")
    done = forecast(now=100, deadline=float("inf"), trials_left=0, trial_s=14,
                    price=ConfirmationPrice(10), workers=1, candidates=2, rounds=3,
                    max_rounds=3, share=0.3, searched_s=100, compile_s=FIRST_COMPILE_PRIOR_S)
    assert done.search_s == 0 and "compile" not in done.describe()
    trial = study.ask()
    for key, value in {TrialKey.STATUS: "ok", TrialKey.ROLE: "compiled-best",
                       TrialKey.WALL_S: 109.0,
                       TrialKey.CONFIG: base.replace(compile_mode="default").to_dict(),
                       TrialKey.MEASUREMENT: Measurement(samples_per_sec=56.3).to_json()}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 56.3)
    assert search_compile_s(study, offers_compile=True) == 0.0


def test_a_compile_after_one_ran_is_priced_as_the_longest_compile_so_far(tmp_path) -> None:
    """Another compile mode compiles anew: what the search holds a compile against (`Window`)
    is, before any compile, the prior; after, the longest a compile took, a measured trial's
    first step over the baseline's (64.3 s, per_feature_towers' default mode), or the wall time
    of a trial killed compiling (73.4 s, its max-autotune-no-cudagraphs beside a load)."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s",
                                direction="maximize")
    assert compile_start_s(study, offers_compile=True) == FIRST_COMPILE_PRIOR_S
    base = TrainConfig(micro_batch_size=64)
    for role, status, config, first_step, wall_s in (
            ("baseline", "ok", base, 0.5, 20.0),
            ("compiled-best", "ok", base.replace(compile_mode="default"), 64.8, 90.0),
            ("search", "compile_timeout",
             base.replace(compile_mode="max-autotune-no-cudagraphs"), None, 73.4)):
        trial = study.ask()
        attrs = {TrialKey.STATUS: status, TrialKey.ROLE: role, TrialKey.WALL_S: wall_s,
                 TrialKey.CONFIG: config.to_dict()}
        if first_step is not None:
            attrs[TrialKey.MEASUREMENT] = Measurement(
                samples_per_sec=100.0, time_to_first_step_s=first_step).to_json()
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 100.0)
        if role == "compiled-best":
            assert compile_start_s(study, offers_compile=True) == pytest.approx(64.3)
    assert compile_start_s(study, offers_compile=True) == 73.4
    assert compile_start_s(study, offers_compile=False) == 0.0


def test_a_compiled_best_prices_each_process_that_compiles(tmp_path) -> None:
    """The H200 study that overran its `--budget 200s` (benchmarks/results/gpu_h200_followup):
    the baseline's run about 8.6 s, the compiled best's first step 18.8 s against the
    baseline's 0.5 s. Its confirmation of six warm processes (the best, the baseline and the
    best less each of four changes) was priced at six baseline starts; four of them compile
    (the best and three of the four taken back: not the baseline, not the best less its
    compile), so they cost 4 x 18.3 s more. Without a compile in the best, nothing is added."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s",
                                direction="maximize")
    base = TrainConfig(micro_batch_size=8, grad_accum_steps=4)
    for role, config, rate, first_s in (
            ("baseline", base, 313.5, 0.48),
            ("search", base.replace(precision="bf16"), 1487.6, 0.54),
            ("search", base.replace(precision="bf16", compile_mode="default"), 2387.2, 18.82)):
        figures = Measurement(samples_per_sec=rate, window_s=3.0, step_time_median_s=0.1,
                              peak_memory_bytes=3 * 2**30, time_to_first_step_s=first_s)
        trial = study.ask()
        for key, value in {TrialKey.STATUS: "ok", TrialKey.ROLE: role, TrialKey.WALL_S: 8.6,
                           TrialKey.CONFIG: config.to_dict(),
                           TrialKey.MEASUREMENT: figures.to_json()}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, rate)
    assert compile_seconds(study) == pytest.approx(18.34)
    price = confirmation_price(study, MeasureSettings(), 99.0, lambda peak: True, 4)
    plain = replace(price, compile_s=0.0)
    assert price.warm and price.compiling(6) == 4
    assert price.seconds(2, 12) == pytest.approx(plain.seconds(2, 12) + 4 * 18.34 + 18.34)
    assert "one that compiles 18.34 s more" in price.describe()
    fresh = replace(price, turn_s=None)
    # fresh rounds compile again every run: the first round's four, then four each round
    assert fresh.seconds(2, 3) == pytest.approx(replace(fresh, compile_s=0.0).seconds(2, 3)
                                                + 3 * 4 * 18.34 + 3 * 3 * 18.34)
    uncompiled = optuna.create_study(storage=open_storage(None, tmp_path), study_name="u")
    for trial in study.trials[:2]:
        uncompiled.add_trial(trial)
    assert compile_seconds(uncompiled) == 0.0


def test_the_answers_checks_are_priced_before_the_rounds_and_the_search_leaves_them_room(
        tmp_path) -> None:
    """The baseline's trial: 2 s to start, 3 s to build, a 1 s first step, steps of 0.1 s.
    A worst batch is a fresh interpreter (3 s more) and six steps 50x the median sample's
    (the largest is 50x): 3 + 6 + 6 x 0.1 x 50 = 39 s; a loss run 6 + 30 steps x 0.1 s = 9 s
    (30 steps: a loss run's 3 s, at least its 50 steps). Three configurations: three worst
    batches, the baseline's two loss runs and one each for the other two (the space offers
    one numerics change): the plan's search ends that much sooner, and its line says so."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s")
    trial = study.ask()
    figures = Measurement(samples_per_sec=1.0, window_s=1.0, step_time_median_s=0.1,
                          setup_s=3.0, time_to_first_step_s=1.0, measure_wall_s=10.0)
    for key, value in {TrialKey.STATUS: "ok", TrialKey.ROLE: "baseline", TrialKey.WALL_S: 12.0,
                       TrialKey.MEASUREMENT: figures.to_json()}.items():
        trial.set_user_attr(key, value)
    study.tell(trial, 1.0)
    sizes = SampleSizes(SCANNED, 100, 100, (1, 2), (5000, 100), 100, 100)
    prices = check_prices(study, sizes, loss_check=True)
    assert prices.loss_steps == 50
    assert prices.worst_s == pytest.approx(3.0 + 6.0 + 6 * 0.1 * 50)
    assert prices.loss_s == pytest.approx(6.0 + 50 * 0.1)
    script = check_prices(study, sizes, loss_check=True, run_steps=30)  # its own run: 30 steps
    assert script.loss_steps == 30 and script.loss_s == pytest.approx(6.0 + 30 * 0.1)
    uniform = check_prices(study, SampleSizes(SCANNED, 9, 9, (1,), (8,), 8, 8), loss_check=False)
    assert uniform.worst_s == 0.0 == uniform.loss_s
    price = confirmation_price(study, MeasureSettings(), 99.0, lambda peak: False,
                               checks=prices, loss_changes=1)
    checks_s = 3 * prices.worst_s + (1 + 2) * prices.loss_s
    assert price.checks_s(3) == pytest.approx(checks_s)
    bare = confirmation_price(study, MeasureSettings(), 99.0, lambda peak: False)
    assert price.seconds(3, 3) == pytest.approx(bare.seconds(3, 3) + checks_s)
    assert "of checks: worst batches and loss runs)" in price.describe_rounds(3, 3)
    # where the best compiles (20 s), the two configurations besides the baseline compile in
    # their worst batches and in their loss runs: every check is a new process
    compiled = replace(price, compile_s=20.0)
    assert compiled.checks_s(3) == pytest.approx(checks_s + (2 + 2) * 20.0)
    checked = plan_time(600, started=0, now=20, trial_s=10, price=price, candidates=3,
                        share=0.3, max_rounds=3)
    plain = plan_time(600, started=0, now=20, trial_s=10, price=bare, candidates=3,
                      share=0.3, max_rounds=3)
    assert checked.search_ends_at <= plain.search_ends_at


def test_a_race_whose_best_waits_on_its_loaders_workers_is_priced_at_its_longer_turns(
        tmp_path) -> None:
    """The best has 8 loader workers and waits on them 40% of its 50 ms steps: each of its warm
    turns spans 16 batches of each worker, capped at 2 s, after 17 untimed steps (30 ms each,
    the wait taken off: what its workers queued, and one more); the baseline's turns stay half
    a second.
    One turn in two is the best's in the race of the two, five in six with two changes taken
    back. A best whose workers keep up (2% waiting) pays the drain alone."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s",
                                direction="maximize")

    def told(role: str, config: TrainConfig, step_s: float, waits: float, rate: float) -> None:
        trial = study.ask()
        figures = Measurement(samples_per_sec=rate, window_s=3.0, step_time_median_s=step_s,
                              data_wait_fraction=waits, peak_memory_bytes=2**30)
        for key, value in {TrialKey.STATUS: "ok", TrialKey.ROLE: role, TrialKey.WALL_S: 10.0,
                           TrialKey.CONFIG: config.to_dict(),
                           TrialKey.MEASUREMENT: figures.to_json()}.items():
            trial.set_user_attr(key, value)
        study.tell(trial, rate)

    told("baseline", TrainConfig(micro_batch_size=32), 0.2, 0.9, 160.0)
    loaded = TrainConfig(micro_batch_size=32, num_workers=8, prefetch_factor=2)
    told("bottleneck", loaded, 0.05, 0.4, 640.0)
    best_s = 2.0 + 17 * 0.05 * 0.6
    for taken_back, share in ((0, 1 / 2), (2, 5 / 6)):
        price = confirmation_price(study, MeasureSettings(), 99.0, lambda peak: True,
                                   taken_back=taken_back)
        assert price.turn_s == pytest.approx(share * best_s + (1 - share) * 0.5)
    told("search", replace(loaded, precision="bf16"), 0.04, 0.02, 800.0)
    price = confirmation_price(study, MeasureSettings(), 99.0, lambda peak: True)
    assert price.turn_s == pytest.approx((0.5 + 17 * 0.04 * 0.98 + 0.5) / 2)
