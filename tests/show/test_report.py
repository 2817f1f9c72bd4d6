"""What the terminal shows: operator tables, a trial's line and a study's summary."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace

import optuna
import pytest
import torch
from rich.console import Console

from autotune.config import DISTRIBUTED_KNOBS, TrainConfig
from autotune.show.report import (
    OPERATOR_TABLE_TITLES,
    bench_tables,
    check_rows,
    diagnosis_lines,
    knob_rows,
    speedup_text,
    stats_table,
    summary_markdown,
    summary_tables,
    trial_row,
)
from autotune.show.report_page import build_report
from autotune.study.bottleneck import COMPUTE, Diagnosis, Share
from autotune.study.checks import CheckSummary
from autotune.study.confirmation import NOISE, PAYS, TakenBack
from autotune.study.records import StudyKey, TrialRecord
from autotune.study.results import applicable_knobs, load_study, study_summary
from autotune.study.storage import open_storage
from autotune.study.summary import ConfirmedFigures, StudySummary
from autotune.target import ModelFile, Script
from autotune.trial.profiling import operator_tables
from autotune.trial.protocol import (
    Measurement,
    ScriptAnswer,
    StudyIdentity,
    TrialStatus,
    WorkKind,
)

from ..study.test_results import _told


def _text(renderable) -> str:
    console = Console(record=True, width=200)
    console.print(renderable)
    return console.export_text()


def test_operator_tables_of_a_raw_profile() -> None:
    model = torch.nn.Linear(32, 8)
    with torch.profiler.profile(record_shapes=True) as prof:
        model(torch.randn(16, 32)).sum().backward()
    tables = operator_tables(prof, top=3)
    assert set(tables) == {"cpu", "input shape"}  # no device table on CPU
    text = "".join(_text(stats_table(stats, OPERATOR_TABLE_TITLES[kind]))
                   for kind, stats in tables.items())
    assert "by self CPU time" in text and "by input shape" in text
    assert "aten::" in text


def test_a_trial_line_names_its_outcome() -> None:
    config = TrainConfig(micro_batch_size=8, precision="bf16")
    ok = TrialRecord(number=3, status=TrialStatus.OK, config=config,
                     measurement=Measurement(samples_per_sec=1234.5,
                                             peak_memory_bytes=2 * 2**30))
    assert trial_row(ok) == ("3", "mb=8x1 bf16 for_loop", "1234.5", "2.00 GiB", "ok", "")
    repeat = TrialRecord(number=4, status=TrialStatus.OK, config=config, duplicate_of=3)
    assert trial_row(repeat)[4] == "repeat of #3"
    failed = TrialRecord(number=5, status=TrialStatus.OOM, config=config,
                         message="CUDA out of memory\n..")
    assert trial_row(failed)[4:] == ("oom", "CUDA out of memory")
    busy = TrialRecord(number=6, status=TrialStatus.OK, config=config,
                       measurement=Measurement(samples_per_sec=99.0, disturbed=True,
                                               other_cpu_share=0.47))
    assert trial_row(busy)[4:] == ("ok", "disturbed (other processes used 47% of the CPUs)")
    waiting = TrialRecord(number=7, status=None, state="WAITING", config=config)
    assert trial_row(waiting)[2:5] == ("", "", "queued")


def _summary(**figures) -> StudySummary:
    """A summary with nothing in it but what a test gives."""
    empty = {f.name: None for f in fields(StudySummary) if f.default is MISSING}
    return StudySummary(**{**empty, "verdict": "a verdict", "devices": (), "trials": {},
                           "statuses": {},
                           "oom_trials": 0, "retried_trials": 0, "free_batch": False,
                           "left_out": (), "warnings": (), "disturbed_trials": (),
                           "queued_trials": (),
                           "best_disturbed": False, **figures})


def _confirmed(**figures) -> ConfirmedFigures:
    empty = {f.name: None for f in fields(ConfirmedFigures)}
    return ConfirmedFigures(**{**empty, "best_runs": (), "confirmation_repeats": 0, **figures})


def test_summary_shows_best_beside_baseline_in_both_forms() -> None:
    base = TrainConfig(micro_batch_size=8)
    best = TrainConfig(micro_batch_size=8, precision="bf16")
    confirmed = _confirmed(baseline_spread=2.0, speedup_ci=(1.9, 2.1), confirmation_repeats=2,
                           best_search_samples_per_sec=250.0)
    summary = _summary(study="mlp", target=ModelFile("models/mlp.py"), device="cpu",
                       best_config=best, baseline_config=base,
                       knobs=applicable_knobs(None, best, base, 1), best_samples_per_sec=200.0,
                       best_spread=5.0, baseline_samples_per_sec=100.0, speedup=2.0,
                       trials={"COMPLETE": 4}, statuses={"ok": 4}, disturbed_trials=(2, 3),
                       confirmation=confirmed)
    text = " ".join(_text(summary_tables(summary)).split())
    assert "2.00x [1.90-2.10]" in text and "200.0 ± 5.0" in text
    assert "median of 2 paired rounds" in text and "confirmed -20%" in text
    tied = replace(summary, speedup=1.02, confirmation=replace(
        confirmed, speedup_ci=(0.97, 1.08), no_measurable_difference=True))
    assert "1.02x [0.97-1.08]: no measurable difference" in " ".join(
        _text(summary_tables(tied)).split())
    # your settings kept: the interval is the closest other's, never the kept settings' own
    kept = replace(summary, best_config=base, speedup=1.0, confirmation=replace(
        confirmed, speedup_ci=(0.46, 1.03), no_measurable_difference=False))
    assert speedup_text(kept) == \
        "1.00x: your settings kept; the closest other [0.46-1.03], no measurable difference"
    assert "1.00x [0.46-1.03]" not in " ".join(_text(summary_tables(kept)).split())
    assert "2: #2, #3" in text
    markdown = summary_markdown(summary)
    assert markdown.startswith("# autotune study `mlp`")
    assert "| precision | fp32 | **bf16** |" in markdown
    assert "- disturbed: 2: #2, #3 (trials timed while other processes used the CPUs" in markdown


def test_your_settings_loss_row_says_one_seed_or_two() -> None:
    """Their second seed runs only where a loss was beyond the floor: one loss is said as
    such, two with their spread."""
    one = CheckSummary(loss_steps=50, baseline_losses=(10.77,))
    rows = {name: (value, how) for name, value, how in check_rows(_summary(
        confirmation=_confirmed(checks=one, ruled_out=())))}
    assert rows["loss (your settings)"] == (
        "10.77", "after 50 steps from one seed, what a loss is compared against (a second "
        "seed, for their spread, runs only where a loss is beyond the floor)")
    two = replace(one, baseline_losses=(10.77, 10.9))
    rows = {name: (value, how) for name, value, how in check_rows(_summary(
        confirmation=_confirmed(checks=two, ruled_out=())))}
    assert rows["loss (your settings)"] == (
        "10.77 | 10.9", "after 50 steps from two seeds: a spread of 1.2%, what a loss is "
        "compared against")


def _stored_summary(tmp_path, nproc_per_node: int, base: TrainConfig, best: TrainConfig,
                    space: dict | None = None) -> StudySummary:
    """The summary of a study on storage: the baseline's trial and a faster one."""
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path / "s"),
                                direction="maximize")
    study.set_user_attr(StudyKey.IDENTITY, StudyIdentity(
        ModelFile("models/mlp.py"), "cuda", nproc_per_node=nproc_per_node).to_json())
    study.set_user_attr(StudyKey.BASELINE_CONFIG, base.to_dict())
    if space is not None:
        study.set_user_attr(StudyKey.SPACE, space)
    _told(study, base, "ok", 100.0, role="baseline")
    _told(study, best, "ok", 150.0)
    return study_summary(load_study("s", tmp_path))


def _listed(summary: StudySummary) -> tuple[set[str], str, str]:
    """The knobs of the summary's rows, its markdown and its terminal tables."""
    return ({knob for knob, _, _ in knob_rows(summary)}, summary_markdown(summary),
            _text(summary_tables(summary)))


def test_a_process_groups_knobs_are_listed_only_for_a_process_group(tmp_path) -> None:
    base = TrainConfig(micro_batch_size=8)
    one = _stored_summary(tmp_path / "one", 1, base, base.replace(precision="bf16"))
    rows, markdown, text = _listed(one)
    assert one.nproc_per_node == 1 and rows == set(one.knobs)
    assert not rows & set(DISTRIBUTED_KNOBS)
    assert {"micro_batch_size", "precision", "compile_mode"} <= rows
    assert "| precision | fp32 | **bf16** |" in markdown
    assert not any(f"| {knob} |" in markdown or knob in text for knob in DISTRIBUTED_KNOBS)

    ddp = base.replace(parallelism="ddp")
    group = _stored_summary(tmp_path / "group", 2, ddp,
                            ddp.replace(parallelism="fsdp", precision="bf16"))
    rows, markdown, text = _listed(group)
    assert group.nproc_per_node == 2 and set(DISTRIBUTED_KNOBS) <= rows
    assert "| parallelism | ddp | **fsdp** |" in markdown
    assert "| ddp_static_graph | False | False |" in markdown
    assert all(knob in text for knob in DISTRIBUTED_KNOBS)


def test_a_knob_the_best_changed_is_listed_though_the_study_did_not_search_it(
        tmp_path) -> None:
    # The study searched the batch and precision only; its best changed the AdamW too.
    space = {"domains": {**{knob: [value] for knob, value in TrainConfig().to_dict().items()},
                         "micro_batch_size": [8, 16], "precision": ["fp32", "bf16"]}}
    base = TrainConfig(micro_batch_size=8)
    summary = _stored_summary(tmp_path, 1, base,
                              base.replace(precision="bf16", optimizer_impl="fused"), space)
    rows, markdown, _ = _listed(summary)
    assert summary.knobs == ("micro_batch_size", "grad_accum_steps", "precision",
                             "optimizer_impl")
    assert "| optimizer_impl | for_loop | **fused** |" in markdown
    assert "compile_mode" not in rows  # one value: not searched, not changed


def test_a_script_studys_answer_is_in_its_own_terms_everywhere() -> None:
    answer = ScriptAnswer("transformers", {"TrainingArguments": {
        "per_device_train_batch_size": 16, "bf16": True}}, "parse_args_into_dataclasses")
    summary = _summary(target=Script("/w/train.py", ("--output_dir", "out")),
                       script_answer=answer, knobs=())
    flags = "--per_device_train_batch_size 16 --bf16"
    assert summary.script_lines() == [flags]
    console = Console(record=True, width=200)
    console.print(summary_tables(summary))
    shown = console.export_text()
    assert f"in your script's terms:\n  {flags}\n" in shown
    markdown = summary_markdown(summary)
    assert f"```\n{flags}\n```" in markdown
    assert "- script: `/w/train.py` `--output_dir out`" in markdown
    data = summary.to_json()
    assert data["answer_in_script_terms"] == [flags] and data["script_flags"] == flags.split()
    # the target under the keys `show --json` has always printed
    assert (data["model"], data["model_args"], data["script_args"]) == \
        ("/w/train.py", {}, ["--output_dir", "out"])
    model = _summary(target=ModelFile("/w/m.py", {"dim": 8}), knobs=()).to_json()
    assert (model["model"], model["model_args"]) == ("/w/m.py", {"dim": 8})
    assert "script_args" not in model and "target" not in model  # a model file's, as before


def test_each_change_taken_back_is_a_row_with_its_cost_and_what_it_says() -> None:
    """The race's best, then each of its changes taken back: the speed lost without it with
    its interval, and kept or dropped and why; in the terminal's table and summary.md alike."""
    base = TrainConfig(micro_batch_size=8)
    best = base.replace(num_workers=2, prefetch_factor=2, persistent_workers=True)
    raced = best.replace(compile_mode="default")
    backs = (TakenBack("2 loader workers, prefetch 2 + persistent workers",
                       ("num_workers", "prefetch_factor", "persistent_workers", "pin_memory"),
                       raced.replace(num_workers=0, prefetch_factor=None,
                                     persistent_workers=False), PAYS, 0.3, (0.29, 0.31), 24),
             TakenBack("torch.compile", ("compile_mode",), best, NOISE, 0.996, (0.988, 1.012),
                       24))
    summary = _summary(study="s", best_config=best, baseline_config=base,
                       knobs=applicable_knobs(None, best, base, 1), speedup=3.4,
                       confirmation=_confirmed(taken_back=backs, taken_from_config=raced,
                                               speedup_ci=(3.3, 3.5)))
    text = " ".join(_text(summary_tables(summary)).split())
    assert "the race's best" in text
    assert "without torch.compile" in text and "0.4% [-1.2%, +1.2%]" in text
    assert "inside the noise: dropped" in text and "it pays: kept" in text
    markdown = summary_markdown(summary)
    assert "- without torch.compile: 0.4% [-1.2%, +1.2%] (speed lost, paired by round, 95% " \
        "interval: inside the noise: dropped)" in markdown
    # a fastest as fast as the race's best, which the answer then took changes from, is
    # compared with what it was compared with, never with the answer
    fastest = replace(summary, confirmation=replace(
        summary.confirmation, fastest_config=raced.replace(memory_format="channels_last"),
        fastest_speedup=3.6, fastest_speedup_ci=(3.4, 3.8), no_measurable_difference=False))
    assert "3.60x [3.40-3.80] of the baseline, no measurable difference from the race's best " \
        "(below), which changes fewer knobs" in summary_markdown(fastest)


# What a CUDA trial of a GPT-2-small-like model records for its MFU (the figures are made up).
CUDA_MFU = Measurement(samples_per_sec=200.0, flops_per_sample=4.21e9, flops_source="counted",
                       peak_flops=989e12, peak_flops_source="the bf16 data-sheet peak",
                       mfu=4.21e9 * 200.0 / 989e12)


def test_bench_shows_mfu_with_what_it_divided_on_cuda_and_why_there_is_none_on_cpu() -> None:
    on_cuda = " ".join(_text(bench_tables(CUDA_MFU, "cuda:0", "gpt2 on cuda")).split())
    assert "MFU │ 0.1% │ 4.21 GFLOP a sample (counted) x samples/sec over 989 TFLOP/s, the " \
        "bf16 data-sheet peak" in on_cuda
    on_cpu = " ".join(_text(bench_tables(Measurement(samples_per_sec=200.0), "cpu",
                                         "mlp on cpu")).split())
    assert "MFU │ n/a on CPU │ no peak FLOP/s to divide by: MFU needs CUDA" in on_cpu


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_show_run_and_summary_md_give_the_best_mfu_or_why_there_is_none(tmp_path,
                                                                       device) -> None:
    """`show`, `run`'s closing summary and summary.md share one row, and `report`'s page says
    the same; on CUDA the best trial's FLOPs a sample and peak are what it divided."""
    study = optuna.create_study(study_name="s", storage=open_storage(None, tmp_path / "s"),
                                direction="maximize")
    study.set_user_attr(StudyKey.IDENTITY,
                        StudyIdentity(ModelFile("models/mlp.py"), device).to_json())
    base = TrainConfig(micro_batch_size=8)
    study.set_user_attr(StudyKey.BASELINE_CONFIG, base.to_dict())
    _told(study, base, "ok", 100.0, role="baseline")
    mfu = {f: getattr(CUDA_MFU, f) for f in ("flops_per_sample", "flops_source", "peak_flops",
                                              "peak_flops_source", "mfu")}
    _told(study, base.replace(precision="bf16"), "ok", 200.0, **(mfu if device == "cuda" else {}))
    summary = study_summary(load_study("s", tmp_path))
    text = " ".join(_text(summary_tables(summary)).split())
    markdown = summary_markdown(summary)
    page = build_report(load_study("s", tmp_path))
    if device == "cuda":
        assert "MFU (best) │ 0.1% │ 4.21 GFLOP a sample (counted) x samples/sec over 989 " \
            "TFLOP/s" in text
        assert "- MFU (best): 0.1% (4.21 GFLOP a sample (counted)" in markdown
        assert "<td>MFU</td><td class=\"num\">n/a</td><td class=\"num\">0.1%</td>" in page
        assert "MFU: 4.21 GFLOP a sample (counted) x samples/sec over 989 TFLOP/s" in page
    else:
        assert "MFU (best) │ n/a on CPU │ no peak FLOP/s to divide by: MFU needs CUDA" in text
        assert "- MFU (best): n/a on CPU (no peak FLOP/s to divide by" in markdown
        assert "<td class=\"num\">n/a on CPU</td><td class=\"num\">n/a on CPU</td>" in page
        assert "MFU: no peak FLOP/s to divide by: MFU needs CUDA." in page


def test_an_mfu_short_of_the_roofline_is_said_with_where_the_answers_step_goes() -> None:
    """On CUDA below 50% MFU the answer's GPU time by kind of work is the account of the gap
    (kinds under 5% not named); at or above it, or on a CPU, the same figures without it."""
    work = ((WorkKind.MATMUL, 0.55), (WorkKind.ELEMENTWISE, 0.3), (WorkKind.ATTENTION, 0.12),
            (WorkKind.COPY, 0.03))
    gpu = Diagnosis((Share(COMPUTE, 1.0),), device_idle=0.18, work=work,
                    kernels_per_step=1204.0)
    short = diagnosis_lines(_summary(answer_diagnosis=gpu, best_mfu=0.39, device_type="cuda"))
    assert short == [
        "the answer's step: forward and backward 100% (-> bf16, torch.compile); the GPU idle "
        "18% of it",
        "MFU 39%, short of the 50% a tuned step reaches: the answer's GPU time: matmuls and "
        "convolutions 55%, elementwise, norms and the rest 30%, attention 12%; 1,204 kernels "
        "a step"]
    reached = diagnosis_lines(_summary(answer_diagnosis=gpu, best_mfu=0.52, device_type="cuda"))
    assert reached[1].startswith("the answer's GPU time: matmuls and convolutions 55%")
    cpu = replace(gpu, device_idle=None, kernels_per_step=None)
    assert diagnosis_lines(_summary(answer_diagnosis=cpu, device_type="cpu"))[1] == \
        "the answer's operator time: matmuls and convolutions 55%, elementwise, norms and the " \
        "rest 30%, attention 12%"
