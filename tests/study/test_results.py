"""A study's results from its storage alone: the summary `show` prints, the studies listing, and
what compiling paid for itself."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.study.confirmation import (
    FRESH_ROUNDS,
    PAYS,
    CandidateSummary,
    Confirmation,
    TakenBack,
    stored_confirmation,
)
from autotune.study.records import (
    MEMORY_CONSTRAINT,
    StudyKey,
    TrialKey,
    TrialRecord,
    trial_records,
)
from autotune.study.results import (
    _short_run,
    compile_payoff,
    compile_rows,
    compile_sentence,
    confirmed_payoff,
    list_studies,
    load_study,
    prediction_errors,
    script_answer,
    shorter_than_measured,
    study_summary,
)
from autotune.study.storage import open_storage
from autotune.study.summary import CompilePayoff
from autotune.trial.protocol import SWITCH, Measurement, ScriptAnswer, ScriptFlag, TrialStatus


def _told(study: optuna.Study, config: TrainConfig, status: str, rate: float | None,
          role: str = "search", other_cpu_share: float | None = None,
          **figures: Any) -> None:
    """A finished trial, recorded as the tuner records one; with `other_cpu_share` above the
    threshold, its window was disturbed; `figures`, more of its measurement's."""
    trial = study.ask()
    if rate is not None:
        measurement = Measurement(
            samples_per_sec=rate, other_cpu_share=other_cpu_share,
            disturbed=other_cpu_share is not None and other_cpu_share > 0.05, **figures)
        trial.set_user_attr(TrialKey.MEASUREMENT, measurement.to_json())
    trial.set_user_attr(TrialKey.CONFIG, config.to_dict())
    trial.set_user_attr(TrialKey.ROLE, role)
    trial.set_user_attr(TrialKey.STATUS, status)
    feasible = status == "ok"
    trial.set_user_attr(TrialKey.CONSTRAINT, 0.0 if feasible else 1.0)
    trial.set_constraint(MEMORY_CONSTRAINT, 0.0 if feasible else 1.0)
    study.tell(trial, rate if feasible else 0.0)


def test_summary_of_an_unconfirmed_study_compares_the_best_trial_with_the_baseline(
        tmp_path) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path / "s"),
                                direction="maximize")
    base = TrainConfig(micro_batch_size=8)
    study.set_user_attr(StudyKey.BASELINE_CONFIG, base.to_dict())
    _told(study, base, "ok", 100.0, role="baseline")
    _told(study, base.replace(precision="bf16"), "ok", 150.0)
    _told(study, base.replace(micro_batch_size=64), "oom", None)
    _told(study, base.replace(micro_batch_size=32), "over_memory", 400.0)
    summary = study_summary(load_study("s", tmp_path))
    assert not summary.confirmed
    assert summary.best_config.precision == "bf16"
    assert summary.speedup == pytest.approx(1.5)
    assert summary.oom_trials == 2
    assert summary.statuses == {"ok": 2, "oom": 1, "over_memory": 1}
    assert [row["study"] for row in list_studies(tmp_path)] == ["s"]


def test_a_disturbed_trial_is_not_the_best_while_a_clean_one_exists(tmp_path) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path / "s"),
                                direction="maximize")
    base = TrainConfig(micro_batch_size=8)
    study.set_user_attr(StudyKey.BASELINE_CONFIG, base.to_dict())
    _told(study, base, "ok", 100.0, role="baseline", other_cpu_share=0.45)
    _told(study, base.replace(precision="bf16"), "ok", 150.0, other_cpu_share=0.01)
    # Disturbed windows are usually slower; this one measured high, and still does not win.
    _told(study, base.replace(micro_batch_size=16), "ok", 400.0, other_cpu_share=0.30)
    summary = study_summary(load_study("s", tmp_path))
    assert summary.best_trial == 1 and not summary.best_disturbed
    assert summary.disturbed_trials == (0, 2)
    assert any("baseline trial #0 disturbed (other processes used 45% of the CPUs)" in w
               for w in summary.warnings)


def test_when_every_trial_was_disturbed_the_best_says_so(tmp_path) -> None:
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path / "s"),
                                direction="maximize")
    base = TrainConfig(micro_batch_size=8)
    _told(study, base, "ok", 100.0, role="baseline", other_cpu_share=0.5)
    _told(study, base.replace(precision="bf16"), "ok", 150.0, other_cpu_share=0.4)
    summary = study_summary(load_study("s", tmp_path))
    assert summary.best_trial == 1 and summary.best_disturbed
    assert any("measure again on a quiet machine" in w for w in summary.warnings)


def test_a_missing_study_is_bad_input(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no study"):
        load_study("nope", tmp_path)


def _record(number: int, compile_mode: str, sps: float, first_step_s: float,
            precision: str = "fp32", micro: int = 64) -> TrialRecord:
    return TrialRecord(number=number, status=TrialStatus.OK,
                       measurement=Measurement(samples_per_sec=sps,
                                               time_to_first_step_s=first_step_s),
                       config=TrainConfig(micro_batch_size=micro, grad_accum_steps=2,
                                          precision=precision, compile_mode=compile_mode))


def test_compile_break_even_from_its_uncompiled_twin() -> None:
    plain = _record(0, "none", sps=1000.0, first_step_s=1.0)
    compiled = _record(1, "default", sps=2000.0, first_step_s=31.0)
    slower = _record(2, "max-autotune", sps=900.0, first_step_s=11.0)
    rows = {r.trial: r for r in compile_rows([plain, compiled, slower])}
    # 128 samples a step: 0.128 s uncompiled, 0.064 s compiled; 30 s of compile pays off after
    # 30 / 0.064 steps.
    assert rows[1].compile_s == pytest.approx(30.0)
    assert rows[1].gain == pytest.approx(1.0)
    assert rows[1].break_even_steps == pytest.approx(30 / 0.064)
    assert "same knobs" in rows[1].reference and rows[1].label == "#1 default"
    assert rows[2].break_even_steps is None  # slower when compiled: never pays off


def test_compile_gain_is_not_credited_with_another_precision() -> None:
    rows = compile_rows([_record(0, "none", 1000.0, 1.0, precision="fp32"),
                         _record(1, "default", 3000.0, 20.0, precision="bf16")])
    assert rows == []


def test_memory_model_reports_its_error() -> None:
    mib = 2**20
    config = TrainConfig(micro_batch_size=8)

    def measured(number: int, peak: int, predicted: int) -> TrialRecord:
        return TrialRecord(number=number, status=TrialStatus.OK, config=config,
                           measurement=Measurement(samples_per_sec=100.0,
                                                   peak_memory_bytes=peak),
                           predicted_peak_bytes=predicted)

    errors = prediction_errors([measured(4, 400 * mib, 360 * mib),
                                measured(5, 300 * mib, 330 * mib)])
    assert errors.checked == 2
    assert errors.max_abs_error == pytest.approx(0.1)
    assert errors.median_abs_error == pytest.approx(0.1)


OLD_STUDY = Path(__file__).resolve().parent.parent / "fixtures" / "study_before_typed_records"


def test_a_study_written_before_typed_records_opens_and_says_what_it_said(tmp_path) -> None:
    """A journal from autotune before measurements had a record of their own (each figure an
    attribute of its own): read with today's code, every trial has its measurement, and the
    summary is the one `show --json` printed then (the new `knobs`, `queued_trials`,
    `trial_times`, `confirmation_measured`, `device_type` and `best_mfu_basis` aside: its
    rounds were fresh ones, on a CPU; the diagnosis of its baseline, read off its profiled
    trial; the loader's CPU share, not measured then; no change of its answer was taken back,
    which confirmations did not do then; and nothing was checked of its answer beyond its
    speed, which they did not do either)."""
    folder = tmp_path / "tiny_dict"
    folder.mkdir()
    shutil.copy(OLD_STUDY / "journal.log", folder / "journal.log")
    study = load_study("tiny_dict", tmp_path)
    records = trial_records(study)
    measured = [r for r in records if r.status in (TrialStatus.OK, TrialStatus.SCREENED)]
    assert measured and all(r.measurement.samples_per_sec > 0 for r in measured)
    assert all(r.measurement.window_steps >= 3 and r.config is not None for r in measured)
    then = json.loads((OLD_STUDY / "show.json").read_text())
    now = study_summary(study).to_json()
    assert now.pop("knobs")[:2] == ["micro_batch_size", "grad_accum_steps"]
    assert now.pop("queued_trials") == [] and now.pop("trial_times") == []
    assert now.pop("probe_s") is None  # not recorded before
    assert now.pop("confirmation_measured") == FRESH_ROUNDS
    assert now.pop("diagnosis")["dominant"] == "overhead"
    assert now.pop("answer_diagnosis") is None  # its answer kept the baseline
    assert all(rate.pop("cpu_share") is None for rate in now["loader_rates"])
    assert now.pop("taken_back") == [] and now.pop("taken_from_config") is None
    assert now.pop("device_type") == "cpu" and now.pop("best_mfu_basis") is None
    for unchecked in ("best_worst_batch_peak_bytes", "best_worst_batch_headroom_bytes",
                      "worst_batch", "loss_check", "checks"):
        assert now.pop(unchecked) is None, unchecked
    assert now.pop("ruled_out") == []
    assert now == then


def test_an_answer_that_compiles_is_questioned_where_the_scripts_run_is_shorter_than_its_payoff(
        ) -> None:
    """A script that trains 96 steps, an answer with torch.compile that pays for itself after
    9,538: the steady ranking does not hold for that run, and `--train-steps 96` would rank by
    it. No warning where the run is long enough, the answer does not compile, or the study
    already ranked by --train-steps."""
    compiled = TrainConfig(micro_batch_size=16, compile_mode="default")
    payoff = CompilePayoff(trial=4, reference="#1", compile_s=31.7, gain=0.16,
                           break_even_steps=9538.0)
    said = _short_run(96, compiled, payoff, None)
    assert said is not None and "96 optimizer steps" in said and "after 9,538 steps" in said
    assert "`--train-steps 96`" in said
    never = CompilePayoff(trial=4, reference="#1", compile_s=31.7, gain=-0.1,
                          break_even_steps=None)
    assert "never, here" in _short_run(96, compiled, never, None)
    assert _short_run(20_000, compiled, payoff, None) is None
    assert _short_run(96, compiled.replace(compile_mode="none"), payoff, None) is None
    assert _short_run(96, compiled, payoff, 96) is None
    assert _short_run(None, compiled, payoff, None) is None


def test_a_scripts_run_shorter_than_a_trial_measures_is_said() -> None:
    """A script whose own run is 2 optimizer steps, tuned on trials that time 14: the ranking
    is of steady steps its run never reaches, and `--train-steps 2` ranks by that run. No
    word where the run is as long, unknown, or the study ranks by --train-steps."""
    assert shorter_than_measured(2, 14, None) == (
        "the script's own run is 2 optimizer steps at its settings, fewer than a trial "
        "measures (14: its first step, the warm-up and a timed window): the trials rank steady "
        "steps that run never reaches; `--train-steps 2` ranks by the run's whole wall time, "
        "start-up included")
    assert shorter_than_measured(14, 14, None) is None
    assert shorter_than_measured(None, 14, None) is None
    assert shorter_than_measured(2, None, None) is None
    assert shorter_than_measured(2, 14, 2) is None


def test_an_answer_that_compiles_says_its_start_up_and_the_steps_it_pays_for_itself_after(
        ) -> None:
    """The answer (no trial of its own: the confirmation made it) compiles: its payoff comes
    from a trial of the same configuration, its gain per step from the paired rounds that took
    compile back (10% slower without: 128 samples a step at 1000/s against 900/s save 14.2 ms
    a step, so 30 s of compile pays after 2,109 steps), and the verdict says so in a
    sentence; nothing where the user's settings compile already."""
    plain = _record(0, "none", sps=1000.0, first_step_s=1.0)
    compiled = _record(1, "default", sps=2000.0, first_step_s=31.0)
    answer = compiled.config
    payoff = compile_payoff([plain, compiled], None, answer)
    assert payoff.trial == 1 and payoff.break_even_steps == pytest.approx(30 / 0.064)
    assert compile_sentence(answer, plain.config, payoff) == (
        "torch.compile costs 30.00 s at start-up and pays for itself after 469 steps")
    assert compile_sentence(answer, answer, payoff) == ""
    assert compile_sentence(plain.config, plain.config, payoff) == ""
    back = TakenBack("torch.compile", ("compile_mode",), plain.config, PAYS, 0.9, (0.88, 0.92), 12)
    confirmation = replace(_confirmed(answer, 1000.0), taken_back=(back,))
    paired = confirmed_payoff(payoff, confirmation, answer)
    assert paired.gain == pytest.approx(1 / 0.9 - 1)
    assert paired.break_even_steps == pytest.approx(30 / (128 * (1 / 900 - 1 / 1000)))
    assert "in the paired rounds" in paired.reference
    never = replace(payoff, break_even_steps=None)
    assert compile_sentence(answer, plain.config, never).endswith("never pays for itself here")


def test_an_answer_with_no_trial_of_its_own_is_said_as_its_rounds_said_it() -> None:
    """The race's best less a change that did not pay (run_clm_no_trainer.py: fused AdamW +
    torch.compile, bf16 dropped) has no trial of its own: its terms in the script's flags and
    lines are what its warm process said, kept in the stored confirmation."""
    answer = TrainConfig(optimizer_impl="fused", compile_mode="default")
    said = ScriptAnswer("loop", {"--fused_adam": {"fused_adam": True}}, None, None,
                        routed=True, script_flags=(ScriptFlag("--fused_adam", True, SWITCH, True),))
    confirmation = _confirmed(answer, 1000.0)
    winner = replace(confirmation.winner, script_answer=said)
    stored = stored_confirmation(replace(confirmation, candidates=(winner,),
                                         winner=winner).to_json())
    assert script_answer([], answer, stored) == said
    assert script_answer([], answer, stored).lines() == ["--fused_adam"]
    assert script_answer([], TrainConfig(), stored) is None


def _confirmed(config: TrainConfig, rate: float) -> Confirmation:
    def one(candidate: TrainConfig, median: float) -> CandidateSummary:
        return CandidateSummary(candidate, None, True, True, (), median, 0.0, median, None,
                                None, 1.0, None, None)

    winner = one(config, rate)
    return Confirmation((winner,), winner, winner, one(TrainConfig(), 100.0), winner, 10.0,
                        (9.0, 11.0), False, None, False, 12, 1.0, 0.0, 0.03, None, 0)
