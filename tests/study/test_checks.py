"""What the confirmation checked of what it may recommend, as the study stores it: read back as
written, a study from before the checks read as unchecked, and the answer's checks in words."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.study.checks import (
    FITS,
    NO_TIME,
    OOM,
    CheckSummary,
    LossCheck,
    WorstBatchCheck,
    answer_lines,
)
from autotune.study.confirmation import (
    FAILS,
    CandidateSummary,
    Confirmation,
    Run,
    TakenBack,
    worst_batch_peaks,
)
from autotune.study.records import config_key
from autotune.study.verdict import checks_verdict, confirmed_verdict

BASE = TrainConfig(micro_batch_size=8, grad_accum_steps=4)
BF16 = BASE.replace(precision="bf16")
MiB = 2**20
WORST = WorstBatchCheck(8, FITS, 500 * MiB, 600 * MiB, 700 * MiB)
SAME = LossCheck("bf16", 200, 1.004, 1.0, 0.009, 0.01, worse=False)
WORSE = LossCheck("bf16", 200, 1.5, 1.0, 0.009, 0.01, worse=True)


def candidate(config: TrainConfig, runs: tuple[Run, ...] = (), **checks: object
              ) -> CandidateSummary:
    return CandidateSummary(config=config, trial=1, feasible=True, ok=bool(runs), runs=runs,
                            median=100.0 if runs else None, spread=None, objective=None,
                            time_to_train_s=None, search_samples_per_sec=None,
                            speedup=1.2 if config != BASE else 1.0, speedup_ci=(1.1, 1.3),
                            trace=None, **checks)


def confirmation(winner: CandidateSummary, *others: CandidateSummary,
                 checks: CheckSummary | None = None) -> Confirmation:
    baseline = candidate(BASE, (Run("ok", 100.0, 100.0, 300 * MiB),))
    return Confirmation(candidates=(winner, *others, baseline), winner=winner, fastest=winner,
                        baseline=baseline, contender=winner if winner.config != BASE else None,
                        speedup=winner.speedup, speedup_ci=(1.1, 1.3),
                        no_measurable_difference=False, search_speedup=None, widened=False,
                        rounds=3, wall_s=1.0, at=0.0, target=0.03, drift=None,
                        disturbed_rounds=0, checks=checks)


CHECKED = CheckSummary(sizes="the largest sample is 51.2x the median (a scan of all 60,000 "
                       "samples)", loss_steps=200, baseline_losses=(1.0, 1.009))


def test_the_checks_are_read_back_as_they_were_written() -> None:
    winner = candidate(BF16, (Run("ok", 120.0, 120.0, 350 * MiB),), worst_batch=WORST,
                       loss_check=SAME)
    out = candidate(BF16.replace(micro_batch_size=32, grad_accum_steps=1), worst_batch=
                    WorstBatchCheck(32, OOM), excluded="its worst batch runs out of memory")
    stored = confirmation(winner, out, checks=CHECKED)
    again = Confirmation.from_json(stored.to_json())
    assert again == stored
    assert again.ruled_out == (out,) and not again.ruled_out[0].ok
    assert again.winner.peak_memory_bytes == 500 * MiB  # its worst batch's, above its rounds'
    assert abs(CHECKED.spread - 0.009) < 1e-12
    assert worst_batch_peaks(stored.to_json()) == {config_key(BF16): 500 * MiB}


def test_a_confirmation_from_before_the_checks_reads_as_unchecked() -> None:
    data = confirmation(candidate(BF16, (Run("ok", 120.0, 120.0, 350 * MiB),))).to_json()
    data.pop("checks")
    for entry in data["candidates"]:
        for key in ("worst_batch", "loss_check", "excluded"):
            entry.pop(key)
    old = Confirmation.from_json(data)
    assert old.checks is None and old.ruled_out == ()
    assert old.winner.worst_batch is None and old.winner.peak_memory_bytes == 350 * MiB
    assert checks_verdict(old, BASE) == ""
    assert worst_batch_peaks(data) == {} == worst_batch_peaks(None)


def test_the_verdict_says_what_was_checked_of_the_answer_and_what_was_ruled_out() -> None:
    winner = candidate(BF16, (Run("ok", 120.0, 120.0),), worst_batch=WORST, loss_check=SAME)
    worse = candidate(BF16.replace(optimizer_impl="fused"), loss_check=WORSE,
                      excluded=f"it learns worse: {WORSE.describe('its')}")
    said = checks_verdict(confirmation(winner, worse, checks=CHECKED), BASE)
    assert said == (
        "The answer's worst batch (the 8 largest samples) peaks at 500.00 MiB, 200.00 MiB "
        "(29%) below the 700.00 MiB memory. The answer's loss after 200 steps is within 0.4% "
        "of your settings', inside the 1% floor (their seed-to-seed spread is 0.9%). Ruled "
        "out by the checks: bf16 + fused AdamW (it learns worse: its loss after 200 steps is "
        "50.0% above your settings', beyond their seed-to-seed spread of 0.9% and the 1% "
        "floor).")


def test_settings_kept_because_the_faster_were_ruled_out_say_so() -> None:
    kept = candidate(BASE, (Run("ok", 100.0, 100.0),), worst_batch=WORST)
    worse = candidate(BF16, loss_check=WORSE, excluded="it learns worse: ...")
    stored = confirmation(kept, worse, checks=CHECKED)
    assert confirmed_verdict(stored, BASE) == (
        "kept your settings: 1 configuration faster in the search was ruled out by the checks, "
        "and your settings measured fastest of the rest in 3 paired rounds")
    assert checks_verdict(stored, BASE).startswith("Your settings' worst batch (the 8 largest")


def test_an_answer_not_checked_says_why() -> None:
    unchecked = CheckSummary(worst_batch_note="", loss_note="off (--no-loss-check)")
    assert answer_lines(None, None, unchecked, numerics=True) == [
        f"its worst batch was not checked: {NO_TIME}",
        "its loss was not checked: off (--no-loss-check)"]
    uniform = CheckSummary(worst_batch_note="not needed: every sample is the same size")
    assert answer_lines(None, None, uniform, numerics=False) == []


def test_a_change_kept_because_without_it_a_check_failed_says_which() -> None:
    back = TakenBack("bf16", ("precision",), BASE, FAILS,
                     why="its worst batch (the 8 largest samples) runs out of memory")
    assert back.describe() == ("without bf16 its worst batch (the 8 largest samples) runs out "
                               "of memory: kept")
    assert TakenBack("bf16", ("precision",), BASE, FAILS).describe() == \
        "without bf16 it did not run in every round: kept"
