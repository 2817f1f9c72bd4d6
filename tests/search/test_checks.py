"""The checks of what the confirmation may recommend: which configuration a loss run trains,
when a loss is worse, what a worst batch's result says, and `AnswerChecks` running each once,
within the time, ruling out what fails (the runs scripted here; real ones in the end-to-end
tests)."""

from __future__ import annotations

import time
from dataclasses import asdict

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.search.checks import (
    LOSS_FLOOR,
    MAX_LOSS_STEPS,
    MIN_LOSS_STEPS,
    AnswerChecks,
    CheckPrices,
    judge_loss,
    loss_config,
    loss_steps,
    numerics_offered,
    worst_batch_check,
)
from autotune.search.events import SilentView
from autotune.search.outcome import Scoring
from autotune.search.runner import MeasureJob
from autotune.study.checks import FAILED, FITS, NO_TIME, OOM, OVER, StoredLossRuns
from autotune.study.storage import open_storage
from autotune.trial.protocol import (
    SCANNED,
    LossRun,
    LossRunSettings,
    SampleSizes,
    TrialResult,
    TrialStatus,
    WorstBatch,
    WorstBatchSettings,
    job_of,
)

BASE = TrainConfig(micro_batch_size=8, grad_accum_steps=4)
MiB = 2**20


def loss(final: float, seed: int = 0, finite: bool = True) -> LossRun:
    return LossRun(seed=seed, steps=100, initial_loss=3.0, final_loss=final, train_loss=final,
                   finite=finite)


def test_a_loss_run_trains_the_numerics_at_the_same_effective_batch_on_your_loader() -> None:
    config = BASE.replace(micro_batch_size=32, grad_accum_steps=1, precision="bf16",
                          num_workers=2, prefetch_factor=2, optimizer_impl="fused")
    assert loss_config(config, BASE) == BASE.replace(micro_batch_size=32, grad_accum_steps=1,
                                                     precision="bf16")
    assert loss_config(BASE.replace(num_workers=2, prefetch_factor=2), BASE) is None
    other_batch = BASE.replace(micro_batch_size=64, grad_accum_steps=1, compile_mode="default")
    assert loss_config(other_batch, BASE) == BASE.replace(compile_mode="default")
    adafactor = loss_config(BASE.setting("optimizer", "adafactor"), BASE)
    assert adafactor.optimizer == "adafactor" and adafactor.optimizer_impl == "for_loop"
    # a script's loop sums its own loss over a step's micro-batches: at the baseline's split
    assert loss_config(config, BASE, with_split=False) == BASE.replace(precision="bf16")


def test_a_loss_run_is_a_few_seconds_of_steps_within_bounds() -> None:
    assert loss_steps(0.01) == 300 == MAX_LOSS_STEPS
    assert loss_steps(0.02) == 150
    assert loss_steps(1.0) == MIN_LOSS_STEPS == loss_steps(None)
    assert numerics_offered({"precision": ("fp32", "bf16"), "compile_mode": ("none",),
                             "optimizer_impl": ("for_loop", "fused")}) == 1


def test_a_loss_beyond_the_seed_to_seed_spread_is_worse_and_one_inside_it_is_not() -> None:
    first, second = loss(1.00), loss(1.03, seed=1)
    worse = judge_loss(loss(1.10), first, second, "bf16")
    assert worse.worse and worse.spread == pytest.approx(0.03)
    assert worse.delta == pytest.approx(0.10)
    assert worse.describe("its") == ("its loss after 100 steps is 10.0% above your settings', "
                                     "beyond their seed-to-seed spread of 3.0%")
    inside = judge_loss(loss(1.02), first, second, "bf16")
    assert not inside.worse
    assert inside.describe("the answer's") == (
        "the answer's loss after 100 steps is within 2.0% of your settings', inside their "
        "seed-to-seed spread of 3.0%")
    below = judge_loss(loss(0.95), first, second, "bf16")
    assert not below.worse and "5.0% below your settings'" in below.describe()


def test_where_the_seeds_agree_the_floor_decides() -> None:
    first, second = loss(2.0), loss(2.0, seed=1)
    assert judge_loss(loss(2.0 * (1 + LOSS_FLOOR / 2)), first, second, "bf16").describe() == (
        "its loss after 100 steps is within 0.5% of your settings', inside the 1% floor (their "
        "seed-to-seed spread is 0.0%)")
    worse = judge_loss(loss(2.1), first, second, "bf16")
    assert worse.worse and worse.describe().endswith("spread of 0.0% and the 1% floor")


def test_a_loss_that_went_nan_is_worse() -> None:
    found = judge_loss(loss(float("nan"), finite=False), loss(1.0), loss(1.0, 1), "fp16")
    assert found.worse and found.loss is None and found.delta is None
    assert found.describe() == "its loss went NaN or inf within 100 steps"


def test_a_worst_batch_fits_is_over_memory_runs_out_or_fails() -> None:
    ok = TrialResult(TrialStatus.OK, worst_batch=WorstBatch(8, 500 * MiB, 3))
    fits = worst_batch_check(ok, 8, 600 * MiB, 700 * MiB)
    assert fits.outcome == FITS and fits.headroom_bytes == 200 * MiB
    assert fits.describe("its") == ("its worst batch (the 8 largest samples) peaks at 500.00 "
                                    "MiB, 200.00 MiB (29%) below the 700.00 MiB memory")
    over = worst_batch_check(ok, 8, 400 * MiB, 700 * MiB)
    assert over.outcome == OVER and "above the 400.00 MiB a trial may use" in over.describe()
    oom = worst_batch_check(TrialResult(TrialStatus.OOM, "MemoryError"), 32, None, None)
    assert oom.outcome == OOM
    assert oom.describe() == "its worst batch (the 32 largest samples) runs out of memory"
    failed = worst_batch_check(TrialResult(TrialStatus.ERROR, "Traceback\nIndexError: 513"),
                               1, None, None)
    assert failed.outcome == FAILED and failed.describe().endswith("fails: error: IndexError: 513")


SIZES = SampleSizes(SCANNED, 100, 100, (42, 7, 3), (4000, 300, 200), 100, 80)


class Scripted:
    """A runner's `measure` that answers each check from a table: the worst batch's peak by
    micro-batch (None: out of memory), the loss by precision and seed."""

    def __init__(self, peaks: dict[int, int | None], losses: dict[tuple[str, int], float],
                 delay_s: float = 0.0) -> None:
        self.peaks, self.losses, self.delay_s = peaks, losses, delay_s
        self.jobs: list[tuple[str, TrainConfig, dict]] = []

    def __call__(self, config: TrainConfig, job: MeasureJob) -> TrialResult:
        settings = job.settings
        assert settings is not None
        self.jobs.append((job_of(settings), config, asdict(settings)))
        time.sleep(self.delay_s)
        if isinstance(settings, WorstBatchSettings):
            assert job.fresh and settings.indices[:1] == (42,)
            assert len(settings.indices) == config.micro_batch_size
            peak = self.peaks[config.micro_batch_size]
            if peak is None:
                return TrialResult(TrialStatus.OOM, "out of memory")
            return TrialResult(TrialStatus.OK, worst_batch=WorstBatch(
                config.micro_batch_size, peak, 3))
        assert isinstance(settings, LossRunSettings) and settings.steps == 120
        final = self.losses[(config.precision, settings.seed)]
        return TrialResult(TrialStatus.OK, loss_run=loss(final, settings.seed))


class Notes(SilentView):
    """The notes a study would print."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def note(self, text: str) -> None:
        self.lines.append(text)


def checks(measure: Scripted, sizes: SampleSizes | None = SIZES, loss_check: bool = True,
           view: SilentView | None = None,
           stored: StoredLossRuns | None = None) -> AnswerChecks:
    return AnswerChecks(measure, BASE, Scoring("cpu", 600 * MiB, 0.1, 0.0), sizes=sizes,
                        capacity_bytes=700 * MiB, loss_check=loss_check,
                        prices=CheckPrices(worst_s=1.0, loss_s=1.0, loss_steps=120),
                        time_limit_s=60, device="cpu", view=view or SilentView(),
                        stored=stored)


def test_what_runs_out_of_memory_on_its_worst_batch_or_learns_worse_is_ruled_out() -> None:
    measure = Scripted({8: 300 * MiB, 32: None, 16: 500 * MiB},
                       {("fp32", 0): 1.0, ("fp32", 1): 1.02, ("bf16", 0): 1.5})
    view = Notes()
    answer = checks(measure, view=view)
    own = answer.check(BASE, reference=True)
    assert own.worst.outcome == FITS and own.loss is None and not own.why_out
    big = answer.check(BASE.replace(micro_batch_size=32, grad_accum_steps=1))
    assert big.why_out == "its worst batch (the 32 largest samples) runs out of memory"
    assert big.loss is None  # ruled out before its loss run
    bf16 = answer.check(BASE.replace(micro_batch_size=16, grad_accum_steps=2, precision="bf16"))
    assert bf16.worst.fits and bf16.loss.worse
    assert bf16.why_out.startswith("it learns worse: its loss after 100 steps is 50.0% above")
    kinds = [(kind, c.micro_batch_size, c.precision, s.get("seed")) for kind, c, s in measure.jobs]
    assert kinds == [("worst_batch", 8, "fp32", None), ("worst_batch", 32, "fp32", None),
                     ("worst_batch", 16, "bf16", None), ("loss_run", 8, "fp32", 0),
                     ("loss_run", 16, "bf16", 0), ("loss_run", 8, "fp32", 1)]
    again = answer.check(BASE.replace(micro_batch_size=16, grad_accum_steps=2, precision="bf16"))
    assert again == bf16 and len(measure.jobs) == 6  # each run once
    ruled = [line for line in view.lines if "is ruled out" in line]
    assert len(ruled) == 2 and ruled[1].startswith(  # said once each, asked twice
        "confirmation: micro-batch 16 x 2 + bf16 is ruled out: it learns worse: ")
    summary = answer.summary()
    assert summary.baseline_losses == (1.0, 1.02) and summary.loss_steps == 120
    assert summary.spread == pytest.approx(0.02)
    assert not summary.worst_batch_note and not summary.loss_note
    assert "51.2x" not in summary.sizes and "the largest sample is 40.0x the median" in \
        summary.sizes


def test_your_second_seed_runs_only_where_a_loss_is_beyond_the_floor() -> None:
    """Within the floor, no spread of theirs can make a loss worse: their second seed (on a
    GPU a run of their fp32 as long as the proof) is not run, and the report says so."""
    measure = Scripted({8: 300 * MiB, 16: 300 * MiB},
                       {("fp32", 0): 1.0, ("fp32", 1): 1.03, ("bf16", 0): 1.005,
                        ("fp16", 0): 1.02})
    view = Notes()
    answer = checks(measure, view=view)
    bf16 = answer.check(BASE.replace(precision="bf16"))
    assert not bf16.why_out and bf16.loss.spread is None
    assert bf16.loss.describe() == ("its loss after 100 steps is within 0.5% of your "
                                    "settings', inside the 1% floor")
    assert [s["seed"] for kind, _, s in measure.jobs if kind == "loss_run"] == [0, 0]
    assert answer.summary().baseline_losses == (1.0,) and answer.summary().spread is None
    fp16 = answer.check(BASE.replace(precision="fp16"))  # 2% above seed 0, inside their 3%
    assert not fp16.why_out and fp16.loss.spread == pytest.approx(0.03)
    assert [s["seed"] for kind, _, s in measure.jobs if kind == "loss_run"] == [0, 0, 0, 1]
    assert view.lines[-1] == ("checking the loss: your settings from seed 1 too, for their own "
                              "spread (fp16 is 2.0% above seed 0's)")
    assert answer.summary().baseline_losses == (1.0, 1.03)


def test_a_resumed_run_keeps_the_loss_runs_the_study_made(tmp_path) -> None:
    """Each loss run is kept in the study as it ends: the run that resumes the study (a new
    process, the study read back from its journal) judges the same configuration without
    training anything again, and says where the figures came from."""
    study = optuna.create_study(storage=open_storage(None, tmp_path), study_name="s")
    losses = {("fp32", 0): 1.0, ("fp32", 1): 1.01, ("bf16", 0): 1.3}
    first = Scripted({8: 300 * MiB}, losses)
    bf16 = BASE.replace(precision="bf16")
    before = checks(first, stored=StoredLossRuns(study)).check(bf16)
    assert [s["seed"] for kind, _, s in first.jobs if kind == "loss_run"] == [0, 0, 1]
    again = Scripted({8: 300 * MiB}, {})  # no loss to give: a run would fail the test
    view = Notes()
    resumed = optuna.load_study(study_name="s", storage=open_storage(None, tmp_path))
    after = checks(again, view=view, stored=StoredLossRuns(resumed)).check(bf16)
    assert after.loss == before.loss and after.why_out == before.why_out
    assert [kind for kind, _, _ in again.jobs] == ["worst_batch"]
    assert [line for line in view.lines if line.startswith("checking the loss")] == [
        "checking the loss: your settings for 120 steps from seed 0: kept from an earlier run "
        "of this study",
        "checking the loss of bf16 for 120 steps from seed 0: kept from an earlier run of this "
        "study",
        "checking the loss: your settings from seed 1 too, for their own spread (bf16 is 30.0% "
        "above seed 0's): kept from an earlier run of this study"]


def test_checks_that_are_not_needed_off_or_out_of_time_say_why() -> None:
    uniform = SampleSizes(SCANNED, 10, 10, (0, 1), (64, 64), 64, 64)
    measure = Scripted({8: 300 * MiB}, {})
    answer = checks(measure, sizes=uniform, loss_check=False)
    found = answer.check(BASE.replace(precision="bf16"))
    assert found == answer.check(BASE.replace(precision="bf16")) and not measure.jobs
    summary = answer.summary()
    assert summary.worst_batch_note.startswith("not needed: every sample is the same size")
    assert summary.loss_note == "off (--no-loss-check)"
    late = checks(Scripted({8: 300 * MiB}, {}))
    skipped = late.check(BASE.replace(precision="bf16"), deadline=time.monotonic())
    assert skipped.worst is None and skipped.loss is None and not skipped.why_out
    assert late.summary().worst_batch_note == NO_TIME == late.summary().loss_note
    unsized = checks(Scripted({}, {}), sizes=None).summary()
    assert "did not size the samples" in unsized.worst_batch_note
    nothing = checks(Scripted({8: 1}, {})).summary()
    assert nothing.loss_note == "not needed: nothing it may recommend changes the numerics"


def test_a_loss_run_that_does_not_finish_rules_its_configuration_out() -> None:
    measure = Scripted({8: 300 * MiB}, {("fp32", 0): 1.0, ("fp32", 1): 1.0})

    def crashing(config: TrainConfig, job: MeasureJob) -> TrialResult:
        if isinstance(job.settings, LossRunSettings) and config.precision == "bf16":
            return TrialResult(TrialStatus.CRASH, "killed by SIGSEGV")
        return measure(config, job)

    answer = AnswerChecks(crashing, BASE, Scoring("cpu", None, 0.1, 0.0), sizes=SIZES,
                          capacity_bytes=None, loss_check=True,
                          prices=CheckPrices(1.0, 1.0, 120), time_limit_s=60, device="cpu",
                          view=SilentView())
    found = answer.check(BASE.replace(precision="bf16"))
    assert found.why_out == ("its loss run did not train 120 steps: it ended as crash: killed "
                             "by SIGSEGV")
