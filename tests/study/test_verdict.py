"""The verdict in words: a recommendation with its interval, the user's settings kept with the
closest contender's figure, or not known, inside the noise."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.search.conclusion import conclusion
from autotune.search.contenders import Candidate
from autotune.study.confirmation import Run
from autotune.study.verdict import confirmed_verdict, search_verdict

BASE = TrainConfig(micro_batch_size=32)


def _candidate(config: TrainConfig, *rates: float) -> Candidate:
    return Candidate(config, 0, True, None,
                     [Run("ok", samples_per_sec=r, objective=r) for r in rates])


def _verdict(*contenders: Candidate) -> str:
    baseline = _candidate(BASE, 100, 110, 95, 105, 101, 99)
    return confirmed_verdict(conclusion([*contenders, baseline], baseline), BASE)


def test_a_measurable_speedup_names_the_changes_its_interval_and_rounds() -> None:
    faster = _candidate(BASE.replace(precision="bf16", optimizer_impl="fused"),
                        122, 135, 115, 128, 124, 120)
    verdict = _verdict(faster)
    assert verdict.startswith("bf16 + fused AdamW: 1.22x faster than your settings [1.")
    assert verdict.endswith("], 95% interval, 6 paired rounds")


def test_a_slower_contender_keeps_the_users_settings_with_its_figure() -> None:
    slower = _candidate(BASE.replace(precision="bf16", optimizer_impl="fused"),
                        78, 86, 74, 82, 79, 77)
    verdict = _verdict(slower)
    assert verdict.startswith("kept your settings: the closest contender, bf16 + fused AdamW, "
                              "is 0.78x [0.")


def test_a_difference_inside_the_noise_is_not_known_and_keeps_the_users_settings() -> None:
    close = _candidate(BASE.replace(optimizer_impl="foreach"), 104, 108, 99, 112, 100, 106)
    verdict = _verdict(close)
    assert verdict.startswith("not known: foreach AdamW is 1.0")
    assert verdict.endswith("inside the noise; your settings kept")


def test_one_round_is_not_known_and_an_unconfirmed_study_says_so() -> None:
    baseline = _candidate(BASE, 100)
    faster = _candidate(BASE.replace(precision="bf16"), 144)
    verdict = confirmed_verdict(conclusion([faster, baseline], baseline), BASE)
    assert verdict == ("not known: bf16 is 1.44x in 1 paired round, too few for an interval; "
                       "your settings kept")
    assert search_verdict(BASE.replace(precision="bf16"), 1.5, BASE) == (
        "not confirmed: bf16 measured 1.50x your settings in single search trials; confirm it "
        "(--confirm-repeats) before you change your training")
    assert search_verdict(None, None, BASE).startswith("no answer")
    # the H200's loader study (benchmarks/results/gpu_h200_followup): its probe took 68 s of
    # a 110 s budget and no search trial ran; that is not the search finding nothing faster
    # (nor is `--trials 1`, the baseline alone, whose run never ran out of time)
    assert search_verdict(BASE, None, BASE, tried=False).startswith(
        "not known: the run ended (its time or its --trials) before any configuration besides "
        "your settings was tried")
