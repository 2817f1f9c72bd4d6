"""The bottleneck first, as an engineer reads a profile: real studies on tiny models whose
step is dominated by one share, the run printing its diagnosis after the baseline and measuring
the fix of the dominant share as its first trial; the win it finds confirmed in warm turns."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autotune.study.confirmation import PAYS, WARM_TURNS, Confirmation
from autotune.study.records import StudyKey, trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import ProbeReport

from ..conftest import FAST, NO_COMPILE, run_cli
from .conftest import Finished, tune

pytestmark = pytest.mark.slow


def test_a_loader_that_waits_on_storage_gets_workers_first_beyond_the_cores(tmp_path) -> None:
    """Samples read one at a time at 2 ms each: the baseline's step is nearly all waiting for
    data, the run says so after the baseline, the loader (a sleeping read, off the CPU) is
    timed with more workers than the cores, and the first trial after the baseline gives it
    workers, alone: measurably faster."""
    done = run_cli("run", "--model", "tests/models/storage_reads.py", "--device", "cpu", *FAST,
                   "--studies-dir", str(tmp_path), "--trials", "2", *NO_COMPILE,
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


class OptimizerBound:
    """The study of tests/models/many_small_params.py: its folder and its run."""

    def __init__(self, studies: Path, run: Finished) -> None:
        self.studies, self.run = studies, run
        self.summary = run.summary()
        self.study = load_study("many_small_params", studies)


@pytest.fixture(scope="module")
def optimizer_bound(tmp_path_factory) -> OptimizerBound:
    """A thousand tiny tensors stepped one at a time by the for-loop AdamW, which fused AdamW
    steps as one, beside a planted loser (channels-last, which this model runs slowly): four
    trials, then the best confirmed in warm paired turns, at least twelve of them, until its
    speedup is known within 10%."""
    studies = tmp_path_factory.mktemp("optimizer_bound") / "studies"
    run = tune("--model", "tests/models/many_small_params.py", "--device", "cpu", *FAST,
               "--studies-dir", str(studies), "--trials", "4", "--seed", "0", *NO_COMPILE,
               "--fix", "num_workers=0", "--fix", "precision=fp32", "--confirm-top", "1",
               "--confirm-repeats", "3", "--confirm-target", "0.1", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    return OptimizerBound(studies, run)


def test_an_optimizer_bound_step_gets_a_fused_adamw_first(
        optimizer_bound: OptimizerBound) -> None:
    """The optimizer's step dominates, the run says so, and the first trial after the baseline
    is a fused AdamW alone, the study's best; the verdict says what became of the optimizer's
    share."""
    stderr, summary = optimizer_bound.run.stderr, optimizer_bound.summary
    assert "the optimizer step" in stderr and "The optimizer step first" in stderr
    trials = trial_records(optimizer_bound.study)
    baseline, first = trials[0], trials[1]
    assert (first.role, first.changed) == ("bottleneck", ("optimizer_impl",)), stderr
    assert first.config == baseline.config.replace(optimizer_impl="fused")
    assert summary["diagnosis"]["dominant"] == "optimizer"
    assert summary["best_config"]["optimizer_impl"] == "fused"
    assert summary["verdict"].startswith("The optimizer step was ")


def test_a_win_hidden_behind_a_losing_corner_is_found_alone(
        optimizer_bound: OptimizerBound) -> None:
    """The fast corner bundles fused AdamW with channels_last, and loses to the fused AdamW it
    was measured from: each change is measured alone from that fix next (fused AdamW's is the
    fix itself, not queued; channels-last's is the corner again, a repeat that costs nothing),
    and fused AdamW is the best."""
    every = trial_records(optimizer_bound.study)
    trials = [t for t in every if not t.duplicate]
    assert [(t.role, t.changed) for t in trials[:3]] == [
        ("baseline", ()), ("bottleneck", ("optimizer_impl",)), ("fast-corner", ())], \
        optimizer_bound.run.stderr
    baseline, fused, corner = trials[:3]
    assert [t.changed for t in every if t.role == "one-change"] == [("memory_format",)]
    assert any(t.duplicate and t.changed == ("memory_format",) for t in every)
    assert (corner.config.memory_format, corner.config.optimizer_impl) == \
        ("channels_last", "fused")
    assert fused.config == baseline.config.replace(optimizer_impl="fused")
    assert fused.score > corner.score and fused.score > baseline.score
    assert max(trials, key=lambda t: t.score or 0) is fused


def test_the_win_is_confirmed_in_warm_paired_turns_with_more_rounds_than_three(
        optimizer_bound: OptimizerBound) -> None:
    """Candidates that fit in memory together confirm in warm processes taking turns, many
    more rounds than three fresh ones (each fresh round asked for is four warm ones at least),
    and say so; each change of the best is taken back in the same turns."""
    studies, summary = optimizer_bound.studies, optimizer_bound.summary
    confirmation = Confirmation.from_json(
        optimizer_bound.study.user_attrs[StudyKey.CONFIRMATION])
    assert confirmation.measured == WARM_TURNS
    assert confirmation.rounds >= 12
    assert len(confirmation.baseline.runs) == confirmation.rounds
    assert summary["confirmation_measured"] == WARM_TURNS
    assert summary["confirmation_repeats"] == (confirmation.answer_rounds or confirmation.rounds)
    # a turn leaves no trace: the winner's warm process was asked for one after the last turn
    trace = json.loads((studies / "many_small_params" / "best-trace.json").read_text())
    assert any(e.get("name", "").startswith("ProfilerStep") for e in trace["traceEvents"])
    # fused AdamW is the change that pays: the answer keeps it
    assert confirmation.winner.config.optimizer_impl == "fused"
    backs = {t.change: t for t in confirmation.taken_back}
    assert "fused AdamW" not in backs or backs["fused AdamW"].outcome == PAYS
    for back in confirmation.dropped:
        assert getattr(confirmation.winner.config, back.knobs[0]) == \
            getattr(confirmation.baseline.config, back.knobs[0])
    # a warm process for each configuration of the race (the best, the best less each of its
    # changes, the baseline), and after it one for each the short races added, no more: the
    # race's processes that a short race needs again stay warm
    logs = studies / "many_small_params" / "logs"
    raced = sorted(p.name for p in logs.glob("confirm-warm-*.log"))
    assert raced == [f"confirm-warm-{i}.log" for i in range(len(raced))]
    assert len(raced) == 2 + sum(t.config is not None for t in confirmation.taken_back)
    assert len(list(logs.glob("minimal-warm-*.log"))) <= 1
    assert all(t.change in summary["verdict"] for t in confirmation.dropped)
