"""The bottleneck first, as an engineer reads a profile: real studies on tiny models whose
step is dominated by one share, the run printing its diagnosis after the baseline and measuring
the fix of the dominant share as its first trial."""

from __future__ import annotations

import json
import os

import pytest

from autotune.study.records import StudyKey, trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import ProbeReport

from ..conftest import FAST, run_cli


@pytest.mark.slow
def test_a_loader_that_waits_on_storage_gets_workers_first_beyond_the_cores(tmp_path) -> None:
    """Samples read one at a time at 2 ms each: the baseline's step is nearly all waiting for
    data, the run says so after the baseline, the loader (a sleeping read, off the CPU) is
    timed with more workers than the cores, and the first trial after the baseline gives it
    workers, alone: measurably faster."""
    done = run_cli("run", "--model", "tests/models/storage_reads.py", "--device", "cpu", *FAST,
                   "--studies-dir", str(tmp_path), "--trials", "3", "--fix", "compile_mode=none",
                   "--confirm-repeats", "0", "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    said = next(line for line in done.stderr.splitlines()
                if line.startswith("where your step's time goes: "))
    assert said.startswith("where your step's time goes: waiting for data ") and \
        "(-> DataLoader workers)" in said and said.endswith("Waiting for data first"), said
    study = load_study("storage_reads", tmp_path)
    probe = ProbeReport.from_dict(study.user_attrs[StudyKey.PROBE]["report"])
    cores = len(os.sched_getaffinity(0))
    assert max(probe.timed_workers()) > cores
    trials = trial_records(study)
    baseline, first = trials[0], trials[1]
    assert (first.role, first.changed) == ("bottleneck", ("num_workers",)), done.stderr
    assert first.config.num_workers > 0 and first.config.precision == baseline.config.precision
    assert first.score > 1.5 * baseline.score
    summary = json.loads(done.stdout)
    assert summary["diagnosis"]["dominant"] == "data_wait"
    assert summary["diagnosis"]["shares"]["data_wait"] > 0.5


@pytest.mark.slow
def test_an_optimizer_bound_step_gets_a_fused_adamw_first(tmp_path) -> None:
    """A thousand tiny tensors stepped one at a time by the for-loop AdamW: the optimizer's
    step dominates, and the first trial after the baseline is a fused AdamW alone, the study's
    best; the verdict says what became of the optimizer's share."""
    done = run_cli("run", "--model", "tests/models/many_small_params.py", "--device", "cpu",
                   *FAST, "--studies-dir", str(tmp_path), "--trials", "3", "--seed", "0",
                   "--fix", "compile_mode=none", "--fix", "num_workers=0",
                   "--fix", "precision=fp32", "--confirm-repeats", "0", "--json", timeout=600)
    assert done.returncode == 0, done.stderr
    assert "the optimizer step" in done.stderr and "The optimizer step first" in done.stderr
    trials = trial_records(load_study("many_small_params", tmp_path))
    baseline, first = trials[0], trials[1]
    assert (first.role, first.changed) == ("bottleneck", ("optimizer_impl",)), done.stderr
    assert first.config == baseline.config.replace(optimizer_impl="fused")
    summary = json.loads(done.stdout)
    assert summary["diagnosis"]["dominant"] == "optimizer"
    assert summary["best_config"]["optimizer_impl"] == "fused"
    assert summary["verdict"].startswith("The optimizer step was ")
