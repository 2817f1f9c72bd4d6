"""What the terminal shows: operator tables, a trial's line and a study's summary."""

from __future__ import annotations

from dataclasses import MISSING, fields, replace

import torch
from rich.console import Console

from autotune.config import TrainConfig
from autotune.show.report import (
    OPERATOR_TABLE_TITLES,
    stats_table,
    summary_markdown,
    summary_tables,
    trial_row,
)
from autotune.study.records import TrialRecord
from autotune.study.summary import ConfirmedFigures, StudySummary
from autotune.trial.profiling import operator_tables


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
    config = TrainConfig(micro_batch_size=8, precision="bf16").to_dict()
    ok = TrialRecord(number=3, status="ok", config=config, samples_per_sec=1234.5,
                     peak_memory_bytes=2 * 2**30)
    assert trial_row(ok) == ("3", "mb=8x1 bf16 for_loop", "1234.5", "2.00 GiB", "ok", "")
    repeat = TrialRecord(number=4, status="ok", config=config, duplicate_of=3)
    assert trial_row(repeat)[4] == "repeat of #3"
    failed = TrialRecord(number=5, status="oom", config=config, message="CUDA out of memory\n..")
    assert trial_row(failed)[4:] == ("oom", "CUDA out of memory")
    busy = TrialRecord(number=6, status="ok", config=config, samples_per_sec=99.0,
                       disturbed=True, other_cpu_share=0.47)
    assert trial_row(busy)[4:] == ("ok", "disturbed (other processes used 47% of the CPUs)")


def _summary(**figures) -> StudySummary:
    """A summary with nothing in it but what a test gives."""
    empty = {f.name: None for f in fields(StudySummary) if f.default is MISSING}
    return StudySummary(**{**empty, "verdict": "a verdict", "devices": (), "trials": {},
                           "statuses": {},
                           "oom_trials": 0, "retried_trials": 0, "free_batch": False,
                           "left_out": (), "warnings": (), "disturbed_trials": (),
                           "best_disturbed": False, **figures})


def _confirmed(**figures) -> ConfirmedFigures:
    empty = {f.name: None for f in fields(ConfirmedFigures)}
    return ConfirmedFigures(**{**empty, "best_runs": (), "confirmation_repeats": 0, **figures})


def test_summary_shows_best_beside_baseline_in_both_forms() -> None:
    base = TrainConfig(micro_batch_size=8).to_dict()
    best = TrainConfig(micro_batch_size=8, precision="bf16").to_dict()
    confirmed = _confirmed(baseline_spread=2.0, speedup_ci=(1.9, 2.1), confirmation_repeats=2,
                           best_search_samples_per_sec=250.0)
    summary = _summary(study="mlp", model="models/mlp.py", device="cpu",
                       best_config=best, baseline_config=base, best_samples_per_sec=200.0,
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
    assert "2: #2, #3" in text
    markdown = summary_markdown(summary)
    assert markdown.startswith("# autotune study `mlp`")
    assert "| precision | fp32 | **bf16** |" in markdown
    assert "- disturbed: 2: #2, #3 (trials timed while other processes used the CPUs" in markdown
