"""`worker`: the search loop decides, measures and records trials; here with a probe and
measurements that answer from a script (recorded figures, no process), so the loop's own
decisions are what is tested."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from autotune.config import TrainConfig
from autotune.options import MeasureSettings, TuneOptions
from autotune.search.runner import MeasureJob
from autotune.search.tuner import Tuner
from autotune.study.records import Role, trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import (
    FIRST_STEP,
    LeftOut,
    LoaderRate,
    LossRun,
    LossRunSettings,
    Measurement,
    ProbeReport,
    TrialResult,
    TrialStatus,
    UnsupportedSetting,
)

from ..conftest import TINY_SOURCE
from .scripted import TINY_PROBE, scripted
from .test_checks import Notes

METRICS = Measurement(samples_per_sec=1000.0, window_samples=800, window_steps=10,
                      window_s=0.8, setup_s=1.0, time_to_first_step_s=0.5, warmup_steps=3,
                      warmup_s=0.3, step_time_median_s=0.08, data_wait_fraction=0.0,
                      peak_memory_bytes=2**20)


def test_a_compile_that_ran_out_of_time_runs_once_more(write_model, tmp_path) -> None:
    model = write_model(TINY_SOURCE)
    jobs: list[tuple[dict, MeasureJob]] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        jobs.append((config.to_dict(), job))
        if config.compile_mode == "none":
            return TrialResult(TrialStatus.OK, "measured", measurement=METRICS)
        return TrialResult("timeout", "still running", phase=FIRST_STEP)

    tuner = scripted(TuneOptions(model_path=str(model), device="cpu", trials=3,
                                 studies_dir=str(tmp_path), fixes={"compile_mode": "default"},
                                 plain_tpe=True, confirm_repeats=0, seed=0), measure)
    run(tuner)
    trials = load_study(tuner.study.study_name, tmp_path).get_trials(deepcopy=False)
    statuses = [t.user_attrs["status"] for t in trials]
    assert statuses == ["ok", "compile_timeout", "timeout"]
    first, retry = trials[1], trials[2]
    assert retry.user_attrs["requeued_from"] == first.number and retry.user_attrs["retry"] == 1
    assert retry.user_attrs["config"] == first.user_attrs["config"]
    assert len(jobs) == 3  # the retry was measured; nothing else


@pytest.mark.slow
def test_under_the_time_budget_the_last_search_trial_gets_a_trials_time_to_finish(
        write_model, tmp_path, monkeypatch) -> None:
    """The plan stops starting trials early enough for the last one to end; that one must be
    given that time, not only what is left until the plan's last start (a 69 s rgat trial on
    2 CPU cores was killed at 32 s that way)."""
    import time

    import autotune.search.tuner

    monkeypatch.setattr(autotune.search.tuner, "DEFAULT_TIME_BUDGET_S", 12.0)
    model = write_model(TINY_SOURCE)
    jobs: list[MeasureJob] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        jobs.append(job)
        time.sleep(0.5)
        figures = replace(METRICS, samples_per_sec=1000.0 + len(jobs))
        # wall_s: what each trial is priced at
        return TrialResult(TrialStatus.OK, "measured", measurement=figures, wall_s=5.0)

    tuner = scripted(TuneOptions(model_path=str(model), device="cpu", studies_dir=str(tmp_path),
                                 confirm_repeats=0, seed=0), measure)
    run(tuner)
    searched = [job for job in jobs if job.name.startswith("trial-") and job.number]
    assert searched, "the plan left time for search trials"
    assert min(job.time_limit_s for job in searched) >= 5.0 * 0.95


@pytest.mark.slow
def test_a_default_budget_grown_for_a_slow_confirmation_is_the_searchs_too(
        write_model, tmp_path, monkeypatch) -> None:
    """Where confirming is so slow that the default budget grows (here from 5 s to 15 s), the
    search plans to the grown budget's end, not the default's (rgat's searches stopped 10 min
    into the 30 they announced, until 0e2a073)."""
    import time

    import autotune.search.tuner

    monkeypatch.setattr(autotune.search.tuner, "DEFAULT_TIME_BUDGET_S", 5.0)
    model = write_model(TINY_SOURCE)
    starts: list[float] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        if job.name.startswith("trial-") and job.number:
            starts.append(time.monotonic())
        time.sleep(0.2)
        return TrialResult(TrialStatus.OK, "measured", measurement=METRICS, wall_s=1.0)

    # a confirmation run priced at its 0.28 s window: three rounds of two need 5.6 s at a 30%
    # share, so the budget grows; the best's proof (27 runs) leaves the search 6.4 s of 15
    tuner = scripted(TuneOptions(model_path=str(model), device="cpu", studies_dir=str(tmp_path),
                                 no_loss_check=True, plain_tpe=True, seed=0,
                                 settings=MeasureSettings(window_seconds=0.28)), measure)
    run(tuner)
    assert tuner.time_budget_s == 15.0
    assert starts and max(starts) > tuner.started + 5.5, \
        [round(s - tuner.started, 1) for s in starts]


def test_a_knob_that_lost_alone_is_kept_at_the_baselines_value_by_the_sampler(
        tmp_path) -> None:
    """Scripted: fused AdamW doubles the rate, channels_last halves it. The corner (both) is
    split, each change is measured alone, and once channels_last has lost alone TPE proposes
    contiguous tensors only: the one configuration left to measure is foreach AdamW, then the
    space is exhausted."""
    model = Path(__file__).parent.parent / "models" / "many_small_params.py"

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        rate = 100.0 * {"fused": 2.0, "foreach": 1.5}.get(config.optimizer_impl, 1.0) * \
            (0.5 if config.memory_format == "channels_last" else 1.0)
        return TrialResult(TrialStatus.OK, "measured",
                           measurement=replace(METRICS, samples_per_sec=rate))

    no_blocks = "activation checkpointing is not applicable: the model has no nn.ModuleList"
    probe = ProbeReport(baseline={"micro_batch_size": 8, "optimizer_impl": "for_loop"},
                        dataset_size=512, state_bytes=4 * 4 * 93, parameters=93,
                        convolutional=True,
                        left_out=[LeftOut("activation_checkpointing", mode, no_blocks)
                                  for mode in ("selective", "full")])
    tuner = scripted(TuneOptions(model_path=str(model), device="cpu", trials=8,
                                 model_args={"tensors": 8}, studies_dir=str(tmp_path),
                                 confirm_repeats=0, seed=0,
                                 fixes={"compile_mode": "none", "num_workers": 0,
                                        "micro_batch_size": 8, "precision": "fp32"}),
                     measure, probe)
    run(tuner)
    trials = trial_records(load_study(tuner.study.study_name, tmp_path))
    measured = [t for t in trials if not t.duplicate]
    assert [(t.role, t.changed) for t in measured[:4]] == [
        ("baseline", ()), ("fast-corner", ()), ("one-change", ("optimizer_impl",)),
        ("one-change", ("memory_format",))]
    assert [(t.config.memory_format, t.config.optimizer_impl) for t in measured[4:]] == \
        [("contiguous", "foreach")]
    assert all(t.config.memory_format == "contiguous" for t in trials[4:])


def test_a_value_pair_found_unsupported_is_never_run_again_and_each_value_alone_still_is(
        write_model, tmp_path) -> None:
    """A trial finds fused AdamW cannot run with checkpointing (as Lightning refuses to clip a
    fused AdamW's gradients under mixed precision): a later configuration with both is
    recorded without a process; fused without checkpointing, and checkpointing with another
    AdamW, are still measured. (Checkpointing, not bf16, whose probe may leave it out on a busy
    machine where it times more than twice as slow as fp32 on this tiny model.)"""
    model = write_model(TINY_SOURCE)
    jobs: list[TrainConfig] = []
    pair = {"activation_checkpointing": "full", "optimizer_impl": "fused"}

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        if not jobs:  # the baseline: then the pair twice (the second unlike the first),
            base = tuner.baseline  # and each value alone
            for changes in (pair, {**pair, "micro_batch_size": 4, "grad_accum_steps": 2},
                            {"activation_checkpointing": "none", "optimizer_impl": "fused"},
                            {"activation_checkpointing": "full", "optimizer_impl": "for_loop"}):
                tuner.study.enqueue_trial(tuner.space.params_for(base.replace(**changes)))
        jobs.append(config)
        if (config.optimizer_impl, config.activation_checkpointing) == ("fused", "full"):
            return TrialResult(TrialStatus.UNSUPPORTED, "no fused AdamW with checkpointing",
                               unsupported=UnsupportedSetting(
                                   "optimizer_impl", "fused", {"activation_checkpointing": "full"}))
        figures = replace(METRICS, samples_per_sec=1000.0 + len(jobs))
        return TrialResult(TrialStatus.OK, "measured", measurement=figures)

    tuner = scripted(TuneOptions(model_path=str(model), device="cpu", trials=5,
                                 studies_dir=str(tmp_path), plain_tpe=True, confirm_repeats=0,
                                 seed=0, fixes={"precision": "fp32"}), measure)
    run(tuner)
    records = trial_records(load_study(tuner.study.study_name, tmp_path))
    by_number = {r.number: r for r in records}
    assert [(c.activation_checkpointing, c.optimizer_impl) for c in jobs[1:4]] == [
        ("full", "fused"), ("none", "fused"), ("full", "for_loop")]
    assert by_number[1].status == by_number[2].status == TrialStatus.UNSUPPORTED
    assert by_number[2].message.startswith(
        "not run: optimizer_impl=fused with activation_checkpointing=full is unsupported on "
        "this model")
    assert by_number[3].status == by_number[4].status == TrialStatus.OK


def _disturbed_at_first(still_disturbed: bool):
    """A measure whose baseline (trial 0) is disturbed by a load the first time, and the second
    time too where `still_disturbed`; every other trial 1,100 samples/s, disturbed."""
    jobs: list[str] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        jobs.append(job.name)
        busy = job.number != 0 or job.name == "trial-0" or still_disturbed
        rate = 1100.0 if job.number else 500.0 if busy else 1000.0
        figures = replace(METRICS, samples_per_sec=rate, disturbed=busy,
                          other_cpu_share=0.6 if busy else 0.05)
        return TrialResult(TrialStatus.OK, "measured", measurement=figures)

    return jobs, measure


@pytest.mark.parametrize("still_disturbed", [False, True])
def test_a_disturbed_baseline_is_measured_again_before_the_search_follows_it(
        write_model, tmp_path, still_disturbed) -> None:
    """A baseline timed while another process was busy makes every calmer trial a win: it is
    measured again before any move is measured from it, and the calmer figure kept. Where the
    load is still there the second time, it is the machine's own: later wins are compared as
    measured, not measured twice each. A disturbed trial that would be the best so far is
    measured again the same way."""
    jobs, measure = _disturbed_at_first(still_disturbed)
    notes = Notes()
    tuner = scripted(TuneOptions(model_path=str(write_model(TINY_SOURCE)), device="cpu",
                                 trials=3, studies_dir=str(tmp_path), plain_tpe=True,
                                 confirm_repeats=0, seed=0), measure, view=notes)
    run(tuner)
    assert jobs[:2] == ["trial-0", "trial-0-again"]
    # a disturbed win is measured again too, until a second measurement is disturbed as well
    assert [j for j in jobs if j.endswith("-again")] == \
        (["trial-0-again"] if still_disturbed else ["trial-0-again", "trial-1-again"])
    records = trial_records(load_study(tuner.study.study_name, tmp_path))
    baseline = records[0].measurement
    assert baseline is not None
    assert (baseline.samples_per_sec, baseline.disturbed) == \
        ((500.0, True) if still_disturbed else (1000.0, False))
    assert any(n.startswith("trial 0 was disturbed (other processes used 60% of the CPUs); "
                            "measured again") for n in notes.lines)
    steady = "disturbed again: the load is the machine's own"
    assert sum(n.startswith(steady) for n in notes.lines) == 1


def run(tuner: Tuner) -> None:
    try:
        tuner.run()
    finally:
        tuner.close()


class Said(Notes):
    """The notes and the lines of time left, in the order a study prints them."""

    def time_left(self, text: str) -> None:
        self.lines.append(text)

    def trial(self, number: int, config: TrainConfig) -> None:
        self.lines.append(f"trial {number}: {config.precision}")


def test_a_loss_run_is_priced_once_a_candidate_changes_the_numerics(
        write_model, tmp_path) -> None:
    """Issue 49: the plan priced loss runs for every numerics change the space could make
    before any candidate made one. Now the plan is made anew after each trial, and a loss run
    is priced, and said, once a candidate measured trains in bf16."""
    said = Said()

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        if isinstance(job.settings, LossRunSettings):
            return TrialResult(TrialStatus.OK, loss_run=LossRun(
                seed=job.settings.seed, steps=job.settings.steps, initial_loss=3.0,
                final_loss=1.0, train_loss=1.0, finite=True))
        if job.name.startswith("trial-"):
            said.trial(int(job.name.split("-")[1]), config)
        fast = 2000.0 if config.precision == "bf16" else 1000.0 + config.micro_batch_size
        return TrialResult(TrialStatus.OK, "measured", wall_s=20.0,
                           measurement=replace(METRICS, samples_per_sec=fast))

    tuner = scripted(TuneOptions(model_path=str(write_model(TINY_SOURCE)), device="cpu",
                                 budget_s=600, trials=4, studies_dir=str(tmp_path),
                                 seed=0), measure, view=said)
    run(tuner)
    plan = next(i for i, line in enumerate(said.lines) if line.startswith("this run ends by"))
    bf16 = next(i for i, line in enumerate(said.lines) if line.endswith(": bf16"))
    assert "loss runs" not in said.lines[plan]
    assert bf16 > plan and not any("loss runs" in line for line in said.lines[:bf16])
    assert "loss runs" in said.lines[bf16 + 1], said.lines


def test_a_first_compile_measured_does_not_cut_the_search_short(write_model, tmp_path) -> None:
    """per_feature_towers at a1b939e: the plan made anew after its compiled trial priced that
    trial's 60 s first compile into every process of the proof, and the search ended at
    trial 3 with 8 minutes left. A confirmation finds the compile cache warm: the plan keeps
    the baseline's price, and the search goes on."""
    trials: list[str] = []
    said = Said()

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        if job.name.startswith("trial-"):
            trials.append(config.compile_mode)
        compiled = config.compile_mode != "none"
        figures = replace(METRICS, samples_per_sec=3000.0 if compiled else 1000.0,
                          time_to_first_step_s=200.0 if compiled else 0.5)
        return TrialResult(TrialStatus.OK, "measured", wall_s=2.0, measurement=figures)

    tuner = scripted(TuneOptions(model_path=str(write_model(TINY_SOURCE)), device="cpu",
                                 budget_s=600, trials=8, studies_dir=str(tmp_path), seed=0,
                                 fixes={"precision": "fp32"}), measure, view=said)
    run(tuner)
    first = next(i for i, mode in enumerate(trials) if mode != "none")
    assert first < len(trials) - 1 and len(trials) == 8, "\n".join(said.lines)
    # the time left told after each trial prices the proof as the plan does: not 200 s of
    # compile in every process and check, which cut its rounds to one
    rounds = [int(line.split(" confirmation round")[0].split()[-1]) for line in said.lines
              if line.startswith("about ") and " confirmation round" in line]
    assert len(rounds) == len(trials) - 1  # after each trial but the baseline (its plan)
    assert min(rounds[first - 1:]) >= 3, said.lines


def test_the_compiled_best_starts_only_where_its_first_compile_ends_in_the_search(
        write_model, tmp_path) -> None:
    """The H200's resumed GPT-2 study started the best compiled with 21.6 s of the search
    left, killed it compiling, and left it queued: time the proof lacked. Under a 40 s budget
    a first compile priced at a minute is not started, by the expert or the sampler (a LoRA
    script's run said so, then its sampler started a compile that timed out); the run says
    so, once."""
    said, measured = Said(), []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        measured.append(config)
        return TrialResult(TrialStatus.OK, "measured", wall_s=2.0, measurement=replace(
            METRICS, samples_per_sec=1000.0 + config.micro_batch_size))

    tuner = scripted(TuneOptions(model_path=str(write_model(TINY_SOURCE)), device="cpu",
                                 budget_s=40, trials=8, studies_dir=str(tmp_path), seed=0,
                                 fixes={"precision": "fp32"}, confirm_repeats=0), measure,
                     view=said)
    run(tuner)
    roles = [r.role for r in trial_records(load_study(tuner.study.study_name, tmp_path))]
    assert Role.COMPILED_BEST not in roles and Role.FAST_CORNER in roles
    assert len(measured) > 4 and {c.compile_mode for c in measured} == {"none"}
    left = [line for line in said.lines if line.startswith("the best so far compiled")]
    assert left == ["the best so far compiled is not tried: its first compile (about 60.00 s) "
                    "would not end within the search's time left; a resumed run, or a longer "
                    "--budget, tries it"]


def test_after_a_compile_the_search_starts_none_its_time_left_cannot_end(
        write_model, tmp_path) -> None:
    """per_feature_towers beside a load at 848bbbe: after the default mode's 64 s compile, the
    sampler started max-autotune-no-cudagraphs with 73 s of the search left, and it timed out
    compiling. A compile measured at 100 s holds the sampler at no compile for a search of
    less than that; the compiled best still ran while the search had the time."""
    measured: list[TrainConfig] = []

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        measured.append(config)
        compiled = config.compile_mode != "none"
        return TrialResult(TrialStatus.OK, "measured", wall_s=2.0, measurement=replace(
            METRICS, samples_per_sec=1000.0 + config.micro_batch_size + 500 * compiled,
            time_to_first_step_s=100.5 if compiled else 0.5))

    tuner = scripted(TuneOptions(model_path=str(write_model(TINY_SOURCE)), device="cpu",
                                 budget_s=90, trials=16, studies_dir=str(tmp_path), seed=0,
                                 fixes={"precision": "fp32"}, confirm_repeats=0), measure)
    run(tuner)
    modes = [c.compile_mode for c in measured]
    first = modes.index("default")
    assert len(modes) > first + 3 and set(modes[first + 1:]) == {"none"}, modes


@pytest.mark.parametrize("loader_waits,fixes", [(False, {}), (True, {}),
                                                (True, {"num_workers": 0})])
def test_a_dominant_wait_for_data_no_worker_can_fix_here_is_said(
        write_model, tmp_path, loader_waits: bool, fixes: dict) -> None:
    """mlp on this CPU: "Waiting for data first", then the fast corner, and no word of the
    loader. A loader that computes on the cores training runs on gets no workers planned, and
    the run says so after the diagnosis; one that waits on storage gets its workers first,
    unless `--fix num_workers=0` holds them, which is said too."""
    said, first = Said(), []
    share = 0.02 if loader_waits else 1.0
    probe = replace(TINY_PROBE, loader_rates=[
        LoaderRate(0, None, 2000.0, cpu_share=share), LoaderRate(2, 2, 3000.0)])

    def measure(config: TrainConfig, job: MeasureJob) -> TrialResult:
        first.append(config)
        return TrialResult(TrialStatus.OK, "measured", measurement=replace(
            METRICS, data_wait_fraction=0.6, host_syncs_per_step=0.0))

    tuner = scripted(TuneOptions(model_path=str(write_model(TINY_SOURCE)), device="cpu",
                                 trials=2, studies_dir=str(tmp_path), confirm_repeats=0,
                                 seed=0, fixes=fixes), measure, probe=probe, view=said)
    run(tuner)
    diagnosis = next(i for i, line in enumerate(said.lines)
                     if line.startswith("where your step's time goes: waiting for data 60%"))
    why = "waiting for data: no DataLoader workers planned for it: on this CPU they would " \
        "take the cores training runs on (its loader computes, it does not wait)" \
        if not loader_waits else "waiting for data: nothing the search offers changes it " \
        "from your settings (num_workers=0: one value in this study's space)"
    moved = loader_waits and not fixes
    assert (said.lines[diagnosis + 1:diagnosis + 2] == [why]) is not moved, said.lines
    assert (first[1].num_workers > 0) is moved
