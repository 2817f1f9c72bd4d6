"""Trials as process groups (`--nproc-per-node 2`, gloo on CPU, a core each): a whole study as
a user runs it, and a tuner killed mid-trial leaving no rank behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.study.records import TrialRecord, trial_records
from autotune.study.results import load_study
from autotune.trial.protocol import TrialStatus

from ..conftest import FAST, ROOT, TINY_SOURCE, run_cli

pytestmark = pytest.mark.slow

# Everything fixed but the parallelism: the study measures DDP (the baseline) and FSDP.
ONLY_PARALLELISM = ["--fix", "micro_batch_size=8", "--fix", "precision=fp32",
                    "--fix", "activation_checkpointing=none", "--fix", "optimizer_impl=for_loop",
                    "--fix", "num_workers=0", "--fix", "compile_mode=none",
                    "--fix", "ddp_bucket_cap_mb=25", "--fix", "ddp_static_graph=false",
                    "--fix", "ddp_gradient_as_bucket_view=false",
                    "--fix", "fsdp_reshard_after_forward=true"]
PIDS_SOURCE = TINY_SOURCE + '''

def loss_fn(model, batch):
    import os, pathlib
    pathlib.Path(os.environ["PIDS"], str(os.getpid())).touch()
    return model(*batch)
'''


def test_a_two_rank_study_measures_ddp_and_fsdp_and_exports_both(write_model, tmp_path):
    model = write_model(TINY_SOURCE)
    done = run_cli("run", "--model", str(model), "--device", "cpu", "--nproc-per-node", "2",
                   *FAST, *ONLY_PARALLELISM, "--trials", "2", "--studies-dir", str(tmp_path),
                   "--json", timeout=900)
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert "checking DDP and FSDP on the model in process groups of 2 ranks" in said
    assert "left out: ddp_static_graph=True: fails with gradient accumulation" in said
    summary = json.loads(done.stdout)
    assert summary["nproc_per_node"] == 2
    # the answer's checks are made for a group too: here none is needed
    assert summary["checks"]["worst_batch_note"].startswith("not needed: every sample")
    assert summary["checks"]["loss_note"].startswith("not needed: nothing it may recommend")
    shown = json.loads(run_cli("show", model.stem, "--studies-dir", str(tmp_path),
                               "--json").stdout)
    measured = {r.config.parallelism for r in _trials(tmp_path, model.stem)
                if r.status == TrialStatus.OK}
    assert measured == {"ddp", "fsdp"}
    group = shown["process_group"]
    assert group["world_size"] == 2 and len(group["rank_samples_per_sec"]) == 2
    assert shown["confirmed"]
    # the confirmation's groups kept warm, their ranks pausing between turns together
    assert "measuring in warm paired turns" in said, said
    hf = run_cli("export", model.stem, "--studies-dir", str(tmp_path), "--format", "hf")
    lightning = run_cli("export", model.stem, "--studies-dir", str(tmp_path), "--format",
                        "lightning")
    torch_script = run_cli("export", model.stem, "--studies-dir", str(tmp_path), "--format",
                           "torch")
    for export in (hf, lightning, torch_script):
        assert export.returncode == 0, export.stderr
        assert "nproc-per-node 2" in export.stdout
    best = summary["best_config"]["parallelism"]
    assert ("DDPStrategy" if best == "ddp" else "ModelParallelStrategy") in lightning.stdout


def _trials(studies: Path, name: str) -> list[TrialRecord]:
    return trial_records(load_study(name, str(studies), None))


def test_a_tuner_killed_mid_trial_leaves_no_rank_and_the_study_resumes(write_model, tmp_path):
    model = write_model(PIDS_SOURCE)
    pids = tmp_path / "pids"
    pids.mkdir()
    command = [sys.executable, "-m", "autotune", "run", "--model", str(model), "--device",
               "cpu", "--nproc-per-node", "2", *FAST, *ONLY_PARALLELISM, "--trials", "2",
               "--confirm-repeats", "0", "--studies-dir", str(tmp_path / "studies")]
    env = {**os.environ, "PIDS": str(pids)}
    tuner = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    log = tmp_path / "studies" / model.stem / "logs" / "trial-0.log"
    deadline = time.monotonic() + 300
    while not (log.exists() and "timing" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert log.exists(), "the baseline trial never started timing"
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    ranks = [int(p.name) for p in pids.iterdir()]
    assert len(ranks) >= 2
    deadline = time.monotonic() + 10
    while [p for p in ranks if _alive(p)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in ranks if _alive(p)] == []

    rerun = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=900)
    assert rerun.returncode == 0, rerun.stderr
    assert "lost its tuner" in " ".join((rerun.stdout + rerun.stderr).split())


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
